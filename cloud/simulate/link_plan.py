"""A capacity plan in steady state, per link class, at a percentile SLO, for both paths and both
backends' KV policies, naming what binds each row.

Method. One replica (``plan.py``'s argument: replicas share nothing, so a fleet is copies of one)
carries m sessions all on one link class. They open at uniform random times over
``open_spread_ms`` (their prefills at most half the model's time); that, ``settle_s`` and two
of the link's round trips more are left out; over the next ``measure_s`` each
session's ms/token is taken in windows of ``window_s`` (window / tokens delivered in it), and
the SLO holds when the ``percentile`` of those windows, over every session, is at most the
SLO's ms/token. So the prefills of the opens, queued on the model, never count as ms/token.

Per link and SLO, for each path and each KV policy (``memory.py``), the plan finds the most
sessions m a replica carries within the SLO (bisection over m, probes shared by the SLOs), up
to the memory's cap (pinned: the reserved contexts that fit; evictable: the cloud-only streams'
contexts that fit, and for speculation no cap but the expected recompute of evicted contexts in
every forward, by m) and ``max_sessions``. The speculative path drafts as the product does with
k=auto: adaptive k (``edge/planner.py``'s ``decide`` through the simulator) and drafting ahead during the
flight; a link whose speculative floor (one session alone) misses the SLO is routed to
cloud-only, as k=auto's planner streams where speculation is slower. Send-ahead (several blocks
in flight) is not modelled: on far links the plan understates speculation.

What binds (``binding``): the SLO's floor (one session misses it), KV memory (the cap is below
what the SLO allows), the admission limit (``max_sessions``), else whichever of the GPU's and
the ingress CPU's utilisation is the higher where one more session misses the SLO.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

import numpy as np

from edgespec.cloud.link.profiles import get_profile
from edgespec.cloud.simulate.calibration import Calibration, VerifyModel
from edgespec.cloud.simulate.config import FleetConfig
from edgespec.cloud.simulate.engine import CLOUD_ONLY, SPECULATIVE, simulate_path
from edgespec.cloud.simulate.hardware import Deployment, Hardware
from edgespec.cloud.simulate.memory import BACKEND_OF, EVICTABLE, PINNED, POLICIES, KvMemory, Workload, miss_rate, with_recompute
from edgespec.cloud.simulate.result import PathResult
from edgespec.cloud.simulate import roofline

SLO_FLOOR, KV_MEMORY, ADMISSION, GPU_TIME, INGRESS = "SLO floor", "KV memory", "max_sessions", "GPU time", "ingress CPU"


@dataclass(frozen=True)
class SteadyConfig:
    """The plan's question and how it is measured (module docstring)."""

    links: tuple[str, ...] = ("wifi", "5g", "4g")
    slos_ms: tuple[float, ...] = (20.0, 30.0, 50.0)
    percentile: float = 90.0
    open_spread_s: float = 1.5
    settle_s: float = 1.0
    measure_s: float = 5.0
    window_s: float = 1.0
    max_sessions: int = 512
    batch_wait_ms: float = 5.0
    k: int | str = "auto"
    draft_ahead: bool = True
    workload: Workload = field(default_factory=Workload)
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.links or not self.slos_ms:
            raise ValueError("give at least one link and one SLO")
        if any(not s > 0 for s in self.slos_ms):
            raise ValueError(f"SLOs must be > 0 ms/token, got {self.slos_ms}")
        if not 0 < self.percentile <= 100:
            raise ValueError(f"percentile must be in (0, 100], got {self.percentile}")
        if self.open_spread_s < 0 or self.settle_s < 0:
            raise ValueError(f"open_spread_s and settle_s must be >= 0, got {self.open_spread_s}, {self.settle_s}")
        if not (self.measure_s > 0 and 0 < self.window_s <= self.measure_s):
            raise ValueError(f"need measure_s > 0 and 0 < window_s <= measure_s, got {self.measure_s}, {self.window_s}")
        if self.max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {self.max_sessions}")


# ---- pure arithmetic ---------------------------------------------------------------------------

def tokens_by(arrivals: list[tuple[float, int]], time_ms: float) -> int:
    """Tokens a session had received by ``time_ms`` (its deliveries: (ms, tokens so far))."""
    i = bisect.bisect_right([t for t, _ in arrivals], time_ms)
    return arrivals[i - 1][1] if i else 0


def window_ms_per_token(arrivals: list[tuple[float, int]], start_ms: float, end_ms: float, window_ms: float) -> list[float]:
    """ms/token of each whole window of [start_ms, end_ms) (inf where none came): the steady
    state's samples, so whatever came before ``start_ms`` (the opens, their prefills) is not in them."""
    out, begin = [], start_ms
    while begin + window_ms <= end_ms + 1e-9:
        got = tokens_by(arrivals, begin + window_ms) - tokens_by(arrivals, begin)
        out.append(window_ms / got if got else math.inf)
        begin += window_ms
    return out


def open_spread_ms(config: SteadyConfig, sessions: int, prefill_ms: float) -> float:
    """Opens are spread so that their prefills take at most half the model's time, and never
    over less than ``open_spread_s``: a burst of prefills is a start-up transient, not the load."""
    return max(config.open_spread_s * 1000.0, 2.0 * sessions * prefill_ms)


def steady_figures(result: PathResult, config: SteadyConfig, warmup_ms: float) -> tuple[float, float]:
    """(the percentile of windowed ms/token over all sessions, tokens/s delivered) in
    [warmup_ms, warmup_ms + measure_s)."""
    start, end = warmup_ms, warmup_ms + config.measure_s * 1000.0
    samples = [v for a in result.arrivals for v in window_ms_per_token(a, start, end, config.window_s * 1000.0)]
    tokens = sum(tokens_by(a, end) - tokens_by(a, start) for a in result.arrivals)
    finite = [v if math.isfinite(v) else 1e12 for v in samples]
    return float(np.percentile(finite, config.percentile)), tokens / config.measure_s


def binding(meets_floor: bool, sessions: int, cap: int | None, max_sessions: int, gpu_util: float, ingress_util: float) -> str:
    """What stops the replica carrying one more session (module docstring)."""
    if not meets_floor:
        return SLO_FLOOR
    if cap is not None and sessions >= cap:
        return KV_MEMORY
    if sessions >= max_sessions:
        return ADMISSION
    return INGRESS if ingress_util > gpu_util else GPU_TIME


def routed_to_cloud(speculative_floor_ms: float, slo_ms: float) -> bool:
    """k=auto streams a link whose speculation, alone on a replica, misses the SLO."""
    return speculative_floor_ms > slo_ms


def largest_within(measure: Callable[[int], float], slo_ms: float, high: int, low: int = 1, guess: int | None = None) -> int:
    """The most sessions in [1, high] whose figure meets ``slo_ms`` (0: not even one), assuming
    the figure never falls as sessions are added. ``low`` is known to meet it (a tighter SLO's
    answer); ``guess``, where given, is tried first and the bracket grown from it by a quarter
    at a time, so few of the (costly) large probes are run."""
    if low <= 1 and measure(1) > slo_ms:
        return 0
    if guess is not None and low < guess < high:
        if measure(guess) > slo_ms:
            high = guess
        else:
            low = guess
            while low < high:
                step = min(high, math.ceil(low * 1.25))
                if measure(step) > slo_ms:
                    high = step
                    break
                low = step
            if low >= high:
                return high
    elif measure(high) <= slo_ms:
        return high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if measure(middle) <= slo_ms else (low, middle)
    return low


# ---- the plan ----------------------------------------------------------------------------------

@dataclass
class Probe:
    sessions: int
    ms_per_token: float  # the percentile
    tokens_per_s: float
    gpu_util: float
    ingress_util: float
    miss_rate: float = 0.0


@dataclass
class Row:
    """One link x SLO x path x KV policy."""

    link: str
    slo_ms: float
    path: str
    policy: str
    sessions: int
    tokens_per_s_per_gpu: float
    binds: str
    ms_per_token: float  # the percentile at ``sessions``
    routed: bool = False  # speculative, streamed by k=auto
    miss_rate: float = 0.0  # evictable speculation: returns that recompute their context

    @property
    def gpu_s_per_1k_tokens(self) -> float:
        return 1000.0 / self.tokens_per_s_per_gpu if self.tokens_per_s_per_gpu > 0 else math.inf


@dataclass
class LinkPlan:
    deployment: Deployment
    memory: KvMemory
    step_source: str
    config: SteadyConfig
    rows: list[Row]
    floors: dict[tuple[str, str], float]  # (link, path) -> one session's percentile ms/token
    recompute_ms: float

    def row(self, link: str, slo_ms: float, path: str, policy: str) -> Row:
        return next(r for r in self.rows if (r.link, r.slo_ms, r.path, r.policy) == (link, slo_ms, path, policy))

    def to_dict(self) -> dict:
        mem, cfg = self.memory, self.config
        return {
            "deployment": {"model": self.deployment.model.name, "gpu": self.deployment.gpu.name, "tp": self.deployment.tp},
            "step": self.step_source,
            "config": {**asdict(cfg), "workload": asdict(cfg.workload)},
            "kv": {"bytes_per_token": mem.bytes_per_token, "bytes_per_session": mem.bytes_per_session,
                   "pool_bytes_per_gpu": mem.pool_bytes_per_gpu, "pinned_cap": mem.cap(PINNED, True),
                   "evictable_resident": mem.resident, "recompute_ms": self.recompute_ms},
            "floors_ms_per_token": {f"{link}/{path}": v for (link, path), v in self.floors.items()},
            "rows": [asdict(r) | {"gpu_s_per_1k_tokens": r.gpu_s_per_1k_tokens} for r in self.rows],
        }

    def header(self) -> list[str]:
        cfg, mem, d = self.config, self.memory, self.deployment
        gb = 1e9
        floors = ", ".join(f"{link} {self.floors[(link, CLOUD_ONLY)]:.1f} / {self.floors[(link, SPECULATIVE)]:.1f}"
                           for link in cfg.links)
        return [
            f"{d.label}: {d.tp} GPU(s) a replica; step: {self.step_source}; k={cfg.k}"
            f"{' + drafting ahead' if cfg.draft_ahead else ''}; seed {cfg.seed}",
            f"steady state: opens over max({cfg.open_spread_s:g} s, 2 x sessions x prefill), that + {cfg.settle_s:g} s + 2 RTT left out, "
            f"{cfg.measure_s:g} s measured; "
            f"SLO on the p{cfg.percentile:g} of {cfg.window_s:g} s windows of ms/token over every session",
            f"KV: {mem.bytes_per_token:,} B/token, {mem.bytes_per_session / gb:.2f} GB a session at "
            f"{cfg.workload.reserved_tokens} tokens (prompt {cfg.workload.prompt_tokens} + max_new_tokens "
            f"{cfg.workload.max_new_tokens}); pool {mem.pool_bytes_per_gpu / gb:.1f} GB a GPU: pinned (transformers) "
            f"{mem.cap(PINNED, True)} sessions, evictable (vllm) {mem.resident} resident at the mean context "
            f"{cfg.workload.mean_context:g}; an evicted return recomputes in {self.recompute_ms:.1f} ms",
            f"floors, one session alone (p{cfg.percentile:g} ms/token cloud-only / speculative): {floors}",
        ]

    def table(self) -> str:
        lines = self.header()
        lines.append(f"{'link':<7}{'SLO':>5}  {'path':<12}{'KV policy':<22}{'sessions':>9}{'tok/s/GPU':>11}"
                     f"{'GPU-s/1k':>10}{'p' + format(self.config.percentile, 'g'):>7}  binds")
        for r in self.rows:
            policy = f"{r.policy} ({BACKEND_OF[r.policy]})"
            binds = f"SLO floor -> cloud-only ({r.binds})" if r.routed else r.binds
            if r.miss_rate:
                binds += f", {r.miss_rate:.0%} of returns recompute"
            lines.append(f"{r.link:<7}{r.slo_ms:>5g}  {_PATH_NAMES[r.path]:<12}{policy:<22}{r.sessions:>9}"
                         f"{r.tokens_per_s_per_gpu:>11,.0f}{r.gpu_s_per_1k_tokens:>10.3f}{r.ms_per_token:>7.1f}  {binds}")
        return "\n".join(lines)

    def markdown(self) -> str:
        """Per link x SLO: sessions, tokens/s a GPU, GPU-s per 1k tokens and what binds, for
        cloud-only and speculative under each policy, and speculation's gain in tokens a GPU."""
        head = "| link | SLO ms | " + " | ".join(f"{_PATH_NAMES[p]}, {pol}" for p in (CLOUD_ONLY, SPECULATIVE) for pol in POLICIES)
        lines = [head + " | spec/cloud, pinned | spec/cloud, evictable |", "|---" * (2 + 2 * len(POLICIES) + 2) + "|"]
        for link in self.config.links:
            for slo in self.config.slos_ms:
                cells = [self._cell(self.row(link, slo, p, pol)) for p in (CLOUD_ONLY, SPECULATIVE) for pol in POLICIES]
                gains = [_gain(self.row(link, slo, SPECULATIVE, pol), self.row(link, slo, CLOUD_ONLY, pol)) for pol in POLICIES]
                lines.append(f"| {link} | {slo:g} | " + " | ".join(cells + gains) + " |")
        return "\n".join(lines)

    @staticmethod
    def _cell(r: Row) -> str:
        if r.routed:
            return "streams (floor)"
        if not r.sessions:
            return f"0 ({r.binds})"
        return f"{r.sessions}, {r.tokens_per_s_per_gpu:,.0f}, {r.gpu_s_per_1k_tokens:.2f}, {_SHORT.get(r.binds, r.binds)}"


_PATH_NAMES = {CLOUD_ONLY: "cloud-only", SPECULATIVE: "speculative"}
_SHORT = {KV_MEMORY: "KV", GPU_TIME: "GPU", f"{GPU_TIME} (recompute)": "GPU+recompute", INGRESS: "ingress",
          ADMISSION: "max_sessions", SLO_FLOOR: "floor"}


def _gain(speculative: Row, cloud: Row) -> str:
    if speculative.routed or not (speculative.tokens_per_s_per_gpu and cloud.tokens_per_s_per_gpu):
        return "-"
    return f"{speculative.tokens_per_s_per_gpu / cloud.tokens_per_s_per_gpu:.2f}x"


class _Planner:
    """Probes for one deployment, cached by (link, path, sessions, recompute)."""

    def __init__(self, deployment: Deployment, calibration: Calibration, memory: KvMemory, config: SteadyConfig,
                 recompute_ms: float):
        self.deployment, self.cal, self.memory, self.config = deployment, calibration, memory, config
        self.recompute_ms = recompute_ms
        self.cache: dict[tuple, Probe] = {}

    def probe(self, link: str, path: str, sessions: int, evictable: bool = False) -> Probe:
        misses = miss_rate(sessions, self.memory.resident) if evictable and path == SPECULATIVE else 0.0
        key = (link, path, sessions, round(misses, 4))
        if key not in self.cache:
            cfg = self.config
            cal = replace(self.cal, verify=with_recompute(self.cal.verify, misses * self.recompute_ms)) if misses else self.cal
            spread = open_spread_ms(cfg, sessions, cal.prefill_ms)
            warmup = spread + cfg.settle_s * 1000.0 + 2 * get_profile(link).rtt_ms  # and the first round trips
            fleet = FleetConfig(devices=sessions, link_mix=link, k=cfg.k, duration_s=(warmup / 1000.0) + cfg.measure_s,
                                max_batch_size=cfg.max_sessions, batch_wait_ms=cfg.batch_wait_ms, draft_ahead=cfg.draft_ahead,
                                start_spread_ms=spread, seed=cfg.seed)
            result = simulate_path(fleet, cal, path)
            ms, rate = steady_figures(result, cfg, warmup)
            self.cache[key] = Probe(sessions, ms, rate, *self._utilisations(result, cal, path, sessions), misses)
        return self.cache[key]

    @staticmethod
    def _utilisations(result: PathResult, cal: Calibration, path: str, sessions: int) -> tuple[float, float]:
        """The model's and the ingress's busy shares without the opens (their prefills and
        their messages: four a session speculative, one cloud-only)."""
        message = cal.ingress_ms_per_round_message if path == SPECULATIVE else cal.ingress_ms_per_stream_message
        opens = 4 if path == SPECULATIVE else 1
        model = max(0.0, sum(result.replica_busy_ms) - sessions * cal.prefill_ms) / result.sim_ms
        ingress = max(0.0, sum(result.ingress_busy_ms) - sessions * opens * message) / result.sim_ms
        return model, ingress

    def within_slo(self, link: str, path: str, slo: float, low: int, guess: int | None) -> int:
        """The most sessions meeting ``slo`` with memory unbounded (no cap, no recompute)."""
        return largest_within(lambda m: self.probe(link, path, m).ms_per_token, slo, self.config.max_sessions, low, guess)

    def row(self, link: str, slo: float, path: str, policy: str, unbounded: int) -> Row:
        """The policy's row, from the sessions the SLO allows with memory unbounded: a pinned pool
        caps them; an evictable one recomputes past its resident sessions, which may lower them."""
        cfg, speculative = self.config, path == SPECULATIVE
        cap = self.memory.cap(policy, speculative)
        evictable = policy == EVICTABLE and speculative
        sessions = unbounded if cap is None else min(unbounded, cap)
        if evictable and sessions > self.memory.resident:
            resident = self.memory.resident
            sessions = largest_within(lambda m: self.probe(link, path, m, True).ms_per_token, slo, sessions, max(1, resident))
        if sessions == 0:
            binds = SLO_FLOOR if unbounded == 0 else KV_MEMORY
            return Row(link, slo, path, policy, 0, 0.0, binds, self.probe(link, path, 1).ms_per_token)
        chosen = self.probe(link, path, sessions, evictable)
        beyond = self.probe(link, path, sessions + 1, evictable) if sessions < cfg.max_sessions else chosen
        binds = binding(True, sessions, cap, cfg.max_sessions, beyond.gpu_util, beyond.ingress_util)
        if chosen.miss_rate > 0 and binds == GPU_TIME:
            binds = f"{GPU_TIME} (recompute)"
        return Row(link, slo, path, policy, sessions, chosen.tokens_per_s / self.deployment.tp, binds,
                   chosen.ms_per_token, miss_rate=chosen.miss_rate)


def step_calibration(base: Calibration, deployment: Deployment, hardware: Hardware, workload: Workload,
                     measured: VerifyModel | None = None) -> tuple[Calibration, str]:
    """The calibration with the deployment's step (the roofline, or a measured table) and prefill."""
    rl = hardware.roofline
    verify = measured or roofline.verify_table(deployment, rl, workload.mean_context)
    source = "measured step table" if measured else f"roofline ({deployment.label}, context {workload.mean_context:g})"
    prefill = roofline.prefill_ms(deployment, rl, workload.prompt_tokens)
    return replace(base, verify=verify, prefill_ms=prefill, source=f"{base.source}; step: {source}"), source


def plan_links(deployment: Deployment, hardware: Hardware, base: Calibration, config: SteadyConfig,
               measured: VerifyModel | None = None) -> LinkPlan:
    """Every link x SLO x path x policy row for one deployment (module docstring)."""
    memory = KvMemory(deployment, hardware.memory, hardware.roofline.dtype_bytes, config.workload)
    calibration, source = step_calibration(base, deployment, hardware, config.workload, measured)
    context = int(config.workload.mean_context)
    recompute = roofline.prefill_ms(deployment, hardware.roofline, context) - roofline.step(deployment, hardware.roofline, 1, 1, 0).ms
    planner = _Planner(deployment, calibration, memory, config, recompute)
    rows, floors = [], {}
    for link in config.links:
        floors[(link, CLOUD_ONLY)] = planner.probe(link, CLOUD_ONLY, 1).ms_per_token
        floors[(link, SPECULATIVE)] = planner.probe(link, SPECULATIVE, 1).ms_per_token
        known: dict[str, tuple[int, float | None]] = {CLOUD_ONLY: (1, None), SPECULATIVE: (1, None)}  # (sessions, the tighter SLO they met)
        for slo in sorted(config.slos_ms):
            routed = routed_to_cloud(floors[(link, SPECULATIVE)], slo)
            unbounded = {}
            for path in (CLOUD_ONLY, SPECULATIVE):
                if routed and path == SPECULATIVE:
                    continue
                low, tighter = known[path]
                guess = round(low * slo / tighter) if tighter else None  # sessions grow about with the SLO
                unbounded[path] = planner.within_slo(link, path, slo, low, guess)
                known[path] = (max(1, unbounded[path]), slo if unbounded[path] else None)
            for policy in POLICIES:
                cloud = planner.row(link, slo, CLOUD_ONLY, policy, unbounded[CLOUD_ONLY])
                speculative = replace(cloud, path=SPECULATIVE, routed=True) if routed else \
                    planner.row(link, slo, SPECULATIVE, policy, unbounded[SPECULATIVE])
                rows += [cloud, speculative]
    return LinkPlan(deployment, memory, source, config, rows, floors, recompute)


__all__ = ["BACKEND_OF", "PINNED", "EVICTABLE", "LinkPlan", "Row", "SteadyConfig", "plan_links"]
