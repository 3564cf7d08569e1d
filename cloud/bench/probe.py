"""The replica's speed at one moment: a short probe of raw Generate streams, run between cells.

The cores the replica runs on are shared, and what else runs on them changes from minute to
minute: on the demo pair the 16-row decode step read 126 ms in the calibration and 89-120 ms
in the cells minutes later. A calibration taken once, at the start, then predicts each cell
under the wrong load. The probe is cheap enough to repeat around every link's cells (a lone
raw stream after each 1-session pair, a lone stream and N at once just before and just after
the N-session cells: ~30 s), and it reads everything the load moves that streams can show:

- the decode step at batch 1 and at the burst's batch (the replies' own ``step_ms``);
- a streamed token's ingress service and latency (``split_stream_ingress``: each reply's gap
  less the step behind it);
- the prefill a session's opening queues on the model thread, apart from the call's setup
  (the first token of the workload's prompts against one-token prompts').

The batch curve of raw rounds (``replica_verify_model``) is too long to repeat; it is carried
from the probes around it to the probes around a cell (``load_scaled_cells``). Nothing here
reads a cell: the probes are raw streams of their own, before and after the cells; they go
through the cells' emulated link, because the emulator's own CPU on the shared cores is part of
the load the cells meet (with direct probes the 16-row step during the cells read 12-27% above
the probes' around them).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from edgespec.cloud.bench.calibrate import load_scaled_cells, split_stream_ingress, stream_prefill, verify_table
from edgespec.cloud.bench.replay import Script, raw_streams, step_at_common_batch
from edgespec.cloud.simulate.calibration import Calibration


Gap = tuple[int, float, float]  # a later reply's (batch_size, step_ms, ms since the stream's previous reply)


@dataclass(frozen=True)
class ProbeReplies:
    """What raw Generate streams sent back: ``lone``, each lone stream's (tokens, s to the last,
    s to the first); ``lone_gaps`` and ``burst_gaps``, the replies of lone streams and of
    streams at once. Replies of several probes pool with ``+``."""

    lone: tuple[tuple[int, float, float], ...] = ()
    lone_gaps: tuple[Gap, ...] = ()
    burst_gaps: tuple[Gap, ...] = ()
    short_first_s: tuple[float, ...] = ()  # one-token prompts' first token, seconds

    def __add__(self, other: "ProbeReplies") -> "ProbeReplies":
        return ProbeReplies(self.lone + other.lone, self.lone_gaps + other.lone_gaps, self.burst_gaps + other.burst_gaps,
                            self.short_first_s + other.short_first_s)

    def only_lone(self) -> "ProbeReplies":
        return ProbeReplies(self.lone, self.lone_gaps, short_first_s=self.short_first_s)

    def only_burst(self) -> "ProbeReplies":
        return ProbeReplies(burst_gaps=self.burst_gaps)


@dataclass(frozen=True)
class ReplicaProbe:
    """What probes read (milliseconds). ``decode_ms_by_batch``: {1: lone step, B: step at the
    bursts' most common batch B}; ``burst_batch_mean``: the bursts' mean rows per forward."""

    decode_ms_by_batch: dict[int, float]
    stream_message_ms: float
    stream_latency_ms: float
    prefill_ms: float
    burst_batch_mean: float
    open_overhead_ms: float = 0.0

    @classmethod
    def from_replies(cls, replies: ProbeReplies) -> "ReplicaProbe":
        """Medians over every reply given (pooled probes: their replies, not their means)."""
        message_ms, latency_ms = split_stream_ingress(list(replies.lone_gaps + replies.burst_gaps))
        decode = {1: statistics.median(step for batch, step, _ in replies.lone_gaps if batch == 1)}
        burst = step_at_common_batch(((batch, step) for batch, step, _ in replies.burst_gaps), least=2)
        if burst is not None:
            decode[burst[0]] = burst[1]
        forwards = sum(1.0 / b for b, _, _ in replies.burst_gaps if b > 0)
        # A first token is the call's setup, the prefill, a step, the stream's latency and two
        # messages. The setup is no model-thread work (N calls at once pay it together, their
        # prefills queue): a one-token prompt's first token (a prefill and a step of a forward
        # over one token each, about one decode step) leaves the setup, the difference the prefill.
        opening = stream_prefill(list(replies.lone), message_ms)  # setup + prefill
        open_overhead = 0.0
        if replies.short_first_s:
            short = 1000.0 * statistics.median(replies.short_first_s)
            open_overhead = min(max(short - decode[1] - latency_ms - 2 * message_ms, 0.0), opening)
        return cls(
            decode_ms_by_batch=decode,
            stream_message_ms=message_ms,
            stream_latency_ms=latency_ms,
            prefill_ms=opening - open_overhead,
            burst_batch_mean=sum(1 for b, _, _ in replies.burst_gaps if b > 0) / forwards if forwards else 0.0,
            open_overhead_ms=open_overhead,
        )

    def to_dict(self) -> dict:
        return {"decode_ms_by_batch": dict(self.decode_ms_by_batch), "stream_message_ms": self.stream_message_ms,
                "stream_latency_ms": self.stream_latency_ms, "prefill_ms": self.prefill_ms,
                "open_overhead_ms": self.open_overhead_ms, "burst_batch_mean": self.burst_batch_mean}


def lone_streams(address: str, fingerprint: str, scripts: list[Script], *, link_ms: float = 0.0) -> ProbeReplies:
    """The scripts' prompts as raw Generate streams, one after another, to ``address``.
    ``link_ms``: the round trip the link in front of it models (``link_round_trip_ms``), taken
    off each stream's first token (and its last), so that the prefill read is the replica's."""
    gaps: list[Gap] = []
    alone = raw_streams(address, fingerprint, scripts, gaps=gaps)
    # One-token prompts, two tokens each: their first token is the call's setup (``ReplicaProbe``).
    shorts = raw_streams(address, fingerprint, [Script(s.prompt_ids[:1], [0, 0], []) for s in scripts])
    shift = link_ms / 1000.0
    return ProbeReplies(tuple((tokens, wall - shift, first - shift) for tokens, wall, first in alone), tuple(gaps),
                        short_first_s=tuple(first - shift for _, _, first in shorts))


def probe_replica(address: str, fingerprint: str, scripts: list[Script], sessions: int, *, lone: int = 3,
                  warm_up: bool = False, link_ms: float = 0.0) -> ProbeReplies:
    """``lone`` raw streams one after another, then ``sessions`` at once (the scripts' prompts
    in turn), to ``address`` (``link_ms``: ``lone_streams``). ``warm_up``: one uncounted burst
    first (a fresh replica's first batches of N one-token rows ran twice as slow on the demo
    pair: 241 ms against 118)."""
    burst = [scripts[i % len(scripts)] for i in range(sessions)]
    if warm_up:
        raw_streams(address, fingerprint, burst, at_once=True)
    alone = lone_streams(address, fingerprint, [scripts[i % len(scripts)] for i in range(lone)], link_ms=link_ms)
    burst_gaps: list[Gap] = []
    raw_streams(address, fingerprint, burst, at_once=True, gaps=burst_gaps)
    return alone + ProbeReplies(burst_gaps=tuple(burst_gaps))


def calibration_now(calibration: Calibration, cells: dict[tuple[int, int], float], base: ReplicaProbe,
                    now: ReplicaProbe, *, client_stream_ms: float = 0.0) -> Calibration:
    """``calibration`` carried to the load ``now`` reads: its batch curve of raw rounds
    ``cells`` (measured under the load ``base`` read) scaled by the decode steps' ratio, the
    decode column, the streamed token's costs and the prefill as ``now`` read them.
    ``client_stream_ms``: the device's own time per streamed token beyond a raw stream's (the
    real client's), added to the streamed token's latency."""
    scaled = load_scaled_cells(cells, base.decode_ms_by_batch, now.decode_ms_by_batch)
    # A round's own latency (the client's Python, the ingress's, the replica's beyond the
    # forward: CPU on the same cores) was read once, beside ``base``; it moves with the load as
    # the forward does (an idle run's speculative cells came out 15-24% slow without this).
    lone_then, lone_now = base.decode_ms_by_batch.get(1), now.decode_ms_by_batch.get(1)
    load = lone_now / lone_then if lone_then and lone_now else 1.0
    return replace(calibration, verify=verify_table(scaled, now.decode_ms_by_batch),
                   round_overhead_ms=calibration.round_overhead_ms * load,
                   ingress_ms_per_stream_message=now.stream_message_ms,
                   stream_overhead_ms=now.stream_latency_ms + client_stream_ms, prefill_ms=now.prefill_ms,
                   open_overhead_ms=now.open_overhead_ms)
