"""Which path produces the next tokens, and how many blocks to keep in flight.

Per request, ``k="auto"`` (the default) lets the planner choose between speculation (draft
here, verify in the cloud: one round trip per block) and cloud-only streaming (the target
decodes every token; the round trip is paid once). Both predictions are per token, like with
like: neither carries the replica's prefill of the context, which both paths pay once (a
segment's first round is left out of every rate; a switch pays it again, ``switch_cost_ms``).

Speculation, at the k the adaptive policy reaches (``policy.best_k``, the policy's own rule):

    round(k)     = round trip + verify forward + device(k)       (device: drafting k, fitted on k)
    ahead(k)     = c_1 ... c_k * c_(k+1)                          (a block sent ahead holds: all k
                                                                   accepted and the bonus guessed)
    effective(k) = ahead(k) * max(forward + device(k), round(k) / depth) + (1 - ahead(k)) * round(k)
    spec ms/token = min over k of effective(k) / E[tokens | k]   x the measured bias

E[tokens | k] comes from acceptance by position (``acceptance.Acceptance``), so the first short
probing blocks of a good draft predict what the longer blocks the policy moves to will commit.
Send-ahead enters with the request's setting (``use_send_ahead``: "auto" keeps ``depth`` blocks
in flight, 1 none) from the first prediction, not only once a block went ahead: whether a block
sent ahead holds is ahead(k)'s to say. ``depth`` drops to 1 where blocks sent ahead do not pay
for their drafting: the share measured to hold (``record_ahead``) times what a held round saves
(most of a round trip) below a fresh round's device time (on 4G a quarter holding pays; on a
near link a held round saves about the round trip, which never does). The bias is measured
round time over predicted round time at each round's own k and kind (fresh, or sent ahead and
held): it corrects the costs, and whether blocks hold is the acceptance's to say.

Cloud-only: the stream's measured rate (first token to last; a loss stall is left out until the
burst of tokens behind it has come, ``record_cloud_rate``); before this device has streamed,
what the replica measured of its own streams, reply to reply (Info's ``stream_ms``: the step
plus the scheduling and sending around it), never less than its decoding step and 1 ms; plus the shadow draft's device time (below) over the share of the stream it
runs on, counted whole since on a device whose cores carry the stream too it competes.

A generation starts on the path predicted faster over its budget (a start costs no switch).
With little known of the draft (under ``ENTER_DRAFTS`` drafts observed) it explores
speculation, whose first block rides with the Open, where a hopeless draft would lose under
``EXPLORE_LOSS`` of the request (a second round and a switch: near links); elsewhere it
streams and lets the shadow judge the draft at no risk. Once the shadow has observed
``REST_DRAFTS`` drafts, that loss is weighed by the chance that the draft cannot win: a
client's first short request streams, and when its shadow found the draft good the next
request tries speculation from its start (a hopeless draft's shadow vouches for nothing).
Texts differ (one prompt's acceptance says little of the next one's), so where exploring is
that cheap (the whole loss) a new request also tries speculation when the last text left the
draft unpromising or the forecast behind, as long as enough earlier texts won
(``new_text_chance_to_win``: the share of texts whose acceptance reached a*; pooled rounds
would say only what the mean text does); its second round tells.
It switches, in either direction, when the other path's prediction beats the current one by
``margin`` and the remaining tokens repay two switches; leaving speculation takes the best of
its measured rate, the forecast and its rate over the segment's last ``PASSAGE_TOKENS`` tokens
(a hard passage does not last: its rounds are many and short, so the last rounds and the
forecast, which weighs rounds, describe only the passage), entering it a forecast
resting on at least ``ENTER_DRAFTS`` observed drafts and a chance of ``ENTER_CHANCE`` that the
draft can win (a run of lucky tokens is no proof; over the last rounds, or over this text's
own once the stream's replays rest on ``ENTER_DRAFTS`` drafts): the forecast over every
round kept, or the one over the stream's own replayed rounds once they rest on
``ENTER_DRAFTS`` drafts, where that is faster (the same weighing of rounds would keep an
easy text after a hard one streaming: the hard text's many short rounds fill what is kept).

A hopeless draft is left fast, a good one that started slowly is not. Every round (and every
round replayed over a stream) is evidence on the per-position acceptance a; with Jeffreys'
prior, a | rounds ~ Beta(1/2 + accepted, 1/2 + rejected). The break-even a* is the least
acceptance at which speculation (at its best k, geometric acceptance, the cost model above)
beats the stream; ``chance_to_win`` = P(a >= a*). Below ``WIN_CHANCE`` (on this text's own
rounds, and where this text's rounds price staying above the switches) speculation is left
on the segment's second or third round (the first one rides with the Open and costs what a
stream's first token does; from ``MIN_ROUNDS`` on the segment's measured rate decides, with
the forecast: a posterior over the last rounds alone would leave at every hard passage), and
a generation starts cloud-only. A good draft whose first
round was unlucky keeps a fair chance (one round that accepts nothing leaves P ~ 0.13 where
a* ~ 0.6), and if it is left it comes back through the shadow.

Coming back: while streaming cloud-only the device probes the round trip (a cheap Info call,
at the stream's start and every 0.5 s; a stream is left only once it has one, after
``MIN_TOKENS``) and runs its draft over the streamed tokens, the shadow. Greedy, each streamed token is a hit
or a miss (``record_shadow``); sampled, each streamed token y carries the chance a draft there
would have been accepted (``record_shadow_sampled``): in coupled mode (the SDK's default for
sampled requests) exactly 1 or 0, since y is t_P = argmax p/E_P and the device knows E_P: a
hit iff its own coupled draft argmax q/E_P is y; otherwise min(1, q(y) / p(y)), with p(y) as
the stream sends it (``GenerateResponse.token_probs``), whose mean over y ~ p is exact mode's
acceptance sum_x min(p, q) (for a lookup draft x, a point mass: the event y == x, whose chance
is p(x)); from a server that sends no p(y), q(y), whose mean sum_x p(x) q(x) is token-only
verification's acceptance, a lower bound. Rounds of ``max_k`` drafts are replayed over
them (``acceptance.Replay``) and feed the same acceptance, so the speculative prediction
stays current and speculation comes back when it pays. The shadow's cost is bounded
(``shadow_share``, ``shadow_wanted``): it runs over the whole stream while the draft is little
known (``LEARN_DRAFTS``) or while that costs under ``SHADOW_SHARE`` of the stream's time, else
over looks of ``SHADOW_LOOK`` tokens spaced to keep that share; once the draft can hardly win
(``REST_CHANCE``, on ``REST_DRAFTS`` observed: two rejections are no verdict), unless watching
every token costs under ``REST_COST`` of the stream (a hard passage ends), over at most 1/8
of the stream (``SHADOW_LOOK`` of every ``SHADOW_PERIOD``, each look first catching the draft
up on what the rest skipped in one batched forward, costed as ``SHADOW_CONTEXT`` tokens). A
request that starts streaming while a new text may suit the draft watches its first
``TEXT_LOOK`` tokens whole first (``first_path``): its own chance needs that many drafts.

Every decision is logged (``switch_log``: the request's start and each switch, with the two
predictions that made it). The planner reads no clock: all time is what the driver measured.
It lives as long as the client, so later generations start from what earlier ones measured.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass
from enum import Enum

from edgespec.edge.acceptance import Replay
from edgespec.edge.estimates import TRIM_SAMPLES, WINDOW, Estimates, Median, Rate  # noqa: F401 (re-exported)
from edgespec.edge.forecast import Forecast


class Path(str, Enum):
    SPECULATIVE = "speculative"
    CLOUD_ONLY = "cloud_only"


@dataclass(frozen=True)
class Switch:
    """One decision: the path a request started on (``from_path`` None) or a switch."""

    at_token: int  # tokens of the request generated before it
    from_path: str | None
    to_path: str
    predicted_spec_ms_per_token: float | None
    predicted_cloud_ms_per_token: float | None
    reason: str

    def to_dict(self) -> dict:
        return asdict(self)


class Planner(Forecast):
    """Chooses the path and the send-ahead depth; ``mode``: "auto", "speculative" or "cloud_only"."""

    MIN_TOKENS = 8  # tokens of a cloud-only segment (and one round-trip probe) before it may be left
    EXPLORE_LOSS = 0.1  # an unknown draft is tried first only where a hopeless one loses less than this
    ENTER_CHANCE = 0.9  # speculation is entered on a forecast only at this chance that the draft can win
    ENTER_DRAFTS = 32  # ...and after this many drafts observed (verified or replayed)
    WIN_CHANCE = 0.1  # below this posterior chance that the draft can win, speculation is left
    NEW_TEXT_CHANCE = 0.2  # ...and a new text after an unpromising one tries it from this share of texts won
    TEXT_LOOK = 48  # a request that starts streaming where a new text may win: its shadow watches this many first
    PASSAGE_TOKENS = 64  # speculation is left mid-text only when its rate over this many tokens loses too
    # (MIN_ROUNDS, the shadow's and the forecast's own settings: ``forecast.Forecast``)

    def __init__(self, mode: str = "auto", *, margin: float = 0.05, max_depth: int = 4):
        if mode not in ("auto", "speculative", "cloud_only"):
            raise ValueError(f"mode must be auto, speculative or cloud_only, got {mode!r}")
        if not 0 <= margin < 1:
            raise ValueError(f"margin must be in [0, 1), got {margin}")
        super().__init__(max_depth=max_depth)
        self.mode, self.margin = mode, margin
        self.switch_log: list[Switch] = []  # this request's decisions (reset by first_path)
        self._segment_rounds = self._segment_tokens = self._segment_probes = 0
        self._current: Path | None = None
        self._budget = 0  # the request's max_new_tokens, told by first_path
        self._replay = Replay(self._max_k)
        self._shadow_clock = 0  # streamed tokens while the shadow ran on a share of the stream
        self._text_look = 0  # streamed tokens the shadow still watches whole at this request's start
        # this speculative segment's last rounds: (wall ms, tokens); each committed a token at least
        self._segment_log: deque[tuple[float, int]] = deque(maxlen=self.PASSAGE_TOKENS)

    # ---- what was measured ---------------------------------------------------------------

    def begin(self, path: Path) -> None:
        """A new segment starts: its own figures must come in before it is left (a speculative
        segment's rate is its own: the last one's may have been measured on another link)."""
        self._segment_rounds = self._segment_tokens = self._segment_probes = 0
        self._segment_log.clear()
        self._end_replay()
        self.est.acceptance.begin_segment()
        # Blocks sent ahead are discarded where acceptance is low: a hard passage's record of
        # them (depth 1) must not price the next segment, whose holds ahead(k) tells (on 4G an
        # easy text's stream priced speculation at depth 1, 11.5 ms/token against the stream's
        # 8.8, where blocks in flight ran it at 4.5); its own blocks sent ahead measure it anew.
        self.est.ahead_sent = self.est.ahead_held = 0.0
        if path is Path.SPECULATIVE:
            self.est.spec.samples.clear()
            self.est.round_ms.samples.clear()
        self._current = path
        self._changed()

    def record_rtt(self, ms: float) -> None:
        self.est.rtt_ms.add(ms)
        self._segment_probes += 1
        self._changed()

    def record_forward(self, ms: float) -> None:
        if ms > 0:
            self.est.forward_ms.add(ms)
            self._changed()

    def record_replica_forward(self, ms: float) -> None:
        """The replica's recent verify forward as it reports it (Info, probed beside a stream).
        No round measures the forward while streaming: without this, one slow forward measured
        under load (220 ms against 15) priced speculation out of every later request. It moves
        the fitted line's level, at the k its rounds had, not its slope."""
        if ms <= 0:
            return
        fit = self.est.forward_fit
        if not fit.empty:
            fit.add(fit.mean_x, ms)
        self.record_forward(ms)

    def record_round(
        self, *, wall_ms: float, wait_ms: float | None, forward_ms: float, tokens: int, k: int | None = None
    ) -> None:
        """One verified round as the device saw it: wall time since the last verdict (drafting
        included), send -> verdict (None for a block sent ahead: it waited at the verifier,
        its wait is no round trip), the server's forward, and the block's k drafts (its chain;
        None: the round tells nothing about acceptance).

        A segment's first round also carried the Open (the replica's prefill of the context, the
        draft's own): both paths pay a prefill, so only its tokens count, not its times."""
        est = self.est
        first = self._segment_rounds == 0
        self._segment_rounds += 1
        est.tokens_per_round.add(tokens, 1)
        if k is not None:
            est.acceptance.add(min(max(tokens - 1, 0), k), k)
        self._changed()
        if first:
            # The Open's prefill rode with this round: what its wait took beyond a round trip and
            # a forward (wherever the replica accounts it) is what a switch pays again.
            rtt, forward = est.rtt_ms.value, est.forward_ms.value
            if wait_ms is not None and rtt is not None and forward is not None:
                est.prefill_ms.add(max(wait_ms - rtt - forward, 0.0))
            return
        self.record_forward(forward_ms)
        if k is not None and forward_ms > 0:
            est.forward_fit.add(k, forward_ms)
        if wait_ms is not None:
            est.rtt_ms.add(max(wait_ms - forward_ms, 0.0))
            if k is not None:
                est.device.add(k, max(wall_ms - wait_ms, 0.0))
        predicted = self._round_as_run(k, held=wait_ms is None)
        est.spec.add(wall_ms, tokens)
        self._segment_log.append((wall_ms, tokens))
        est.round_ms.add(wall_ms, 1)
        if predicted:
            est.bias.add(wall_ms, predicted)
            bias = est.bias.trimmed  # (None only while it has no sample)
            if len(est.bias) >= 4 and bias is not None:
                est.spec_bias = min(max(bias, 2 / 3), 1.5)
        if est.ahead_sent and not self.ahead_pays():
            # No block goes ahead at this rate, so nothing would update it: forget slowly, so
            # that send-ahead is tried again after a few dozen rounds.
            self._weigh_ahead(0.98, 0.0, 0.0)
        # (no ``_changed`` here: what changed since ``_round_as_run`` computed the round's costs,
        # the rates and the bias, is read fresh by every prediction, so the costs stay cached
        # for the ``should_switch`` that follows; a depth that changed went through ``_weigh_ahead``)

    def _round_as_run(self, k: int | None, *, held: bool) -> float | None:
        """What a round of ``k`` drafts was predicted to cost as it ran: a block that waited for
        its verdict a fresh round, one sent ahead that held a held one (``_round_costs``). The
        bias compares like with like, so it corrects the costs alone: against the mix of the
        two weighted by the chance a block holds, the fresh rounds of a hard text after easy
        ones (blocks expected to hold on the last texts' acceptance) taught a bias of 1.3 that
        then priced the next easy text's speculation a third too dear."""
        return self.predicted_round_ms() if k is None else self._effective_round(k, 1.0 if held else 0.0)

    def record_drafting(self, ms: float, k: int) -> None:
        """A block of ``k`` drafts took ``ms`` of the device's drafting (not one that fed the
        Open's context: its time is no per-draft cost)."""
        self.est.drafting.add(ms, k)

    def drafting_ms(self) -> float | None:
        """The device's drafting per draft token over the last blocks, on any request: where
        adaptive k starts a request's price of a draft (``Policies``); None before any."""
        return self.est.drafting.value

    def record_ahead(self, valid: bool) -> None:
        """A block sent ahead was verified (``valid``) or discarded."""
        self._weigh_ahead(self.AHEAD_DECAY, 1.0, 1.0 if valid else 0.0)

    def _weigh_ahead(self, decay: float, sent: float, held: float) -> None:
        """Blocks sent ahead and held, each count's past weighed by ``decay`` (``ahead_share``)."""
        est = self.est
        est.ahead_sent, est.ahead_held = decay * est.ahead_sent + sent, decay * est.ahead_held + held
        self._changed()

    def record_shadow(self, hits, k: int | None = None, *, draft_ms: float | None = None) -> None:
        """Greedy: cloud-only tokens in order, each True where the draft (run over the stream)
        predicted it; ``draft_ms``: the draft's time over them, when measured. Rounds of
        ``max_k`` drafts are replayed over them (``k``, the policy's current k, is not needed:
        acceptance by position tells what a shorter block commits)."""
        self.record_shadow_sampled([1.0 if hit else 0.0 for hit in hits], k, draft_ms=draft_ms)

    def record_shadow_sampled(self, chances, k: int | None = None, *, draft_ms: float | None = None) -> None:
        """Sampled (and greedy): per cloud-only token in order, the chance a draft there would
        have been accepted (the module docstring: 1.0 or 0.0 for a lookup point mass, q of the
        streamed token for a model draft); ``draft_ms``: the draft's time over them."""
        chances = list(chances)
        if self._replay.k != self._max_k:
            self._replay = Replay(self._max_k)
        rounds = self._replay.feed(chances)
        for reached, accepted, tokens in rounds:
            self.est.acceptance.add_counts(reached, accepted)
            self.est.tokens_per_round.add(tokens, 1)
        if draft_ms is not None and chances:
            self.est.shadow_ms.add(draft_ms, len(chances))
        if rounds:  # (between rounds nothing a prediction reads has changed: a token costs no recompute)
            self._changed()

    def _end_replay(self) -> None:
        """The shadow's stream pauses or ends: what it observed of the round in progress counts."""
        pending = self._replay.restart()
        if pending is not None:
            self.est.acceptance.add_counts(pending[0], pending[1])
            self._changed()

    def record_first_token(self, ms: float) -> None:
        """A Generate stream's first token came ``ms`` after the call: beyond a round trip and a
        decoding step, the replica's prefill of the context, which a switch pays again (so the
        way back to speculation is priced from what this link and replica measured, not from a
        guess in forwards)."""
        est = self.est
        rtt, step = est.rtt_ms.value, est.decode_ms or est.forward_ms.value
        if rtt is not None and step is not None and ms > 0:
            est.prefill_ms.add(max(ms - rtt - step, 0.0))
            self._changed()

    def record_decode(self, ms: float, *, stream_ms: float = 0.0) -> None:
        """The replica's decoding step and, from a server that tells it, its streams' time per
        token (the step plus the scheduling and sending around it): a stream's price until this
        device has measured one of its own, and after, how far the replica's load has moved it
        (``Forecast.stream_ms_per_token``). Probed beside every segment."""
        if ms > 0:
            self.est.decode_ms = ms
        if stream_ms > 0:
            self.est.replica_stream_ms = stream_ms
        self._changed()

    def record_cloud_rate(self, ms_since_first: float, tokens_since_first: int, *, messages: int = 0,
                          slowest: tuple[float, int, int] = (0.0, 0, 0)) -> None:
        """The current Generate stream so far: ``tokens_since_first`` tokens arrived within
        ``ms_since_first`` of its first token, in ``messages`` messages (rates between single
        messages are meaningless on a jittery link, where messages arrive in bursts).

        ``slowest``: the message that waited longest per token (its wait, its tokens, and the
        stream's tokens once it came). A loss stall holds the stream's tokens back, and the
        replica's, made meanwhile, then arrive in a burst: counted whole until then, the stall
        once sent a satellite stream to speculate at 2.4x its cost. From ``TRIM_SAMPLES``
        messages on, until the tokens from that message on would have taken its wait at the
        rate without it (the stream caught up), that message is left out, as a speculative
        segment's rate leaves out its slowest round; after, the stream's whole rate counts
        (left out then, the burst's tokens would count as free)."""
        if tokens_since_first <= 0:
            return
        self._segment_tokens = tokens_since_first  # (cached figures do not depend on it; a* is keyed by it)
        rate, (wait, tokens, at) = ms_since_first / tokens_since_first, slowest
        if messages >= TRIM_SAMPLES and 0 < tokens < tokens_since_first:
            without = max((ms_since_first - wait) / (tokens_since_first - tokens), self.est.decode_ms or 0.0)
            if without > 0 and (tokens_since_first - at + tokens) * without < wait:  # not caught up yet
                rate = without
        self.est.cloud_ms_per_token = rate
        self.est.stream_basis_ms = self.replica_stream_figure()  # the replica's figure it was measured beside

    # ---- decisions ---------------------------------------------------------------------------

    def first_path(self, max_new_tokens: int, max_k: int = 16) -> Path:
        """The path a request starts on. One that starts streaming while a new text may suit the
        draft (``NEW_TEXT_CHANCE`` of the last texts won) has its shadow watch its first
        ``TEXT_LOOK`` tokens whole, whatever its share: at a share's looks (16 tokens in 42, or
        in 256 while the last texts' rounds say unpromising) the text's own chance rests on too
        few drafts to bring it back within the request. On 5G, after three hard texts, four
        started streaming and two easy ones streamed to their end at 7.1 and 6.8 ms/token where
        the always-speculating arms ran them at 2.1-5.5. The look costs ``TEXT_LOOK`` drafted
        tokens a request (14 ms at 0.3 ms a token)."""
        path = self._first_path(max_new_tokens, max_k)
        chance = self.new_text_chance_to_win() if path is Path.CLOUD_ONLY and self.mode == "auto" else None
        self._text_look = self.TEXT_LOOK if chance is not None and chance >= self.NEW_TEXT_CHANCE else 0
        return path

    def _first_path(self, max_new_tokens: int, max_k: int) -> Path:
        self.switch_log = []
        if self.mode != "auto":
            return Path(self.mode)
        if max_k != self._max_k:
            self._max_k = max_k
            self._changed()
        self._budget = max_new_tokens
        self._end_replay()  # what the shadow observed of the last request's round in progress counts, for its text
        self.est.acceptance.end_text()  # the last request was another text
        self._changed()
        cloud, rtt = self.cloud_ms_per_token(), self.est.rtt_ms.value or 0.0
        if self.unpromising():
            chance = self.new_text_chance_to_win()
            if chance is None or chance < self.NEW_TEXT_CHANCE or cloud is None or self.exploring_costs_too_much(max_new_tokens):
                return self._decide(0, None, Path.CLOUD_ONLY, self.predicted_speculative(), cloud, "draft unpromising")
            # The last text went badly, enough earlier ones did not: a new text may suit the
            # draft (one text's acceptance says little of the next one's); its second round tells.
            spec = self.predicted_speculative(tau=max_k + 1.0)
            return self._decide(0, None, Path.SPECULATIVE, spec, cloud, f"a new text: earlier texts say it can win (P {chance:.2f})")
        if self.drafts_observed() >= self.ENTER_DRAFTS:  # a request's start costs no switch: the forecast decides
            spec, why = self.predicted_speculative(), "predicted"
        else:  # acceptance is unknown until measured: explore unless an always-right draft would lose
            spec, why = self.predicted_speculative(tau=max_k + 1.0), "exploring the draft"
            if cloud is not None and self.exploring_costs_too_much(max_new_tokens, weigh_chance=True):
                return self._decide(0, None, Path.CLOUD_ONLY, spec, cloud, "the shadow judges the draft: a wrong guess costs too much here")
        if spec is None or cloud is None:
            return self._decide(0, None, Path.SPECULATIVE, spec, cloud, "nothing measured: speculate, and learn")
        # Speculation pays one more round trip to start (the Open, then the first verdict).
        faster = 2 * rtt + max_new_tokens * spec <= rtt + max_new_tokens * cloud
        if not faster and (self.new_text_chance_to_win() or 0.0) >= 0.5 and not self.exploring_costs_too_much(max_new_tokens):
            # The forecast leans on the last text; over texts the draft wins more often than not,
            # and trying costs little here: a new text gets its own first rounds.
            return self._decide(0, None, Path.SPECULATIVE, spec, cloud, "a new text: most texts win, trying costs little")
        return self._decide(0, None, Path.SPECULATIVE if faster else Path.CLOUD_ONLY, spec, cloud, why)

    def exploring_costs_too_much(self, max_new_tokens: int, *, weigh_chance: bool = False) -> bool:
        """Whether speculating on a draft would lose more than ``EXPLORE_LOSS`` of the request if
        it were hopeless: a second round (the first rides with the Open) and the switch away.
        Then the request streams and the shadow judges the draft, at no risk. ``weigh_chance``
        (a draft still little known): the loss is weighed by the chance that the draft cannot
        win once ``REST_DRAFTS`` drafts were observed (a client's first short request streamed
        and its shadow found the draft good: the next request tries it, rather than streaming
        until ``ENTER_DRAFTS`` are observed); before that it counts whole."""
        fresh, cloud = self.fresh_round_ms(4), self.stream_ms_per_token()
        if fresh is None or cloud is None:
            return False
        loss = max(fresh - cloud, 0.0) + self.switch_cost_ms()
        chance = self.chance_to_win() if weigh_chance and self.drafts_observed() >= self.REST_DRAFTS else None
        return (1.0 - (chance or 0.0)) * loss > self.EXPLORE_LOSS * max_new_tokens * cloud

    def _decide(self, at: int, current: Path | None, to: Path, spec, cloud, reason: str) -> Path:
        self.switch_log.append(Switch(at, None if current is None else current.value, to.value, spec, cloud, reason))
        return to

    def should_switch(self, current: Path, remaining: int) -> bool:
        """True when the other path is predicted clearly faster for the tokens still to come."""
        if self.mode != "auto" or remaining < 4:
            return False
        # (the forecast, asked only where a decision needs it: it is most of a round's planning)
        cloud = self.cloud_ms_per_token()
        if cloud is None or self._round_costs() is None:  # (no forecast until a round's costs are known)
            return False
        at, other = max(self._budget - remaining, 0), Path.CLOUD_ONLY
        if current is Path.SPECULATIVE:
            if self._segment_rounds >= 2 and self.hopeless():
                return bool(self._decide(at, current, other, self._forecast(), cloud, "hopeless: not even an always-right draft wins"))
            # (on this text's own rounds: the last text's would end every new one that follows a hard one)
            if 2 <= self._segment_rounds < self.MIN_ROUNDS and self.unpromising(this_text=True):  # (later: its measured rate decides)
                # staying is priced on this text's own rounds as much as on the forecast pooled
                # over the texts before: that alone called every new text faster, this one too,
                # and kept a hard one speculating (two or three rounds alone are no price either:
                # a text that starts hard may win over its rest)
                own, forecast = self.segment_forecast(), self._forecast()
                stay = forecast if own is None else (own + forecast) / 2
                if remaining * (stay - cloud) > 2 * self.switch_cost_ms():
                    return bool(self._decide(at, current, other, stay, cloud, f"unpromising: P(win) {self.text_chance_to_win():.2f}"))
                return False
            if self._segment_rounds < self.MIN_ROUNDS:
                return False
            # (a segment's first round carried the Open and is no rate: from its MIN_ROUNDS-th round
            # on, MIN_ROUNDS - 1 measured rounds; the forecast alone leans on the texts before)
            measured = self.est.spec.trimmed if len(self.est.spec) >= self.MIN_ROUNDS - 1 else None
            if measured is not None and measured <= cloud * (1 + self.margin):
                return False  # (staying is priced at most at the measured rate: the stream cannot be clearly faster)
            forecast = self._forecast()
            measured = forecast if measured is None else measured
            here, there, why = min(measured, forecast, self._passage_rate()), cloud, "cloud-only predicted faster"
        else:
            if self._segment_tokens < self.MIN_TOKENS or not self._segment_probes:
                return False
            step, rate = self.est.decode_ms, self.est.cloud_ms_per_token
            if self._segment_tokens < 4 * self.MIN_TOKENS and step and rate and rate > 3 * (step + 1.0):
                return False  # a loss stall early in the stream is no rate yet (a satellite link's first tokens)
            if not self.evidence_to_enter():
                return False
            here, (there, why), other = cloud, self._entering_forecast(self._forecast()), Path.SPECULATIVE
        if there * (1 + self.margin) < here and remaining * (here - there) > 2 * self.switch_cost_ms():
            spec, cloud_ms = (here, there) if current is Path.SPECULATIVE else (there, here)
            return bool(self._decide(at, current, other, spec, cloud_ms, why))
        return False

    def _forecast(self) -> float:
        """``predicted_speculative``, where the round's costs are known (``should_switch``)."""
        forecast = self.predicted_speculative()
        assert forecast is not None  # (None only while the costs are)
        return forecast

    def _entering_forecast(self, forecast: float) -> tuple[float, str]:
        """What speculating on the rest of this text would do: the forecast, or once this
        stream's shadow has observed ``ENTER_DRAFTS`` drafts, the forecast from its rounds alone
        where that is faster (an easy text after a hard one, the easy rest of a text after the
        hard passage that was left: every round kept weighs in the forecast, the hard part's
        many short ones the most)."""
        own = self.segment_forecast()
        if own is not None and own < forecast and self.est.acceptance.segment_drafts() >= self.ENTER_DRAFTS:
            return own, "speculation predicted faster on this stream's text"
        return forecast, "speculation predicted faster"

    def _passage_rate(self) -> float:
        """This speculative segment's measured ms/token over its last ``PASSAGE_TOKENS`` tokens
        (its rounds after the first): a hard passage's rounds are many and short, so the last
        rounds alone (``est.spec``) describe only the passage, where this spans the text around it."""
        ms = tokens = 0.0
        for wall, n in reversed(self._segment_log):
            ms, tokens = ms + wall, tokens + n
            if tokens >= self.PASSAGE_TOKENS:
                break
        return ms / tokens if tokens else math.inf

    def hopeless(self) -> bool:
        """Whether speculation loses to cloud-only by the margin even if every draft of the
        longest block (max_k + 1 tokens a round) were accepted: the round trip alone rules it
        out, however few rounds were measured."""
        best, cloud = self.predicted_speculative(tau=self._max_k + 1.0, corrected=False), self.cloud_ms_per_token()
        return best is not None and cloud is not None and best > cloud * (1 + self.margin)

    def evidence_to_enter(self) -> bool:
        """Whether the forecast is worth acting on to enter speculation: at least
        ``ENTER_DRAFTS`` drafts observed (verified or replayed) and a chance of at least
        ``ENTER_CHANCE`` that the draft can win (one long lucky run is no proof: 17 hits in a
        row happen one time in nine to a draft right 88% of the time): over the last rounds,
        or over this text's own once this stream's replays rest on ``ENTER_DRAFTS`` drafts
        (an easy text after a hard one: the hard one's replays fill the last rounds)."""
        chance = self.chance_to_win() or 0.0
        if self.est.acceptance.segment_drafts() >= self.ENTER_DRAFTS:
            chance = max(chance, self.text_chance_to_win() or 0.0)
        return self.drafts_observed() >= self.ENTER_DRAFTS and chance >= self.ENTER_CHANCE

    def unpromising(self, *, this_text: bool = False) -> bool:
        """Whether the draft has less than ``WIN_CHANCE`` of being able to win here (over the
        last rounds, or ``this_text``'s own)."""
        chance = self.text_chance_to_win() if this_text else self.chance_to_win()
        return chance is not None and chance < self.WIN_CHANCE

    def shadow_wanted(self, tokens: int) -> bool:
        """Whether the draft should run over the next ``tokens`` streamed tokens (the shadow):
        always when its share is whole, else over the last ``SHADOW_LOOK`` tokens of each
        period that keeps its share (a look's catch-up costed as ``SHADOW_CONTEXT`` tokens)."""
        if self._text_look > 0:
            self._text_look -= tokens
            return True
        share = self.shadow_share()
        if share >= 1.0:
            return True
        period = max(2 * self.SHADOW_LOOK, math.ceil((self.SHADOW_LOOK + self.SHADOW_CONTEXT) / share))
        position = self._shadow_clock % period
        self._shadow_clock += tokens
        if position >= period - self.SHADOW_LOOK:
            return True
        self._end_replay()  # a rest ends the replayed round
        return False
