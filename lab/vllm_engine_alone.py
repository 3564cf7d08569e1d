"""The vLLM backend's engine alone, no Serve: its plain greedy decode and its greedy rounds on one
prompt, in ms, and whether the rounds reproduce the plain decode token for token.

    .venv/bin/python lab/vllm_engine_alone.py [--target DIR] [--tokens 48] [--k 4] [--tensor-parallel-size 1]

A round's drafts follow the engine's own greedy text, every other round with a wrong last draft.
With --tensor-parallel-size 2 on the CPU it rehearses a split target (two worker processes).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

from edgespec.cloud.serving.accept import Row
from edgespec.cloud.serving.config import VerifierConfig
from edgespec.edge.params import Mode, SamplingParams
from edgespec.edge.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[1]
PROMPT = "<|im_start|>user\nWrite a haiku about rivers.<|im_end|>\n<|im_start|>assistant\n"


async def run(args: argparse.Namespace) -> None:
    from edgespec.cloud.serving.vllm_backend import VllmBackend

    started = time.perf_counter()
    backend = VllmBackend(VerifierConfig(model=str(args.target), backend="vllm", device="cpu", max_context=1024,
                                         tensor_parallel_size=args.tensor_parallel_size, max_kv_bytes=256 << 20))
    print(f"engine up in {time.perf_counter() - started:.0f}s: {backend.info.description}")
    ids = load_tokenizer(args.target).encode(PROMPT).ids
    plain: list[int] = []
    started = time.perf_counter()
    async for step in backend.decode(1, ids, SamplingParams(), args.tokens, frozenset()):
        plain += step
    print(f"plain greedy: {(time.perf_counter() - started) * 1000 / args.tokens:.1f} ms/token over {args.tokens} tokens")
    await backend.open(2, ids[:-1])
    committed, times = list(ids), []
    while len(committed) - len(ids) < args.tokens:
        done = len(committed) - len(ids)
        drafts = plain[done : done + args.k]
        if len(times) % 2:
            drafts = drafts[:-1] + [(drafts[-1] + 1) % backend.info.vocab_size] if drafts else drafts
        row = Row(key=2, cache_len=len(committed) - 1, tokens=[committed[-1], *drafts], mode=Mode.GREEDY,
                  sampling=SamplingParams(), round_no=len(times))
        started = time.perf_counter()
        outcome = await backend.verify(row, committed[:-1])
        times.append((time.perf_counter() - started) * 1000)
        committed += drafts[: outcome.accepted] + [outcome.next_token]
    same = committed[len(ids) : len(ids) + args.tokens] == plain
    print(f"rounds (k={args.k}): {len(times)}, median {statistics.median(times):.1f} ms a round; "
          f"the rounds reproduce the plain decode: {same}")
    backend.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, default=REPO / "models" / "smollm2-135m" / "target")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
