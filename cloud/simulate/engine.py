"""The discrete-event simulation of one fleet on one path: a heap of timestamped callbacks, no threads.

Time is simulated milliseconds. Every event is ``(time, priority, sequence, callback)``;
``priority`` 1 runs after every priority-0 event of the same instant, so a batch closed "now"
takes every row that arrives at that instant (as asyncio runs the scheduler's task only after
the callbacks of the current loop turn).

Each replica has three shared resources, each a FIFO:

- the **ingress** (``Calibration`` docstring, "The ingress"): every message of every session
  of the replica, in either direction, occupies it for its service time;
- the **batch scheduler** (``cloud/serving/scheduler.py``, replicated exactly): a batch is gathered
  only once the model is free: whatever queued during the previous forward plus, for at most
  ``batch_wait_ms``, more of the open sessions; it closes early when none of the open sessions
  not yet in is expected back by the deadline (the scheduler's own ``gather_wait`` and
  ``ReturnTimes``: a session is expected when its last verdict left plus its measured return
  interval; a Generate stream always; with ``batch_wait_for="all"``, when every open session is
  in), and takes at most ``max_batch_size`` rows; it shares the replica's event loop with the
  ingress, so a batch cannot close while the ingress is busy (a gather's timer fires only when
  the loop is free: rows whose messages are being handled get in, as the replica's batches
  stay whole where a slower loop would split them);
- the **model thread**: forwards and prompt prefills, one at a time, in submission order.

A speculative device, one round (k from the policy):

1. draft k tokens: ``k * draft_ms_per_token`` times a lognormal factor (mean 1, cv
   ``draft_cv``), less any drafts made ahead during the previous flight;
2. the Draft goes up its link (``DirectionSchedule``: base delay, jitter, bytes / bandwidth,
   loss stalls) plus the round's fixed latency on that link (``Calibration.round_overhead_for``:
   device, link and transport, all before the replica), then through the ingress into the
   batch queue;
3. the replica verifies it in the next batch; the forward takes ``verify(batch, longest row)``;
4. the Verdict goes through the ingress and down the link; accepted n is drawn from the
   per-position acceptance; emitted = n + 1 (capped by the token budget); the next round starts.

Before the first round the device opens its session (``open_overhead_ms`` of latency, the
call's setup, then Open up and through the ingress, the session counts as open, prefill on the
model, Opened through the ingress and down); after
its last verdict it sends Close (through the ingress: the session stops counting as open)
and the replica answers Closed (ingress load only: the device has its tokens).

A cloud-only device sends one Generate request (``open_overhead_ms``, up, ingress, prefill on
the model); the
replica then decodes one token per forward for it (rows of 1 token, batched with the other
cloud-only sessions). ``stream_overhead_ms`` after a forward (once per batch: the model thread
hands its result back, the scheduler wakes the batch's streams) each stream's token message
goes through the ingress, in turn, then down the link; the session's next step joins the batch
queue as its message leaves the ingress (the replica's generator resumes right after its yield,
``cloud/serving/deployment.py``: nothing waits for the device). So a batch's streams come back
together, and the ingress work of the last keeps the next gather open until all are in, as the
replica's own batches of N streams stay whole (``GenerateResponse.batch_size``). The network
delay is paid once; later tokens are pipelined behind it.

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
from functools import partial
from typing import Callable

from edgespec.cloud.link.profiles import DirectionSchedule, LinkProfile
from edgespec.cloud.serving.scheduler import ReturnTimes, gather_wait
from edgespec.cloud.simulate.calibration import Calibration
from edgespec.cloud.simulate.config import FleetConfig
from edgespec.cloud.simulate.result import PathResult, SimResult
from edgespec.edge.planner import Info, Path, Planner, Round, Start

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
    planner: Planner | None = None  # speculative: the SDK's own planner chooses k
    tokens: int = 0
    finish_ms: float | None = None
    rounds: int = 0
    arrivals: list = field(default_factory=list)  # (ms, tokens so far) at each delivery: steady-state windows
    drafted: int = 0
    accepted: int = 0
    # the round in flight
    k: int = 0
    draft_ms: float = 0.0
    sent_ms: float = 0.0
    accepted_now: int = 0  # the verdict on its way down
    forward_ms: float = 0.0  # the forward that verified its last block (a batch's, as a verdict tells)
    ahead_credit: int = 0  # next-block drafts already made while the last block was in flight
    steps_left: float = 0  # cloud-only decode steps still to run


@dataclass(eq=False)
class _Replica:
    queue: deque = field(default_factory=deque)  # devices whose row waits for a forward
    open_sessions: int = 0  # admitted, not yet released: the scheduler's ``expected()``
    in_forward: bool = False  # the scheduler awaits a forward
    gathering: bool = False  # the model is free and a batch is being gathered
    gather_id: int = 0  # invalidates a deadline or close scheduled for an earlier batch
    gather_started_ms: float = 0.0
    gather_deadline_ms: float = 0.0
    gather_wait_ms: float = 0.0  # summed over gathers: the model free with rows queued, waiting for more
    returns: ReturnTimes = field(default_factory=ReturnTimes)  # when each session is expected back
    ingress_free_ms: float = 0.0
    model_free_ms: float = 0.0
    busy_ms: float = 0.0  # on the model (forwards and prefills)
    ingress_busy_ms: float = 0.0
    batch_sizes: Counter = field(default_factory=Counter)


class FleetSimulation:
    """One run of ``config`` on ``path`` ("speculative" or "cloud_only"); call ``run()`` once."""

    def __init__(self, config: FleetConfig, calibration: Calibration, path: str = SPECULATIVE):
        if path not in PATHS:
            raise ValueError(f"path must be one of {PATHS}, got {path!r}")
        self.config, self.cal, self.path = config, calibration, path
        self.end_ms = config.duration_s * 1000.0 if config.duration_s is not None else math.inf
        self.budget = config.tokens_per_device if config.tokens_per_device is not None else math.inf
        self.message_ms = (
            calibration.ingress_ms_per_round_message if path == SPECULATIVE else calibration.ingress_ms_per_stream_message
        )
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
                # The device knows its round trip and the replica's forward as the SDK's client
                # does before its first request (an Info call); one block in flight.
                device.planner = Planner("speculative")
                budget = int(min(self.budget, 1 << 30))
                device.planner.observe(Start(budget, cfg.k_max, cfg.k, send_ahead=1))
                device.planner.observe(Info(forward_ms=self.cal.verify(1, 5), rtt_ms=link.rtt_ms))
            devices.append(device)
        return devices

    # ---- the loop -------------------------------------------------------------------------

    def _at(self, time_ms: float, callback: Callable[[], None], priority: int = 0) -> None:
        self._sequence += 1
        heapq.heappush(self._heap, (time_ms, priority, self._sequence, callback))

    def run(self) -> PathResult:
        opener = self._open_session if self.path == SPECULATIVE else self._open_generate
        for device in self.devices:
            self._at(device.start_ms, partial(opener, device))
        while self._heap:
            time_ms, _, _, callback = heapq.heappop(self._heap)
            if time_ms > self.end_ms:
                break
            self.now = time_ms
            callback()
        return self._result()

    # ---- messages -------------------------------------------------------------------------

    def _send_up(self, device: _Device, nbytes: int, then: Callable[[], None]) -> None:
        """Device -> replica: up the link, then through the replica's ingress, then ``then``."""
        arrival = device.up.release_ms(self.now, nbytes)
        self._at(arrival, partial(self._ingress, device, then))

    def _send_down(self, device: _Device, nbytes: int, then: Callable[[], None]) -> None:
        """Replica -> device: through the ingress, then down the link, then ``then`` on the device."""
        self._ingress(device, partial(self._down_link, device, nbytes, then))

    def _down_link(self, device: _Device, nbytes: int, then: Callable[[], None]) -> None:
        self._at(device.down.release_ms(self.now, nbytes), then)

    def _ingress(self, device: _Device, then: Callable[[], None] | None) -> None:
        """One message joins the replica's ingress queue now (FIFO, one server)."""
        replica = self.replicas[device.replica]
        start = max(self.now, replica.ingress_free_ms)
        replica.ingress_free_ms = start + self.message_ms
        replica.ingress_busy_ms += self._within_run(start, replica.ingress_free_ms)
        if then is not None:
            self._at(replica.ingress_free_ms, then)

    # ---- speculative path -----------------------------------------------------------------

    def _open_session(self, device: _Device) -> None:
        self._at(self.now + self.cal.open_overhead_ms,
                 partial(self._send_up, device, self.cal.open_bytes, partial(self._admit, device, self._opened)))

    def _opened(self, device: _Device) -> None:
        self._send_down(device, self.cal.down_bytes_per_round, partial(self._begin_round, device))

    def _begin_round(self, device: _Device) -> None:
        remaining = self.budget - device.tokens
        limit = self.config.k_max if math.isinf(remaining) else int(min(self.config.k_max, max(1, remaining - 1)))
        assert device.planner is not None
        device.k = max(1, min(device.planner.decide(Path.SPECULATIVE, int(min(remaining, 1 << 30))).k, limit))
        to_draft = max(0, device.k - device.ahead_credit)
        device.ahead_credit = 0
        device.draft_ms = to_draft * self.cal.draft_ms_per_token * self._noise_factor(device)
        self._at(self.now + device.draft_ms, partial(self._send_block, device))

    def _send_block(self, device: _Device) -> None:
        """The Draft goes up, and the round's fixed latency is paid before the replica's
        ingress: it is the device's, the link's and the transport's (the client's own time per
        round, the emulator's or a middlebox's, gRPC), none of it the replica's event loop, so
        other sessions' messages go through the ingress meanwhile."""
        device.sent_ms = self.now
        arrival = device.up.release_ms(self.now, self.cal.up_bytes(device.k)) + self.cal.round_overhead_for(device.link.name)
        self._at(arrival, partial(self._ingress, device, partial(self._enqueue, device)))

    def _verdict(self, device: _Device) -> None:
        k, n = device.k, device.accepted_now
        device.tokens += int(min(n + 1, self.budget - device.tokens))
        device.arrivals.append((self.now, device.tokens))
        device.rounds += 1
        device.drafted += k
        device.accepted += n
        flight_ms = self.now - device.sent_ms
        assert device.planner is not None
        device.planner.observe(Round(k, n, n + 1, device.draft_ms + flight_ms, flight_ms, device.forward_ms,
                                     device.draft_ms))
        if self.config.draft_ahead and n == k:
            # During the flight the device drafted position k+1 (its guess at the bonus token)
            # and on; those count only if the target's bonus token equals that guess.
            made = int(flight_ms // self.cal.draft_ms_per_token)
            if made >= 2 and device.accept_rng.random() < self.cal.acceptance_at(k):
                device.ahead_credit = min(made - 1, self.config.k_max)
        if device.tokens >= self.budget:
            device.finish_ms = self.now
            self._send_up(device, self.cal.up_bytes_base, partial(self._close_session, device))
            return
        self._begin_round(device)

    def _close_session(self, device: _Device) -> None:
        self._release(device)
        self._ingress(device, None)  # Closed: load on the ingress; the device no longer waits

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
        self._at(self.now + self.cal.open_overhead_ms,
                 partial(self._send_up, device, self.cal.open_bytes, partial(self._admit, device, self._enqueue)))

    def _stream_replies(self, rows: list[_Device]) -> None:
        """A decoding batch's streams resume (``stream_overhead_ms`` after the forward, once
        for the batch): each hands its token's message to the ingress, in turn."""
        for device in rows:
            self._ingress(device, partial(self._token_leaves, device))

    def _token_leaves(self, device: _Device) -> None:
        """A token's message left the ingress: it goes down, and the generator, resumed right
        after its yield, queues its next step at once."""
        self._down_link(device, self.cal.down_bytes_per_token, partial(self._token_arrives, device))
        if device.steps_left > 0:
            self._enqueue(device)
        else:
            self._release(device)

    def _token_arrives(self, device: _Device) -> None:
        device.tokens += 1
        device.arrivals.append((self.now, device.tokens))
        device.rounds += 1
        if device.tokens >= self.budget:
            device.finish_ms = self.now

    # ---- replicas -------------------------------------------------------------------------

    def _admit(self, device: _Device, then: Callable[[_Device], None]) -> None:
        """The session takes a slot (the scheduler now expects it) and its prompt is prefilled."""
        replica = self.replicas[device.replica]
        replica.open_sessions += 1
        done = self._on_model(replica, self.cal.prefill_ms)
        self._at(done, partial(then, device))

    def _release(self, device: _Device) -> None:
        replica = self.replicas[device.replica]
        replica.open_sessions -= 1
        replica.returns.forget(device)

    def _session(self, device: _Device) -> _Device | None:
        """The scheduler's name for a device's session; None for a Generate stream (back at once)."""
        return device if self.path == SPECULATIVE else None

    def _on_model(self, replica: _Replica, duration_ms: float) -> float:
        """Queues ``duration_ms`` of work on the model thread; returns when it ends."""
        start = max(self.now, replica.model_free_ms)
        replica.model_free_ms = start + duration_ms
        replica.busy_ms += self._within_run(start, replica.model_free_ms)
        return replica.model_free_ms

    def _enqueue(self, device: _Device) -> None:
        replica = self.replicas[device.replica]
        replica.queue.append(device)
        if (session := self._session(device)) is not None:
            replica.returns.arrived(session, self.now)
        if replica.in_forward:
            return  # joins the batch gathered once the forward ends
        if replica.gathering:
            self._check_gather(replica)
        else:
            self._begin_gather(replica)

    def _begin_gather(self, replica: _Replica) -> None:
        """The model is free and a row waits: the other open sessions get batch_wait_ms to join."""
        replica.gathering = True
        replica.gather_id += 1
        replica.gather_started_ms = self.now
        replica.gather_deadline_ms = self.now + self.config.batch_wait_ms
        if self.config.batch_wait_ms > 0:
            self._at(replica.gather_deadline_ms, partial(self._close_batch, replica, replica.gather_id), priority=1)
        self._check_gather(replica)

    def _check_gather(self, replica: _Replica) -> None:
        if self._wait_left(replica) <= 0:
            self._at(self.now, partial(self._close_batch, replica, replica.gather_id), priority=1)

    def _wait_left(self, replica: _Replica) -> float:
        """How much longer the gather waits (``BatchScheduler._wait_left``)."""
        deadline = replica.gather_deadline_ms
        if len(replica.queue) >= self.config.max_batch_size or self.now >= deadline:
            return 0.0
        if self.config.batch_wait_for == "all":
            return deadline - self.now if len(replica.queue) < max(replica.open_sessions, 1) else 0.0
        present = [self._session(device) for device in replica.queue]
        return gather_wait(self.now, deadline, replica.returns.away(replica.open_sessions, present))

    def _close_batch(self, replica: _Replica, gather_id: int) -> None:
        if not replica.gathering or gather_id != replica.gather_id:
            return  # this batch already closed
        if replica.ingress_free_ms > self.now:
            # The scheduler runs on the event loop that does the ingress work: while that loop
            # handles messages, the gather's timer cannot fire, and the rows they carry get in.
            self._at(replica.ingress_free_ms, partial(self._close_batch, replica, gather_id), priority=1)
            return
        replica.gathering = False
        replica.gather_id += 1
        replica.gather_wait_ms += self._within_run(replica.gather_started_ms, self.now)
        size = min(len(replica.queue), self.config.max_batch_size)
        rows = [replica.queue.popleft() for _ in range(size)]
        tokens_per_row = max(d.k + 1 for d in rows) if self.path == SPECULATIVE else 1
        replica.in_forward = True
        replica.batch_sizes[size] += 1
        forward_ms = self.cal.verify(size, tokens_per_row)
        for device in rows:
            device.forward_ms = forward_ms
        done = self._on_model(replica, forward_ms)
        self._at(done, partial(self._finish_batch, replica, rows))

    def _finish_batch(self, replica: _Replica, rows: list[_Device]) -> None:
        replica.in_forward = False
        for device in rows:
            if (session := self._session(device)) is not None:
                replica.returns.left(session, self.now)
            if self.path == SPECULATIVE:
                device.accepted_now = self._draw_accepted(device)
                self._send_down(device, self.cal.down_bytes_per_round, partial(self._verdict, device))
            else:
                device.steps_left -= 1
        if self.path != SPECULATIVE:
            self._at(self.now + self.cal.stream_overhead_ms, partial(self._stream_replies, rows))
        if replica.queue:
            self._begin_gather(replica)

    # ---- figures --------------------------------------------------------------------------

    def _within_run(self, start: float, end: float) -> float:
        """The part of [start, end) inside the run (a duration-bounded run stops counting)."""
        return max(0.0, min(end, self.end_ms) - min(start, self.end_ms))

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
            ingress_busy_ms=[r.ingress_busy_ms for r in self.replicas],
            gather_wait_ms=sum(r.gather_wait_ms for r in self.replicas),
            arrivals=[d.arrivals for d in self.devices],
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
        "batch_wait_for": config.batch_wait_for,
        "draft_ahead": config.draft_ahead,
        "start_spread_ms": config.start_spread_ms,
        "seed": config.seed,
        "calibration": calibration.to_dict(),
    }
    return SimResult(config.describe(), calibration.source, speculative, cloud_only, settings)
