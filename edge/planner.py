"""Which path produces the next tokens, and how many blocks to keep in flight.

Per request, ``k="auto"`` (the default) lets the planner choose between speculation (draft
here, verify in the cloud: one round trip per block) and cloud-only streaming (the target
decodes every token; the round trip is paid once), from measured figures:

    speculative ms/token = (round trip + forward + the device's own time) / tokens per round
    cloud-only ms/token  = the target's per-token time on the stream

Every figure is a rate over a short window of recent samples (sum of times over sum of
tokens), and the round trip is the median of recent samples, so one loss stall or one unlucky
round does not flip the decision. A generation starts on the path predicted faster over its
budget; until speculation has been measured it explores speculation first unless even a
draft that is always right could not win (a satellite round trip), since tokens per round are
only known once measured. It switches,
mid-generation and in either direction, when the other path's prediction beats the current
path's measured rate by ``margin`` and the remaining tokens repay the switch (two round trips).
While streaming cloud-only the device probes the round trip (a cheap Info call) and so notices
a link that got faster.

The planner lives as long as the client, so later generations start from what earlier ones
measured. Send-ahead depth follows the same figures: enough blocks in flight to cover the
round trip, while sent-ahead blocks are often valid.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from enum import Enum


class Path(str, Enum):
    SPECULATIVE = "speculative"
    CLOUD_ONLY = "cloud_only"


WINDOW = 8  # recent samples each figure is computed over


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

    def __len__(self) -> int:
        return len(self.samples)


@dataclass
class Median:
    samples: deque = field(default_factory=lambda: deque(maxlen=WINDOW))

    def add(self, value: float) -> None:
        self.samples.append(value)

    @property
    def value(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None


@dataclass
class Estimates:
    """What the device has measured; each None (or empty) until measured."""

    rtt_ms: Median = field(default_factory=Median)  # network round trip + ingress
    forward_ms: Median = field(default_factory=Median)  # the target's forward + accept on the replica
    spec: Rate = field(default_factory=Rate)  # wall ms per committed token while speculating
    round_ms: Rate = field(default_factory=Rate)  # wall ms per speculative round
    tokens_per_round: Rate = field(default_factory=Rate)  # tokens per round (tau): units = rounds
    device_ms: Rate = field(default_factory=Rate)  # a fresh round's wall beyond its wait, per round
    cloud_ms_per_token: float | None = None  # a Generate stream's rate: first token to last, per token
    chain_valid: float | None = None  # share of sent-ahead blocks that were verified, not discarded


class Planner:
    """Chooses the path and the send-ahead depth; ``mode``: "auto", "speculative" or "cloud_only"."""

    MIN_ROUNDS = 4  # rounds of a speculative segment before it may be left
    MIN_TOKENS = 8  # tokens of a cloud-only segment (and one round-trip probe) before it may be left
    PRIOR_TAU = 3.0  # tokens per round assumed before any round is measured

    def __init__(self, mode: str = "auto", *, margin: float = 0.15, max_depth: int = 4):
        if mode not in ("auto", "speculative", "cloud_only"):
            raise ValueError(f"mode must be auto, speculative or cloud_only, got {mode!r}")
        if not 0 <= margin < 1:
            raise ValueError(f"margin must be in [0, 1), got {margin}")
        self.mode, self.margin, self.max_depth = mode, margin, max_depth
        self.est = Estimates()
        self._segment_rounds = self._segment_tokens = self._segment_probes = 0

    # ---- what was measured ---------------------------------------------------------------

    def begin(self, path: Path) -> None:
        """A new segment starts: its own figures must come in before it is left (a speculative
        segment's rate is its own: the last one's may have been measured on another link)."""
        self._segment_rounds = self._segment_tokens = self._segment_probes = 0
        if path is Path.SPECULATIVE:
            self.est.spec.samples.clear()
            self.est.round_ms.samples.clear()

    def record_rtt(self, ms: float) -> None:
        self.est.rtt_ms.add(ms)
        self._segment_probes += 1

    def record_forward(self, ms: float) -> None:
        if ms > 0:
            self.est.forward_ms.add(ms)

    def record_round(self, *, wall_ms: float, wait_ms: float | None, forward_ms: float, tokens: int) -> None:
        """One verified round as the device saw it: wall time since the last verdict (drafting
        included), send -> verdict (None for a block sent ahead: it waited at the verifier,
        its wait is no round trip), and the server's forward."""
        est = self.est
        self.record_forward(forward_ms)
        if wait_ms is not None:
            est.rtt_ms.add(max(wait_ms - forward_ms, 0.0))
            est.device_ms.add(max(wall_ms - wait_ms, 0.0), 1)
        est.spec.add(wall_ms, tokens)
        est.round_ms.add(wall_ms, 1)
        est.tokens_per_round.add(tokens, 1)
        if est.chain_valid is not None and est.chain_valid < 0.15:
            # No block goes ahead at this rate, so nothing would update it: drift back up
            # slowly, so that send-ahead is tried again after a few dozen rounds.
            est.chain_valid = 0.98 * est.chain_valid + 0.02 * 0.5
        self._segment_rounds += 1

    def record_ahead(self, valid: bool) -> None:
        value = 1.0 if valid else 0.0
        self.est.chain_valid = value if self.est.chain_valid is None else 0.8 * self.est.chain_valid + 0.2 * value

    def record_cloud_rate(self, ms_since_first: float, tokens_since_first: int) -> None:
        """The current Generate stream so far: ``tokens_since_first`` tokens arrived within
        ``ms_since_first`` of its first token (rates between single messages are meaningless
        on a jittery link, where messages arrive in bursts)."""
        if tokens_since_first > 0:
            self.est.cloud_ms_per_token = ms_since_first / tokens_since_first
            self._segment_tokens = tokens_since_first

    # ---- predictions -----------------------------------------------------------------------

    def predicted_speculative(self, tau: float | None = None) -> float | None:
        """ms/token of speculation from its components at the current round trip (``tau``:
        tokens per round, by default the measured figure)."""
        est = self.est
        rtt, forward = est.rtt_ms.value, est.forward_ms.value
        if rtt is None or forward is None:
            return None
        tau = tau or est.tokens_per_round.value or self.PRIOR_TAU
        round_ms = rtt + forward + (est.device_ms.value or 2.0)
        depth = self.depth()
        if depth > 1 and est.chain_valid:
            # A valid sent-ahead block is verified right after its predecessor: it costs one
            # forward (and the device's time), not a whole round.
            chained = forward + (est.device_ms.value or 2.0)
            round_ms = est.chain_valid * min(chained, round_ms) + (1 - est.chain_valid) * round_ms
        return round_ms / tau

    def speculative_ms_per_token(self) -> float | None:
        """Measured while speculating, else predicted."""
        return self.est.spec.value if len(self.est.spec) >= self.MIN_ROUNDS else self.predicted_speculative()

    def cloud_ms_per_token(self) -> float | None:
        if self.est.cloud_ms_per_token is not None:
            return self.est.cloud_ms_per_token
        forward = self.est.forward_ms.value
        return None if forward is None else forward + 1.0  # NOTE: one decode step + a message's cost

    # ---- decisions ---------------------------------------------------------------------------

    def first_path(self, max_new_tokens: int, max_k: int = 16) -> Path:
        if self.mode != "auto":
            return Path(self.mode)
        cloud, rtt = self.cloud_ms_per_token(), self.est.rtt_ms.value
        if len(self.est.spec) >= self.MIN_ROUNDS:
            spec, limit = self.est.spec.value, 1 + self.margin
        else:
            # Tokens per round are unknown until measured: explore speculation unless even a
            # draft that is always right (max_k + 1 tokens a round) could not win.
            spec, limit = self.predicted_speculative(tau=max_k + 1.0), 1.0
        if spec is None or cloud is None:
            return Path.SPECULATIVE  # nothing measured yet: speculate, and learn
        # Speculation pays one more round trip to start (the Open, then the first verdict).
        spec_total = 2 * rtt + max_new_tokens * spec
        cloud_total = rtt + max_new_tokens * cloud
        return Path.SPECULATIVE if spec_total <= cloud_total * limit else Path.CLOUD_ONLY

    def should_switch(self, current: Path, remaining: int) -> bool:
        """True when the other path is predicted clearly faster for the tokens still to come."""
        if self.mode != "auto" or remaining < 4:
            return False
        if current is Path.SPECULATIVE:
            if self._segment_rounds < self.MIN_ROUNDS:
                return False
            here, there = self.est.spec.value, self.cloud_ms_per_token()
        else:
            if self._segment_tokens < self.MIN_TOKENS or not self._segment_probes:
                return False
            here, there = self.cloud_ms_per_token(), self.predicted_speculative()
        if here is None or there is None:
            return False
        gain_ms = remaining * (here - there)
        return there * (1 + self.margin) < here and gain_ms > 2 * (self.est.rtt_ms.value or 0.0)

    def depth(self) -> int:
        """Blocks to keep in flight: enough to cover the round trip while ahead blocks hold."""
        est = self.est
        rtt, forward = est.rtt_ms.value, est.forward_ms.value
        if rtt is None or forward is None:
            return 2
        if est.chain_valid is not None and est.chain_valid < 0.15:
            return 1  # sent-ahead blocks are nearly always discarded: drafting them is waste
        per_block = forward + (est.device_ms.value or 2.0)
        return max(2, min(self.max_depth, 1 + math.ceil(rtt / max(per_block, 1.0))))
