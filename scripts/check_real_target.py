"""Checks that a real target is served losslessly: speculative greedy through Ray Serve's gRPC
path == transformers ``generate()``, with several sessions verified in shared batches, on
prompts long enough that prompt + generation passes ``--past`` tokens (e.g. Gemma 3's 512-token
sliding window).

    .venv/bin/python scripts/check_real_target.py --target models/gemma3-270m/target --past 512

The draft is ``--draft`` (an exported ONNX draft on the target's tokenizer) or, by default, a
one-layer random model over the target's tokenizer (``build_tiny_draft_for``): its drafts are
mostly rejected, which is what exercises the rollback paths. Prints one line per prompt and a
verdict; exits 1 on any mismatch. Torch and ONNX Runtime run on one thread each.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SOURCES = ("argparse.py", "textwrap.py", "json/encoder.py", "string.py")


def long_prompts(tokenizer, count: int, length: int) -> list[list[int]]:
    """``count`` prompts of ``length`` tokens cut from standard-library files (plain text, code)."""
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    prompts = []
    for name in SOURCES[:count]:
        ids = tokenizer(stdlib.joinpath(name).read_text(encoding="utf-8"))["input_ids"]
        prompts.append(ids[:length])
    return prompts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, type=Path, help="Hugging Face target directory")
    parser.add_argument("--draft", type=Path, default=None, help="exported ONNX draft (default: a tiny random one)")
    parser.add_argument("--past", type=int, default=512, help="prompt + generation must pass this many tokens")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--sessions", type=int, default=3, help="concurrent sessions (prompts), batched on one replica")
    parser.add_argument("--k", type=int, default=4)
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    from edgespec.cloud.serving.app import init_ray, serve_verifier
    from edgespec.cloud.serving.config import DeploymentOptions, VerifierConfig
    from edgespec.cloud.training.export import export_draft
    from edgespec.cloud.training.tiny import build_tiny_draft_for
    from edgespec.edge.aclient import AsyncEdgeClient

    tokenizer = AutoTokenizer.from_pretrained(str(args.target), local_files_only=True)
    prompt_length = args.past - args.max_new_tokens // 2  # the generation crosses the window half-way
    prompts = long_prompts(tokenizer, args.sessions, prompt_length)
    workdir = Path(tempfile.mkdtemp(prefix="check-real-target-"))
    draft = args.draft
    if draft is None:
        started = time.perf_counter()
        hf = build_tiny_draft_for(args.target, workdir / "draft-hf", max_positions=args.past * 4)
        draft = export_draft(hf, workdir / "draft", parity_steps=4, target_dir=args.target, log=lambda _: None).out_dir
        print(f"tiny random draft exported in {time.perf_counter() - started:.0f} s", flush=True)

    model = AutoModelForCausalLM.from_pretrained(str(args.target), local_files_only=True, dtype=torch.float32).eval()
    references = []
    for ids in prompts:
        started = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids]), max_new_tokens=args.max_new_tokens, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
        references.append(out[0, len(ids):].tolist())
        print(f"generate(): {len(ids)} + {len(references[-1])} tokens in {time.perf_counter() - started:.0f} s", flush=True)
    del model

    init_ray(num_cpus=4)
    port = 9000 + os.getpid() % 500
    config = VerifierConfig(model=str(args.target), device="cpu", max_sessions=args.sessions, max_batch_size=args.sessions,
                            batch_wait_timeout_s=0.05, max_context=args.past * 4, torch_threads=1)
    serve_verifier(config, DeploymentOptions(num_cpus=0.5), grpc_port=port, http_port=port + 500, timeout_s=600)

    async def one(ids):
        async with AsyncEdgeClient(f"127.0.0.1:{port}", draft, timeout=600) as client:
            return await client.generate(ids, max_new_tokens=args.max_new_tokens, k=args.k, speculate=True, stop_token_ids=())

    async def all_at_once():
        return await asyncio.gather(*(one(ids) for ids in prompts))

    try:
        started = time.perf_counter()
        results = asyncio.run(all_at_once())
        seconds = time.perf_counter() - started
    finally:
        from ray import serve

        import ray
        serve.shutdown()
        ray.shutdown()
    failures = 0
    for ids, expected, result in zip(prompts, references, results):
        same = result.token_ids == expected
        failures += not same
        first = next((i for i, (a, b) in enumerate(zip(result.token_ids, expected)) if a != b), None)
        batches = result.stats.server_batch_sizes
        print(f"prompt {len(ids)} tokens -> {len(ids) + len(expected)} (past {args.past}): "
              f"{'equal' if same else f'DIFFERS at {first}'}; tau {result.stats.mean_acceptance_length:.2f}, "
              f"largest verify batch {max(batches) if batches else 0}")
    print(f"{args.sessions} sessions in {seconds:.0f} s: {'OK, greedy == generate()' if not failures else f'{failures} MISMATCHES'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
