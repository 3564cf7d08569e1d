"""Which path produces the next tokens, how many drafts a block holds, and how many blocks fly.

Its knobs in ``PlannerConfig``; what the device measured in ``State``, changed only by
``observe(state, config, event)``; ``decide(state, config, ...)``, pure, which the driver
(``edge/driver.py``) and the simulators call alike. ``Planner`` holds one of each for a client.

The rule. Speculation's price per token at k drafts is a round over what it commits:

    fresh(k)  = round trip + verify forward(k) + device(k)         (device: drafting k and the rest)
    held(k)   = max(forward(k) + device(k), fresh(k) / depth)      (a block sent ahead that held)
    round(k)  = holds(k) held(k) + (1 - holds(k)) fresh(k)         (sent ahead only where it pays)
    spec      = min over k of round(k) / E[tokens | k]  x  bias

with E[tokens | k] and holds(k) from acceptance by position (``acceptance.Acceptance``), depth
the blocks that cover a round trip, and bias the measured over the predicted round time (the
model's error, which the machine's load makes). The stream's price is its measured rate (the
replica's figure before any) plus the shadow's drafting at its share.

A request starts on the cheaper path over its budget (speculation pays one more round trip to
start). An unknown draft (under ``enter_drafts`` observed) is tried where a hopeless one would
lose under ``explore_loss`` of the request (three rounds and a switch); elsewhere the
request streams and the shadow judges the draft. Mid-request the path switches when the other
is cheaper by ``margin`` and the tokens left repay two switches (a round trip and a prefill
each): speculation is left from its ``min_rounds``-th round (the first carries the Open), a
stream from its ``min_stream_tokens``-th token once a probe beside it measured the round trip.
The shadow (``shadow_wanted``) runs the draft over streamed tokens, replayed as rounds into the
same acceptance, so speculation comes back when the text or the link turns good.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from enum import Enum

from edgespec.edge.acceptance import Acceptance, Replay


class Path(str, Enum):
    SPECULATIVE = "speculative"
    CLOUD_ONLY = "cloud_only"


@dataclass(frozen=True)
class PlannerConfig:
    """The planner's knobs; each default with its reason.

    margin: the other path must be predicted this much cheaper per token to switch (0.1: a
        forecast from a few dozen drafts errs by several percent; a switch on noise pays two
        prefills, and switching back and forth on it costs more than either path).
    max_depth: most blocks in flight (4: covers a 4G round trip; more only lose at each miss).
    prior_acceptance: each position's acceptance before any is observed (0.7: a draft trained
        for its target; one that is not is found out in a round or two).
    shrink: pseudo-drafts pulling each position's acceptance towards the one before it (1: a
        hopeless draft shows within three rounds; a position seldom reached follows its elder).
    acceptance_decay: a round's weight in acceptance one round later (0.97: about 30 rounds,
        a short text's worth, so a hard passage shows within a few rounds and then fades).
    new_text_weight: what earlier texts' rounds weigh when a request starts (0.2: texts differ;
        the last one is a guess at the next one's opening that its own first rounds overrule).
    window: timings are the median of their last this many samples (5: a link that changed
        shows after three; one loss stall moves nothing); lines against k keep four times more.
    min_rounds: rounds of a speculative segment before it may be left (2: the first one rode
        with the Open and priced the prefill, not a round).
    min_stream_tokens: streamed tokens before a stream may be left (8: its first ones are a
        burst behind the prefill, not a rate).
    enter_drafts: drafts observed before a forecast may enter speculation, or start a request
        on it without exploring (12: two lucky rounds are no proof).
    explore_loss: an unknown draft is tried first only where a hopeless one costs less than this
        share of the request (0.1: on a near link its rounds and switch cost little).
    shadow_share: the shadow's drafting, at most this share of the stream's time (0.03: it
        runs on cores the stream's client uses too).
    shadow_look: streamed tokens per look when the shadow is bounded (16: a round's worth).
    bias_limit: the measured/predicted round time kept within [1/limit, limit] (1.5: a slow
        forward or two must not price a path out for good).
    prefill_forwards: a switch's prefill in verify forwards until one is measured (4: a few).
    """

    margin: float = 0.1
    max_depth: int = 4
    prior_acceptance: float = 0.7
    shrink: float = 1.0
    acceptance_decay: float = 0.97
    new_text_weight: float = 0.2
    window: int = 5
    min_rounds: int = 2
    min_stream_tokens: int = 8
    enter_drafts: float = 12.0
    explore_loss: float = 0.1
    shadow_share: float = 0.03
    shadow_look: int = 16
    bias_limit: float = 1.5
    prefill_forwards: float = 4.0

    def __post_init__(self) -> None:
        ranges = {"(0, 1)": lambda v: 0 < v < 1, "[0, 1)": lambda v: 0 <= v < 1, ">= 1": lambda v: v >= 1,
                  ">= 0": lambda v: v >= 0}
        for name, allowed in [("margin", "[0, 1)"), ("prior_acceptance", "(0, 1)"), ("acceptance_decay", "(0, 1)"),
                              ("new_text_weight", "(0, 1)"), ("explore_loss", "(0, 1)"), ("shadow_share", "(0, 1)"),
                              ("max_depth", ">= 1"), ("window", ">= 1"), ("min_rounds", ">= 1"), ("bias_limit", ">= 1"),
                              ("min_stream_tokens", ">= 1"), ("shadow_look", ">= 1"), ("shrink", ">= 0"),
                              ("enter_drafts", ">= 0"), ("prefill_forwards", ">= 0")]:
            if not ranges[allowed](getattr(self, name)):
                raise ValueError(f"PlannerConfig.{name} must be {allowed}, got {getattr(self, name)}")


@dataclass(frozen=True)
class Start:  # (the events: what the driver saw)
    """A request begins: its token budget, the server's max_k, and its k and send-ahead settings."""
    max_new_tokens: int
    max_k: int = 16
    k: int | str = "auto"
    send_ahead: int | str = "auto"


@dataclass(frozen=True)
class Segment:
    path: Path  # a segment of this path begins (a request's first, or after a switch)


@dataclass(frozen=True)
class Info:
    """The replica's figures (Info): verify forward, decoding step, its streams' ms per token
    (0: not told); ``rtt_ms``: the call's round trip where it measured one."""
    forward_ms: float = 0.0
    decode_ms: float = 0.0
    stream_ms: float = 0.0
    rtt_ms: float | None = None


@dataclass(frozen=True)
class Round:
    """A verified round: k drafts (its chain), accepted, tokens committed; the previous verdict
    to this one (wall), send to verdict (wait; None for a block sent ahead, which waited behind
    another), the replica's forward, and the drafting (None where it also fed the context)."""
    k: int
    accepted: int
    tokens: int
    wall_ms: float
    wait_ms: float | None
    forward_ms: float
    draft_ms: float | None = None


@dataclass(frozen=True)
class FirstToken:
    ms: float  # a stream's first token came this long after its call


@dataclass(frozen=True)
class Streamed:
    ms: float  # the stream so far: ``tokens`` arrived within ``ms`` of its first
    tokens: int


@dataclass(frozen=True)
class Shadowed:
    """Per streamed token, the chance a draft there would have been accepted (greedy: 1 or 0);
    the draft's time over them (None: it also read context); ``after_gap``: the shadow rested
    before them."""
    chances: tuple[float, ...]
    draft_ms: float | None = None
    after_gap: bool = False


Event = Start | Segment | Info | Round | FirstToken | Streamed | Shadowed


# ---- what the device measured ---------------------------------------------------------------

@dataclass
class Line:
    """An exponentially weighted least-squares line y = base + slope x (slope >= 0)."""
    decay: float
    sums: list[float] = field(default_factory=lambda: [0.0] * 5)  # w, wx, wxx, wy, wxy

    def add(self, x: float, y: float) -> None:
        self.sums = [self.decay * s + v for s, v in zip(self.sums, (1.0, x, x * x, y, x * y))]

    def at(self, x: float) -> float | None:
        w, wx, wxx, wy, wxy = self.sums
        if w < 1e-9:
            return None
        mx, my = wx / w, wy / w
        var = wxx / w - mx * mx
        # NOTE: no slope until blocks of k apart were measured (fitted on one k, noise kept k short)
        slope = max((wxy / w - mx * my) / var, 0.0) if var >= 1.0 else 0.0
        return max(my + slope * (x - mx), 0.0)


@dataclass
class Median:
    """The median of the last ``size`` samples; None before any."""
    size: int
    samples: list[float] = field(default_factory=list)
    value: float | None = None

    def add(self, x: float) -> None:
        self.samples = (self.samples + [x])[-self.size:]
        self.value = statistics.median(self.samples)


@dataclass
class State:
    """What the device measured (ms), across requests, and where the current request stands."""
    config: PlannerConfig
    rtt: Median = field(init=False)  # network round trip + ingress
    forward: Line = field(init=False)  # the replica's verify forward against k
    device: Line = field(init=False)  # a fresh round's device time (drafting and the rest) against k
    streams: list[float] = field(default_factory=list)  # the last streams' measured ms per token
    replica_stream: float | None = None  # what the replica tells of its streams' ms per token
    prefill: Median = field(init=False)  # what a segment's start pays beyond a round trip and a step
    bias: Median = field(init=False)  # measured / predicted round time
    shadow: Median = field(init=False)  # the shadow's drafting per streamed token
    acceptance: Acceptance = field(init=False)
    replay: Replay = field(default_factory=lambda: Replay(16))
    max_k: int = 16
    k: int | str = "auto"  # this request's settings (``Start``)
    send_ahead: int | str = "auto"
    segment_rounds: int = 0  # this segment's rounds, streamed tokens and round-trip probes
    segment_tokens: int = 0
    segment_probes: int = 0
    chain: int = 0  # positions a block sent ahead now continues (the blocks before it held)

    def __post_init__(self) -> None:
        c = self.config
        self.forward, self.device = Line(1 - 1 / (4 * c.window)), Line(1 - 1 / (4 * c.window))  # (a slope needs many)
        self.rtt, self.prefill, self.bias, self.shadow = (Median(c.window) for _ in range(4))
        self.acceptance = Acceptance(c.acceptance_decay, c.shrink, c.prior_acceptance)


def observe(state: State, config: PlannerConfig, event: Event) -> None:
    """Folds one event into the state."""
    s = state
    if isinstance(event, Start):
        s.max_k, s.k, s.send_ahead = event.max_k, event.k, event.send_ahead
        if s.replay.k != s.max_k:
            s.replay = Replay(s.max_k)
        s.replay.restart()
        s.acceptance.forget(config.new_text_weight)
    elif isinstance(event, Segment):
        s.segment_rounds = s.segment_tokens = s.segment_probes = s.chain = 0
        s.streams = s.streams[-config.window + 1:] + [math.nan] if event.path is Path.CLOUD_ONLY else s.streams
    elif isinstance(event, Info):
        if event.forward_ms > 0:
            w, wx = s.forward.sums[:2]  # (at no known k: at the mean k, a sample moves the level, not the slope)
            s.forward.add(wx / w if w > 1e-9 else 1.0, event.forward_ms)
        if event.stream_ms > 0 or event.decode_ms > 0:
            s.replica_stream = max(event.stream_ms, event.decode_ms)
        if event.rtt_ms is not None:
            s.rtt.add(event.rtt_ms)
            s.segment_probes += 1
    elif isinstance(event, Round):
        _observe_round(s, config, event)
    elif isinstance(event, FirstToken):
        step = s.replica_stream or s.forward.at(1)
        if s.rtt.value is not None and step is not None:
            s.prefill.add(max(event.ms - s.rtt.value - step, 0.0))
    elif isinstance(event, Streamed):
        s.segment_tokens = event.tokens
        if event.tokens >= config.min_stream_tokens and s.streams:  # (fewer: a burst behind the prefill)
            s.streams[-1] = event.ms / event.tokens  # (a median over streams: one stall is no price)
    elif isinstance(event, Shadowed):
        if event.after_gap:
            s.replay.restart()
        reached, accepted, rounds = s.replay.feed(list(event.chances))
        s.acceptance.add_counts(reached, accepted, rounds)
        if event.draft_ms is not None and event.chances:
            s.shadow.add(event.draft_ms / len(event.chances))


def _observe_round(s: State, config: PlannerConfig, r: Round) -> None:
    """A segment's first round also carried the Open (the replica's prefill of the context): its
    wait beyond a round trip and a forward is what a switch pays; its times price no round."""
    accepted = min(max(r.tokens - 1, 0), r.k)  # (a tree's accepted leaves count as its chain's)
    after = s.chain if r.wait_ms is None else 0  # (a block sent ahead is verified only behind ones that held)
    if after <= s.max_k:  # (deeper positions price no block)
        s.acceptance.add(accepted, r.k, after, s.max_k + 1)
    s.chain = after + r.k + 1 if accepted == r.k else 0
    s.segment_rounds += 1
    if s.segment_rounds == 1:
        if r.wait_ms is not None and s.rtt.value is not None:
            s.prefill.add(max(r.wait_ms - s.rtt.value - r.forward_ms, 0.0))
        return
    if r.forward_ms > 0:
        s.forward.add(r.k, r.forward_ms)
    if r.wait_ms is not None:
        s.rtt.add(max(r.wait_ms - r.forward_ms, 0.0))
        s.device.add(r.k, max(r.wall_ms - r.wait_ms, 0.0))
    costs = _costs(s, config, r.k)  # the model's error once its parts are measured, like with like
    if costs is not None and costs[0] > 0:
        predicted = costs[1] if r.wait_ms is None else costs[0]  # (a held round against a held one's price)
        s.bias.add(min(max(r.wall_ms / predicted, 1 / config.bias_limit), config.bias_limit))


# ---- the decision ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Decision:
    path: Path
    k: int  # drafts in the next block
    depth: int  # blocks to keep in flight (1: never send ahead)
    spec_ms: float | None  # predicted ms per token of each path
    cloud_ms: float | None
    reason: str


def _costs(s: State, config: PlannerConfig, k: int) -> tuple[float, float, float, int] | None:
    """A round of k drafts: (fresh, held, device, depth), depth the blocks that cover a round
    trip (no more travel in one)."""
    forward, rtt = s.forward.at(k), s.rtt.value
    if rtt is None or forward is None:  # (no price until both are known)
        return None
    device = s.device.at(k) or 0.0  # (until a round measured it: the round trip dominates a first guess)
    fresh, per_block = rtt + forward + device, forward + device
    if s.send_ahead != "auto":
        depth = max(1, int(s.send_ahead))
    else:
        depth = max(2, min(config.max_depth, 1 + math.ceil(rtt / max(per_block, 1.0))))
    return fresh, (max(per_block, fresh / depth) if depth > 1 else fresh), device, depth


def forecast(s: State, config: PlannerConfig) -> tuple[int, float | None, int]:
    """(best k, speculation's ms per token there with the bias, blocks in flight); k = max_k
    and no price until the round trip and the forward are known."""
    tokens, holds = s.acceptance.tokens_and_holds(s.max_k)
    best: tuple[float, int, int] = (math.inf, s.max_k, 1 if s.send_ahead == "auto" else int(s.send_ahead))
    for k in range(1, s.max_k + 1):
        costs = _costs(s, config, k)
        if costs is None:
            return best[1], None, best[2]
        fresh, held, device, depth = costs
        # A block goes ahead where what it saves when it holds pays for drafting it.
        ahead = depth > 1 and (s.send_ahead != "auto" or holds[k] * (fresh - held) >= device)
        rate = (holds[k] * held + (1 - holds[k]) * fresh if ahead else fresh) / tokens[k]
        if rate < best[0]:
            best = (rate, k, depth if ahead else 1)
    bias = s.bias.value if len(s.bias.samples) > config.window // 2 else None  # (one round is no error yet)
    return best[1], best[0] * (bias or 1.0), best[2]


def cloud_ms(s: State, config: PlannerConfig) -> float | None:
    """The stream's ms per token (measured, else the replica's figure, else a forward), plus the
    shadow's drafting at its share: on a device whose cores carry the stream too, it competes."""
    stream = _stream(s) or s.replica_stream or s.forward.at(1)
    return None if stream is None else stream + _shadow_share(s, config, stream) * (s.shadow.value or 0.0)


def _stream(s: State) -> float | None:
    rates = [r for r in s.streams if not math.isnan(r)]
    return statistics.median(rates) if rates else None


def _shadow_share(s: State, config: PlannerConfig, stream: float) -> float:
    return 1.0 if not s.shadow.value else min(1.0, config.shadow_share * stream / s.shadow.value)


def shadow_wanted(s: State, config: PlannerConfig, position: int) -> bool:
    """Whether the shadow runs over the stream's token at ``position`` (from the stream's start):
    every one while that costs under ``shadow_share`` of the stream, else the last
    ``shadow_look`` of each period that keeps the share. The first look opens the stream (a new
    text's opening judges it), and while the draft is little known (under ``enter_drafts`` ever
    observed) every token is worth watching."""
    if position < config.shadow_look or s.acceptance.seen < config.enter_drafts:
        return True
    stream = _stream(s) or s.replica_stream
    share = 1.0 if stream is None else _shadow_share(s, config, stream)
    period = math.ceil(config.shadow_look / share)
    return share >= 1.0 or position % period >= period - config.shadow_look


def switch_cost_ms(s: State, config: PlannerConfig) -> float:
    """A switch: the round trip that opens the other path and the replica's prefill."""
    prefill = s.prefill.value if s.prefill.value is not None else config.prefill_forwards * (s.forward.at(1) or 0.0)
    return (s.rtt.value or 0.0) + prefill


def decide(s: State, config: PlannerConfig, mode: str, current: Path | None, remaining: int) -> Decision:
    """The path for the tokens still to come (``current`` None: a request's start), and the next
    block's k and the blocks in flight; pure."""
    k, spec, depth = forecast(s, config)
    k = k if s.k == "auto" else int(s.k)
    cloud = cloud_ms(s, config)
    path, why = _path(s, config, mode, current, remaining, spec, cloud)
    return Decision(path, k, depth, spec, cloud, why)


def _path(s: State, config: PlannerConfig, mode: str, current: Path | None, remaining: int,
          spec: float | None, cloud: float | None) -> tuple[Path, str]:
    if mode != "auto":
        return Path(mode), mode
    if current is None:
        return _start(s, config, remaining, spec, cloud)
    if spec is None or cloud is None:
        return current, ""
    switch = 2 * switch_cost_ms(s, config)
    if current is Path.SPECULATIVE:
        if s.segment_rounds >= config.min_rounds and cloud * (1 + config.margin) < spec \
                and remaining * (spec - cloud) > switch:
            return Path.CLOUD_ONLY, "cloud-only predicted faster"
        return current, ""
    ready = s.segment_tokens >= config.min_stream_tokens and s.segment_probes > 0
    if ready and s.acceptance.drafts() >= config.enter_drafts and spec * (1 + config.margin) < cloud \
            and remaining * (cloud - spec) > switch:
        return Path.SPECULATIVE, "speculation predicted faster"
    return current, ""


def _start(s: State, config: PlannerConfig, budget: int, spec: float | None, cloud: float | None) -> tuple[Path, str]:
    if spec is None or cloud is None:
        return Path.SPECULATIVE, "nothing measured: speculate, and learn"
    if s.acceptance.seen < config.enter_drafts:
        # A hopeless draft costs up to three rounds of a token (it shows by the third) and a switch.
        fresh = (_costs(s, config, s.max_k) or (0.0,))[0]
        if 3 * max(fresh - cloud, 0.0) + switch_cost_ms(s, config) > config.explore_loss * budget * cloud:
            return Path.CLOUD_ONLY, "the shadow judges the draft: a wrong guess costs too much here"
        return Path.SPECULATIVE, "exploring the draft"
    if (s.rtt.value or 0.0) + budget * spec <= budget * cloud:  # (speculation pays one more round trip to start)
        return Path.SPECULATIVE, "predicted"
    return Path.CLOUD_ONLY, "cloud-only predicted faster"


@dataclass(frozen=True)
class Switch:
    """One decision: the path a request started on (``from_path`` None) or a switch."""
    at_token: int  # tokens of the request generated before it
    from_path: str | None
    to_path: str
    predicted_spec_ms_per_token: float | None
    predicted_cloud_ms_per_token: float | None
    reason: str


class Planner:
    """A client's planner: config, state, and the current request's decisions (``switch_log``).
    ``mode``: "auto" chooses the path, "speculative" or "cloud_only" keep one."""

    def __init__(self, mode: str = "auto", config: PlannerConfig | None = None):
        self.mode, self.config = Path(mode).value if mode != "auto" else mode, config or PlannerConfig()
        self.state = State(self.config)
        self.switch_log: list[Switch] = []
        self._budget = 0

    def observe(self, event: Event) -> None:
        if isinstance(event, Start):  # (a request's start begins its log)
            self.switch_log, self._budget = [], event.max_new_tokens
        observe(self.state, self.config, event)

    def decide(self, current: Path | None, remaining: int) -> Decision:
        """``decide`` on this planner's state; a start or a change of path is logged."""
        decision = decide(self.state, self.config, self.mode, current, remaining)
        if decision.path is not current:
            self.switch_log.append(Switch(self._budget - remaining, None if current is None else current.value,
                                          decision.path.value, decision.spec_ms, decision.cloud_ms, decision.reason))
        return decision


