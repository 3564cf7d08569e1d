"""Verify step time of the engine alone (no Serve): the packed paged path against the padded
batch it replaced, in one process, alternating (prints figures).

    .venv/bin/python scripts/bench_step.py [--target DIR] [--sessions 16] [--contexts 64:2048] [--k 4]
    .venv/bin/python scripts/bench_step.py --target /work/models/smollm2-target --decode 32

1. a batch of --sessions rows, contexts spread evenly over --contexts, k drafts + the pending
   token each: median step time of the packed path and of the padded path (padded.py, what
   every batch ran before), and the bytes each moves for caches per forward: the padded path
   copies every row's cache into the [B, H, Lmax, D] batch cache and DynamicLayer.update
   concatenates the new tokens onto that (a second copy); the packed path writes only the new
   tokens and reads each row's keys by slot (a transient, counted apart);
2. --decode N: batch-1 greedy decoding, ms per token, a DynamicCache (the old batch-1 path)
   against the pool (context --decode-context).

Positions past a model's max_position_embeddings (the demo target's is 512) still time right:
rotary embeddings are computed, not looked up. One torch thread unless --threads.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        started = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def padded_cache_bytes(engine, lengths: list[int], new: int) -> int:
    """Bytes the padded path copies per forward: the stacked batch cache, then its concatenation
    with the new tokens (DynamicLayer.update), keys and values, every layer."""
    per_token = engine.kv_bytes_per_token()
    lmax = max(lengths)
    return len(lengths) * lmax * per_token + len(lengths) * (lmax + new) * per_token


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, default=ROOT / "models" / "demo" / "target")
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--contexts", default="64:2048", help="LOW:HIGH, spread evenly over the sessions")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--decode", type=int, default=0, help="also time batch-1 decoding of this many tokens")
    parser.add_argument("--decode-context", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from edgespec.cloud.serving.config import VerifierConfig
    from edgespec.cloud.serving.engine import SessionKV, TargetEngine
    from edgespec.cloud.serving.padded import forward_padded

    low, high = (int(x) for x in args.contexts.split(":"))
    lengths = [round(low + (high - low) * i / max(args.sessions - 1, 1)) for i in range(args.sessions)]
    # The pool sized for these contexts (past the demo target's max_context of 512).
    TargetEngine._pool_pages = lambda self: (args.sessions + 2) * (high + 64) // 16 + 64
    engine = TargetEngine(VerifierConfig(model=str(args.target), device=args.device, torch_threads=args.threads,
                                         max_sessions=args.sessions + 2, max_kv_bytes=64 << 30))
    print(f"target {args.target.name}: {engine.params / 1e6:.1f}M params, {engine.device}, {engine.dtype}, path {engine.path}, "
          f"{args.threads} thread(s)")
    generator = torch.Generator().manual_seed(0)
    contexts = [torch.randint(1, engine.vocab_size, (n,), generator=generator).tolist() for n in lengths]
    news = [torch.randint(1, engine.vocab_size, (args.k + 1,), generator=generator).tolist() for _ in lengths]
    paged = []
    padded = []
    for context in contexts:
        kv = engine.new_kv()
        engine.prefill(kv, context)
        paged.append(kv)
        old = SessionKV(engine._new_cache())
        with torch.inference_mode():
            for start in range(0, len(context), 256):
                engine._forward_one(old, context[start : start + 256], need_logits=False)
        padded.append(old)

    def step_paged():
        engine.forward(list(zip(paged, news)))
        for kv, length in zip(paged, lengths):
            engine.trim(kv, length)

    def step_padded():
        with torch.inference_mode():
            forward_padded(engine, list(zip(padded, news)), [None] * len(news))
        for kv, length in zip(padded, lengths):
            engine.trim(kv, length)

    new_ms, old_ms = [], []
    for _ in range(3):  # alternate, so a busy neighbour hurts both alike
        new_ms.append(timed(step_paged, args.repeats))
        old_ms.append(timed(step_padded, args.repeats))
    new, old = statistics.median(new_ms), statistics.median(old_ms)
    step = engine.last_step
    written = sum(len(n) for n in news) * engine.kv_bytes_per_token()
    print(f"{args.sessions} sessions, contexts {low}..{high} (mean {statistics.mean(lengths):.0f}), {args.k + 1} new tokens each:")
    print(f"  step  packed {new:8.2f} ms   padded {old:8.2f} ms   packed/padded {new / old:.2f}x")
    print(f"  cache bytes copied per forward: packed 0 (writes {written} B of new tokens; reads {step.gathered_bytes} B by slot, "
          f"transient)   padded {padded_cache_bytes(engine, lengths, args.k + 1)} B")
    if args.decode:
        generator.manual_seed(1)
        prompt = torch.randint(1, engine.vocab_size, (args.decode_context,), generator=generator).tolist()

        def decode(kv, one):
            engine.prefill(kv, prompt[:-1])
            token = prompt[-1]
            started = time.perf_counter()
            for _ in range(args.decode):
                (logits,) = one(kv, token)
                token = int(logits[-1].argmax())
            return (time.perf_counter() - started) * 1000 / args.decode

        def old_one(kv, token):
            with torch.inference_mode():
                return [engine._forward_one(kv, [token])]

        results = {"pool": [], "DynamicCache": []}
        for _ in range(3):
            kv = engine.new_kv()
            results["pool"].append(decode(kv, lambda kv, token: engine.forward([(kv, [token])])))
            engine.release(kv)
            results["DynamicCache"].append(decode(SessionKV(engine._new_cache()), old_one))
        pool, dyn = statistics.median(results["pool"]), statistics.median(results["DynamicCache"])
        print(f"batch-1 decode, context {args.decode_context}, {args.decode} tokens: pool {pool:.2f} ms/token   "
              f"DynamicCache {dyn:.2f} ms/token   ({pool / dyn:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
