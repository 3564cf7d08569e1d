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
a link that got faster, and (greedy) it runs its draft over the streamed tokens: the tokens a
round would have committed there (``record_shadow``) keep the speculative prediction current,
so text the draft has become good at brings speculation back. Predictions are corrected by how
far the last speculative segment's measured rate was from its prediction, and a switch must
repay its own cost (a round trip to open the other stream, the replica's prefill of the
context) over the tokens still to come.

A draft that cannot win is left within a few rounds, not after a fixed count. Each round (and
each round replayed over a stream) is evidence on the draft's per-position acceptance a: k drafts
of which n were accepted are n successes and, if n < k, one failure. From Jeffreys' prior
Beta(1/2, 1/2), over the last 16 rounds (``acceptance.Acceptance``),

    a | rounds ~ Beta(1/2 + accepted drafts, 1/2 + rounds that ended in a rejection)

Speculation can beat the stream only if a round of max_k drafts commits round / cloud tokens,
i.e. only if a >= a* (``acceptance.break_even``; the optimistic case: a longer block costs no
more). ``chance_to_win`` = P(a >= a* | rounds); below 1 in 10 (``unpromising``) speculation is
left from the segment's second round on, and a generation starts cloud-only. The number of
rounds this takes follows what a round loses: where a* ~ 0.6 (a round costs 2.5 streamed
tokens) two rounds that accept nothing suffice (P = 0.04), while one such round of a good draft
is not enough (P = 0.13); where a* ~ 0.2 (a round costs 1.25 tokens) it takes six, a* ~ 0.1
thirteen. The first round is nearly free: its block rides with the Open, and its verdict comes
about when a stream's first token would. So a hopeless draft costs (rounds - 1) x (round -
cloud) + one switch (about a round): 2.5 to 4 streamed tokens for any a* from 0.1 to 0.6, no
more than 3% of a 128-token request.

While the draft is unpromising it rests over the stream (``shadow_wanted``): it is run over the
last 16 of every 256 streamed tokens (a look, started from the last 16 tokens of context), so
its cost there is bounded at about 1/8 of the stream's tokens, and a draft that has become good
on this text gains the chance to win back, runs over the whole stream again and brings
speculation back as before.

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

from edgespec.edge.acceptance import Acceptance, break_even


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

    @property
    def trimmed(self) -> float | None:
        """``value`` without the slowest sample once there are six or more: one loss stall
        in a window of rounds is the link's rare event, not its rate."""
        if len(self.samples) < 6:
            return self.value
        samples = sorted(self.samples, key=lambda s: s[0] / s[1])[:-1]
        return sum(ms for ms, _ in samples) / sum(units for _, units in samples)

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
    spec_bias: float = 1.0  # measured / predicted speculative ms per token, of the last segment
    long_tau: float | None = None  # tokens per round over many rounds (text difficulty reverts to it)
    acceptance: Acceptance = field(default_factory=Acceptance)  # per-position acceptance, rounds with k known
    decode_ms: float | None = None  # the replica's decoding step of Generate streams (Info)


class Planner:
    """Chooses the path and the send-ahead depth; ``mode``: "auto", "speculative" or "cloud_only"."""

    MIN_ROUNDS = 8  # rounds of a speculative segment before it may be left (acceptance varies a lot)
    MIN_TOKENS = 8  # tokens of a cloud-only segment (and one round-trip probe) before it may be left
    PRIOR_TAU = 3.0  # tokens per round assumed before any round is measured
    LONG_TAU_WEIGHT = 0.05  # per round, of the long-run tokens per round
    WIN_CHANCE = 0.1  # below this posterior chance that the draft can win, speculation is left
    SHADOW_PERIOD = 256  # streamed tokens per look while the draft is unpromising...
    SHADOW_LOOK = 16  # ...of which the draft is run over the last this many

    def __init__(self, mode: str = "auto", *, margin: float = 0.15, max_depth: int = 4):
        if mode not in ("auto", "speculative", "cloud_only"):
            raise ValueError(f"mode must be auto, speculative or cloud_only, got {mode!r}")
        if not 0 <= margin < 1:
            raise ValueError(f"margin must be in [0, 1), got {margin}")
        self.mode, self.margin, self.max_depth = mode, margin, max_depth
        self.est = Estimates()
        self._segment_rounds = self._segment_tokens = self._segment_probes = 0
        self._current: Path | None = None
        self._shadow_run, self._shadow_bonus = 0, False
        self._shadow_clock = 0  # streamed tokens while the draft rested (``shadow_wanted``)
        self._max_k = 16  # the server's max_k, told by first_path

    # ---- what was measured ---------------------------------------------------------------

    def begin(self, path: Path) -> None:
        """A new segment starts: its own figures must come in before it is left (a speculative
        segment's rate is its own: the last one's may have been measured on another link)."""
        self._segment_rounds = self._segment_tokens = self._segment_probes = 0
        self._shadow_run, self._shadow_bonus = 0, False
        if path is Path.SPECULATIVE:
            self.est.spec.samples.clear()
            self.est.round_ms.samples.clear()
        self._current = path

    def record_rtt(self, ms: float) -> None:
        self.est.rtt_ms.add(ms)
        self._segment_probes += 1

    def record_forward(self, ms: float) -> None:
        if ms > 0:
            self.est.forward_ms.add(ms)

    def record_round(
        self, *, wall_ms: float, wait_ms: float | None, forward_ms: float, tokens: int, k: int | None = None
    ) -> None:
        """One verified round as the device saw it: wall time since the last verdict (drafting
        included), send -> verdict (None for a block sent ahead: it waited at the verifier,
        its wait is no round trip), the server's forward, and the block's k drafts (its chain;
        None: the round tells nothing about acceptance).

        A segment's first round also carried the Open (the replica's prefill of the context, the
        draft's own): that is the switch's cost, not the path's rate, so only its tokens count."""
        est = self.est
        first = self._segment_rounds == 0
        self._segment_rounds += 1
        self.record_forward(forward_ms)
        self._tau_sample(tokens, k)
        if first:
            return
        if wait_ms is not None:
            est.rtt_ms.add(max(wait_ms - forward_ms, 0.0))
            est.device_ms.add(max(wall_ms - wait_ms, 0.0), 1)
        est.spec.add(wall_ms, tokens)
        est.round_ms.add(wall_ms, 1)
        if len(est.round_ms) >= self.MIN_ROUNDS // 2:
            predicted = self.predicted_round_ms()
            if predicted:
                est.spec_bias = min(max(est.round_ms.trimmed / predicted, 2 / 3), 1.5)
        if est.chain_valid is not None and est.chain_valid < 0.15:
            # No block goes ahead at this rate, so nothing would update it: drift back up
            # slowly, so that send-ahead is tried again after a few dozen rounds.
            est.chain_valid = 0.98 * est.chain_valid + 0.02 * 0.5

    def record_ahead(self, valid: bool) -> None:
        value = 1.0 if valid else 0.0
        self.est.chain_valid = value if self.est.chain_valid is None else 0.8 * self.est.chain_valid + 0.2 * value

    def record_shadow(self, hits, k: int) -> None:
        """Cloud-only tokens in order, each True where the draft (run over the stream) predicted
        it: blocks of ``k`` drafts are replayed over them and each round's committed tokens
        (accepted drafts + the correction or bonus) join the tokens-per-round window."""
        k = max(1, int(k))
        for hit in hits:
            if self._shadow_bonus:  # the bonus token of a block accepted whole
                self._tau_sample(k + 1, k)
                self._shadow_run, self._shadow_bonus = 0, False
            elif hit:
                self._shadow_run += 1
                self._shadow_bonus = self._shadow_run >= k
            else:  # the first rejected draft: the target's token is the round's last
                self._tau_sample(self._shadow_run + 1, k)
                self._shadow_run = 0

    def _tau_sample(self, tokens: int, k: int | None) -> None:
        est = self.est
        est.tokens_per_round.add(tokens, 1)
        if k is not None:
            est.acceptance.add(tokens - 1, k)
        w = self.LONG_TAU_WEIGHT
        est.long_tau = float(tokens) if est.long_tau is None else (1 - w) * est.long_tau + w * tokens

    def record_decode(self, ms: float) -> None:
        if ms > 0:
            self.est.decode_ms = ms

    def future_tau(self) -> float | None:
        """Tokens per round to expect from here: the recent window, pulled halfway to the
        long-run figure (a hard passage does not last, nor an easy one)."""
        recent, long = self.est.tokens_per_round.value, self.est.long_tau
        if recent is None or long is None:
            return recent
        return 0.5 * recent + 0.5 * long

    def record_cloud_rate(self, ms_since_first: float, tokens_since_first: int) -> None:
        """The current Generate stream so far: ``tokens_since_first`` tokens arrived within
        ``ms_since_first`` of its first token (rates between single messages are meaningless
        on a jittery link, where messages arrive in bursts)."""
        if tokens_since_first > 0:
            self.est.cloud_ms_per_token = ms_since_first / tokens_since_first
            self._segment_tokens = tokens_since_first

    # ---- predictions -----------------------------------------------------------------------

    def predicted_round_ms(self) -> float | None:
        """A speculative round's wall time from its components at the current round trip."""
        est = self.est
        rtt, forward = est.rtt_ms.value, est.forward_ms.value
        if rtt is None or forward is None:
            return None
        device = est.device_ms.value or 2.0
        round_ms = rtt + forward + device
        depth = self.depth()
        if depth > 1 and est.chain_valid:
            # A valid sent-ahead block is verified right after its predecessor: it costs one
            # forward (and the device's time), not a whole round, but no more than ``depth``
            # blocks travel in one round trip.
            pipelined = max(forward + device, round_ms / depth)
            round_ms = est.chain_valid * pipelined + (1 - est.chain_valid) * round_ms
        return round_ms

    def predicted_speculative(self, tau: float | None = None, *, corrected: bool = True) -> float | None:
        """ms/token of speculation: the predicted round over ``tau`` tokens per round (by
        default ``future_tau``), times ``spec_bias`` (how far measured rounds were from the
        prediction) when ``corrected``."""
        round_ms = self.predicted_round_ms()
        if round_ms is None:
            return None
        tau = tau or self.future_tau() or self.PRIOR_TAU
        return round_ms / tau * (self.est.spec_bias if corrected else 1.0)

    def speculative_ms_per_token(self) -> float | None:
        """Measured while speculating, else predicted."""
        return self.est.spec.trimmed if len(self.est.spec) >= self.MIN_ROUNDS else self.predicted_speculative()

    def cloud_ms_per_token(self) -> float | None:
        if self.est.cloud_ms_per_token is not None:
            return self.est.cloud_ms_per_token
        if self.est.decode_ms is not None:
            return self.est.decode_ms + 1.0  # the replica's decoding step + a message's cost
        forward = self.est.forward_ms.value  # a verify forward: more tokens than a decoding step
        return None if forward is None else forward + 1.0

    # ---- decisions ---------------------------------------------------------------------------

    def first_path(self, max_new_tokens: int, max_k: int = 16) -> Path:
        if self.mode != "auto":
            return Path(self.mode)
        self._max_k = max_k
        if self.unpromising():
            return Path.CLOUD_ONLY  # the draft has shown it can hardly win here
        cloud, rtt = self.cloud_ms_per_token(), self.est.rtt_ms.value
        # Once rates are measured a tie goes to cloud-only: never slower than cloud-only.
        if self._current is Path.SPECULATIVE and len(self.est.spec) >= self.MIN_ROUNDS:
            spec, limit = self.est.spec.trimmed, 1.0
        elif len(self.est.tokens_per_round) >= self.MIN_ROUNDS:
            spec, limit = self.predicted_speculative(), 1.0  # tau measured, or replayed over a stream
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
            if self._segment_rounds >= 2 and self.hopeless():
                return True  # measured: not even a draft that is always right could win
            if self._segment_rounds >= 2 and self.unpromising():
                # Hardly a chance the draft can win: leave if the rounds' own rate repays it.
                gain_ms = remaining * (self.predicted_speculative() - self.cloud_ms_per_token())
                return gain_ms > 2 * self.switch_cost_ms()
            if self._segment_rounds < self.MIN_ROUNDS or len(self.est.spec) < self.MIN_ROUNDS // 2:
                return False
            # Leave only when the forecast (recent tau pulled towards the long run) agrees.
            measured, forecast = self.est.spec.trimmed, self.predicted_speculative()
            here = None if measured is None else min(measured, forecast if forecast is not None else measured)
            there = self.cloud_ms_per_token()
        else:
            if self._segment_tokens < self.MIN_TOKENS or not self._segment_probes:
                return False
            here, there = self.cloud_ms_per_token(), self.predicted_speculative()
        if here is None or there is None:
            return False
        gain_ms = remaining * (here - there)
        return there * (1 + self.margin) < here and gain_ms > 2 * self.switch_cost_ms()

    def hopeless(self) -> bool:
        """Whether speculation loses to cloud-only by the margin even if every draft of the
        longest block (max_k + 1 tokens a round) were accepted: the round trip alone rules it
        out, however few rounds were measured."""
        best, cloud = self.predicted_speculative(tau=self._max_k + 1.0, corrected=False), self.cloud_ms_per_token()
        return best is not None and cloud is not None and best > cloud * (1 + self.margin)

    def chance_to_win(self) -> float | None:
        """The posterior chance that the draft's per-position acceptance is high enough for
        speculation to beat cloud-only at all: P(a >= a*), where at a* a round of max_k drafts
        commits (predicted round time) / (cloud-only ms per token) tokens on average. None until
        both are known."""
        round_ms, cloud = self.predicted_round_ms(), self.cloud_ms_per_token()
        if round_ms is None or cloud is None:
            return None
        return self.est.acceptance.chance_at_least(break_even(round_ms / max(cloud, 1e-3), self._max_k))

    def unpromising(self) -> bool:
        """Whether the draft has less than ``WIN_CHANCE`` of being able to win here."""
        chance = self.chance_to_win()
        return chance is not None and chance < self.WIN_CHANCE

    def shadow_wanted(self, tokens: int) -> bool:
        """Whether the draft should run over the next ``tokens`` streamed tokens (the shadow,
        ``record_shadow``): always while it may win; while it is unpromising it rests and looks
        only at the last ``SHADOW_LOOK`` tokens of every ``SHADOW_PERIOD``, so a draft that
        has become good on this text is still noticed."""
        if not self.unpromising():
            return True
        position = self._shadow_clock % self.SHADOW_PERIOD
        self._shadow_clock += tokens
        if position >= self.SHADOW_PERIOD - self.SHADOW_LOOK:
            return True
        self._shadow_run, self._shadow_bonus = 0, False  # a rest ends the replayed round
        return False

    def switch_cost_ms(self) -> float:
        """What a switch costs: the round trip that opens the other stream and the replica's
        prefill of the context (a few forwards), before the other path's first token."""
        return (self.est.rtt_ms.value or 0.0) + 2 * (self.est.forward_ms.value or 0.0)

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
