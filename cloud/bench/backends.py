"""``edgespec bench backends``: the verifier's two engines on the same prompts, in one run.

Each backend in turn gets a Serve of its own on this machine (started, measured, stopped):

1. every prompt cloud-only (``Generate``) and speculative (k as given, auto by default), the arms
   alternating prompt by prompt; greedy, so the speculative output must equal the cloud-only one
   on the same backend (``identical``), and the two backends' outputs are compared too;
2. ``sessions`` concurrent speculative devices, each on its own client: verified tokens/s of the
   replica, and each output against the same prompt's output alone.

Printed per backend: cloud-only and speculative ms/token, the speedup, tau and mean k, the round's
breakdown (device drafting, send -> verdict, the replica's verify), and the concurrent tokens/s;
then vllm / transformers ratios. Ratios inside one run are the figures to compare (the machine is
shared); the engines start one after the other, each with the same thread count.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from edgespec.cloud.bench.harness import BACKEND_ENV, Harness, Summary
from edgespec.edge.client import EdgeClient
from edgespec.edge.types import Result


@dataclass(frozen=True)
class BackendsConfig:
    target: Path
    draft: Path
    prompts: list[str]
    backends: tuple[str, ...] = ("transformers", "vllm")
    k: int | str = "auto"
    max_new_tokens: int = 64
    sessions: int = 16


def run_backends(config: BackendsConfig, out: Path, progress: Callable[[str], None] = print) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    rows, outputs = [], {}
    for index, backend in enumerate(config.backends):
        progress(f"[{index + 1}/{len(config.backends)}] backend {backend}")
        os.environ[BACKEND_ENV] = backend
        with Harness(config.target, config.draft, progress=progress, max_sessions=config.sessions + 8) as harness:
            row, outputs[backend] = _measure(harness, config, progress)
        rows.append({"backend": backend, **row})
    report = {"config": {"target": str(config.target), "draft": str(config.draft), "prompts": len(config.prompts),
                         "k": config.k, "max_new_tokens": config.max_new_tokens, "sessions": config.sessions},
              "rows": rows, "same_text_across_backends": _agreement(outputs)}
    (out / "backends.json").write_text(json.dumps(report, indent=2))
    (out / "backends.md").write_text(markdown(report))
    return report


def _measure(harness: Harness, config: BackendsConfig, progress: Callable[[str], None]) -> tuple[dict, list[list[int]]]:
    harness.warm_up(config.prompts[0])
    params = dict(max_new_tokens=config.max_new_tokens, k=config.k)
    spec, cloud = harness.compare(config.prompts, params, label="speculative vs cloud-only")
    identical = sum(s.token_ids == c.token_ids for s, c in zip(spec, cloud))
    speculative, cloud_only = Summary.of(spec), Summary.of(cloud)
    rounds = [r for result in spec for r in result.rounds]
    progress(f"  {config.sessions} concurrent speculative devices")
    concurrent = _concurrent(harness, config, [s.token_ids for s in spec])
    row = {
        "cloud_only_ms_per_token": cloud_only.ms_per_token,
        "speculative_ms_per_token": speculative.ms_per_token,
        "speedup": cloud_only.ms_per_token / speculative.ms_per_token if speculative.ms_per_token else 0.0,
        "tau": speculative.tau,
        "mean_k": speculative.mean_k,
        "identical": f"{identical}/{len(spec)}",
        "streamed_share": sum(s.stats.cloud_only_tokens for s in spec) / max(1, sum(s.stats.generated for s in spec)),
        "round_draft_ms": _median(r.draft_ms for r in rounds),
        "round_wait_ms": _median(r.wait_ms for r in rounds),
        "round_verify_ms": _median(r.verify_ms for r in rounds),
        "replica_decode_ms": harness.client.info(refresh=True).decode_ms,
        **concurrent,
    }
    return row, [c.token_ids for c in cloud]


def _concurrent(harness: Harness, config: BackendsConfig, alone: list[list[int]]) -> dict:
    """``sessions`` devices at once, each its own client on prompt i mod len(prompts)."""
    results: dict[int, Result] = {}
    errors: list[BaseException] = []

    def device(i: int) -> None:
        try:
            with EdgeClient(harness.address, harness.draft, timeout=300) as client:
                results[i] = client.generate(harness_prompt(i), max_new_tokens=config.max_new_tokens, k=config.k)
        except BaseException as exc:  # reported below, with the count
            errors.append(exc)

    def harness_prompt(i: int) -> str:
        return config.prompts[i % len(config.prompts)]

    threads = [threading.Thread(target=device, args=(i,)) for i in range(config.sessions)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    tokens = sum(r.stats.generated for r in results.values())
    same = sum(results[i].token_ids == alone[i % len(alone)] for i in results)
    return {"concurrent_tokens_per_s": tokens / wall if wall else 0.0, "concurrent_identical": f"{same}/{config.sessions}",
            "concurrent_errors": [repr(e) for e in errors]}


def _agreement(outputs: dict[str, list[list[int]]]) -> str:
    names = list(outputs)
    if len(names) < 2:
        return "n/a"
    first, second = outputs[names[0]], outputs[names[1]]
    return f"{sum(a == b for a, b in zip(first, second))}/{len(first)}"


def _median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else 0.0


def markdown(report: dict) -> str:
    rows = report["rows"]
    columns = ["backend", "cloud_only_ms_per_token", "speculative_ms_per_token", "speedup", "tau", "mean_k", "identical",
               "streamed_share", "round_draft_ms", "round_wait_ms", "round_verify_ms", "replica_decode_ms",
               "concurrent_tokens_per_s", "concurrent_identical"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row[c]) for c in columns) + " |")
    by_name = {row["backend"]: row for row in rows}
    if {"vllm", "transformers"} <= set(by_name):
        v, t = by_name["vllm"], by_name["transformers"]
        lines += ["", f"vllm / transformers: cloud-only ms/token {v['cloud_only_ms_per_token'] / t['cloud_only_ms_per_token']:.2f}, "
                      f"speculative ms/token {v['speculative_ms_per_token'] / t['speculative_ms_per_token']:.2f}, "
                      f"concurrent tokens/s {v['concurrent_tokens_per_s'] / max(t['concurrent_tokens_per_s'], 1e-9):.2f}"]
    lines += ["", f"same greedy text on both backends: {report['same_text_across_backends']} prompts"]
    return "\n".join(lines) + "\n"


def _cell(value) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)
