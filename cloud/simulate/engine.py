"""The discrete-event simulation of one fleet on one path: a heap of timestamped events, no threads.

Time is simulated milliseconds. Every event is ``(time, priority, sequence, handler, argument)``;
``priority`` 1 runs after every priority-0 event of the same instant, so a replica that wakes
up takes every block that arrived at that instant into one batch (Serve's ``@serve.batch``
with ``batch_wait_timeout_s=0`` does the same within one event-loop turn). With
``batch_wait_ms`` > 0 an idle replica waits that long after the oldest queued row, or until
the batch is full, as ``@serve.batch`` does.

A speculative device, one round (k from the policy):

1. draft k tokens: ``k * draft_ms_per_token`` times a lognormal factor (mean 1, cv
   ``draft_cv``), less any drafts made ahead during the previous flight;
2. send the block up its link (``DirectionSchedule``: base delay, jitter, bytes / bandwidth,
   loss stalls), plus ``round_overhead_ms`` (Serve's proxy) before it reaches the replica;
3. the replica verifies it in the next batch: every row that arrived while the previous
   forward ran, up to ``max_batch_size``; the forward takes ``verify(batch, longest row)``.
   With batch_wait 0, sessions whose rows come back at different moments can settle into
   convoys that take turns on the replica instead of sharing forwards: a real effect of that
   setting, which the simulation reproduces rather than smooths over;
4. the verdict comes down the link; accepted n is drawn from the per-position acceptance;
   emitted = n + 1 (capped by the token budget); the device starts the next round.

Before the first round the device opens its session: Open up, ``prefill_ms`` + proxy, Opened
down. A cloud-only device sends one Generate request (up, then ``prefill_ms``); the replica
then decodes one token per forward for it (rows of 1 token, batched with the other cloud-only
sessions), each token travels down the link as its own message, and the session's next step
joins the queue ``stream_overhead_ms`` after the last one finished: the network delay is paid
once, later tokens are pipelined behind it.

Randomness: each device owns separate streams (uplink, downlink, acceptance, drafting noise)
seeded from (seed, device, purpose), so a device's draws do not depend on how events
interleave, and the two paths see the same link draws (common random numbers).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter, deque
from dataclasses import dataclass, field

from edgespec.cloud.link_profiles import DirectionSchedule, LinkProfile
from edgespec.cloud.simulate.calibration import Calibration
from edgespec.cloud.simulate.config import FleetConfig
from edgespec.cloud.simulate.result import PathResult, SimResult
from edgespec.edge.policy import make_policy

SPECULATIVE = "speculative"
CLOUD_ONLY = "cloud_only"
PATHS = (SPECULATIVE, CLOUD_ONLY)


@dataclass(eq=False)
class _Device:
    index: int
    link: LinkProfile
    replica: int
    start_ms: float
    up: DirectionSchedule
    down: DirectionSchedule
    accept_rng: random.Random
    noise_rng: random.Random
    policy: object = None
    tokens: int = 0
    finish_ms: float | None = None
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    # the round in flight
    k: int = 0
    draft_ms: float = 0.0
    sent_ms: float = 0.0
    accepted_now: int = 0  # the verdict on its way down
    ahead_credit: int = 0  # next-block drafts already made while the last block was in flight
    steps_left: float = 0  # cloud-only decode steps still to run


@dataclass(eq=False)
class _Replica:
    queue: deque = field(default_factory=deque)  # (arrival ms, device)
    busy: bool = False
    start_at: float | None = None  # when the next forward is scheduled to start
    generation: int = 0  # invalidates a scheduled start that an earlier one replaced
    busy_ms: float = 0.0
    batch_sizes: Counter = field(default_factory=Counter)


class FleetSimulation:
    """One run of ``config`` on ``path`` ("speculative" or "cloud_only"); call ``run()`` once."""

    def __init__(self, config: FleetConfig, calibration: Calibration, path: str = SPECULATIVE):
        if path not in PATHS:
            raise ValueError(f"path must be one of {PATHS}, got {path!r}")
        self.config, self.cal, self.path = config, calibration, path
        self.end_ms = config.duration_s * 1000.0 if config.duration_s is not None else math.inf
        self.budget = config.tokens_per_device if config.tokens_per_device is not None else math.inf
        self._heap: list = []
        self._sequence = 0
        self.now = 0.0
        self.replicas = [_Replica() for _ in range(config.replicas)]
        self.devices = self._make_devices()
        sigma2 = math.log1p(calibration.draft_cv**2)
        self._noise = (-sigma2 / 2.0, math.sqrt(sigma2))  # lognormal with mean 1

    def _make_devices(self) -> list[_Device]:
        cfg = self.config
        links = cfg.device_links()
        random.Random(f"{cfg.seed}/links").shuffle(links)
        start_rng = random.Random(f"{cfg.seed}/starts")
        devices = []
        for i, link in enumerate(links):

            def stream(purpose: str) -> random.Random:
                return random.Random(f"{cfg.seed}/{i}/{purpose}")

            device = _Device(
                index=i,
                link=link,
                replica=i % cfg.replicas,
                start_ms=start_rng.random() * cfg.start_spread_ms,
                up=DirectionSchedule(link, "up", stream("up").random),
                down=DirectionSchedule(link, "down", stream("down").random),
                accept_rng=stream("accept"),
                noise_rng=stream("noise"),
            )
            if self.path == SPECULATIVE:
                device.policy = make_policy(cfg.k, k_max=cfg.k_max)
            devices.append(device)
        return devices

    # ---- the loop -------------------------------------------------------------------------

    def _at(self, time_ms: float, handler, argument, priority: int = 0) -> None:
        self._sequence += 1
        heapq.heappush(self._heap, (time_ms, priority, self._sequence, handler, argument))

    def run(self) -> PathResult:
        opener = self._open_session if self.path == SPECULATIVE else self._open_generate
        for device in self.devices:
            self._at(device.start_ms, opener, device)
        while self._heap:
            time_ms, _, _, handler, argument = heapq.heappop(self._heap)
            if time_ms > self.end_ms:
                break
            self.now = time_ms
            handler(argument)
        return self._result()

    # ---- speculative path -----------------------------------------------------------------

    def _open_session(self, device: _Device) -> None:
        cal = self.cal
        at_replica = device.up.release_ms(self.now, cal.open_bytes)
        opened = device.down.release_ms(at_replica + cal.prefill_ms + cal.round_overhead_ms, cal.down_bytes_per_round)
        self._at(opened, self._begin_round, device)

    def _begin_round(self, device: _Device) -> None:
        remaining = self.budget - device.tokens
        limit = self.config.k_max if math.isinf(remaining) else int(min(self.config.k_max, max(1, remaining - 1)))
        device.k = device.policy.next_k(limit)
        to_draft = max(0, device.k - device.ahead_credit)
        device.ahead_credit = 0
        device.draft_ms = to_draft * self.cal.draft_ms_per_token * self._noise_factor(device)
        self._at(self.now + device.draft_ms, self._send_block, device)

    def _send_block(self, device: _Device) -> None:
        device.sent_ms = self.now
        arrival = device.up.release_ms(self.now, self.cal.up_bytes(device.k))
        self._at(arrival + self.cal.round_overhead_ms, self._enqueue, device)

    def _verdict(self, device: _Device) -> None:
        k, n = device.k, device.accepted_now
        device.tokens += int(min(n + 1, self.budget - device.tokens))
        device.rounds += 1
        device.drafted += k
        device.accepted += n
        flight_ms = self.now - device.sent_ms
        device.policy.update(k, n, draft_ms=device.draft_ms, wait_ms=flight_ms)
        if self.config.draft_ahead and n == k:
            # During the flight the device drafted position k+1 (its guess at the bonus token)
            # and on; those count only if the target's bonus token equals that guess.
            made = int(flight_ms // self.cal.draft_ms_per_token)
            if made >= 2 and device.accept_rng.random() < self.cal.acceptance_at(k):
                device.ahead_credit = min(made - 1, self.config.k_max)
        if device.tokens >= self.budget:
            device.finish_ms = self.now
            return
        self._begin_round(device)

    def _draw_accepted(self, device: _Device) -> int:
        n = 0
        while n < device.k and device.accept_rng.random() < self.cal.acceptance_at(n):
            n += 1
        return n

    def _noise_factor(self, device: _Device) -> float:
        if self.cal.draft_cv == 0:
            return 1.0
        return device.noise_rng.lognormvariate(*self._noise)

    # ---- cloud-only path ------------------------------------------------------------------

    def _open_generate(self, device: _Device) -> None:
        device.steps_left = self.budget
        at_replica = device.up.release_ms(self.now, self.cal.open_bytes)
        self._at(at_replica + self.cal.prefill_ms, self._enqueue, device)

    def _token_arrives(self, device: _Device) -> None:
        device.tokens += 1
        device.rounds += 1
        if device.tokens >= self.budget:
            device.finish_ms = self.now

    # ---- replicas -------------------------------------------------------------------------

    def _enqueue(self, device: _Device) -> None:
        replica = self.replicas[device.replica]
        replica.queue.append((self.now, device))
        self._request_batch(replica)

    def _request_batch(self, replica: _Replica) -> None:
        """Schedules the next forward: when the queue is full, else batch_wait after its oldest row."""
        if replica.busy or not replica.queue:
            return
        if len(replica.queue) >= self.config.max_batch_size:
            start = self.now
        else:
            start = max(self.now, replica.queue[0][0] + self.config.batch_wait_ms)
        if replica.start_at is not None and replica.start_at <= start:
            return
        replica.start_at = start
        replica.generation += 1
        self._at(start, self._start_batch, (replica, replica.generation), priority=1)

    def _start_batch(self, scheduled) -> None:
        replica, generation = scheduled
        if generation != replica.generation or replica.busy:
            return
        replica.start_at = None
        size = min(len(replica.queue), self.config.max_batch_size)
        rows = [replica.queue.popleft()[1] for _ in range(size)]
        tokens_per_row = max(d.k + 1 for d in rows) if self.path == SPECULATIVE else 1
        duration = self.cal.verify(size, tokens_per_row)
        replica.busy = True
        replica.busy_ms += min(self.now + duration, self.end_ms) - self.now
        replica.batch_sizes[size] += 1
        self._at(self.now + duration, self._finish_batch, (replica, rows))

    def _finish_batch(self, batch) -> None:
        replica, rows = batch
        replica.busy = False
        cal = self.cal
        for device in rows:
            if self.path == SPECULATIVE:
                device.accepted_now = self._draw_accepted(device)
                arrival = device.down.release_ms(self.now, cal.down_bytes_per_round)
                self._at(arrival, self._verdict, device)
            else:
                arrival = device.down.release_ms(self.now, cal.down_bytes_per_token)
                self._at(arrival, self._token_arrives, device)
                device.steps_left -= 1
                if device.steps_left > 0:
                    self._at(self.now + cal.stream_overhead_ms, self._enqueue, device)
        self._request_batch(replica)

    # ---- figures --------------------------------------------------------------------------

    def _result(self) -> PathResult:
        bounded = not math.isinf(self.end_ms)
        sim_ms = self.end_ms if bounded else max((d.finish_ms or 0.0) for d in self.devices)
        ms_per_token = []
        for device in self.devices:
            end = self.end_ms if bounded else device.finish_ms
            ms_per_token.append((end - device.start_ms) / device.tokens if device.tokens else math.inf)
        batch_sizes: Counter = Counter()
        for replica in self.replicas:
            batch_sizes.update(replica.batch_sizes)
        return PathResult(
            path=self.path,
            ms_per_token=ms_per_token,
            device_links=[d.link.name for d in self.devices],
            tokens=sum(d.tokens for d in self.devices),
            rounds=sum(d.rounds for d in self.devices),
            drafted=sum(d.drafted for d in self.devices),
            accepted=sum(d.accepted for d in self.devices),
            sim_ms=sim_ms,
            replica_busy_ms=[r.busy_ms for r in self.replicas],
            batch_sizes=dict(batch_sizes),
            devices_without_tokens=sum(1 for d in self.devices if d.tokens == 0),
        )


def simulate_path(config: FleetConfig, calibration: Calibration | None = None, path: str = SPECULATIVE) -> PathResult:
    return FleetSimulation(config, calibration or Calibration.default(), path).run()


def simulate(config: FleetConfig, calibration: Calibration | None = None, *, baseline: bool = True) -> SimResult:
    """Runs the fleet speculatively and (unless ``baseline`` is False) cloud-only, same links and seed."""
    calibration = calibration or Calibration.default()
    speculative = simulate_path(config, calibration, SPECULATIVE)
    cloud_only = simulate_path(config, calibration, CLOUD_ONLY) if baseline else None
    settings = {
        "devices": config.devices,
        "link_mix": {p.name: w for p, w in config.link_mix},
        "links": {p.name: p.to_dict() for p, _ in config.link_mix},
        "replicas": config.replicas,
        "k": config.k,
        "k_max": config.k_max,
        "tokens_per_device": config.tokens_per_device,
        "duration_s": config.duration_s,
        "max_batch_size": config.max_batch_size,
        "batch_wait_ms": config.batch_wait_ms,
        "draft_ahead": config.draft_ahead,
        "start_spread_ms": config.start_spread_ms,
        "seed": config.seed,
        "calibration": calibration.to_dict(),
    }
    return SimResult(config.describe(), calibration.source, speculative, cloud_only, settings)
