"""Verifier benchmark through the real Serve gRPC proxy on loopback (prints figures).

    .venv/bin/python scripts/bench_verify.py [--target DIR] [--k 4] [--rounds 200] [--sessions 1,16]

1. per-round latency: one session sends k-token drafts back to back (greedy, raw gRPC, no draft
   model in the loop), median and p90 of send -> verdict;
2. verify throughput: N concurrent sessions doing the same; tokens verified per second
   (k drafts + the pending token per round, summed over sessions) and the batch sizes the
   replica reported, for each N.

Drafts are random tokens, so most are rejected: this measures the server path, not acceptance.
The target defaults to the demo target (models/demo/target), else a tiny random one.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from edgespec.v1 import speculative_pb2 as pb  # noqa: E402
from edgespec.v1 import speculative_pb2_grpc as pb_grpc  # noqa: E402


async def session_loop(address: str, fingerprint: str, vocab: int, k: int, rounds: int, seed: int, out: dict) -> None:
    rng = random.Random(seed)
    async with grpc.aio.insecure_channel(address) as channel:
        call = pb_grpc.SpeculativeStub(channel).Session()
        prompt = [rng.randrange(vocab) for _ in range(32)]
        await call.write(pb.SessionRequest(open=pb.Open(
            prompt_ids=prompt, mode=pb.VERIFY_MODE_GREEDY, tokenizer_fingerprint=fingerprint, max_new_tokens=rounds * (k + 1),
        )))
        opened = await call.read()
        assert opened.HasField("opened"), opened
        for r in range(rounds):
            drafts = [rng.randrange(vocab) for _ in range(k)]
            started = time.perf_counter()
            await call.write(pb.SessionRequest(draft=pb.Draft(round=r, token_ids=drafts)))
            verdict = (await call.read()).verdict
            out["latency_ms"].append((time.perf_counter() - started) * 1000)
            out["batch"].append(verdict.batch_size)
            out["verify_ms"].append(verdict.verify_ms)
            out["verified"] += k + 1
            if verdict.finished:
                break
        await call.write(pb.SessionRequest(close=pb.Close()))
        await call.done_writing()


async def measure(address: str, info, k: int, rounds: int, sessions: int) -> dict:
    out = {"latency_ms": [], "batch": [], "verify_ms": [], "verified": 0}
    started = time.perf_counter()
    await asyncio.gather(*(session_loop(address, info.tokenizer_fingerprint, info.vocab_size, k, rounds, s, out) for s in range(sessions)))
    out["wall_s"] = time.perf_counter() - started
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--sessions", default="1,16")
    parser.add_argument("--batch-wait-ms", type=float, default=5.0)
    parser.add_argument("--inline-engine", action="store_true", help="run the model in the replica process")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    from edgespec.cloud.bench.harness import free_port

    from edgespec.cloud.serving.app import init_ray, serve_verifier
    from edgespec.cloud.serving.config import DeploymentOptions, VerifierConfig

    target = args.target or ROOT / "models" / "demo" / "target"
    if not (target / "config.json").is_file():
        from edgespec.cloud.training.tiny import build_tiny_pair

        target = build_tiny_pair(ROOT / "runs" / "tiny-pair").target_dir
    counts = [int(n) for n in args.sessions.split(",")]
    init_ray(num_cpus=2)
    port = free_port()
    config = VerifierConfig(model=str(target), device="cpu", torch_threads=1, max_sessions=max(counts) + 4,
                            max_batch_size=max(counts), max_new_tokens=100_000,
                            batch_wait_timeout_s=args.batch_wait_ms / 1000, engine_process=not args.inline_engine)
    serve_verifier(config, DeploymentOptions(num_cpus=1), grpc_port=port, http_port=free_port(), timeout_s=300)
    address = f"127.0.0.1:{port}"
    with grpc.insecure_channel(address) as channel:
        info = pb_grpc.SpeculativeStub(channel).Info(pb.InfoRequest(), timeout=30)
    print(f"target {target} ({info.model_id}), k={args.k}, {args.rounds} rounds per session, loopback, 1 torch thread")
    asyncio.run(measure(address, info, args.k, 20, 1))  # warm-up
    base = None
    for n in counts:
        result = asyncio.run(measure(address, info, args.k, args.rounds if n == 1 else max(args.rounds // 4, 20), n))
        lat = sorted(result["latency_ms"])
        p90 = lat[int(0.9 * (len(lat) - 1))]
        throughput = result["verified"] / result["wall_s"]
        base = base or throughput
        print(
            f"sessions={n:3d}  round latency median {statistics.median(lat):6.2f} ms  p90 {p90:6.2f} ms  "
            f"verified {throughput:8.1f} tokens/s  ({throughput / base:.2f}x)  "
            f"batch size mean {statistics.mean(result['batch']):.1f} max {max(result['batch'])}  "
            f"forward+accept median {statistics.median(result['verify_ms']):.2f} ms"
        )
    from ray import serve

    serve.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
