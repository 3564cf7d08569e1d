"""Server capacity: many concurrent device sessions against one replica.

For each number of sessions N, N edge clients (each with its own ONNX draft, as N devices would
have) generate at once, speculatively; then N cloud-only Generate calls run at once. Reported:
generated tokens/s over all sessions, per-session ms/token, and the verification batch sizes
the replica reported. The two arms alternate which goes first.

NOTE: on a single machine the N "devices" draft on the same cores as the replica; on real
devices that work is off the server, so these figures understate the speculative arm.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from edgespec.cloud.bench.connection import connection_to
from edgespec.cloud.bench.harness import SPECULATION_ONLY
from edgespec.edge.aclient import AsyncEdgeClient
from edgespec.edge.draft import DraftModel
from edgespec.edge import loop as sdk_loop


@dataclass
class CapacityRow:
    sessions: int
    speculative_tokens_per_s: float
    cloud_only_tokens_per_s: float
    speculative_ms_per_token: float  # per session, mean
    cloud_only_ms_per_token: float
    batch_size_mean: float
    batch_size_max: int
    tau: float

    @property
    def gain(self) -> float:
        return self.speculative_tokens_per_s / self.cloud_only_tokens_per_s if self.cloud_only_tokens_per_s else 0.0


async def _run_arm(server: str, drafts: list[DraftModel], prompts: list[str], params: dict, cloud_only: bool):
    clients = [AsyncEdgeClient(server, draft, timeout=300, **connection_to(server).client_options()) for draft in drafts]
    try:
        for client in clients:
            await client.info()
        started = time.perf_counter()
        if cloud_only:
            cloud_params = {k: v for k, v in params.items() if k not in SPECULATION_ONLY}
            calls = [c.generate_cloud(p, **cloud_params) for c, p in zip(clients, prompts)]
        else:
            calls = [c.generate(p, **params) for c, p in zip(clients, prompts)]
        results = await asyncio.gather(*calls)
        return results, time.perf_counter() - started
    finally:
        for client in clients:
            await client.close()


def measure(server: str, draft_dir: Path, prompts: list[str], sessions: int, params: dict, first_cloud: bool) -> CapacityRow:
    base = DraftModel(draft_dir, threads=1)
    drafts = [base.fork() for _ in range(sessions)]  # one device each: own client, cache and thread
    chosen = [prompts[i % len(prompts)] for i in range(sessions)]

    async def both_arms() -> dict:
        # One event loop for both arms: gRPC's aio poller outlives a loop closed under it.
        return {
            cloud_only: await _run_arm(server, drafts, chosen, params, cloud_only)
            for cloud_only in ((True, False) if first_cloud else (False, True))
        }

    arms = sdk_loop.run(both_arms())
    (spec, spec_wall), (cloud, cloud_wall) = arms[False], arms[True]
    batches = [b for r in spec for b in r.stats.server_batch_sizes] or [0]
    rounds = sum(r.stats.rounds for r in spec)
    return CapacityRow(
        sessions=sessions,
        speculative_tokens_per_s=sum(r.stats.generated for r in spec) / spec_wall,
        cloud_only_tokens_per_s=sum(r.stats.generated for r in cloud) / cloud_wall,
        speculative_ms_per_token=statistics.mean(r.stats.ms_per_token for r in spec),
        cloud_only_ms_per_token=statistics.mean(r.stats.ms_per_token for r in cloud),
        batch_size_mean=statistics.mean(batches),
        batch_size_max=max(batches),
        tau=(sum(r.stats.accepted for r in spec) + rounds) / rounds if rounds else 0.0,
    )


def run_capacity(
    server: str,
    draft_dir: Path,
    prompts: list[str],
    session_counts: list[int],
    params: dict,
    progress: Callable[[str], None] = print,
) -> list[CapacityRow]:
    rows = []
    for i, n in enumerate(session_counts):
        progress(f"  {n} concurrent session(s) ...")
        row = measure(server, draft_dir, prompts, n, params, first_cloud=i % 2 == 1)
        progress(
            f"  {n:3d} sessions: speculative {row.speculative_tokens_per_s:7.1f} tok/s vs cloud-only "
            f"{row.cloud_only_tokens_per_s:7.1f} tok/s = {row.gain:.2f}x; per session "
            f"{row.speculative_ms_per_token:.1f} vs {row.cloud_only_ms_per_token:.1f} ms/token; "
            f"batch mean {row.batch_size_mean:.1f} max {row.batch_size_max}"
        )
        rows.append(row)
    return rows


def write_capacity(rows: list[CapacityRow], out: Path, title: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    data = [asdict(r) | {"gain": r.gain} for r in rows]
    (out / "capacity.json").write_text(json.dumps(data, indent=2))
    lines = [
        f"# Capacity: {title}",
        "",
        "| sessions | speculative tok/s | cloud-only tok/s | gain | ms/token per session (spec / cloud) | verify batch mean / max | tau |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.sessions} | {r.speculative_tokens_per_s:.1f} | {r.cloud_only_tokens_per_s:.1f} | {r.gain:.2f}x | "
            f"{r.speculative_ms_per_token:.1f} / {r.cloud_only_ms_per_token:.1f} | {r.batch_size_mean:.1f} / {r.batch_size_max} | {r.tau:.2f} |"
        )
    (out / "capacity.md").write_text("\n".join(lines) + "\n")
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    n = [r.sessions for r in rows]
    ax.plot(n, [r.speculative_tokens_per_s for r in rows], "o-", label="speculative")
    ax.plot(n, [r.cloud_only_tokens_per_s for r in rows], "s-", label="cloud-only")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent sessions on one replica")
    ax.set_ylabel("generated tokens/s (all sessions)")
    ax.set_title("Capacity")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "capacity.png", dpi=110)
    plt.close(fig)
    return [out / "capacity.json", out / "capacity.md", out / "capacity.png"]
