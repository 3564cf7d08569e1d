"""Calibrating the fleet simulator from measurements of this pair on this machine.

- verification time: the replica's own forward + accept times (in its verdicts) for raw
  sessions of random drafts at several batch sizes and k, at the workload's context, fitted as
  a linear batch curve (``replica_verify_model``);
- draft ms/token, acceptance at each position, message sizes: a greedy loopback run of the
  real client at k = k_max through the Serve gRPC path (``calibrate``);
- the ingress (proxy and replica I/O, a queue shared by the replica's sessions; see
  ``edgespec.cloud.simulate.calibration``): the overhead of a raw round beyond its forward,
  split into queueing service and latency by a loaded replica (``split_round_ingress``); the
  real client's own time per round on top of it is its latency; a streamed token's ingress
  service and latency from raw Generate streams alone and at once (``split_stream_ingress``);
- the load on shared cores: the batch curve carried to the decode steps read later
  (``load_scaled_cells``, used by ``probe.py``);
- each link's fixed cost per round, from raw rounds through it (``link_round_overhead``).

Every figure comes from raw rounds or single sessions, never from the multi-session runs of
real drafts that the simulator is checked against (``simcheck.py``).
"""

from __future__ import annotations

import statistics

import numpy as np

from edgespec.cloud.bench.diagnosis import Diagnosis
from edgespec.cloud.bench.harness import Harness, Summary, shown
from edgespec.cloud.bench.ingress import raw_rounds
from edgespec.cloud.link.profiles import DirectionSchedule, LinkProfile
from edgespec.cloud.simulate.calibration import Calibration, VerifyModel
from edgespec.cloud.simulate.config import FleetConfig
from edgespec.cloud.simulate.engine import SPECULATIVE, simulate_path


def calibrate(
    harness: Harness,
    prompts: list[str],
    verify: VerifyModel,
    prefill_ms: float | None,
    *,
    k: int = 8,
    max_new_tokens: int = 64,
    round_message_ms: float | None = None,
    progress=print,
) -> Calibration:
    """``round_message_ms``: the ingress service time of a round message when measured under
    load (``split_round_ingress``); the rest of the single-session round overhead is then pure
    latency (``round_overhead_ms``). None: all of it queues (two messages). ``prefill_ms``
    None: taken from the cloud-only runs (first token less a steady token)."""
    # One block in flight: the simulator models rounds one after another (no send-ahead).
    params = dict(max_new_tokens=max_new_tokens, k=k, send_ahead=1, stop_token_ids=())
    spec = harness.run(prompts, params, "calibration (speculative)")
    cloud = [harness.cloud_only(p, params) for p in prompts]
    diagnosis = Diagnosis()
    decode = lambda ids: harness.client.draft.tokenizer.decode(ids)  # noqa: E731
    for result in spec:
        diagnosis.add(decode, result.prompt_ids, result.token_ids, result.rounds)
    by_position = diagnosis.by_position()
    acceptance = tuple(by_position.get(i, 0.0) for i in range(1, k + 1))
    rounds = [r for result in spec for r in result.rounds]
    # Each round against the forward the replica reported for it (the table's only where a
    # verdict did not say): the load on the cores moves both alike. A round is verdict to
    # verdict (its wall, where recorded: the client's own work between a verdict and its next
    # send counts, as the simulator's device has none), less its drafting and that forward;
    # a generation's first round is left out (its wall starts with the session's opening).
    timed = [r for result in spec for r in result.rounds[1:] if r.wall_ms > 0]
    if timed:
        round_overhead = max(statistics.median(r.wall_ms - r.draft_ms - _forward(r, verify) for r in timed), 0.0)
    else:
        round_overhead = max(statistics.median(r.wait_ms - _forward(r, verify) for r in rounds), 0.0)
    cloud_summary = Summary.of(cloud)
    # Steady state: the first token also carries the request and the prefill.
    steady = [
        1000.0 * (c.stats.wall_s - c.stats.first_token_s) / (c.stats.generated - 1) for c in cloud if c.stats.generated > 1
    ]
    cloud_ms_per_token = statistics.median(steady) if steady else cloud_summary.ms_per_token
    stream_message_ms = max(cloud_ms_per_token - verify(1, 1), 0.0)
    if prefill_ms is None:
        first = [1000.0 * c.stats.first_token_s - cloud_ms_per_token - stream_message_ms for c in cloud if c.stats.generated > 1]
        prefill_ms = max(statistics.median(first), 0.0) if first else 0.0
    if round_message_ms is None:
        round_message_ms = round_overhead / 2  # Draft in, Verdict out
    round_latency_ms = max(round_overhead - 2 * round_message_ms, 0.0)
    spec_summary = Summary.of(spec)
    rounds_total = max(spec_summary.rounds, 1)
    up_per_round = sum(s.stats.bytes_sent for s in spec) / rounds_total
    down_per_round = sum(s.stats.bytes_received for s in spec) / rounds_total
    down_per_token = sum(c.stats.bytes_received for c in cloud) / max(cloud_summary.tokens, 1)
    progress(f"  calibration: draft {spec_summary.draft_ms_per_token:.2f} ms/token, round overhead {round_overhead:.2f} ms "
             f"(ingress {round_message_ms:.2f} ms/message + {round_latency_ms:.2f} ms latency), stream ingress "
             f"{stream_message_ms:.2f} ms/message, prefill {prefill_ms:.1f} ms, "
             f"acceptance by position {[round(a, 2) for a in acceptance]}")
    return Calibration(
        source=f"measured on this machine: target {shown(harness.target)}, draft {shown(harness.draft)}, loopback, {len(prompts)} prompts",
        draft_ms_per_token=spec_summary.draft_ms_per_token,
        draft_cv=0.1,
        acceptance=acceptance,
        verify=verify,
        ingress_ms_per_round_message=round_message_ms,
        ingress_ms_per_stream_message=stream_message_ms,
        round_overhead_ms=round_latency_ms,
        stream_overhead_ms=0.0,
        prefill_ms=prefill_ms,
        # Payload + gRPC framing as counted by the client; HTTP/2 frame headers add ~9 B each.
        up_bytes_base=max(int(up_per_round - 2 * spec_summary.mean_k), 1),
        up_bytes_per_draft=2,
        down_bytes_per_round=max(int(down_per_round), 1),
        open_bytes=400,
        down_bytes_per_token=max(int(down_per_token), 1),
    )


def _forward(record, verify: VerifyModel) -> float:
    """The forward behind a round: what the replica reported, else the batch curve's."""
    return record.verify_ms if record.verify_ms > 0 else verify(1, record.k + 1)


# ---- the replica as it serves: its batch curve, its ingress, each link's fixed cost -------------


def replica_verify_model(
    address: str, fingerprint: str, vocab: int, *, ks=(1, 4, 8), session_counts=(1, 2, 4, 8, 16), rounds: int = 12,
    decode_ms: float = 0.0, context: int = 32, passes: int = 1,
) -> tuple[VerifyModel, list[dict]]:
    """The replica's own forward + accept time (reported in every verdict) as a measured table.

    Raw sessions of random drafts (nothing is accepted, so every row is k + 1 tokens) at each
    session count n and k, direct to the server; the cell (n, k + 1) is the median forward of
    that run's batches of n rows. ``context``: the rows' mean context during the runs (prompt of
    context - rounds / 2 tokens, one committed token per round): give the workload's, as a
    row's cost grows with its context (on the demo pair, 7 ms per row at 271 tokens against
    2.8 ms at 50: the batch's padded KV cache is rebuilt for every forward).

    One-token rows (a Generate decode step) cannot be sent as a round (a Draft holds >= 1
    token), so that column is the smallest-k column less the gap at batch 1 between it and
    ``decode_ms``, the replica's own lone decode step: a decode step is not a short
    verification (on the demo pair 1 token costs 20 ms, 2 tokens 21, 5 tokens 21.4). Better,
    give ``verify_table`` the decode steps measured on real streams (``decode_steps``).

    ``passes``: the grid measured that many times over (each cell the median of its passes;
    ``runs`` holds every run, its cell's figure as ``cell_ms``): on shared cores a single pass
    took 192 ms for a cell its neighbours put near 80.

    Why not the engine timed in this process (what the calibration did before): another
    process, another moment, no gRPC server beside it, and short made-up contexts.
    """
    runs, passes_ms = [], {}
    order = [(k, n) for k in ks for n in session_counts]
    for index in range(passes):
        # NOTE: each pass in another order, so that a burst of load elsewhere on the cores
        # lands on different cells in each; a cell is the median of its passes.
        for k, n in order if index % 2 == 0 else order[::-1]:
            raw = raw_rounds(address, fingerprint, vocab, k, rounds, n, prompt_len=max(context - rounds // 2, 1))
            by_batch = raw["verify_ms_by_batch"]
            _, ms = by_batch.get(n) or max(by_batch.values())  # else the most common batch's
            passes_ms.setdefault((n, k + 1), []).append(ms)
            runs.append(raw | {"cell_ms": ms})
    cells = {cell: statistics.median(values) for cell, values in passes_ms.items()}
    return verify_table(cells, {1: decode_ms} if decode_ms > 0 else None), runs


def verify_table(cells: dict[tuple[int, int], float], decode: dict[int, float] | None = None) -> VerifyModel:
    """A ``VerifyModel`` table from {(batch, tokens_per_row): ms} over a full grid, plus a
    one-token column from the replica's decode step times {batch: ms}: with one (the lone step)
    the column grows with the batch as the smallest-k column does; with several it is linear
    between them (the replica's batched decode step, from Info after a burst of streams)."""
    batches = sorted({b for b, _ in cells})
    tokens = sorted({t for _, t in cells})
    grid = [[cells[(b, t)] for t in tokens] for b in batches]
    if decode and tokens[0] > 1:
        if len(decode) == 1:
            ((at, ms),) = decode.items()
            gap = cells[(at, tokens[0])] - ms
            column = [row[0] - gap for row in grid]
        else:
            known = sorted(decode)
            column = [float(np.interp(b, known, [decode[x] for x in known])) for b in batches]
        # NOTE: a noisy gap could push a cell to or below 0; a forward never takes < 1 us.
        grid = [[max(value, 1e-3)] + row for value, row in zip(column, grid)]
        tokens = [1] + tokens
    return VerifyModel(batch=tuple(batches), tokens_per_row=tuple(tokens), ms=tuple(tuple(row) for row in grid))


def decode_steps(steps: list[tuple[int, float]], min_forwards: int = 3) -> dict[int, float]:
    """The replica's decoding step by batch size, {batch: median ms}, from the (batch_size,
    step_ms) of every reply of real Generate streams (``raw_streams(steps=...)``).

    Each forward is reported once per stream in it, so a batch of b rows appears b times (the
    median is the same as over forwards); a batch size seen in fewer than ``min_forwards``
    forwards is dropped (a stream's ramp-up or tail, too few to trust). Replies without the
    diagnostics (batch_size 0: an older replica) are ignored.
    """
    by_batch: dict[int, list[float]] = {}
    for batch, ms in steps:
        if batch > 0:
            by_batch.setdefault(batch, []).append(ms)
    return {b: statistics.median(v) for b, v in sorted(by_batch.items()) if len(v) >= min_forwards * b}


def link_round_trip_ms(profile: LinkProfile, up_bytes: int, down_bytes: int, samples: int = 4001) -> float:
    """Median of the delay the profile models for one round (one chunk up, one down), sampled
    with the simulator's own arithmetic (``DirectionSchedule``), chunks far apart."""
    import random

    draws = random.Random(f"round-trip/{profile.name}")
    up, down = DirectionSchedule(profile, "up", draws.random), DirectionSchedule(profile, "down", draws.random)
    delays = []
    for i in range(samples):
        t = i * 1e5
        delays.append(up.release_ms(t, up_bytes) - t + down.release_ms(t + 5e4, down_bytes) - (t + 5e4))
    return statistics.median(delays)


def link_round_overhead(measured_overhead_ms: float, direct_overhead_ms: float, profile: LinkProfile,
                        up_bytes: int, down_bytes: int) -> float:
    """The per-round fixed cost of a link (``Calibration`` docstring, "Per-link fixed cost"):
    what a raw round through it costs beyond the same round direct and the profile's delay."""
    return max(measured_overhead_ms - direct_overhead_ms - link_round_trip_ms(profile, up_bytes, down_bytes), 0.0)


def split_round_ingress(verify: VerifyModel, single_overhead_ms: float, loaded: dict, batch_wait_ms: float) -> float:
    """The ingress service time per round message, from raw rounds at one session and at many.

    One session cannot tell queueing work from pure latency (both add to its round the same);
    a loaded replica can: its N sessions' messages queue for the ingress, the latency does not.
    The split is the service time s (with the latency L = overhead(1) - 2 s) for which the
    simulator, replaying ``loaded`` (N raw sessions of random drafts, nothing accepted), comes
    closest to its measured mean round time; s on a grid over [0, overhead(1) / 2] (not a
    bisection: the round time is not monotonic in s, as a slow ingress staggers the sessions'
    drafts past the scheduler's gather and splits the batches).
    """
    sessions, k = loaded["sessions"], loaded["k"]
    # NOTE: the steady rounds only: the N sessions open together and their prefills queue on
    # the model thread ahead of every forward, so the first sessions' first round waits for
    # all of them (16 x ~55 ms on the demo pair); simulated without prefills, that wait read
    # as ingress work (0.6-0.8 ms per message, against ~0.2 for a streamed token).
    target = loaded.get("round_ms_steady_mean", loaded["round_ms_mean"])

    def simulated_round_ms(service_ms: float) -> float:
        calibration = Calibration(
            source="ingress split", draft_ms_per_token=1e-3, draft_cv=0.0, acceptance=(0.0,), verify=verify,
            ingress_ms_per_round_message=service_ms, round_overhead_ms=max(single_overhead_ms - 2 * service_ms, 0.0),
            prefill_ms=0.0,
        )
        config = FleetConfig(devices=sessions, link_mix="loopback", k=k, tokens_per_device=60, batch_wait_ms=batch_wait_ms,
                             max_batch_size=max(sessions, 1))
        return simulate_path(config, calibration, SPECULATIVE).mean_ms_per_token  # one token per round

    grid = [single_overhead_ms / 2 * i / 40 for i in range(41)]
    return min(grid, key=lambda s: (abs(simulated_round_ms(s) - target), s))


def split_stream_ingress(gaps: list[tuple[int, float, float]]) -> tuple[float, float]:
    """A streamed token's ingress service time and its latency, (message_ms, latency_ms), from
    the replies of raw Generate streams (``raw_streams(gaps=...)``): one stream alone and
    several at once.

    In the simulator's model (``Calibration`` docstring, "The ingress") a stream's reply comes
    every step(b) + L + b * s when b streams decode together: the forward, the latency once per
    batch, then the b token messages through the ingress in turn (the last must leave before
    the batch it rejoins can close). Each reply's gap less the step it reports (the same
    forward) cancels the step, and with it the load the machine was under at that moment:

        excess(1) = L + s,   excess(b) = L + b * s   =>   s = (excess(b) - excess(1)) / (b - 1).

    b is the loaded streams' most common batch (their ramp-up and tail are left out); the
    excess at each batch is a mean: along a stream the gaps telescope, so a link's jitter and
    the catch-up after a stall cancel (a median would not), and a slow forward is in its own
    step. A round message's service time (``split_round_ingress``) is no stand-in: a
    generator's yield is not a bidi request/reply pair.
    """
    excess: dict[int, list[float]] = {}
    for batch, step_ms, gap_ms in gaps:
        if batch > 0:
            excess.setdefault(batch, []).append(gap_ms - step_ms)
    if 1 not in excess:
        raise ValueError("split_stream_ingress: no reply of a lone stream (batch 1) to read the latency from")
    lone = statistics.fmean(excess[1])
    loaded = max((b for b in excess if b > 1), key=lambda b: (len(excess[b]), b), default=None)
    if loaded is None:
        return 0.0, max(lone, 0.0)
    message_ms = max((statistics.fmean(excess[loaded]) - lone) / (loaded - 1), 0.0)
    return message_ms, max(lone - message_ms, 0.0)


def load_scaled_cells(cells: dict[tuple[int, int], float], decode_then: dict[int, float],
                      decode_now: dict[int, float]) -> dict[tuple[int, int], float]:
    """The batch curve ``cells`` {(batch, tokens_per_row): ms}, measured while the replica's
    decode steps were ``decode_then`` {batch: ms}, carried to a moment when they are
    ``decode_now``: each cell scaled by the ratio now / then of the decode step at its batch
    (linear in the batch between the batches both measured; flat past them).

    Why: other work on the replica's cores slows every forward alike and changes from minute
    to minute (the demo pair's 16-row step read 126 ms in one calibration and 89-120 ms in the
    cells after it); the grid of raw rounds is too long to repeat before every cell, a few
    streams' decode steps are not.
    """
    common = sorted(set(decode_then) & set(decode_now))
    if not common:
        return dict(cells)
    ratios = [decode_now[b] / decode_then[b] for b in common]
    return {(b, t): ms * float(np.interp(b, common, ratios)) for (b, t), ms in cells.items()}


def stream_prefill(streams: list[tuple[int, float, float]], message_ms: float) -> float:
    """A prompt's prefill as a session sees it, from raw Generate streams of one session: the
    first token's time less a steady token's less the request's ingress service."""
    firsts = [1000.0 * first - 1000.0 * (wall - first) / (tokens - 1) - message_ms for tokens, wall, first in streams if tokens > 1]
    return max(statistics.median(firsts), 0.0) if firsts else 0.0
