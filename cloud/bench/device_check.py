"""The device check behind ``scripts/device_check.py``: the verifier's engine alone on one GPU,
without Serve, against ``generate()``; the packed step's time; KV memory per session.

For a machine with torch and transformers and nothing else (no Ray, no gRPC, edgespec not
installed): it imports the engine (``edgespec.cloud.serving.engine``), the accept rule and
their own imports, and the models of ``gpu_check``. Per target, the demo target
(``models/demo/target``) and a ~1B-parameter random Llama (``gpu_check.random_llama``):

1. greedy: ``--prompts`` sessions prefilled into the engine's KV pool, then verified together,
   one packed forward per round, each round drafting two of ``generate()``'s next tokens and two
   wrong ones (accept, reject and rollback every round). The committed tokens must equal
   ``generate()``'s, same weights and dtype (bf16 on a GPU) on the same device. A divergence
   where ``generate()``'s own top-two logits are within bf16 resolution (``gpu_check.near_tie``)
   is printed as a tie, not a mismatch: two correct bf16 kernels may round such a pair either way;
2. the packed step: ``--rows`` sessions of ``--context`` tokens each verify their pending token
   and k random drafts in one forward, rolled back after every step (trim, forward, accept:
   what a replica does per batch): median ms per step and verified tokens/s;
3. memory: KV bytes per token (from the config, and from the pool's tensors) and per session.

Exit code 1 on a mismatch, or when the engine did not take the packed path.
"""

from __future__ import annotations

import argparse
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

from edgespec.cloud.bench.gpu_check import NO_CUDA, near_tie, random_llama, references
from edgespec.cloud.serving.accept import Outcome, Row, accept_rows
from edgespec.cloud.serving.config import VerifierConfig
from edgespec.cloud.serving.engine import TargetEngine
from edgespec.edge.params import Mode, SamplingParams

REPO = Path(__file__).resolve().parents[2]
GREEDY = SamplingParams()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="device_check.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu: the same checks, small, anywhere")
    parser.add_argument("--demo-target", type=Path, default=REPO / "models" / "demo" / "target")
    parser.add_argument("--layers", type=int, default=20, help="random Llama: layers (20 x 2048 wide: ~1.0B parameters)")
    parser.add_argument("--hidden", type=int, default=2048, help="random Llama: width")
    parser.add_argument("--skip-random", action="store_true", help="only the demo target")
    parser.add_argument("--prompts", type=int, default=8, help="greedy: sessions verified together")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="greedy: tokens per session")
    parser.add_argument("--rows", default="1,16,64", help="packed step: sessions per forward")
    parser.add_argument("--k", type=int, default=4, help="packed step: drafts per session")
    parser.add_argument("--context", type=int, default=256, help="packed step: tokens cached per session")
    parser.add_argument("--steps", type=int, default=20, help="packed step: timed steps per row count (after 3 warm-up)")
    parser.add_argument("--work", type=Path, default=None, help="where the random model is written (default a temp dir)")
    return parser.parse_args(argv)


def verify(engine: TargetEngine, caches: list, rows: list[Row]) -> list[Outcome]:
    """One verification as the replica's backend runs it: roll every row's cache back to its
    committed length, one packed forward, the accept rule."""
    for row in rows:
        engine.trim(caches[row.key], row.cache_len)
    logits = engine.forward([(caches[row.key], row.tokens) for row in rows])
    return accept_rows(rows, logits, engine.last_logits)


def half_right(reference: list[int], done: int, vocab: int) -> list[int]:
    """Two of the reference's next tokens, then two wrong ones: accept, reject and roll back."""
    return reference[done : done + 2] + [(t + 1) % vocab for t in reference[done + 2 : done + 4]]


def engine_greedy(engine: TargetEngine, prompts: list[list[int]], refs: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """Every session verified together, round by round, until it has its reference's length;
    returns the committed tokens and each session's KV bytes after its prefill."""
    caches = [engine.new_kv() for _ in prompts]
    for kv, prompt in zip(caches, prompts):
        engine.prefill(kv, prompt[:-1])  # the cache holds all but the pending token
    kv_bytes = [kv.nbytes() for kv in caches]
    committed: list[list[int]] = [[] for _ in prompts]
    for round_no in range(max(map(len, refs)) + 1):
        live = [i for i, ref in enumerate(refs) if len(committed[i]) < len(ref)]
        if not live:
            break
        rows = []
        for i in live:
            context = prompts[i] + committed[i]
            drafts = half_right(refs[i], len(committed[i]), engine.vocab_size)
            rows.append(Row(key=i, cache_len=len(context) - 1, tokens=[context[-1]] + drafts, mode=Mode.GREEDY,
                            sampling=GREEDY, round_no=round_no))
        for i, row, outcome in zip(live, rows, verify(engine, caches, rows)):
            committed[i] += row.drafts[: outcome.accepted] + [outcome.next_token]
    for kv in caches:
        engine.release(kv)
    return [c[: len(r)] for c, r in zip(committed, refs)], kv_bytes


def compare(name: str, model, prompts: list[list[int]], refs: list[list[int]], served: list[list[int]], device: str) -> tuple[int, int]:
    """(mismatches, ties) between ``generate()``'s tokens and the engine's."""
    mismatches = ties = 0
    for prompt, ref, got in zip(prompts, refs, served):
        first = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), None)
        if first is None:
            continue
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([prompt + ref[:first]], device=device)).logits[0, -1].float()
        if near_tie(logits, ref[first], got[first]):
            ties += 1
            print(f"  tie {name}: token {first}: generate() {ref[first]}, engine {got[first]}, logits "
                  f"{float(logits[ref[first]]):.4f} vs {float(logits[got[first]]):.4f} (bf16 resolution)")
        else:
            mismatches += 1
            print(f"  MISMATCH {name}: token {first}: generate() {ref[first]}, engine {got[first]}")
    return mismatches, ties


def check_greedy(name: str, path: Path, engine: TargetEngine, args) -> int:
    rng = random.Random(1)
    prompts = [[rng.randrange(1, engine.vocab_size) for _ in range(rng.randrange(8, 200))] for _ in range(args.prompts)]
    model, refs = references(path, prompts, args.max_new_tokens, args.device)
    served, kv_bytes = engine_greedy(engine, prompts, refs)
    mismatches, ties = compare(name, model, prompts, refs, served, args.device)
    del model
    if args.device == "cuda":
        torch.cuda.empty_cache()
    verdict = "OK" if not mismatches else "FAILED"
    print(f"{name}: greedy == generate() {verdict}: {args.prompts} sessions x {args.max_new_tokens} tokens, packed rounds "
          f"of 2 right + 2 wrong drafts, {mismatches} mismatch(es), {ties} bf16 tie(s)", flush=True)
    tokens = [len(p) - 1 for p in prompts]
    per_token = engine.pool.page_bytes() // engine.page_tokens
    print(f"{name}: KV {engine.kv_bytes_per_token()} B/token (config), {per_token} B/token (pool); after prefill "
          f"{statistics.median(kv_bytes) / 2**20:.2f} MiB per session (median of {len(tokens)}, "
          f"{min(tokens)}-{max(tokens)} tokens, whole {engine.page_tokens}-token pages)")
    return mismatches


def step_times(name: str, engine: TargetEngine, args) -> None:
    """The packed step at each row count: sessions at ``--context`` tokens, k random drafts each."""
    rng = random.Random(2)
    vocab = engine.vocab_size
    for count in (int(n) for n in args.rows.split(",")):
        caches = [engine.new_kv() for _ in range(count)]
        for kv in caches:
            engine.prefill(kv, [rng.randrange(1, vocab) for _ in range(args.context)])
        pending = [rng.randrange(1, vocab) for _ in range(count)]
        times = []
        for step in range(3 + args.steps):
            rows = [Row(key=b, cache_len=args.context, tokens=[pending[b]] + [rng.randrange(1, vocab) for _ in range(args.k)],
                        mode=Mode.GREEDY, sampling=GREEDY, round_no=step) for b in range(count)]
            if args.device == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            verify(engine, caches, rows)  # the logits come back to the host: the step has finished on the device
            times.append((time.perf_counter() - started) * 1000.0)
        for kv in caches:
            engine.release(kv)
        median = statistics.median(times[3:])
        print(f"{name}: packed step {count:3d} rows  median {median:8.2f} ms  min {min(times[3:]):8.2f} ms  "
              f"{count * (args.k + 1) / median * 1000:9.0f} verified tokens/s  (k={args.k}, context {args.context}, "
              f"{args.steps} steps)", flush=True)
    for context in (256, 2048):
        pages = -(-context // engine.page_tokens)
        print(f"{name}: KV per session at {context} tokens: {pages * engine.page_tokens * engine.kv_bytes_per_token() / 2**20:.1f} MiB")


def check_target(name: str, path: Path, args) -> int:
    """Loads ``path`` into the engine as a replica would; greedy check, step times, memory."""
    limit = int(transformers.AutoConfig.from_pretrained(str(path)).max_position_embeddings or 2048)
    largest = max(args.prompts, *(int(n) for n in args.rows.split(",")))
    config = VerifierConfig(model=str(path), device=args.device, max_sessions=largest, max_batch_size=largest,
                            max_context=min(2048, limit))
    started = time.perf_counter()
    engine = TargetEngine(config)
    info = engine.describe()
    print(f"{name}: {path}, {engine.params / 1e6:.1f}M params, {info['dtype']} on {info['device']}, batch path "
          f"{engine.path}, loaded and checked in {time.perf_counter() - started:.1f}s", flush=True)
    failures = 0
    if engine.path != "paged":
        failures += 1
        print(f"  FAILED {name}: the engine refused the packed path ({engine.path}): see its warning above")
    failures += check_greedy(name, path, engine, args)
    step_times(name, engine, args)
    del engine
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return failures


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(NO_CUDA.replace("gpu_check", "device_check"), file=sys.stderr)
        return 1
    started = time.perf_counter()
    transformers.utils.logging.disable_progress_bar()
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU"
    print(f"device_check: {where}, Python {platform.python_version()}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}", flush=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="device-check-"))
    failures = 0
    try:
        targets = [("demo", args.demo_target)]
        if not args.skip_random:
            targets.append(("random-llama", random_llama(work / "random-llama", args.demo_target, args.layers, args.hidden, args.device)))
        for name, path in targets:
            failures += check_target(name, path, args)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"device_check: {'FAILED' if failures else 'passed'} in {time.perf_counter() - started:.0f}s")
    return 1 if failures else 0
