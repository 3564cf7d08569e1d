"""``edgespec bench links``: what each network link does to speculative vs cloud-only generation,
where a round's time goes, and the fleet simulator checked against the emulator.

1. calibrate: the simulator on loopback (``calibrate.py``), and the ingress: raw rounds direct
   and through the emulator's transparent profile (its own CPU per round);
2. per link profile, through the link emulator, arms alternating prompt by prompt:
   - speculative with the defaults (k auto, send-ahead auto, the planner choosing the path) vs
     cloud-only streaming: ``speedup_auto``, and which path produced the tokens;
   - one-variable variants, always speculating: k=4 with one block in flight (the round-time
     breakdown comes from it), adaptive k with and without send-ahead, with a tree;
   - exact vs token-only sampling at T=0.8;
   - 16 concurrent sessions of each path: ``capacity_ratio`` (tokens/s of the replica), with
     the devices' drafting replayed off this machine's cores (``replay.py``: the same drafts a
     real device sends, every output checked; 16 SDK clients drafting on the replica's two
     cores measure the clients instead);
   - the simulator's prediction for 1 and N sessions of k=4 rounds against the emulator
     (``simcheck.py``, which ``edgespec bench simcheck`` runs alone, with its calibration);
3. the same speedup, measured through another ingress (Serve's proxy) in a child process;
4. simulator sweeps with the measured calibration.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from edgespec.cloud.bench.replay import measure_replay
from edgespec.cloud.bench.simcheck import calibrate_link, calibrate_replica, check_profile
from edgespec.cloud.bench.harness import Harness, Summary, shown, switch_log
from edgespec.cloud.bench.ingress import raw_rounds
from edgespec.cloud.link.profiles import get_profile
from edgespec.cloud.simulate import sweeps


@dataclass(frozen=True)
class LinksConfig:
    target: Path
    draft: Path
    prompts: list[str]
    profiles: tuple[str, ...] = ("loopback", "lan", "wifi", "5g", "4g", "satellite")
    sessions: int = 16
    max_new_tokens: int = 128
    main_prompts: int = 6  # prompts of the headline comparison (each arm, alternating)
    variant_prompts: int = 3  # prompts of each variant row
    capacity_k: tuple[int, ...] = (4, 8)  # drafts per round of the replayed devices (the best one is reported)
    other_ingresses: tuple[str, ...] = ("proxy",)
    server: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        for name in self.profiles:
            get_profile(name)  # unknown names fail here, before anything starts
        if not self.prompts:
            raise ValueError("prompts: at least one prompt is needed")
        for name in ("sessions", "max_new_tokens", "main_prompts", "variant_prompts"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def _greedy(config: LinksConfig, **params) -> dict:
    return dict(max_new_tokens=config.max_new_tokens, stop_token_ids=(), seed=config.seed, **params)


SIMULATED_K = 4  # the simulator check's k (one block in flight)

# The variants: always speculating, one thing changed at a time.
VARIANTS = {
    "k4_one_in_flight": dict(k=4, send_ahead=1),
    "adaptive_one_in_flight": dict(k="auto", speculate=True, send_ahead=1),
    "adaptive_send_ahead": dict(k="auto", speculate=True, send_ahead="auto"),
    "adaptive_tree": dict(k="auto", speculate=True, send_ahead=1, tree=4),
}


def run_links(config: LinksConfig, out: Path, progress: Callable[[str], None] = print) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    with Harness(config.target, config.draft, server=config.server, progress=progress, max_sessions=config.sessions + 8) as harness:
        harness.warm_up(config.prompts[0])
        progress("[1/4] calibrating: the ingress (raw rounds, direct and through the emulator) and the simulator")
        ingress = _ingress_calibration(harness)
        calibration, replayed, scripts, replica = calibrate_replica(  # scripts: the replayed devices' drafts
            harness, config.prompts, sessions=config.sessions, k=SIMULATED_K, max_new_tokens=config.max_new_tokens,
            progress=progress)
        replica.pop("replies", None)  # the probe's raw replies: simcheck's, not this report's
        rows = []
        for index, name in enumerate(config.profiles):
            profile = get_profile(name)
            progress(f"[2/4] link {name} ({index + 1}/{len(config.profiles)}): RTT {profile.rtt_ms} ms + jitter {profile.jitter_ms} ms")
            harness.use_link(profile)
            calibration, replayed, _ = calibrate_link(harness, profile, (calibration, replayed), replica, k=SIMULATED_K, rounds=15)
            rows.append(_profile_row(harness, config, profile, (calibration, replayed), ingress, scripts, progress))
        harness.use_link(None)
        calibration.save(out / "calibration.json")
    progress("[3/4] the headline comparison through the other ingress(es), in a child process each")
    others = {ingress_name: _other_ingress(config, ingress_name, progress) for ingress_name in config.other_ingresses}
    for row in rows:
        row["other_ingresses"] = {name: per_profile.get(row["profile"]) for name, per_profile in others.items()}
    progress("[4/4] simulator sweeps with the measured calibration")
    sweep_data = {
        "speedup_vs_rtt": sweeps.speedup_vs_rtt(calibration=calibration, k=4, tokens_per_device=config.max_new_tokens, seed=config.seed),
        "optimal_k_vs_rtt": sweeps.optimal_k_vs_rtt(calibration=calibration, seed=config.seed),
        "capacity_vs_devices": sweeps.capacity_vs_devices(calibration=calibration, link_mix="lan", k=4, seed=config.seed),
    }
    sweeps.plot_speedup_vs_rtt(sweep_data["speedup_vs_rtt"], out / "sim_speedup_vs_rtt.png")
    sweeps.plot_optimal_k(sweep_data["optimal_k_vs_rtt"], out / "sim_optimal_k_vs_rtt.png")
    sweeps.plot_capacity(sweep_data["capacity_vs_devices"], out / "sim_capacity_vs_devices.png")
    report = {"config": _settings(config), "ingress_calibration": ingress, "profiles": rows, "simulator_sweeps": sweep_data}
    (out / "links.json").write_text(json.dumps(report, indent=2, default=str))
    (out / "links.md").write_text(markdown(report, config, calibration.source))
    _plot_measured(rows, out)
    return report


def _settings(config: LinksConfig) -> dict:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items() if k != "prompts"} | {"prompts": len(config.prompts)}


def _ingress_calibration(harness: Harness) -> dict:
    """A round's overhead beyond the forward: direct, and through the emulator adding nothing."""
    info = harness.info
    direct = raw_rounds(harness.server, info.tokenizer_fingerprint, info.vocab_size, 4, 60, 1)
    harness.use_link(get_profile("loopback"))
    through = raw_rounds(harness.address, info.tokenizer_fingerprint, info.vocab_size, 4, 60, 1)
    return {
        "direct_overhead_ms": direct["overhead_ms_median"],
        "emulator_overhead_ms": through["overhead_ms_median"],
        "emulator_cpu_ms": max(through["overhead_ms_median"] - direct["overhead_ms_median"], 0.0),
        "forward_ms": direct["verify_ms_median"],
    }


def _profile_row(harness: Harness, config: LinksConfig, profile, calibrations, ingress: dict, scripts, progress) -> dict:
    main = config.prompts[: config.main_prompts]
    few = config.prompts[: config.variant_prompts]
    spec, cloud = harness.compare(main, _greedy(config), profile.name)
    spec_s, cloud_s = Summary.of(spec), Summary.of(cloud)
    segments = {"speculative": 0, "cloud_only": 0}
    for result in spec:
        for path, count in result.segments:
            segments[path] += count
    decisions = [switch_log(result) for result in spec]
    for i, log in enumerate(decisions):
        if log:
            progress(f"  {profile.name} auto, prompt {i + 1}: " + "; ".join(decision_text(d) for d in log))
    variants, breakdown = {}, None
    for label, params in VARIANTS.items():
        before = _link_delays(harness)
        results = harness.run(few, _greedy(config, **params), f"{profile.name} {label}")
        after = _link_delays(harness)
        summary = Summary.of(results)
        variants[label] = {"ms_per_token": summary.ms_per_token, "tau": summary.tau, "mean_k": summary.mean_k,
                           "speedup": cloud_s.ms_per_token / summary.ms_per_token,
                           "ahead_hits": sum(r.stats.ahead_hits for r in results),
                           "discarded_blocks": sum(r.stats.discarded_blocks for r in results)}
        if label == "k4_one_in_flight":
            breakdown = _breakdown(results, tuple(a - b for a, b in zip(after, before)), ingress)
    sampled = _greedy(config, temperature=0.8, k=4)
    exact = Summary.of(harness.run(few, dict(sampled, mode="exact"), f"{profile.name} exact"))
    token = Summary.of(harness.run(few, dict(sampled, mode="token"), f"{profile.name} token"))
    progress(f"  {profile.name}: {config.sessions} concurrent sessions of each path")
    capacities = [measure_replay(harness.address, harness.info.tokenizer_fingerprint, scripts, config.sessions, k,
                                 cloud_first=i % 2 == 0) for i, k in enumerate(config.capacity_k)]
    capacity = max(capacities, key=lambda row: row.gain)
    sim = check_profile(harness, profile, *calibrations, scripts, sessions=config.sessions, k=SIMULATED_K,
                        max_new_tokens=config.max_new_tokens, prompts=config.prompts[: config.variant_prompts], seed=config.seed)
    row = {
        "profile": profile.name,
        "rtt_ms": profile.rtt_ms,
        "jitter_ms": profile.jitter_ms,
        "speedup_auto": cloud_s.ms_per_token / spec_s.ms_per_token,
        "speculative": spec_s.to_dict(),
        "cloud_only": cloud_s.to_dict(),
        "tokens_by_path": segments,
        "decisions": decisions,
        "variants": variants,
        # k=auto against the faster of cloud-only and the always-speculating variants, on the
        # prompts the variants ran (the headline comparison may run more of them).
        "auto_vs_faster": min([Summary.of(cloud[: len(few)]).ms_per_token]
                              + [v["ms_per_token"] for v in variants.values()]) / Summary.of(spec[: len(few)]).ms_per_token,
        "send_ahead_gain": variants["adaptive_one_in_flight"]["ms_per_token"] / variants["adaptive_send_ahead"]["ms_per_token"],
        "tree_gain": variants["adaptive_one_in_flight"]["ms_per_token"] / variants["adaptive_tree"]["ms_per_token"],
        "breakdown": breakdown,
        "sampling": {
            "exact": {"ms_per_token": exact.ms_per_token, "bytes_per_round": exact.bytes_per_round, "tau": exact.tau},
            "token": {"ms_per_token": token.ms_per_token, "bytes_per_round": token.bytes_per_round, "tau": token.tau},
        },
        "capacity": capacity.to_dict(),
        "capacity_by_k": [row.to_dict() for row in capacities],
        "capacity_ratio": capacity.gain,
        "sim": sim,
    }
    progress(
        f"  {profile.name}: auto {row['speedup_auto']:.2f}x ({segments['speculative']} speculative / {segments['cloud_only']} "
        f"cloud-only tokens), k=4 {variants['k4_one_in_flight']['speedup']:.2f}x, send-ahead gain {row['send_ahead_gain']:.2f}x, "
        f"tree gain {row['tree_gain']:.2f}x, capacity {row['capacity_ratio']:.2f}x"
    )
    return row


def decision_text(d: dict) -> str:
    """One decision: where, which way, the two predictions (ms/token) that made it, and why."""
    shown = lambda ms: "?" if ms is None else f"{ms:.1f}"  # noqa: E731
    way = f"start {d['to_path']}" if not d.get("from_path") else f"@{d['at_token']} {d['from_path']} -> {d['to_path']}"
    return (f"{way} (spec {shown(d.get('predicted_spec_ms_per_token'))} / cloud "
            f"{shown(d.get('predicted_cloud_ms_per_token'))} ms/token: {d.get('reason', '')})")


def decisions_markdown(rows: list[dict]) -> list[str]:
    """The report's table of k=auto's decisions, per link and prompt (none: no lines)."""
    decided = [(row["profile"], i, d) for row in rows for i, log in enumerate(row.get("decisions") or []) for d in log]
    if not decided:
        return []
    shown = lambda ms: "n/a" if ms is None else f"{ms:.1f}"  # noqa: E731
    lines = [
        "",
        "k=auto's decisions (the planner's switch log: each request's start and every switch, with the "
        "predictions that made it):",
        "",
        "| link | prompt | at token | from | to | predicted speculative ms/token | predicted cloud-only ms/token | why |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for profile, i, d in decided:
        lines.append(f"| {profile} | {i + 1} | {d['at_token']} | {d.get('from_path') or 'start'} | {d['to_path']} | "
                     f"{shown(d.get('predicted_spec_ms_per_token'))} | {shown(d.get('predicted_cloud_ms_per_token'))} | "
                     f"{d.get('reason', '')} |")
    return lines


def _link_delays(harness: Harness) -> tuple[float, int, int, float, int]:
    """The emulator's scheduled delays so far (ms, both directions summed), its chunk counts, and
    how late it wrote chunks after their release (ms summed, chunks)."""
    stats = harness.link.stats
    return stats.delay_ms_up + stats.delay_ms_down, stats.chunks_up, stats.chunks_down, stats.late_ms, stats.late_chunks


def _breakdown(results, delays, ingress: dict) -> dict:
    """Where a round's time goes, each part measured on its own, against the measured round."""
    rounds = [r for result in results for r in result.rounds]
    delay_ms, up_chunks, down_chunks, late_ms, late_chunks = delays
    # The emulator's delays cover every chunk of the runs (Open, Opened, Close too): per round,
    # one Draft chunk up and one Verdict chunk down, at the mean delay of each.
    link = delay_ms / max(up_chunks + down_chunks, 1) * 2
    late = late_ms / max(late_chunks, 1) * 2  # the emulator's own lateness, both directions
    measured = statistics.fmean(r.wall_ms for r in rounds) if rounds else 0.0
    wait = statistics.fmean(r.wait_ms for r in rounds) if rounds else 0.0
    parts = {
        "link_ms": link,
        "ingress_ms": ingress["emulator_overhead_ms"],  # measured on loopback through the emulator
        "verify_ms": statistics.fmean(r.verify_ms for r in rounds) if rounds else 0.0,
        "draft_ms": statistics.fmean(r.draft_ms for r in rounds) if rounds else 0.0,
        "client_ms": max(measured - wait - (statistics.fmean(r.draft_ms for r in rounds) if rounds else 0.0), 0.0),
        "emulator_late_ms": late,  # the emulator's, not the product's: its timers on shared cores
    }
    total = sum(parts.values())
    return parts | {
        "emulator_cpu_ms": ingress["emulator_cpu_ms"],
        "sum_ms": total,
        "measured_round_ms": measured,
        "error": total / measured - 1.0 if measured else 0.0,
        "rounds": len(rounds),
    }


def _other_ingress(config: LinksConfig, ingress: str, progress) -> dict:
    """speedup_auto per profile through ``ingress``, measured in a child process (a fresh Ray)."""
    payload = {**_settings(config), "prompts": config.prompts, "ingress": ingress}
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "rows.json"
        code = ("import json, sys; from pathlib import Path; from edgespec.cloud.bench.links import headline_worker; "
                f"Path({str(result)!r}).write_text(json.dumps(headline_worker(json.load(sys.stdin))))")
        proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(payload), capture_output=True, text=True, timeout=7200)
        if proc.returncode != 0 or not result.is_file():
            progress(f"  the {ingress} ingress measurement failed: {proc.stderr[-2000:]}")
            return {}
        rows = json.loads(result.read_text())
    for name, row in rows.items():
        progress(f"  {ingress} ingress, {name}: auto {row['speedup_auto']:.2f}x ({row['speculative_ms_per_token']:.1f} vs "
                 f"{row['cloud_only_ms_per_token']:.1f} ms/token)")
    return rows


def headline_worker(payload: dict) -> dict:
    """Child process: Serve with ``payload['ingress']``, the headline comparison per profile."""
    config = LinksConfig(target=Path(payload["target"]), draft=Path(payload["draft"]), prompts=payload["prompts"],
                         profiles=tuple(payload["profiles"]), max_new_tokens=payload["max_new_tokens"],
                         main_prompts=payload["main_prompts"], seed=payload["seed"])
    rows = {}
    with Harness(config.target, config.draft, ingress=payload["ingress"], progress=lambda m: print(m, file=sys.stderr)) as harness:
        harness.warm_up(config.prompts[0])
        for name in config.profiles:
            harness.use_link(get_profile(name))
            spec, cloud = harness.compare(config.prompts[: config.main_prompts], _greedy(config), name)
            spec_s, cloud_s = Summary.of(spec), Summary.of(cloud)
            rows[name] = {"speedup_auto": cloud_s.ms_per_token / spec_s.ms_per_token,
                          "speculative_ms_per_token": spec_s.ms_per_token, "cloud_only_ms_per_token": cloud_s.ms_per_token}
        harness.use_link(None)
    return rows


# ---- the report --------------------------------------------------------------------------------


def markdown(report: dict, config: LinksConfig, calibration_source: str) -> str:
    rows = report["profiles"]
    ingress = report["ingress_calibration"]
    others = sorted({name for row in rows for name in (row.get("other_ingresses") or {})})
    lines = [
        "# edgespec over network links",
        "",
        f"Target `{shown(config.target)}`, draft `{shown(config.draft)}`, {config.max_new_tokens} new tokens, greedy. "
        "Links emulated in user space (`edgespec link`; profiles and sources in docs/links.md); Serve's HAProxy ingress. "
        "Each figure is a ratio measured within this run, speculative and cloud-only alternating prompt by prompt.",
        "",
        "## Per-user speedup over cloud-only streaming (ms/token, same ingress)",
        "",
        "| link | RTT + jitter ms | speculative ms/token | cloud-only ms/token | **speedup (auto)** | tokens speculative / cloud-only | "
        "k=4, 1 in flight | send-ahead gain | tree gain | capacity at " + f"{config.sessions} sessions |"
        + "".join(f" auto through {name} |" for name in others),
        "|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(others),
    ]
    for row in rows:
        v = row["variants"]
        cells = [
            row["profile"], f"{row['rtt_ms']:g} + {row['jitter_ms']:g}", f"{row['speculative']['ms_per_token']:.1f}",
            f"{row['cloud_only']['ms_per_token']:.1f}", f"**{row['speedup_auto']:.2f}x**",
            f"{row['tokens_by_path']['speculative']} / {row['tokens_by_path']['cloud_only']}",
            f"{v['k4_one_in_flight']['speedup']:.2f}x", f"{row['send_ahead_gain']:.2f}x", f"{row['tree_gain']:.2f}x",
            f"{row['capacity_ratio']:.2f}x",
        ]
        for name in others:
            other = (row.get("other_ingresses") or {}).get(name)
            cells.append(f"{other['speedup_auto']:.2f}x" if other else "n/a")
        lines.append("| " + " | ".join(cells) + " |")
    lines += decisions_markdown(rows)
    lines += [
        "",
        "Variants (always speculating, 1 thing changed): k=4 with one block in flight (the round-time breakdown below); "
        "adaptive k with one block in flight, with send-ahead (gain = the first over the second in ms/token), and with "
        "a tree of 4 runner-up tokens per block (gain likewise). Capacity: generated tokens/s of the one replica with "
        f"{config.sessions} concurrent devices, speculative over cloud-only, the devices replayed (one block in flight: the drafts a real device sends, computed once, so that 16 devices' drafting does not run on "
        "the replica's cores; every replayed output was checked against the target's).",
        "",
        "| link | variant | ms/token | tau | mean k | verified ahead / discarded |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        for label, v in row["variants"].items():
            lines.append(f"| {row['profile']} | {label} | {v['ms_per_token']:.1f} | {v['tau']:.2f} | {v['mean_k']:.1f} | "
                         f"{v['ahead_hits']} / {v['discarded_blocks']} |")
    lines += [
        "",
        f"## Capacity: one replica, {config.sessions} devices (replayed; the better of k={config.capacity_k})",
        "",
        "| link | k | speculative tokens/s | cloud-only tokens/s | **ratio** | per device ms/token spec / cloud | tau | batch mean | outputs exact |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        c = row["capacity"]
        lines.append(f"| {row['profile']} | {c['k']} | {c['speculative_tokens_per_s']:.0f} | {c['cloud_only_tokens_per_s']:.0f} | "
                     f"**{c['gain']:.2f}x** | {c['speculative_ms_per_token']:.1f} / {c['cloud_only_ms_per_token']:.1f} | "
                     f"{c['tau']:.2f} | {c['batch_size_mean']:.1f} | {'yes' if c['exact'] else 'NO'} |")
    lines += [
        "",
        "## Where a round's time goes (k=4, one block in flight)",
        "",
        f"Each part measured on its own: link = the emulator's scheduled delay of one chunk up and one down (mean over "
        f"the run's chunks); ingress = a raw round's overhead beyond the forward on loopback through the emulator "
        f"({ingress['emulator_overhead_ms']:.2f} ms, of which {ingress['emulator_cpu_ms']:.2f} ms is the emulator's own "
        f"CPU: {ingress['direct_overhead_ms']:.2f} ms without it); verify = the replica's forward + accept (reported "
        "in each verdict); draft = the device's drafting; client = the rest of the device's round (wall - wait - draft); "
        "emulator late = how long after a chunk's release time the emulator wrote it (its event loop's timers and CPU "
        "on these shared cores: the emulator's share, not the product's).",
        "",
        "| link | measured round ms | link | ingress | verify | draft | client | emulator late | sum | error |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        b = row["breakdown"]
        lines.append(
            f"| {row['profile']} | {b['measured_round_ms']:.1f} | {b['link_ms']:.1f} | {b['ingress_ms']:.1f} | {b['verify_ms']:.1f} | "
            f"{b['draft_ms']:.1f} | {b['client_ms']:.1f} | {b.get('emulator_late_ms', 0.0):.1f} | {b['sum_ms']:.1f} | {b['error']:+.1%} |"
        )
    lines += [
        "",
        "## Sampling at T=0.8, k=4: exact vs token-only",
        "",
        "| link | exact ms/token (B/round) | token-only ms/token (B/round) |",
        "|---|---|---|",
    ]
    for row in rows:
        s = row["sampling"]
        lines.append(f"| {row['profile']} | {s['exact']['ms_per_token']:.1f} ({s['exact']['bytes_per_round']:.0f}) | "
                     f"{s['token']['ms_per_token']:.1f} ({s['token']['bytes_per_round']:.0f}) |")
    lines += [
        "",
        f"## Simulator vs emulator (k=4, one block in flight; ms/token per session, 1 and {config.sessions} sessions)",
        "",
        f"Calibration: {calibration_source}.",
        "",
        "| link | path | sessions | emulated | simulated | error |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        sim = row["sim"]
        for path in ("spec", "cloud"):
            for label, count in (("1", 1), ("n", config.sessions)):
                key = f"{path}_{label}"
                lines.append(f"| {row['profile']} | {'speculative' if path == 'spec' else 'cloud-only'} | {count} | "
                             f"{sim['measured'][key]:.1f} | {sim['predicted'][key]:.1f} | {sim['errors'][key]:+.1%} |")
    within = sum(abs(e) <= 0.10 for row in rows for e in row["sim"]["errors"].values())
    total = sum(len(row["sim"]["errors"]) for row in rows)
    lines += ["", f"{within}/{total} predictions within 10% of the emulated measurement.", ""]
    lines += ["![speedup by link](measured_speedup_by_link.png)", "![simulated speedup vs RTT](sim_speedup_vs_rtt.png)",
              "![optimal k vs RTT](sim_optimal_k_vs_rtt.png)", "![capacity vs devices](sim_capacity_vs_devices.png)", ""]
    return "\n".join(lines)


def _plot_measured(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    rtts = [max(row["rtt_ms"] + row["jitter_ms"], 0.1) for row in rows]
    left.plot(rtts, [row["speculative"]["ms_per_token"] for row in rows], "o-", label="speculative (auto)")
    left.plot(rtts, [row["cloud_only"]["ms_per_token"] for row in rows], "s-", label="cloud-only")
    left.plot(rtts, [row["variants"]["k4_one_in_flight"]["ms_per_token"] for row in rows], "^--", label="k=4, one block in flight")
    left.set_xscale("log")
    left.set_xlabel("mean round-trip time (ms)")
    left.set_ylabel("ms per token")
    left.legend()
    left.set_title("Measured through the link emulator")
    right.bar([row["profile"] for row in rows], [row["speedup_auto"] for row in rows])
    right.axhline(1.0, color="grey", linewidth=0.8)
    right.set_ylabel("speedup over cloud-only (auto)")
    right.set_title("Per-user speedup")
    for row, rtt in zip(rows, rtts):
        left.annotate(row["profile"], (rtt, row["speculative"]["ms_per_token"]), fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "measured_speedup_by_link.png", dpi=110)
    plt.close(fig)


def summary_lines(report: dict) -> list[str]:
    return [
        f"{row['profile']:>10}: auto {row['speedup_auto']:.2f}x ({row['auto_vs_faster']:.2f}x the faster of cloud-only "
        f"and the variants), capacity {row['capacity_ratio']:.2f}x, "
        f"send-ahead gain {row['send_ahead_gain']:.2f}x, tree gain {row['tree_gain']:.2f}x, "
        f"round breakdown error {row['breakdown']['error']:+.0%}"
        for row in report["profiles"]
    ]

