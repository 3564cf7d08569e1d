"""What the device has measured about the link, the replica, its draft and the stream: the
figures the planner predicts from (``planner.Planner``). Each is None (or empty) until measured."""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from edgespec.edge.acceptance import Acceptance
from edgespec.edge.policy import LinearFit

WINDOW = 8  # recent samples each rate is computed over
RTT_WINDOW = 5  # round trips: a median over few, so a link that changed shows after three samples
TRIM_SAMPLES = 6  # samples (rounds, a stream's messages) from which a rate leaves out its slowest one


@dataclass
class Rate:
    """Milliseconds per unit over the last ``WINDOW`` samples (sum of times / sum of units)."""

    samples: deque = field(default_factory=lambda: deque(maxlen=WINDOW))

    def add(self, ms: float, units: float) -> None:
        if units > 0 and ms >= 0:
            self.samples.append((ms, units))

    @property
    def value(self) -> float | None:
        if not self.samples:
            return None
        return sum(ms for ms, _ in self.samples) / sum(units for _, units in self.samples)

    @property
    def trimmed(self) -> float | None:
        """``value`` without the slowest sample once there are six or more: one loss stall
        in a window of rounds is the link's rare event, not its rate."""
        if len(self.samples) < TRIM_SAMPLES:
            return self.value
        samples = sorted(self.samples, key=lambda s: s[0] / s[1])[:-1]
        return sum(ms for ms, _ in samples) / sum(units for _, units in samples)

    def __len__(self) -> int:
        return len(self.samples)


@dataclass
class Median:
    samples: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    _value: float | None = None  # computed once per sample

    def add(self, value: float) -> None:
        self.samples.append(value)
        self._value = statistics.median(self.samples)

    @property
    def value(self) -> float | None:
        return self._value


@dataclass
class Estimates:
    rtt_ms: Median = field(default_factory=lambda: Median(deque(maxlen=RTT_WINDOW)))  # network round trip + ingress
    forward_ms: Median = field(default_factory=Median)  # the target's verify forward + accept on the replica
    forward_fit: LinearFit = field(default_factory=LinearFit)  # the verify forward against k
    prefill_ms: Median = field(default_factory=Median)  # a segment's first round beyond a forward: the Open's prefill
    device: LinearFit = field(default_factory=LinearFit)  # a fresh round's device time (drafting its k) against k
    spec: Rate = field(default_factory=Rate)  # wall ms per committed token while speculating
    round_ms: Rate = field(default_factory=Rate)  # wall ms per speculative round
    bias: Rate = field(default_factory=Rate)  # measured round ms per predicted round ms
    tokens_per_round: Rate = field(default_factory=Rate)  # tokens per round, verified or replayed (tau)
    shadow_ms: Rate = field(default_factory=Rate)  # the shadow draft's device ms per streamed token it ran over
    drafting: Rate = field(default_factory=Rate)  # a block's drafting, device ms per draft (adaptive k's first price)
    cloud_ms_per_token: float | None = None  # a Generate stream's rate: first token to last (a stall out until caught up), per token
    ahead_sent: float = 0.0  # blocks sent ahead this segment, recent ones weighing most (``Forecast.ahead_share``)
    ahead_held: float = 0.0  # ...of which verified
    spec_bias: float = 1.0  # measured / predicted speculative round time, recent rounds
    acceptance: Acceptance = field(default_factory=Acceptance)  # per-position acceptance, rounds with k known
    decode_ms: float | None = None  # the replica's decoding step of Generate streams (Info)
    replica_stream_ms: float | None = None  # the replica's time per token of its Generate streams (Info)
    stream_basis_ms: float | None = None  # the replica's stream figure when cloud_ms_per_token was measured
