"""``edgespec bench simcheck``: the fleet simulator against the link emulator, and nothing else.

The simulator is only worth its plans if it predicts what it can be checked against. This runs
the calibration and the check of ``edgespec bench links`` without the rest of that report, in a
quarter of an hour:

1. the replica as it serves, direct (no link), raw sessions of random drafts
   (``calibrate.py``): its batch curve from the forward times it reports in every verdict
   (three passes, each cell the median), its decode step by batch size and a streamed
   token's ingress service and latency from the replies of raw Generate streams (1 alone,
   then N at once: ``probe.py``), and the round's ingress split: service time per round
   message (the part that queues across sessions) vs pure latency, from one session and
   from a loaded replica;
2. the pair on loopback through the emulator, real client (``calibrate.calibrate``):
   acceptance by position, drafting, message sizes, its own time per round (each round less
   the forward the replica reported for it) and per streamed token (less a raw stream's);
3. per link profile: raw single-session rounds through the emulator against as many direct
   ones just before give that link's fixed cost per round
   (``Calibration.round_overhead_by_link_ms``); then the four cells are measured with the
   replica's load read around them (``measure_profile``: raw streams through the same link
   between and around the cells) and predicted with the calibration carried to that load
   (``probe.calibration_now``, ``predict_profile``).

The four cells of a profile, k = 4, one block in flight (what the simulator models):

- 1 session, speculative and cloud-only: the real client (ONNX draft, planner, streaming);
- N sessions, speculative: replayed devices (``replay.py``): the drafts a real device would
  send, computed once, so N devices' drafting does not run on the replica's two cores (a real
  fleet drafts on its own phones); simulated with drafting that costs nothing, as replayed;
- N sessions, cloud-only: N raw Generate streams (the replay's cloud arm).

No number of the check is fitted to a cell it predicts: every calibrated figure comes from
raw rounds and raw streams (random drafts, nothing accepted; direct, or through the link),
single sessions on loopback, or the replica's own step times; a cell's own ms/token is never
read. The simulator is given the workload's acceptance (the per-position acceptance the cells'
own drafts meet at k, read off the replay scripts), so the cells check the timing model, not
the prompts' luck.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

from edgespec.cloud.bench.calibrate import (
    calibrate,
    link_round_overhead,
    link_round_trip_ms,
    replica_verify_model,
    split_round_ingress,
    verify_table,
)
from edgespec.cloud.bench.harness import Harness, shown
from edgespec.cloud.bench.ingress import raw_rounds
from edgespec.cloud.bench.probe import ProbeReplies, ReplicaProbe, calibration_now, lone_streams, probe_replica
from edgespec.cloud.bench.replay import acceptance_by_position, make_scripts, measure_replay
from edgespec.cloud.link.profiles import LinkProfile, get_profile
from edgespec.cloud.simulate.calibration import Calibration
from edgespec.cloud.simulate.config import FleetConfig
from edgespec.cloud.simulate.engine import CLOUD_ONLY, SPECULATIVE, simulate, simulate_path

PROFILES = ("loopback", "lan", "wifi", "5g", "4g", "satellite")
CELLS = ("spec_1", "cloud_1", "spec_n", "cloud_n")
TOLERANCE = 0.10  # a prediction within 10% of the measurement counts as agreeing
REPLAYED_DRAFT_MS = 1e-3  # a replayed device's drafts are precomputed: drafting costs ~nothing


@dataclass(frozen=True)
class SimcheckConfig:
    target: Path
    draft: Path
    prompts: list[str]
    profiles: tuple[str, ...] = PROFILES
    sessions: int = 16
    max_new_tokens: int = 128
    k: int = 4
    single_prompts: int = 4  # prompts of each 1-session cell (arms alternating; the cell is their median)
    link_rounds: int = 40  # raw rounds per link (and as many direct) for its fixed cost
    batch_wait_ms: float = 5.0  # the server's batch_wait_timeout_s (Harness: VerifierConfig's default)
    server: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        for name in self.profiles:
            get_profile(name)
        if not self.prompts:
            raise ValueError("prompts: at least one prompt is needed")
        for name in ("sessions", "max_new_tokens", "k", "single_prompts", "link_rounds"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def calibrate_replica(harness: Harness, prompts: list[str], *, sessions: int, k: int, max_new_tokens: int,
                      batch_wait_ms: float = 5.0, progress: Callable[[str], None] = print):
    """Steps 1 and 2 of the module docstring. Returns the calibration of a real client's
    sessions, the same for replayed devices (no drafting, no client cost per round), the
    replay scripts and the raw figures behind them (``details["cells"]``: the batch curve of
    raw rounds; ``details["probe"]``: the replica probe taken just before it)."""
    info = harness.info
    fingerprint, vocab = info.tokenizer_fingerprint, info.vocab_size
    harness.cloud_only(prompts[0], dict(max_new_tokens=32, stop_token_ids=()))  # warms Generate up
    scripts = make_scripts(harness.client, prompts, max_new_tokens)  # the replayed devices' drafts
    context = round(statistics.fmean(len(s.prompt_ids) for s in scripts)) + max_new_tokens // 2
    # A Generate decode step is no short verification, and a raw round cannot carry a one-token
    # row: the step by batch size is read off real streams' replies (GenerateResponse.batch_size,
    # step_ms), 3 streams one after another (batch 1), then N at once (the batches they form);
    # their reply gaps split a streamed token's cost into ingress service and latency.
    replies = probe_replica(harness.server, fingerprint, scripts, sessions, warm_up=True)
    probe = ReplicaProbe.from_replies(replies)
    decode = probe.decode_ms_by_batch
    decode_ms = decode[1]
    progress(f"  the replica's batch curve (raw rounds, direct, context {context}); lone decode step {decode_ms:.2f} ms")
    verify, runs = replica_verify_model(harness.server, fingerprint, vocab, ks=tuple(sorted({1, k, 8})), context=context,
                                        session_counts=tuple(sorted({n for n in (1, 2, 4, 8) if n < sessions} | {sessions})),
                                        decode_ms=decode_ms, rounds=12, passes=3)
    cells = {(b, t): v for b, row in zip(verify.batch, verify.ms) for t, v in zip(verify.tokens_per_row, row) if t > 1}
    verify = verify_table(cells, decode)
    progress(f"  decode step by batch (real streams) {({b: round(v, 1) for b, v in decode.items()})} ms; "
             f"{sessions} streams at once formed batches of {probe.burst_batch_mean:.1f} on average; a streamed token "
             f"{probe.stream_message_ms:.2f} ms at the ingress + {probe.stream_latency_ms:.2f} ms latency")
    single = raw_rounds(harness.server, fingerprint, vocab, k, 40, 1, prompt_len=context - 20)
    # The loaded run whose forward is the table's (the pass under the load the table stands for).
    loaded = min((r for r in runs if r["k"] == k and r["sessions"] == sessions),
                 key=lambda r: abs(r["cell_ms"] - verify(sessions, k + 1)))
    message_ms = split_round_ingress(verify, single["overhead_ms_median"], loaded, batch_wait_ms)
    progress(f"  verify at batch {list(verify.batch)} (tokens {list(verify.tokens_per_row)}): "
             f"{[[round(v, 1) for v in row] for row in verify.ms]} ms; round overhead {single['overhead_ms_median']:.2f} ms "
             f"direct, {message_ms:.2f} ms of it per message queues; prefill {probe.prefill_ms:.1f} ms")
    harness.use_link(get_profile("loopback"))
    # Acceptance on every prompt of the workload (the replayed devices cycle through all of them).
    calibration = calibrate(harness, prompts, verify, probe.prefill_ms, k=8, max_new_tokens=max_new_tokens,
                            round_message_ms=message_ms, progress=progress)
    # A stream's next step waits for the replica alone: the client's own per-token work does
    # not hold it back, so both device kinds get the raw stream's figures.
    calibration = replace(calibration, ingress_ms_per_stream_message=probe.stream_message_ms,
                          stream_overhead_ms=probe.stream_latency_ms, prefill_ms=probe.prefill_ms,
                          open_overhead_ms=probe.open_overhead_ms)
    client_stream_ms = client_stream_cost(harness, prompts, scripts, max_new_tokens)
    progress(f"  the real client's own time per streamed token beyond a raw stream's: {client_stream_ms:.2f} ms")
    replayed = replace(calibration, draft_ms_per_token=REPLAYED_DRAFT_MS, draft_cv=0.0,
                       round_overhead_ms=max(single["overhead_ms_median"] - 2 * message_ms, 0.0))
    details = {
        "decode_ms": decode_ms,
        "decode_ms_by_batch": decode,
        "burst_batch_mean": probe.burst_batch_mean,
        "prefill_ms": probe.prefill_ms,
        "context": context,
        "verify": verify.to_dict(),
        "cells": cells,
        "probe": probe.to_dict(),
        "replies": replies,
        "verify_points": [{"sessions": r["sessions"], "k": r["k"], "verify_ms_by_batch": r["verify_ms_by_batch"],
                           "round_ms_mean": r["round_ms_mean"], "round_ms_steady_mean": r["round_ms_steady_mean"],
                           "overhead_ms_median": r["overhead_ms_median"]} for r in runs],
        "direct_round": single,
        "round_message_ms": message_ms,
        "stream_message_ms": probe.stream_message_ms,
        "stream_latency_ms": probe.stream_latency_ms,
        "client_round_ms": calibration.round_overhead_ms,
        "client_stream_ms": client_stream_ms,
    }
    return calibration, replayed, scripts, details


def client_stream_cost(harness: Harness, prompts: list[str], scripts, max_new_tokens: int, count: int = 6) -> float:
    """The real client's own time per streamed token: its cloud-only steady ms/token less a raw
    Generate stream's of the same prompt beside it (before it and after it in turn), both
    through the link in use (the calibration's loopback), median over ``count`` prompts. The
    analogue of its own time per round (``calibrate``): raw streams carry the replica's costs,
    the difference is the client's. NOTE: under a burst of load elsewhere a starved client
    reads slow (7 ms in one run, 0-1.3 in others): the median of several pairs in both orders."""
    params = dict(max_new_tokens=max_new_tokens, stop_token_ids=())
    fingerprint = harness.info.tokenizer_fingerprint
    differences = []
    for index, (prompt, script) in enumerate((prompts[i % len(prompts)], scripts[i % len(scripts)]) for i in range(count)):
        if index % 2:
            ((tokens, wall, first),) = lone_streams(harness.address, fingerprint, [script]).lone
            real = harness.cloud_only(prompt, params).stats
        else:
            real = harness.cloud_only(prompt, params).stats
            ((tokens, wall, first),) = lone_streams(harness.address, fingerprint, [script]).lone
        if real.generated > 1 and tokens > 1:
            differences.append(1000.0 * (real.wall_s - real.first_token_s) / (real.generated - 1)
                               - 1000.0 * (wall - first) / (tokens - 1))
    return max(statistics.median(differences), 0.0) if differences else 0.0


def calibrate_link(harness: Harness, profile: LinkProfile, calibrations: tuple[Calibration, Calibration], details: dict,
                   *, k: int, rounds: int) -> tuple[Calibration, Calibration, float]:
    """Step 3's calibration: the link's fixed cost per round from raw single-session rounds
    through it (``harness`` must be using ``profile``), against as many direct ones just before
    (the same load), added to both calibrations."""
    info = harness.info
    args = (info.tokenizer_fingerprint, info.vocab_size, k, rounds, 1)
    direct = raw_rounds(harness.server, *args, prompt_len=details["context"] - 20)
    raw = raw_rounds(harness.address, *args, prompt_len=details["context"] - 20)
    calibration, replayed = calibrations
    fixed = link_round_overhead(raw["overhead_ms_median"], direct["overhead_ms_median"], profile,
                                calibration.up_bytes(k), calibration.down_bytes_per_round)
    costs = calibration.round_overhead_by_link_ms | {profile.name: fixed}
    return (replace(calibration, round_overhead_by_link_ms=costs), replace(replayed, round_overhead_by_link_ms=costs), fixed)


def measure_profile(harness: Harness, profile: LinkProfile, scripts, *, sessions: int, k: int, max_new_tokens: int,
                    prompts: list[str], seed: int = 0, probes: bool = False, link_ms: float = 0.0) -> dict:
    """The four cells of one link, measured (1 session: the real client, arms alternating; N:
    replayed devices and raw Generate streams). ``probes``: the replica's load read around
    them, through the same link (``probe.py``; ``link_ms``: the round trip it models): a lone
    raw stream after each prompt's pair of 1-session runs, and a probe (1 lone stream, N at
    once) before the N-session cloud-only arm, between it and the speculative arm, and after
    that; ``"replies"`` then holds what each group of cells is calibrated from (an N-session
    cell: the probes on either side of it)."""
    params = dict(max_new_tokens=max_new_tokens, k=k, send_ahead=1, stop_token_ids=(), seed=seed)
    fingerprint = harness.info.tokenizer_fingerprint
    by_prompt = {tuple(script.prompt_ids): script for script in scripts}
    spec, cloud, lone = [], [], ProbeReplies()
    for i, prompt in enumerate(prompts):
        arms = ((spec, harness.speculative), (cloud, harness.cloud_only))
        for results, run in arms if i % 2 == 0 else arms[::-1]:
            results.append(run(prompt, params))
        if probes:
            lone += lone_streams(harness.address, fingerprint, [by_prompt[tuple(harness.client.encode(prompt))]],
                                 link_ms=link_ms)
        harness.progress(f"  {profile.name} 1 session prompt {i + 1}/{len(prompts)}")
    def probe() -> ProbeReplies:
        return probe_replica(harness.address, fingerprint, scripts, sessions, lone=1, link_ms=link_ms) if probes else ProbeReplies()

    # Each N-session arm between two probes (the load drifts by tens of percent over minutes
    # on shared cores): a probe, the cloud-only arm, a probe, the speculative arm, a probe.
    middle: list[ProbeReplies] = []
    before = probe()
    many = measure_replay(harness.address, fingerprint, scripts, sessions, k, cloud_first=True,
                          between=lambda: middle.append(probe()))
    after = probe()
    between = middle[0] if middle else ProbeReplies()
    # The median prompt: a burst of load elsewhere on the shared cores during one prompt's run
    # (seconds) moves a mean of a few by tens of percent.
    measured = {
        "spec_1": statistics.median(r.stats.ms_per_token for r in spec),
        "cloud_1": statistics.median(r.stats.ms_per_token for r in cloud),
        "spec_n": many.speculative_ms_per_token,
        "cloud_n": many.cloud_only_ms_per_token,
    }
    row = {
        "measured": measured, "replay": many.to_dict(),
        "by_prompt": {"spec_1": [r.stats.ms_per_token for r in spec], "cloud_1": [r.stats.ms_per_token for r in cloud]},
        "single_prompt_ids": [harness.client.encode(prompt) for prompt in prompts],
        "tau_1": (sum(r.stats.accepted for r in spec) + sum(r.stats.rounds for r in spec)) / max(sum(r.stats.rounds for r in spec), 1),
    }
    if probes:
        # The 1-session cells: the lone streams between them (the bursts only for the stream's
        # ingress split); the N-session cells: the probes around them, and the lone streams.
        row["replies"] = {"one": lone + (before + between + after).only_burst(), "spec_n": lone + between + after,
                          "cloud_n": lone + before + between}
        row["probes"] = {name: ReplicaProbe.from_replies(replies).to_dict()
                         for name, replies in (("before", before), ("between", between), ("after", after))}
    return row


def predict_profile(profile: LinkProfile, calibration: Calibration, replayed: Calibration, scripts, measured: dict, *,
                    sessions: int, k: int, max_new_tokens: int, seed: int = 0,
                    replayed_cloud: Calibration | None = None) -> dict:
    """The four cells of one link simulated (``calibration`` for the real client, ``replayed``
    for the replayed devices; ``replayed_cloud``, if given, for the N cloud-only streams, which
    ran at another moment's load), next to ``measured`` (``measure_profile``'s)."""
    # The simulator is given the workload's acceptance (what the cells' own drafts meet at this
    # k: the first prompts for 1 session, the replay's cycle for N), so the cells check timing.
    by_prompt = {tuple(script.prompt_ids): script for script in scripts}
    singles = [by_prompt[tuple(ids)] for ids in measured["single_prompt_ids"]]
    calibration = replace(calibration, acceptance=acceptance_by_position(singles, k))
    replayed = replace(replayed, acceptance=acceptance_by_position([scripts[i % len(scripts)] for i in range(sessions)], k))
    streams = replayed if replayed_cloud is None else replace(replayed_cloud, acceptance=replayed.acceptance)
    predicted, simulated = {}, {}
    for label, devices, spec_cal, cloud_cal in (("1", 1, calibration, calibration), ("n", sessions, replayed, streams)):
        fleet = FleetConfig(devices=devices, link_mix=profile, k=k, tokens_per_device=max_new_tokens, seed=seed)
        spec, cloud = simulate_path(fleet, spec_cal, SPECULATIVE), simulate_path(fleet, cloud_cal, CLOUD_ONLY)
        predicted[f"spec_{label}"], predicted[f"cloud_{label}"] = spec.mean_ms_per_token, cloud.mean_ms_per_token
        simulated[label] = {"speculative_batch_mean": spec.mean_batch_size, "cloud_only_batch_mean": cloud.mean_batch_size,
                            "acceptance_length": spec.acceptance_length}
    # The 1-session speculative cell is the median prompt (``measure_profile``), and prompts
    # differ in acceptance far more than in anything else: each prompt is simulated with its
    # own acceptance, and the median of those is the prediction.
    per_prompt = [simulate(FleetConfig(devices=1, link_mix=profile, k=k, tokens_per_device=max_new_tokens, seed=seed),
                           replace(calibration, acceptance=acceptance_by_position([single], k)), baseline=False)
                  .speculative.mean_ms_per_token for single in singles]
    predicted["spec_1"] = statistics.median(per_prompt)
    errors = {key: predicted[key] / measured["measured"][key] - 1.0 for key in CELLS}
    return {"predicted": predicted, "errors": errors, "simulated": simulated, "predicted_by_prompt": {"spec_1": per_prompt}}


def check_profile(harness: Harness, profile: LinkProfile, calibration: Calibration, replayed: Calibration, scripts, *,
                  sessions: int, k: int, max_new_tokens: int, prompts: list[str], seed: int = 0) -> dict:
    """The four cells of one link: measured, then simulated with the calibrations as given."""
    measured = measure_profile(harness, profile, scripts, sessions=sessions, k=k, max_new_tokens=max_new_tokens,
                               prompts=prompts, seed=seed)
    return measured | predict_profile(profile, calibration, replayed, scripts, measured, sessions=sessions, k=k,
                                      max_new_tokens=max_new_tokens, seed=seed)


def run_simcheck(config: SimcheckConfig, out: Path, progress: Callable[[str], None] = print) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    shown_progress = progress
    progress = lambda line: shown_progress(f"[{time.perf_counter() - started:5.0f} s] {line}")  # noqa: E731
    with Harness(config.target, config.draft, server=config.server, progress=progress, max_sessions=config.sessions + 8) as harness:
        harness.warm_up(config.prompts[0])
        progress("[1/2] calibrating the replica (direct) and the pair (loopback)")
        calibration, replayed, scripts, details = calibrate_replica(
            harness, config.prompts, sessions=config.sessions, k=config.k, max_new_tokens=config.max_new_tokens,
            batch_wait_ms=config.batch_wait_ms, progress=progress)
        fingerprint = harness.info.tokenizer_fingerprint
        first = details.pop("replies")
        second = probe_replica(harness.server, fingerprint, scripts, config.sessions)
        # The batch curve was measured between these two probes: their replies stand for its load.
        base = ReplicaProbe.from_replies(first + second)
        details["probe"] = base.to_dict()
        progress(f"  {describe(base, 'the calibration')}")
        rows = []
        for index, name in enumerate(config.profiles):
            profile = get_profile(name)
            progress(f"[2/2] link {name} ({index + 1}/{len(config.profiles)}): its fixed cost, then the four cells")
            harness.use_link(profile)
            calibration, replayed, fixed = calibrate_link(harness, profile, (calibration, replayed), details, k=config.k,
                                                          rounds=config.link_rounds)
            row = measure_profile(harness, profile, scripts, sessions=config.sessions, k=config.k,
                                  max_new_tokens=config.max_new_tokens, prompts=config.prompts[: config.single_prompts],
                                  seed=config.seed, probes=True,
                                  link_ms=link_round_trip_ms(profile, calibration.open_bytes, calibration.down_bytes_per_token))
            replies = row.pop("replies")
            one, spec_n, cloud_n = (ReplicaProbe.from_replies(replies[key]) for key in ("one", "spec_n", "cloud_n"))
            progress(f"  {describe(one, '1 session')}; {describe(cloud_n, f'{config.sessions} streams')}; "
                     f"{describe(spec_n, f'{config.sessions} speculative sessions')}")
            row |= predict_profile(
                profile, calibration_now(calibration, details["cells"], base, one, client_stream_ms=details["client_stream_ms"]),
                calibration_now(replayed, details["cells"], base, spec_n), scripts, row, sessions=config.sessions, k=config.k,
                max_new_tokens=config.max_new_tokens, seed=config.seed,
                replayed_cloud=calibration_now(replayed, details["cells"], base, cloud_n))
            row |= {"profile": name, "link_fixed_ms": fixed,
                    "load": {"1": one.to_dict(), "n": spec_n.to_dict(), "cloud_n": cloud_n.to_dict()}}
            rows.append(row)
            progress("  " + ", ".join(f"{key} {row['measured'][key]:.1f} vs {row['predicted'][key]:.1f} ({row['errors'][key]:+.0%})"
                                      for key in CELLS))
        harness.use_link(None)
    calibration.save(out / "calibration.json")
    replayed.save(out / "calibration-replayed.json")
    details["cells"] = [{"batch": b, "tokens_per_row": t, "ms": ms} for (b, t), ms in sorted(details["cells"].items())]
    report = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items() if k != "prompts"}
        | {"prompts": len(config.prompts)},
        "replica": details,
        "calibration_source": calibration.source,
        "profiles": rows,
        "within": agreeing(rows),
        "cells": len(rows) * len(CELLS),
        "wall_s": time.perf_counter() - started,
    }
    (out / "simcheck.json").write_text(json.dumps(report, indent=2, default=str))
    (out / "simcheck.md").write_text(markdown(report, config))
    return report


def describe(probe: ReplicaProbe, label: str) -> str:
    return (f"load at {label}: decode step {({b: round(v, 1) for b, v in probe.decode_ms_by_batch.items()})} ms, "
            f"streamed token {probe.stream_message_ms:.2f} ms ingress + {probe.stream_latency_ms:.2f} ms latency, "
            f"prefill {probe.prefill_ms:.1f} ms + {probe.open_overhead_ms:.1f} ms of call setup")


def agreeing(rows: list[dict], tolerance: float = TOLERANCE) -> int:
    return sum(abs(e) <= tolerance for row in rows for e in row["errors"].values())


def markdown(report: dict, config: SimcheckConfig) -> str:
    replica = report["replica"]
    verify = replica["verify"]
    n = config.sessions
    lines = [
        f"# Simulator vs emulator: k={config.k}, one block in flight, 1 and {n} sessions",
        "",
        f"Target `{shown(config.target)}`, draft `{shown(config.draft)}`, {config.max_new_tokens} new tokens, greedy; "
        f"{report['wall_s']:.0f} s for the whole check (`edgespec bench simcheck`).",
        "",
        "Calibrated, nothing fitted to a cell below (a cell's own ms/token is never read): the replica's batch curve "
        f"(its own verdict times, raw rounds at the workload's mean context of {replica['context']} tokens, three passes, "
        "each cell the median; table below, under the load of the calibration); the decode step (1-token column) by batch "
        "and a streamed token's ingress service and latency from raw Generate streams' replies "
        "(`GenerateResponse.batch_size`/`step_ms`; each reply's gap less its step: "
        + ", ".join(f"{v:.1f} ms at {b}" for b, v in replica["decode_ms_by_batch"].items())
        + f", {replica['stream_message_ms']:.2f} ms + {replica['stream_latency_ms']:.2f} ms at the calibration); a direct "
        f"round's overhead {replica['direct_round']['overhead_ms_median']:.2f} ms, of it {replica['round_message_ms']:.2f} ms "
        "per message queueing at the ingress (the split that reproduces a loaded replica's raw rounds); acceptance, "
        f"drafting, the real client's own {replica['client_round_ms']:.2f} ms per round (each round less the forward the "
        f"replica reported for it) and {replica['client_stream_ms']:.2f} ms per streamed token (less a raw stream's) from "
        "the real client on loopback; each link's fixed cost from raw rounds through it against direct ones just before. "
        "**The load**: around each link's cells, raw streams through the same link (a lone one after each 1-session pair, "
        f"a lone one and {n} at once before the {n}-session cloud-only arm, between it and the speculative arm, and "
        "after that) read the decode steps, the streamed token's costs and the prefill again; each group of cells is "
        "predicted with those on either side of it, and the batch curve "
        "scaled by the decode steps' ratio to the calibration's (columns `load` below).",
        "",
        "| rows \\ tokens per row | " + " | ".join(str(t) for t in verify["tokens_per_row"]) + " |",
        "|---|" + "---|" * len(verify["tokens_per_row"]),
    ]
    lines += [f"| {b} | " + " | ".join(f"{v:.1f}" for v in row) + " |" for b, row in zip(verify["batch"], verify["ms"])]
    lines += [
        "",
        f"1 session: the real client. {n} sessions: replayed devices (precomputed drafts, so {n} devices' drafting "
        "does not run on the replica's cores) and raw Generate streams.",
        "",
        "| link | fixed ms/round | path | sessions | load: decode step at 1 / N, ms | emulated ms/token | simulated | error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in report["profiles"]:
        for key, path, count in (("spec_1", "speculative", 1), ("spec_n", "speculative", n),
                                 ("cloud_1", "cloud-only", 1), ("cloud_n", "cloud-only", n)):
            error = row["errors"][key]
            mark = "" if abs(error) <= TOLERANCE else " **miss**"
            loads = row.get("load", {})
            moment = "1" if count == 1 else "cloud_n" if key == "cloud_n" and "cloud_n" in loads else "n"
            load = loads.get(moment, {}).get("decode_ms_by_batch", {})
            steps = " / ".join(f"{v:.1f}" for v in load.values()) or "-"
            lines.append(f"| {row['profile']} | {row['link_fixed_ms']:.1f} | {path} | {count} | {steps} | "
                         f"{row['measured'][key]:.1f} | {row['predicted'][key]:.1f} | {error:+.1%}{mark} |")
    lines += ["", f"{report['within']}/{report['cells']} predictions within {TOLERANCE:.0%} of the emulated measurement.", "",
              f"Cloud-only, {n} sessions: the replica's decoding batches (mean rows, mean step) measured vs simulated:", ""]
    lines += [f"- {row['profile']}: {row['replay'].get('cloud_only_batch_mean', 0):.1f} rows, "
              f"{row['replay'].get('cloud_only_step_ms', 0):.1f} ms measured; "
              f"{row['simulated']['n']['cloud_only_batch_mean']:.1f} rows simulated" for row in report["profiles"]]
    lines.append("")
    return "\n".join(lines)
