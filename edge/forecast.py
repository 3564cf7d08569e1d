"""What each path will cost per token, from what the device measured (``estimates``): the
predictions the planner decides on (``planner.Planner``; its docstring has the formulas).

Predictions are computed once per new measurement (``_changed`` drops them), and the
break-even acceptance a* once per distinct set of costs: the planner is asked on every
streamed token and every round, on a device's Python.
"""

from __future__ import annotations

import math

from edgespec.edge.acceptance import bisect_acceptance
from edgespec.edge.estimates import Estimates
from edgespec.edge.policy import best_k, expected_tokens, on_line


class Forecast:
    """The predictions; ``Planner`` adds what is measured and what is decided."""

    PRIOR_ACCEPTANCE = 0.7  # per-position acceptance assumed before any round is measured
    MIN_ROUNDS = 4  # rounds of a speculative segment before it may be left on its rates (or they stand for speculation's)
    DEVICE_MS = (1.5, 0.25)  # a round's device time before any is measured: base + per draft
    PREFILL_FORWARDS = 4  # the replica's prefill in verify forwards, until a first round measures it
    REST_CHANCE = 0.01  # below this chance that the draft can win, the shadow rests (looks now and then)...
    REST_DRAFTS = 12  # ...once this many drafts were observed (two rejections in a row are no verdict)...
    REST_COST = 0.03  # ...and where running over every streamed token costs more than this share of it (SHADOW_SHARE)
    # (a draft that cheap keeps watching: a hard passage ends, and the shadow sees when)
    LEARN_DRAFTS = 48  # drafts observed before the shadow's cost is bounded by...
    SHADOW_SHARE = 0.03  # the shadow's device time, at most this share of the stream's time...
    SHADOW_PERIOD = 256  # ...and while the draft is unpromising: streamed tokens per look...
    SHADOW_LOOK = 16  # ...of which the draft is run over the last this many
    SHADOW_CONTEXT = 16  # a look's catch-up (one batched forward over the tokens a rest skipped) costs about this many tokens observed
    AHEAD_PRIOR = 0.5  # the share of blocks sent ahead that hold, worth one block, before they are measured...
    AHEAD_DECAY = 0.95  # ...and each block's weight in it, one block later

    def __init__(self, *, max_depth: int = 4):
        self.max_depth = max_depth
        self.est = Estimates()
        self._max_k = 16  # the server's max_k, told by first_path
        self._send_ahead: int | str = "auto"  # the request's setting (``use_send_ahead``)
        self._cache: dict = {}  # predictions, computed once per new measurement
        self._break_even: dict[tuple, float] = {}  # a* by its inputs (``break_even``)

    def _changed(self) -> None:
        self._cache.clear()

    def _cached(self, key, compute):
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    def use_send_ahead(self, setting: int | str) -> None:
        """The request's send-ahead setting: "auto" keeps ``depth()`` blocks in flight, n keeps
        n, 1 never sends ahead. Rounds are priced with it from the first: a client that sends
        ahead hides the round trip before it has measured a block sent ahead (a stream that
        priced speculation without it kept a 5G link's easy texts streaming at half speed)."""
        if setting != self._send_ahead:
            self._send_ahead = setting
            self._changed()

    def blocks_in_flight(self) -> int:
        return self.depth() if self._send_ahead == "auto" else int(self._send_ahead)

    def device_ms(self, k: int) -> float:
        return self._device_at(self.est.device.line(), k)

    def _device_at(self, line: tuple[float, float, float] | None, k: int) -> float:
        """``device_ms`` from the device's fitted line (``LinearFit.line``), the prior's before any."""
        base, per_draft = self.DEVICE_MS
        return on_line(line, k, base + per_draft * k)

    def verify_ms(self, k: int) -> float | None:
        """The replica's verify forward over a block of k (fitted on k once rounds are measured)."""
        forward = self.est.forward_ms.value
        return None if forward is None else self.est.forward_fit.at(k, forward)

    def fresh_round_ms(self, k: int) -> float | None:
        """A round whose block waits for the verdict before it: round trip + forward + device."""
        rtt, forward = self.est.rtt_ms.value, self.verify_ms(k)
        if rtt is None or forward is None:
            return None
        return rtt + forward + self.device_ms(k)

    def _round_costs(self) -> list[tuple[float, float]] | None:
        """Per k (index k - 1): (a fresh round, a round whose block was sent ahead and held).
        A held block is verified right after its predecessor, costing a forward and the device's
        time, but no more than ``depth`` blocks travel in one round trip. None until the round
        trip and the forward are known. Whether a sent-ahead block holds is the acceptance's to
        say (``_tokens_and_holds``); sent-ahead blocks that do not pay for their drafting end it
        (``depth()`` 1, ``ahead_pays``)."""
        def compute() -> list[tuple[float, float]] | None:
            rtt, forward = self.est.rtt_ms.value, self.est.forward_ms.value
            if rtt is None or forward is None:
                return None
            depth = self.blocks_in_flight()
            forward_line, device_line = self.est.forward_fit.line(), self.est.device.line()  # (once, not per k)
            out = []
            for k in range(1, self._max_k + 1):  # (verify_ms and device_ms at each k)
                out.append(fresh_and_held(rtt, on_line(forward_line, k, forward), self._device_at(device_line, k), depth))
            return out
        return self._cached("costs", compute)

    def wait_ms(self, k: int) -> float | None:
        """A fresh round's send -> verdict at ``k`` drafts: the round trip and the verify forward
        (a ``_round_costs`` round without the device's time); None until both are known. What
        adaptive k prices a round's wait at before its request has measured one
        (``AdaptiveK.round_prior``): the first round's wait also carried the prefill."""
        rtt, forward = self.est.rtt_ms.value, self.verify_ms(k)
        return None if rtt is None or forward is None else rtt + forward

    def _effective_round(self, k: int, holds: float) -> float | None:
        """A round at k when its block holds with chance ``holds`` (sent ahead)."""
        costs = self._round_costs()
        return None if costs is None else self._round_at(costs, k, holds)

    def _round_at(self, costs: list[tuple[float, float]], k: int, holds: float) -> float:
        """``_effective_round`` from the per-k ``costs`` (``_round_costs``)."""
        fresh, held = costs[max(1, min(int(k), self._max_k)) - 1]
        return holds * held + (1 - holds) * fresh

    def _by_position(self) -> list[float]:
        """c_1..c_(max_k + 1): measured, else the prior's."""
        if not len(self.est.acceptance):
            return [self.PRIOR_ACCEPTANCE] * (self._max_k + 1)
        return self._cached("by_position", lambda: self.est.acceptance.by_position(self._max_k + 1))

    def _tokens_and_holds(self) -> tuple[list[float], list[float]]:
        """Per k (index k, 1..max_k): E[tokens | k] and the chance a block of k sent ahead holds."""
        return self._cached("tokens", lambda: tokens_and_holds(self._by_position(), self._max_k))

    def expected_tokens(self, k: int) -> float:
        """A round of ``k`` drafts' expected tokens from acceptance by position (the prior's
        before any is measured): what ``policy.AdaptiveK(tokens=...)`` may choose k by."""
        return self._tokens_and_holds()[0][max(1, min(int(k), self._max_k))]

    def reachable_k(self) -> int | None:
        """The k the adaptive policy settles on from the acceptance measured so far."""
        def compute() -> int | None:
            costs = self._round_costs()
            if costs is None:
                return None
            return self._best_k(costs, *self._tokens_and_holds())
        return self._cached("k", compute)

    def _best_k(self, costs: list[tuple[float, float]], tokens: list[float], holds: list[float]) -> int:
        """The k the adaptive policy's rule picks for these round costs and E[tokens | k] and holds."""
        return best_k(lambda k: tokens[k], lambda k: self._round_at(costs, k, holds[k]), 1, self._max_k)

    def predicted_round_ms(self, k: int | None = None) -> float | None:
        """A speculative round's wall time at ``k`` (default: the k the policy reaches)."""
        k = k or self.reachable_k()
        if k is None:
            return None
        k = max(1, min(int(k), self._max_k))
        return self._effective_round(k, self._tokens_and_holds()[1][k])

    def predicted_speculative(self, tau: float | None = None, *, corrected: bool = True) -> float | None:
        """ms/token of speculation at the k the policy reaches (``tau`` given: a round of
        max_k drafts committing ``tau`` tokens), times the measured bias when ``corrected``."""
        bias = self.est.spec_bias if corrected else 1.0
        if tau is not None:
            round_ms = self._effective_round(self._max_k, 1.0 if tau >= self._max_k + 1 else 0.0)
            return None if round_ms is None else round_ms / tau * bias
        k = self.reachable_k()
        round_ms = None if k is None else self.predicted_round_ms(k)
        if k is None or round_ms is None:
            return None
        return round_ms / self._tokens_and_holds()[0][k] * bias

    def segment_forecast(self) -> float | None:
        """``predicted_speculative`` from this segment's rounds (verified or replayed) alone, at
        the k that is best for them; None before its first."""
        def compute() -> float | None:
            c, costs = self.est.acceptance.segment_by_position(self._max_k + 1), self._round_costs()
            if c is None or costs is None:
                return None
            tokens, holds = tokens_and_holds(c, self._max_k)
            k = self._best_k(costs, tokens, holds)
            return self._round_at(costs, k, holds[k]) / tokens[k] * self.est.spec_bias
        return self._cached(("segment forecast", self.est.spec_bias), compute)  # (the bias moves after a round's costs)

    def speculative_ms_per_token(self) -> float | None:
        """Measured while speculating, else predicted."""
        return self.est.spec.trimmed if len(self.est.spec) >= self.MIN_ROUNDS else self.predicted_speculative()

    def stream_ms_per_token(self) -> float | None:
        """The stream's own rate: measured (first token to last, a stall left out until the
        stream caught up), moved by as much as the replica's own figure for its streams has moved
        since (``replica_stream_figure``); else that figure; else a verify forward and a message.

        The measured rate is this device's link and the replica's load when it streamed: a
        stream measured on a busy replica priced cloud-only at 20.6 ms/token for five later
        texts of a 4G run whose streams, measured beside them, took 12.4-16.2, and kept those
        texts speculating at 17-26. The replica's figure, probed beside every segment, moves
        with its load; the link's share of the measured rate stays."""
        est = self.est
        replica = self.replica_stream_figure()
        if est.cloud_ms_per_token is not None:
            if replica is None or est.stream_basis_ms is None:
                return est.cloud_ms_per_token
            return max(est.cloud_ms_per_token + replica - est.stream_basis_ms, est.decode_ms or 0.0, 0.1)
        if replica is not None:
            return replica
        forward = est.forward_ms.value  # a verify forward: more tokens than a decoding step
        return None if forward is None else forward + 1.0

    def replica_stream_figure(self) -> float | None:
        """What the replica reports of its Generate streams: its time per token (reply to reply),
        at least its decoding step and a message's cost; None before it has told either."""
        est = self.est
        if est.decode_ms is not None:
            return max(est.decode_ms + 1.0, est.replica_stream_ms or 0.0)
        return est.replica_stream_ms

    def cloud_ms_per_token(self) -> float | None:
        """Cloud-only's cost per token: the stream's rate and the shadow draft's device time over
        its share of the stream (counted whole: where the device's cores also carry the stream,
        as on one machine, it competes with it; the share keeps it under ``SHADOW_SHARE``)."""
        stream = self.stream_ms_per_token()
        shadow = self.est.shadow_ms.value
        if stream is None or shadow is None:
            return stream
        return stream + self.shadow_share(stream) * shadow

    def _wins_at(self, a: float, costs: list[tuple[float, float]], cloud: float) -> bool:
        """Whether a draft of geometric per-position acceptance ``a`` beats the stream (``cloud``
        ms/token) at its best k, for these round costs."""
        best = math.inf
        for k, (fresh, held) in enumerate(costs, 1):
            holds = a ** (k + 1)
            best = min(best, (holds * held + (1 - holds) * fresh) / expected_tokens(a, k))
        return best <= cloud

    def break_even(self) -> float | None:
        """a*: the least per-position acceptance at which speculation (at its best k, with the
        cost model above) beats the stream."""
        cloud, costs = self.stream_ms_per_token(), self._round_costs()
        if costs is None or cloud is None:
            return None
        # NOTE: the figures move a little with every token and round; 0.2% of any is no news, so
        # a* is kept by its inputs at that grain, across measurements (a bisection per round is
        # a millisecond of a device's Python).
        grain = lambda ms: round(math.log(max(ms, 1e-3)) * 500)  # noqa: E731
        key = (grain(cloud),) + tuple(grain(ms) for pair in costs for ms in pair)
        if key not in self._break_even:
            if len(self._break_even) > 256:
                self._break_even.clear()
            self._break_even[key] = bisect_acceptance(lambda a: self._wins_at(a, costs, cloud))
        return self._break_even[key]

    def chance_to_win(self) -> float | None:
        """The posterior chance that the draft's per-position acceptance reaches the break-even
        a* (``break_even``). None until the round and the stream are both known."""
        a_star = self.break_even()
        if a_star is None:
            return None
        return self._cached(("chance", a_star), lambda: self.est.acceptance.chance_at_least(a_star))

    def long_run_chance_to_win(self) -> float | None:
        """``chance_to_win`` over every round kept, not the last ``ROUNDS``."""
        a_star = self.break_even()
        if a_star is None:
            return None
        return self._cached(("long chance", a_star), lambda: self.est.acceptance.long_run_chance_at_least(a_star))

    def text_chance_to_win(self) -> float | None:
        """``chance_to_win`` over this request's own rounds (``Acceptance.text_chance_at_least``)."""
        a_star = self.break_even()
        if a_star is None:
            return None
        return self._cached(("text chance", a_star), lambda: self.est.acceptance.text_chance_at_least(a_star))

    def new_text_chance_to_win(self) -> float | None:
        """The chance that a new text lets the draft reach a*: the share of earlier texts that
        did (``Acceptance.new_text_chance_at_least``); before any text ended, the long run's."""
        a_star = self.break_even()
        if a_star is None:
            return None
        chance = self.est.acceptance.new_text_chance_at_least(a_star)
        return self.long_run_chance_to_win() if chance is None else chance

    def drafts_observed(self) -> float:
        """Drafts (verified or replayed) the acceptance estimates rest on."""
        alpha, beta = self.est.acceptance.posterior
        return alpha + beta - 1.0

    def shadow_share(self, stream_ms: float | None = None) -> float:
        """The share of streamed tokens the shadow runs over (looks included): all of them while
        the draft is little known (fewer than ``LEARN_DRAFTS`` observed) or while that costs
        under ``SHADOW_SHARE`` of the stream's time, else that share; while the draft can
        hardly win (below ``REST_CHANCE``, ``REST_DRAFTS`` observed) and watching costs over
        ``REST_COST`` of the stream, at most ``(SHADOW_LOOK + SHADOW_CONTEXT) / SHADOW_PERIOD``.
        The stream's rate is ``stream_ms``, else ``stream_ms_per_token``: the rate cloud-only's
        price reads (``cloud_ms_per_token``), so the shadow runs on the share its price assumes."""
        stream_ms = stream_ms or self.stream_ms_per_token()
        # (asked on every streamed token: computed once per measurement and 0.1 ms of stream rate)
        key = ("share", None if stream_ms is None else round(stream_ms, 1))
        return self._cached(key, lambda: self._shadow_share(stream_ms))

    def _shadow_share(self, stream_ms: float | None) -> float:
        share = 1.0
        shadow_ms = self.est.shadow_ms.value
        if shadow_ms and stream_ms and self.drafts_observed() >= self.LEARN_DRAFTS:
            share = min(1.0, self.SHADOW_SHARE * stream_ms / shadow_ms)
        costly = not (shadow_ms and stream_ms) or shadow_ms > self.REST_COST * stream_ms
        # (a* only where it can matter: a cheap shadow watches every token whatever the chance,
        # and a* moves with every round, so asking for it here cost a bisection per round)
        if costly and self.drafts_observed() >= self.REST_DRAFTS:
            chance = self.chance_to_win()
            if chance is not None and chance < self.REST_CHANCE:
                share = min(share, (self.SHADOW_LOOK + self.SHADOW_CONTEXT) / self.SHADOW_PERIOD)
        return share

    def switch_cost_ms(self) -> float:
        """What a switch costs: the round trip that opens the other stream and the replica's
        prefill of the context (measured on first rounds, else a few forwards), before the other
        path's first token."""
        prefill = self.est.prefill_ms.value
        if prefill is None:  # a prompt's prefill costs several forwards (10 on the demo pair)
            prefill = self.PREFILL_FORWARDS * (self.est.forward_ms.value or 0.0)
        return (self.est.rtt_ms.value or 0.0) + prefill

    def depth(self) -> int:
        """Blocks to keep in flight: enough to cover the round trip, while a block sent ahead
        pays for its drafting (``ahead_pays``); else 1."""
        def compute() -> int:
            depth = self._covering_depth()
            return 2 if depth is None else depth if self.ahead_pays(depth) else 1
        return self._cached("depth", compute)

    def _covering_depth(self) -> int | None:
        """Blocks that cover the round trip, each a forward and the device's time; None until
        the round trip and the forward are known."""
        rtt, forward = self.est.rtt_ms.value, self.est.forward_ms.value
        if rtt is None or forward is None:
            return None
        per_block = forward + self.device_ms(4)
        return max(2, min(self.max_depth, 1 + math.ceil(rtt / max(per_block, 1.0))))

    def ahead_pays(self, depth: int | None = None) -> bool:
        """Whether a block sent ahead saves on average more time than the device spends on it:
        the share of them that held (measured, ``AHEAD_PRIOR`` before any was) times what a held
        round of max_k drafts saves against a fresh one at ``depth`` blocks in flight, against
        a fresh round's device time. A held block saves most of a round trip, so on a far link
        one in four holding pays many times over (4G: 25% held, 14.1 -> 12.5 ms/token at two in
        flight), where on a near one it saves about the round trip and never pays."""
        depth = depth or self._covering_depth()
        rtt, forward = self.est.rtt_ms.value, self.verify_ms(self._max_k)
        if depth is None or rtt is None or forward is None:
            return True  # nothing measured: try it
        device = self.device_ms(self._max_k)
        fresh, held = fresh_and_held(rtt, forward, device, depth)
        return self.ahead_share() * (fresh - held) >= device

    def ahead_share(self) -> float:
        """The share of blocks sent ahead that held: recent ones weigh most (``AHEAD_DECAY``),
        and a prior worth one block at ``AHEAD_PRIOR``, the share before any was sent (the
        first discard is no verdict)."""
        return (self.est.ahead_held + self.AHEAD_PRIOR) / (self.est.ahead_sent + 1.0)


def fresh_and_held(rtt: float, verify: float, device: float, depth: int) -> tuple[float, float]:
    """A fresh round (round trip + verify forward + device) and a round whose block was sent
    ahead and held: verified right after its predecessor, but no more than ``depth`` blocks in
    one round trip."""
    fresh = rtt + verify + device
    return fresh, max(verify + device, fresh / depth) if depth > 1 else fresh


def tokens_and_holds(c: list[float], max_k: int) -> tuple[list[float], list[float]]:
    """From acceptance by position c_1..c_(max_k + 1), per k (index k, 1..max_k): E[tokens | k]
    and the chance a block of k sent ahead holds (all k accepted and the bonus guessed)."""
    tokens, holds, survive = [1.0], [0.0], 1.0
    for k in range(1, max_k + 1):
        survive *= c[k - 1]
        tokens.append(tokens[-1] + survive)
        holds.append(survive * c[k])
    return tokens, holds
