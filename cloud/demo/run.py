"""``edgespec demo`` (``make demo``): the whole product on one machine, in one command.

1. picks the demo pair: the trained one shipped in models/demo, or (if absent) a tiny pair
   built on the fly, and says which;
2. starts Ray and Serve locally with the target on CPU (one thread);
3. streams a speculative completion of a held-out prompt with the ONNX draft (one thread);
4. generates the same prompt cloud-only (Generate) over the same gRPC path, alternating
   runs, and prints acceptance, mean acceptance length, target calls per token, ms/token and
   the speedup as a ratio of medians measured in this run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PAIR = REPO / "models" / "demo"
HELD_OUT_PROMPTS = REPO / "prompts" / "heldout.jsonl"
FALLBACK_PROMPT = "def parse_args(argv=None):\n    parser = argparse.ArgumentParser("


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", type=Path, help="target model dir (default: models/demo/target)")
    parser.add_argument("--draft", type=Path, help="ONNX draft dir (default: models/demo/draft)")
    parser.add_argument("--prompt", help="prompt text (default: the first held-out prompt)")
    parser.add_argument("--prompt-index", type=int, default=0, help="which held-out prompt to use")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--k", default="4", help="drafted tokens per round, or 'auto'")
    parser.add_argument("--repeats", type=int, default=3, choices=range(1, 101), metavar="N", help="alternating speculative/cloud-only runs to time (1-100)")
    parser.add_argument("--grpc-port", type=int, default=9000)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object last")


def resolve_pair(args: argparse.Namespace) -> tuple[Path, Path, str]:
    if args.target and args.draft:
        return args.target, args.draft, "given"
    target, draft = DEFAULT_PAIR / "target", DEFAULT_PAIR / "draft"
    if (target / "config.json").is_file() and (draft / "manifest.json").is_file():
        return target, draft, "trained demo pair (models/demo)"
    from edgespec.cloud.export import export_draft
    from edgespec.cloud.tiny import build_tiny_pair

    root = REPO / "runs" / "tiny-pair"
    print("models/demo not found: building a tiny random pair on the fly (no speedup expected from it)")
    pair = build_tiny_pair(root)
    if not (root / "draft" / "manifest.json").is_file():
        export_draft(pair.draft_dir, root / "draft", overwrite=True)
    return pair.target_dir, root / "draft", "tiny random pair (runs/tiny-pair)"


def load_prompt(args: argparse.Namespace) -> str:
    if args.prompt:
        return args.prompt
    if HELD_OUT_PROMPTS.is_file():
        lines = [json.loads(line) for line in HELD_OUT_PROMPTS.read_text().splitlines() if line.strip()]
        if lines:
            record = lines[args.prompt_index % len(lines)]
            return record.get("prompt") or record.get("text")
    return FALLBACK_PROMPT


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from edgespec.cloud.app import init_ray, serve_verifier
    from edgespec.cloud.config import DeploymentOptions, VerifierConfig
    from edgespec.edge.client import EdgeClient

    target, draft, origin = resolve_pair(args)
    prompt = load_prompt(args)
    print(f"[1/4] models: {origin}\n      target {target}\n      draft  {draft}")
    print("[2/4] starting Ray and Serve (target on CPU, 1 thread) ...", flush=True)
    started = time.perf_counter()
    init_ray(num_cpus=2)
    config = VerifierConfig(model=str(target), device="cpu", torch_threads=1, max_new_tokens=4096)
    serve_verifier(config, DeploymentOptions(num_cpus=1), grpc_port=args.grpc_port, timeout_s=600, progress=lambda m: print("      " + m, flush=True))
    print(f"      serving on 127.0.0.1:{args.grpc_port} after {time.perf_counter() - started:.0f}s")
    try:
        with EdgeClient(f"127.0.0.1:{args.grpc_port}", draft, draft_threads=1) as client:
            figures = demo_session(client, prompt, args)
    finally:
        from ray import serve

        serve.shutdown()
    if args.json:
        print(json.dumps(figures))
    return 0


def demo_session(client, prompt: str, args: argparse.Namespace) -> dict:
    params = dict(max_new_tokens=args.max_new_tokens, k=args.k)
    client.generate(prompt, max_new_tokens=8)  # warm-up: first-call costs stay out of the timings
    client.generate_cloud(prompt, max_new_tokens=8)
    print(f"[3/4] speculative completion (k={args.k}) of a held-out prompt:\n")
    sys.stdout.write(prompt)
    stream = client.stream(prompt, **params)
    for piece in stream:
        sys.stdout.write(piece)
        sys.stdout.flush()
    first = stream.result
    print("\n")
    print(f"[4/4] timing {args.repeats} alternating runs of speculative vs cloud-only (Generate) ...", flush=True)
    spec_ms, cloud_ms, spec_runs = [first.stats.ms_per_token], [], [first]
    for i in range(args.repeats):
        cloud = client.generate_cloud(prompt, max_new_tokens=args.max_new_tokens)
        cloud_ms.append(cloud.stats.ms_per_token)
        if cloud.token_ids != first.token_ids[: len(cloud.token_ids)]:
            print("      WARNING: cloud-only output differs from speculative output", file=sys.stderr)
        if i + 1 < args.repeats:
            spec = client.generate(prompt, **params)
            spec_runs.append(spec)
            spec_ms.append(spec.stats.ms_per_token)
    stats = first.stats
    speedup = statistics.median(cloud_ms) / statistics.median(spec_ms)
    figures = {
        "tokens": stats.generated,
        "acceptance_rate": round(stats.acceptance_rate, 4),
        "mean_acceptance_length": round(stats.mean_acceptance_length, 3),
        "acceptance_by_position": [round(x, 3) for x in stats.acceptance_by_position],
        "target_calls_per_token": round(stats.target_calls_per_token, 4),
        "speculative_ms_per_token": round(statistics.median(spec_ms), 2),
        "cloud_only_ms_per_token": round(statistics.median(cloud_ms), 2),
        "speedup": round(speedup, 3),
        "draft_ms_per_token": round(stats.draft_ms_per_token, 3),
        "bytes_per_round": round(stats.bytes_per_round, 1),
        "identical_to_cloud_only": cloud.token_ids == first.token_ids,
    }
    print(f"      acceptance rate          {stats.acceptance_rate:.1%}")
    print(f"      mean acceptance length   {stats.mean_acceptance_length:.2f} tokens/round (k={args.k}, bonus included)")
    print(f"      acceptance by position   {' '.join(f'{x:.2f}' for x in stats.acceptance_by_position)}")
    print(f"      target calls per token   {stats.target_calls_per_token:.3f} (cloud-only: 1.000)")
    print(f"      ms per token             {figures['speculative_ms_per_token']:.1f} speculative vs {figures['cloud_only_ms_per_token']:.1f} cloud-only (medians)")
    print(f"      speedup                  {speedup:.2f}x over cloud-only generation on the same gRPC path")
    print(f"      output identical to cloud-only greedy: {figures['identical_to_cloud_only']}")
    return figures
