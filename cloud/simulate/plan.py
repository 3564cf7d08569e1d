"""A capacity plan: how many verifier replicas a fleet needs for a per-session goal, speculative
vs cloud-only, and the autoscaling policy that keeps it there.

Method (why it is fast at 10,000 devices): sessions are sticky to a replica and spread evenly
over replicas (Serve routes a new stream to a replica with room), and replicas share nothing,
so a fleet of R replicas is R copies of one replica carrying its share. The plan therefore
simulates **one representative replica** with m concurrent sessions drawn from the link mix
(``FleetConfig``: largest-remainder split of the mix, shuffled by seed), in steady state (every
session generates for ``duration_s`` of simulated time, the discrete-event model of
``engine.py`` with the batch curve, the ingress queue and the scheduler's gather), and finds
the largest m whose per-session ms/token (mean over the sessions, or p90) meets the goal:
``sessions_per_replica``. Then ``replicas = ceil(concurrent sessions / sessions_per_replica)``.
The device count enters only in that division, so the plan costs the same for 100 or 10^6
devices: about ten one-replica simulations per path, a second or two.

The search is a bisection over m in [1, max_sessions]: it assumes per-session time does not
fall when sessions are added to a replica (more rows per forward, a longer ingress queue),
which holds for this model; the probes are kept in the plan so it can be checked. Without a
goal, a replica carries ``max_sessions`` and the plan reports the ms/token that gives.

Autoscaling (Serve's ``autoscaling_config``; one Session stream or Generate call is one
ongoing request): ``target_ongoing_requests`` = sessions_per_replica, the load at which the goal
still holds; ``max_replicas`` = the replicas for every device generating at once;
``max_sessions`` (each replica's admission limit) such that the server's own derivation
(``cloud.serving.config.target_ongoing_requests``: three quarters of max_sessions, at most
max_batch_size) gives that target, leaving room for sessions that arrive while a replica starts.

Modelling limits (say them with every plan): sessions are long-lived (one prefill each, at the
start); the devices' acceptance, drafting time and the per-message ingress cost come from the
calibration, the target's step from the batch curve; a replica is one model instance (tensor
parallel counts as one replica with its own step time).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from edgespec.cloud.serving.config import target_ongoing_requests
from edgespec.cloud.simulate.calibration import Calibration, VerifyModel
from edgespec.cloud.simulate.config import FleetConfig, _normalise_mix
from edgespec.cloud.simulate.engine import CLOUD_ONLY, PATHS, SPECULATIVE, simulate_path

GOAL_STATS = ("mean", "p90")


def batch_curve(step_ms: float, per_row_ms: float = 0.0, per_token_ms: float = 0.0) -> VerifyModel:
    """The target's forward as fixed + per-row + per-row-token cost, from its batch-1 decode step.

    ``step_ms``: one row of one token (a plain decode step at batch 1); ``per_row_ms``: what
    each further row adds; ``per_token_ms``: what each further token of a row adds (verifying
    k drafts is a row of k + 1 tokens). ``VerifyModel``'s linear form, a + b + c = step_ms.
    """
    fixed = step_ms - per_row_ms - per_token_ms
    if fixed < 0:
        raise ValueError(f"target_step_ms ({step_ms}) must be >= per_row_ms + per_token_ms ({per_row_ms + per_token_ms})")
    return VerifyModel(a_ms=fixed, b_ms=per_row_ms, c_ms=per_token_ms)


@dataclass(frozen=True)
class PlanConfig:
    """One planning question.

    Attributes:
        devices: devices in the fleet, each one session when it generates.
        link_mix: "wifi:0.5,5g:0.3,4g:0.2" (as ``FleetConfig.link_mix``).
        concurrency: the fraction of devices generating at the same moment (1: all at once).
        goal_ms_per_token: the per-session goal; None: replicas carry max_sessions each.
        goal_stat: "mean" or "p90" over the sessions of a replica.
        max_sessions: most sessions one replica may admit (the server's max_sessions).
        max_batch_size: most rows in one forward (the server's max_batch_size).
        k: drafts per round, or "auto".
        duration_s: simulated steady-state time per probe.
        seed: every random draw derives from it (same seed, same plan).
    """

    devices: int
    link_mix: Any = "wifi:0.5,5g:0.3,4g:0.2"
    concurrency: float = 1.0
    goal_ms_per_token: float | None = None
    goal_stat: str = "mean"
    max_sessions: int = 256
    max_batch_size: int = 256
    batch_wait_ms: float = 5.0
    k: int | str = 4
    duration_s: float = 10.0
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "link_mix", _normalise_mix(self.link_mix))
        for name in ("devices", "max_sessions", "max_batch_size"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if not 0 < self.concurrency <= 1:
            raise ValueError(f"concurrency must be in (0, 1], got {self.concurrency}")
        if self.goal_ms_per_token is not None and not self.goal_ms_per_token > 0:
            raise ValueError(f"goal_ms_per_token must be > 0, got {self.goal_ms_per_token}")
        if self.goal_stat not in GOAL_STATS:
            raise ValueError(f"goal_stat must be one of {GOAL_STATS}, got {self.goal_stat!r}")
        if not self.duration_s > 0:
            raise ValueError(f"duration_s must be > 0, got {self.duration_s}")

    @property
    def concurrent_sessions(self) -> int:
        return max(1, math.ceil(self.devices * self.concurrency - 1e-9))


@dataclass
class PathPlan:
    """One path's answer: sessions per replica, replicas, and what a session gets."""

    path: str
    sessions_per_replica: int  # 0: the goal cannot be met even by a replica with one session
    replicas: int | None  # None when the goal cannot be met
    ms_per_token: float  # the goal statistic at sessions_per_replica (at 1 session when unmet)
    mean_ms_per_token: float
    p90_ms_per_token: float
    replica_tokens_per_s: float
    mean_batch_size: float
    probes: list[tuple[int, float]] = field(default_factory=list)  # (sessions, goal statistic) tried

    @property
    def meets_goal(self) -> bool:
        return self.replicas is not None


@dataclass
class CapacityPlan:
    config: PlanConfig
    calibration_source: str
    speculative: PathPlan
    cloud_only: PathPlan
    calibration_verify: VerifyModel | None = None  # the batch curve the plan assumed

    @property
    def replica_ratio(self) -> float | None:
        """Cloud-only replicas over speculative replicas (> 1: speculation saves replicas)."""
        if not (self.speculative.meets_goal and self.cloud_only.meets_goal):
            return None
        return self.cloud_only.replicas / self.speculative.replicas

    def autoscaling(self, path: str = SPECULATIVE) -> dict[str, Any] | None:
        """Serve's autoscaling_config and the max_sessions that keep ``path`` at its plan."""
        chosen = self.speculative if path == SPECULATIVE else self.cloud_only
        if not chosen.meets_goal:
            return None
        target = chosen.sessions_per_replica
        max_sessions = math.ceil(target / 0.75)
        while target_ongoing_requests(max_sessions, self.config.max_batch_size) > target:
            max_sessions -= 1
        while target_ongoing_requests(max_sessions, self.config.max_batch_size) < target and max_sessions < 4 * target:
            max_sessions += 1
        return {
            "max_sessions": max_sessions,
            "autoscaling_config": {"min_replicas": 1, "max_replicas": chosen.replicas,
                                   "target_ongoing_requests": float(target)},
        }

    def to_dict(self) -> dict[str, Any]:
        config = asdict(self.config) | {"link_mix": {p.name: w for p, w in self.config.link_mix},
                                        "concurrent_sessions": self.config.concurrent_sessions}
        return {
            "config": config,
            "calibration_source": self.calibration_source,
            "batch_curve": self.calibration_verify.to_dict() if self.calibration_verify else None,
            "speculative": asdict(self.speculative),
            "cloud_only": asdict(self.cloud_only),
            "replica_ratio_cloud_over_speculative": self.replica_ratio,
            "autoscaling": {SPECULATIVE: self.autoscaling(SPECULATIVE), CLOUD_ONLY: self.autoscaling(CLOUD_ONLY)},
        }

    def table(self) -> str:
        cfg = self.config
        mix = ", ".join(f"{p.name} {w:.0%}" for p, w in cfg.link_mix)
        goal = f"{cfg.goal_stat} <= {cfg.goal_ms_per_token:g} ms/token" if cfg.goal_ms_per_token else "none (max_sessions per replica)"
        lines = [
            f"capacity plan: {cfg.devices} devices [{mix}], {cfg.concurrent_sessions} generating at once, goal {goal}, "
            f"k={cfg.k}, seed {cfg.seed}",
            f"calibration: {self.calibration_source}",
            f"{'':<28}{'speculative':>14}{'cloud-only':>14}",
        ]
        rows = [
            ("sessions per replica", lambda p: f"{p.sessions_per_replica}"),
            ("replicas", lambda p: f"{p.replicas}" if p.meets_goal else "unreachable"),
            (f"ms/token ({cfg.goal_stat})", lambda p: f"{p.ms_per_token:.1f}"),
            ("ms/token mean / p90", lambda p: f"{p.mean_ms_per_token:.1f} / {p.p90_ms_per_token:.1f}"),
            ("tokens/s per replica", lambda p: f"{p.replica_tokens_per_s:.0f}"),
            ("rows per forward", lambda p: f"{p.mean_batch_size:.1f}"),
        ]
        for label, fmt in rows:
            lines.append(f"{label:<28}{fmt(self.speculative):>14}{fmt(self.cloud_only):>14}")
        ratio = self.replica_ratio
        lines.append(f"cloud-only / speculative replicas: {ratio:.2f}x" if ratio else "cloud-only / speculative replicas: n/a")
        verify = self.calibration_verify
        if verify is not None:
            lines.append(f"assumed: forward = {verify.a_ms:g} + {verify.b_ms:g} x rows + {verify.c_ms:g} x rows x tokens ms, "
                         f"one replica simulated in steady state ({cfg.duration_s:g} s) and scaled (edgespec.cloud.simulate.plan)")
        policy = self.autoscaling(SPECULATIVE)
        if policy:
            scaling = policy["autoscaling_config"]
            lines.append(f"autoscaling (speculative): max_sessions {policy['max_sessions']}, target_ongoing_requests "
                         f"{scaling['target_ongoing_requests']:g}, min_replicas 1, max_replicas {scaling['max_replicas']}")
        return "\n".join(lines)


def _probe(config: PlanConfig, calibration: Calibration, path: str, sessions: int):
    fleet = FleetConfig(
        devices=sessions, link_mix=config.link_mix, replicas=1, k=config.k, duration_s=config.duration_s,
        max_batch_size=config.max_batch_size, batch_wait_ms=config.batch_wait_ms, seed=config.seed,
    )
    return simulate_path(fleet, calibration, path)


def _statistic(result, stat: str) -> float:
    return result.mean_ms_per_token if stat == "mean" else result.p90_ms_per_token


def plan_path(config: PlanConfig, calibration: Calibration, path: str) -> PathPlan:
    """Sessions per replica and replicas for one path (module docstring: the method)."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    results, probes = {}, []

    def probe(m: int) -> float:
        if m not in results:
            results[m] = _probe(config, calibration, path, m)
            probes.append((m, _statistic(results[m], config.goal_stat)))
        return _statistic(results[m], config.goal_stat)

    goal = config.goal_ms_per_token
    if goal is None:
        best = config.max_sessions
        probe(best)
    elif probe(1) > goal:
        best = 0
    elif probe(config.max_sessions) <= goal:
        best = config.max_sessions
    else:
        low, high = 1, config.max_sessions  # probe(low) meets the goal, probe(high) does not
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if probe(middle) <= goal else (low, middle)
        best = low
    shown = results[max(best, 1)]
    replicas = math.ceil(config.concurrent_sessions / best) if best else None
    return PathPlan(
        path=path, sessions_per_replica=best, replicas=replicas, ms_per_token=_statistic(shown, config.goal_stat),
        mean_ms_per_token=shown.mean_ms_per_token, p90_ms_per_token=shown.p90_ms_per_token,
        replica_tokens_per_s=shown.capacity_tokens_per_s, mean_batch_size=shown.mean_batch_size,
        probes=sorted(probes),
    )


def plan(config: PlanConfig, calibration: Calibration | None = None) -> CapacityPlan:
    calibration = calibration or Calibration.default()
    return CapacityPlan(config, calibration.source, plan_path(config, calibration, SPECULATIVE),
                        plan_path(config, calibration, CLOUD_ONLY), calibration.verify)
