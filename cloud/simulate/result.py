"""What a simulation reports: per-path figures, the speculative/cloud-only comparison, a table, JSON.

Terms:

- **ms/token** of a device: (time its last counted token arrived - its session start) /
  tokens it received; with a duration, (duration - start) / tokens received by then. The
  mean, p50 and p90 are taken over devices.
- **speedup**: mean cloud-only ms/token / mean speculative ms/token (> 1: speculation wins).
- **utilisation** of a replica: the fraction of the run its model spent in forwards and
  prefills; **ingress utilisation**: the fraction its ingress (proxy and I/O) was busy.
- **capacity**: tokens delivered to all devices per second of the run.
- **acceptance length**: tokens committed per round, the bonus/recovered token included
  (1 + accepted drafts / rounds, from raw verdicts, before any token budget cuts a round short).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class PathResult:
    """One path (``speculative`` or ``cloud_only``) of one fleet."""

    path: str
    ms_per_token: list[float]  # per device, device order
    device_links: list[str]
    tokens: int
    rounds: int  # speculative rounds, or cloud-only decode steps (one per token)
    drafted: int
    accepted: int
    sim_ms: float
    replica_busy_ms: list[float]
    batch_sizes: dict[int, int]  # batch size -> forwards of that size
    devices_without_tokens: int = 0
    ingress_busy_ms: list[float] = field(default_factory=list)
    gather_wait_ms: float = 0.0  # summed over forwards: the model free with rows queued, waiting for more
    arrivals: list[list[tuple[float, int]]] = field(default_factory=list)  # per device: (ms, tokens so far) at each delivery

    @property
    def mean_ms_per_token(self) -> float:
        return float(np.mean(self.ms_per_token))

    @property
    def p50_ms_per_token(self) -> float:
        return float(np.percentile(self.ms_per_token, 50))

    @property
    def p90_ms_per_token(self) -> float:
        return float(np.percentile(self.ms_per_token, 90))

    @property
    def capacity_tokens_per_s(self) -> float:
        return self.tokens / (self.sim_ms / 1000.0) if self.sim_ms > 0 else 0.0

    @property
    def utilisation(self) -> list[float]:
        return [busy / self.sim_ms if self.sim_ms > 0 else 0.0 for busy in self.replica_busy_ms]

    @property
    def mean_utilisation(self) -> float:
        return float(np.mean(self.utilisation))

    @property
    def ingress_utilisation(self) -> list[float]:
        return [busy / self.sim_ms if self.sim_ms > 0 else 0.0 for busy in self.ingress_busy_ms]

    @property
    def forwards(self) -> int:
        return sum(self.batch_sizes.values())

    @property
    def mean_gather_wait_ms(self) -> float:
        """How long a forward waited for more rows once the model was free, averaged over forwards."""
        forwards = self.forwards
        return self.gather_wait_ms / forwards if forwards else 0.0

    @property
    def mean_batch_size(self) -> float:
        """Rows per forward, averaged over forwards."""
        forwards = self.forwards
        return sum(size * n for size, n in self.batch_sizes.items()) / forwards if forwards else 0.0

    @property
    def acceptance_length(self) -> float:
        return 1.0 + self.accepted / self.rounds if self.rounds else 0.0

    @property
    def mean_k(self) -> float:
        return self.drafted / self.rounds if self.rounds else 0.0

    def per_link_ms_per_token(self) -> dict[str, float]:
        by_link: dict[str, list[float]] = {}
        for name, ms in zip(self.device_links, self.ms_per_token):
            by_link.setdefault(name, []).append(ms)
        return {name: float(np.mean(values)) for name, values in by_link.items()}

    def summary(self) -> dict[str, Any]:
        return {
            "mean_ms_per_token": self.mean_ms_per_token,
            "p50_ms_per_token": self.p50_ms_per_token,
            "p90_ms_per_token": self.p90_ms_per_token,
            "per_link_ms_per_token": self.per_link_ms_per_token(),
            "tokens": self.tokens,
            "rounds": self.rounds,
            "acceptance_length": self.acceptance_length,
            "mean_k": self.mean_k,
            "capacity_tokens_per_s": self.capacity_tokens_per_s,
            "replica_utilisation": self.utilisation,
            "ingress_utilisation": self.ingress_utilisation,
            "mean_batch_size": self.mean_batch_size,
            "mean_gather_wait_ms": self.mean_gather_wait_ms,
            "batch_sizes": {str(k): v for k, v in sorted(self.batch_sizes.items())},
            "sim_s": self.sim_ms / 1000.0,
            "devices_without_tokens": self.devices_without_tokens,
        }


@dataclass
class SimResult:
    """A fleet run on both paths (cloud_only is None when the baseline was skipped)."""

    scenario: str
    calibration_source: str
    speculative: PathResult
    cloud_only: PathResult | None = None
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def speedup(self) -> float:
        if self.cloud_only is None:
            return math.nan
        return self.cloud_only.mean_ms_per_token / self.speculative.mean_ms_per_token

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "calibration_source": self.calibration_source,
            "config": self.config,
            "speedup": self.speedup,
            "speculative": self.speculative.summary(),
            "cloud_only": self.cloud_only.summary() if self.cloud_only else None,
            "per_device": {
                "link": self.speculative.device_links,
                "speculative_ms_per_token": self.speculative.ms_per_token,
                "cloud_only_ms_per_token": self.cloud_only.ms_per_token if self.cloud_only else None,
            },
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(finite_json(self.to_dict()), indent=2) + "\n")

    def table(self) -> str:
        paths = [p for p in (self.speculative, self.cloud_only) if p is not None]
        rows = [
            ("ms/token mean", lambda p: f"{p.mean_ms_per_token:.2f}"),
            ("ms/token p50", lambda p: f"{p.p50_ms_per_token:.2f}"),
            ("ms/token p90", lambda p: f"{p.p90_ms_per_token:.2f}"),
            ("tokens", lambda p: f"{p.tokens}"),
            ("rounds / steps", lambda p: f"{p.rounds}"),
            ("acceptance length", lambda p: f"{p.acceptance_length:.2f}" if p.path == "speculative" else "-"),
            ("mean k", lambda p: f"{p.mean_k:.2f}" if p.path == "speculative" else "-"),
            ("capacity tok/s", lambda p: f"{p.capacity_tokens_per_s:.1f}"),
            ("utilisation", lambda p: _fractions(p.utilisation)),
            ("ingress utilisation", lambda p: _fractions(p.ingress_utilisation)),
            ("mean batch", lambda p: f"{p.mean_batch_size:.2f}"),
            ("mean forward wait ms", lambda p: f"{p.mean_gather_wait_ms:.2f}"),
            ("simulated s", lambda p: f"{p.sim_ms / 1000:.2f}"),
        ]
        links = sorted(set(self.speculative.device_links))
        for name in links:
            rows.append((f"ms/token [{name}]", lambda p, name=name: f"{p.per_link_ms_per_token()[name]:.2f}"))
        width = max(len(label) for label, _ in rows)
        header = f"{'':<{width}}  " + "  ".join(f"{p.path:>14}" for p in paths)
        lines = [self.scenario, f"calibration: {self.calibration_source}", header]
        lines += [f"{label:<{width}}  " + "  ".join(f"{fmt(p):>14}" for p in paths) for label, fmt in rows]
        if self.cloud_only is not None:
            lines.append(f"speedup (cloud-only / speculative mean ms/token): {self.speedup:.2f}x")
        busy_without = sum(p.devices_without_tokens for p in paths)
        if busy_without:
            lines.append(f"note: {busy_without} device run(s) received no token before the end (ms/token = inf)")
        return "\n".join(lines)


def _fractions(values: list[float], shown: int = 8) -> str:
    return " ".join(f"{v:.2f}" for v in values[:shown]) + (" ..." if len(values) > shown else "")


def finite_json(value):
    """JSON has no inf/nan: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value

