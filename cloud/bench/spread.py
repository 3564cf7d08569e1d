"""``edgespec bench spread``: where sessions land with several replicas, and how they batch.

Starts Serve with ``replicas`` verifier replicas on this machine (or measures ``--server``),
runs ``sessions`` devices at once (``fleet.Fleet``: one channel each, generations back to
back) for ``generations`` generations each, and reports per replica: the sessions it held
(``Opened.replica_id``), the verify batch sizes its verdicts reported, and ms/token. Every
output is checked against the same prompt's output from the first generation of it (greedy is
deterministic), so a wrong spread cannot pass for a fast one.
"""

from __future__ import annotations

import collections
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from edgespec.cloud.bench.fleet import Fleet
from edgespec.cloud.bench.harness import Harness


@dataclass(frozen=True)
class SpreadConfig:
    target: Path
    draft: Path
    prompts: list[str]
    replicas: int = 2
    sessions: int = 16
    generations: int = 3  # per device
    max_new_tokens: int = 96
    k: str = "4"
    server: str | None = None

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.sessions < 1 or self.generations < 1:
            raise ValueError("replicas, sessions and generations must be >= 1")


def run_spread(config: SpreadConfig, progress: Callable[[str], None] = print) -> dict:
    k = config.k if config.k == "auto" else int(config.k)
    with Harness(config.target, config.draft, server=config.server, progress=progress,
                 max_sessions=config.sessions + 8, replicas=config.replicas) as harness:
        harness.warm_up(config.prompts[0])
        prompts = [harness.client.encode(p) for p in config.prompts]
        started = time.monotonic()
        with Fleet(harness.server, config.draft, prompts, max_new_tokens=config.max_new_tokens, k=k,
                   stop_token_ids=()) as fleet:
            fleet.resize(config.sessions)
            target = config.sessions * config.generations
            while len(fleet.results) < target and not fleet.errors:
                time.sleep(0.2)
            fleet.stop()
        wall_s = time.monotonic() - started
    if fleet.errors:
        device, error = fleet.errors[0]
        raise RuntimeError(f"device {device} failed: {error!r}")
    return summarise(fleet.results, config, wall_s)


def summarise(results, config: SpreadConfig, wall_s: float) -> dict:
    first_output: dict[int, list[int]] = {}
    mismatches = 0
    by_replica: dict[str, dict] = collections.defaultdict(lambda: {"sessions": 0, "batch_sizes": [], "tokens": 0, "wall_s": 0.0})
    for item in results:
        expected = first_output.setdefault(item.prompt, item.result.token_ids)
        mismatches += item.result.token_ids != expected
        stats = item.result.stats
        replica = stats.replica_ids[0] if stats.replica_ids else "?"
        row = by_replica[replica]
        row["sessions"] += 1
        row["batch_sizes"].extend(stats.server_batch_sizes)
        row["tokens"] += stats.generated
        row["wall_s"] += stats.wall_s
    replicas = {}
    for name, row in sorted(by_replica.items()):
        sizes = row["batch_sizes"]
        replicas[name] = {
            "sessions": row["sessions"],
            "batch_size_mean": statistics.mean(sizes) if sizes else 0.0,
            "batch_size_max": max(sizes, default=0),
            "ms_per_token": 1000 * row["wall_s"] / row["tokens"] if row["tokens"] else 0.0,
        }
    counts = [r["sessions"] for r in replicas.values()]
    return {
        "config": {"replicas": config.replicas, "sessions": config.sessions, "generations": config.generations,
                   "max_new_tokens": config.max_new_tokens, "k": config.k},
        "replicas": replicas,
        "imbalance": max(counts) / min(counts) if counts and min(counts) else float("inf"),
        "outputs_consistent": mismatches == 0,
        "generations": len(results),
        "wall_s": wall_s,
    }


def write_spread(report: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "spread.json"
    path.write_text(json.dumps(report, indent=2))
    return path


def summary_lines(report: dict) -> list[str]:
    lines = [f"{name}: {row['sessions']} sessions, verify batch mean {row['batch_size_mean']:.1f} "
             f"(max {row['batch_size_max']}), {row['ms_per_token']:.1f} ms/token" for name, row in report["replicas"].items()]
    lines.append(f"imbalance (most / fewest sessions): {report['imbalance']:.2f}; "
                 f"outputs consistent: {report['outputs_consistent']}")
    return lines
