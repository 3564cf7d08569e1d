"""``edgespec bench eviction``: sessions whose contexts together exceed the vLLM engine's KV space.

The vLLM backend pins nothing per session: a session waiting on its device keeps its blocks only
while the engine has room. This bench opens ``sessions`` greedy sessions of ``context`` tokens
each on one engine (no Serve: the engine's own cost), and runs ``rounds`` rounds of each in
turn, round-robin, as devices that each take a while to come back would. Every round's drafts
are the engine's own greedy tokens with a wrong one at the end, so each round accepts and
rejects. It runs twice: with a KV space that holds every session (``--kv-bytes`` 0: sized for
all of them) and with the small one given, and prints, for each:

- whether every session committed exactly the engine's plain greedy text (and none was refused);
- the share of the rounds' prompt tokens read from the prefix cache (the rest were recomputed);
- ms per round (median and mean) and the recomputed tokens per round.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from edgespec.cloud.serving.accept import Row
from edgespec.cloud.serving.config import VerifierConfig
from edgespec.edge.params import Mode, SamplingParams


@dataclass(frozen=True)
class EvictionConfig:
    target: Path
    prompts: list[list[int]]  # token ids; each session's context is built from one, repeated
    sessions: int = 64
    context: int = 1024
    rounds: int = 3
    k: int = 4
    kv_bytes: int = 256 << 20  # the small KV space


def run_eviction(config: EvictionConfig, out: Path, progress: Callable[[str], None] = print) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    contexts = [(config.prompts[i % len(config.prompts)] * (config.context // max(1, len(config.prompts[i % len(config.prompts)])) + 1))
                [: config.context - i % 7] for i in range(config.sessions)]  # lengths differ a little: not in lockstep
    new_tokens = config.rounds * (config.k + 1)
    ample = _kv_bytes_per_token(config) * (config.sessions * (config.context + new_tokens + config.k + 64))
    rows = []
    truths: list[list[int]] | None = None
    for label, kv_bytes in (("ample", ample), ("small", config.kv_bytes)):
        progress(f"[{label}] KV space {kv_bytes / 2**20:.0f} MiB for {config.sessions} sessions x {config.context} tokens")
        row, truths = asyncio.run(_one_engine(config, contexts, kv_bytes, truths, new_tokens, progress))
        rows.append({"kv_space": label, "kv_bytes": kv_bytes, **row})
    report = {"config": {"target": str(config.target), "sessions": config.sessions, "context": config.context,
                         "rounds": config.rounds, "k": config.k}, "rows": rows}
    (out / "eviction.json").write_text(json.dumps(report, indent=2))
    (out / "eviction.md").write_text(markdown(report))
    return report


def _kv_bytes_per_token(config: EvictionConfig) -> int:
    from edgespec.cloud.serving.vllm_backend import kv_bytes_per_token

    return kv_bytes_per_token(str(config.target), 32)


async def _one_engine(config: EvictionConfig, contexts: list[list[int]], kv_bytes: int, truths: list[list[int]] | None,
                      new_tokens: int, progress: Callable[[str], None]) -> tuple[dict, list[list[int]]]:
    from edgespec.cloud.serving.vllm_backend import VllmBackend

    backend = VllmBackend(VerifierConfig(model=str(config.target), backend="vllm", device="cpu",
                                         max_context=config.context + new_tokens + config.k + 64,
                                         max_sessions=config.sessions, max_kv_bytes=kv_bytes))
    try:
        if truths is None:
            progress("  the engine's plain greedy text of each session (the reference)")
            truths = [await _plain(backend, context, new_tokens) for context in contexts]
        keys = list(range(1, len(contexts) + 1))
        committed = [list(c) for c in contexts]
        for key, context in zip(keys, contexts):
            await backend.open(key, context[:-1])
        times, refused = [], 0
        before_prompt, before_cached = backend.prompt_tokens, backend.cached_tokens
        for round_no in range(config.rounds):
            for i, key in enumerate(keys):
                done = len(committed[i]) - len(contexts[i])
                drafts = truths[i][done : done + config.k - 1] + [0]
                row = Row(key=key, cache_len=len(committed[i]) - 1, tokens=[committed[i][-1], *drafts], mode=Mode.GREEDY,
                          sampling=SamplingParams(), round_no=round_no)
                started = time.perf_counter()
                try:
                    outcome = await backend.verify(row, committed[i][:-1])
                except Exception:  # counted: the backend must never refuse a round for memory
                    refused += 1
                    continue
                times.append((time.perf_counter() - started) * 1000)
                committed[i] += drafts[: outcome.accepted] + [outcome.next_token]
            progress(f"  round {round_no + 1}/{config.rounds}: median {statistics.median(times):.0f} ms a round")
        prompt = backend.prompt_tokens - before_prompt
        cached = backend.cached_tokens - before_cached
        exact = sum(c[len(ctx):] == t[: len(c) - len(ctx)] for c, ctx, t in zip(committed, contexts, truths))
        row = {"exact": f"{exact}/{len(contexts)}", "refused_rounds": refused, "rounds": len(times),
               "cached_share": cached / prompt if prompt else 0.0, "recomputed_tokens_per_round": (prompt - cached) / max(1, len(times)),
               "ms_per_round_median": statistics.median(times) if times else 0.0, "ms_per_round_mean": statistics.fmean(times) if times else 0.0}
        return row, truths
    finally:
        backend.shutdown()


async def _plain(backend, context: list[int], new_tokens: int) -> list[int]:
    tokens: list[int] = []
    async for step in backend.decode(0, context, SamplingParams(), new_tokens, frozenset()):
        tokens += step
    return tokens


def markdown(report: dict) -> str:
    columns = ["kv_space", "kv_bytes", "exact", "refused_rounds", "rounds", "cached_share", "recomputed_tokens_per_round",
               "ms_per_round_median", "ms_per_round_mean"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in report["rows"]:
        lines.append("| " + " | ".join(f"{row[c]:.2f}" if isinstance(row[c], float) else str(row[c]) for c in columns) + " |")
    return "\n".join(lines) + "\n"
