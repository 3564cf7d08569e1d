"""Coupled vs exact sampling through Serve: tau, acceptance, bytes per round and ms/token at one
temperature and a fixed k, the two modes alternating prompt by prompt in one run (docs/sampling.md
"Randomness: coupled mode"). Starts a local Serve replica on the pair unless --server is given.

    .venv/bin/python lab/coupled_vs_exact.py --models models/demo --prompts prompts/heldout.jsonl \\
        --prompt-limit 8 --max-new-tokens 96 --temperature 0.8 --k 4
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from edgespec.cloud.bench.harness import load_prompts
from edgespec.edge.client import EdgeClient
from edgespec.edge.stats import RequestStats

MODES = ("exact", "coupled")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=Path("models/demo"), help="folder with target/ and draft/")
    parser.add_argument("--server", default=None, help="HOST:PORT of a running verifier (default: start one)")
    parser.add_argument("--prompts", type=Path, default=Path("prompts/heldout.jsonl"))
    parser.add_argument("--prompt-limit", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--seeds", type=int, default=1, help="generations per prompt and mode")
    parser.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. first-seed + seeds - 1")
    args = parser.parse_args()

    address, stop = args.server, None
    if address is None:
        address, stop = start_local(args.models / "target")
    try:
        prompts = load_prompts(args.prompts, args.prompt_limit)
        stats: dict[str, list[RequestStats]] = {mode: [] for mode in MODES}
        with EdgeClient(address, args.models / "draft", timeout=60) as client:
            client.generate(prompts[0], max_new_tokens=8, temperature=args.temperature, k=args.k)  # warm-up
            for prompt in prompts:
                for seed in range(args.first_seed, args.first_seed + args.seeds):
                    for mode in MODES:  # alternating: the same load on both
                        result = client.generate(prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                                 k=args.k, send_ahead=1, mode=mode, seed=seed, stop_token_ids=())
                        stats[mode].append(result.stats)
        for mode in MODES:
            total = RequestStats.combined(stats[mode])
            print(json.dumps({
                "mode": mode, "temperature": args.temperature, "k": args.k, "requests": len(stats[mode]),
                "tau": round(total.mean_acceptance_length, 3), "acceptance": round(total.acceptance_rate, 4),
                "by_position": [round(a, 3) for a in total.acceptance_by_position],
                "bytes_per_round": round(total.bytes_per_round), "ms_per_token": round(total.ms_per_token, 2),
            }), flush=True)
    finally:
        if stop is not None:
            stop()


def start_local(target: Path):
    """One CPU replica of ``target`` on free ports: (address, stop)."""
    from edgespec.cloud.serving.app import init_ray, serve_verifier, stop_serving
    from edgespec.cloud.serving.config import DeploymentOptions, VerifierConfig
    from edgespec.cloud.serving.haproxy_owner import free_port

    init_ray(num_cpus=2, metrics_export_port=free_port())
    port = free_port()
    serve_verifier(VerifierConfig(model=str(target), device="cpu"), DeploymentOptions(num_cpus=0.5),
                   grpc_port=port, http_port=free_port(), timeout_s=240)
    return f"127.0.0.1:{port}", stop_serving


if __name__ == "__main__":
    main()
