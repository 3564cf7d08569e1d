"""``edgespec bench links``: what each network link does to speculative vs cloud-only generation,
and the fleet simulator checked against the emulator.

1. calibrate the simulator on loopback (``calibrate.py``);
2. per link profile, through the link emulator: speculative vs cloud-only (alternating), the
   k sweep, exact vs token-only sampling (bytes on the wire), drafting ahead on and off, and
   1 and N concurrent sessions of each path;
3. the simulator's predicted ms/token for the same 1 and N sessions on the same profile, and
   its error against the emulated measurement;
4. simulator sweeps with the measured calibration: speedup vs RTT, optimal k vs RTT, capacity.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict
from pathlib import Path

from edgespec.cloud.bench.capacity import CapacityRow
from edgespec.cloud.bench.capacity import measure as measure_sessions
from edgespec.cloud.bench.calibrate import calibrate, time_verify_table
from edgespec.cloud.bench.harness import Harness, Summary, shown
from edgespec.cloud.link.profiles import get_profile
from edgespec.cloud.simulate.config import FleetConfig
from edgespec.cloud.simulate import sweeps
from edgespec.cloud.simulate.engine import simulate

K_SWEEP = (1, 2, 4, 8, 12, 16)


def run_links(args, prompts: list[str], out: Path, progress) -> int:
    profiles = [get_profile(name) for name in args.profiles.split(",")]
    sessions = max(int(n) for n in args.sessions.split(","))
    out.mkdir(parents=True, exist_ok=True)
    tokens = args.max_new_tokens
    greedy = dict(max_new_tokens=tokens, stop_token_ids=(), seed=args.seed)
    k = int(args.k) if str(args.k).isdigit() else 4
    with Harness(args.target, args.draft, server=args.server, progress=progress, max_sessions=sessions + 8) as harness:
        harness.warm_up(prompts[0])
        progress("[1/4] calibrating the simulator (one session, through the emulator's loopback profile)")
        # Through the emulator, so its own per-message cost is in the calibration like in every
        # measurement it is compared with; the profile itself adds no delay.
        harness.use_link(get_profile("loopback"))
        verify, prefill_ms = time_verify_table(args.target)
        calibration = calibrate(harness, prompts[:4], verify, prefill_ms, k=8, max_new_tokens=tokens, progress=progress)
        calibration.save(out / "calibration.json")
        rows = []
        for index, profile in enumerate(profiles):
            progress(f"[2/4] link {profile.name} ({index + 1}/{len(profiles)}): RTT {profile.rtt_ms} ms")
            harness.use_link(profile)
            rows.append(_profile_row(harness, profile, prompts, greedy, k, sessions, calibration, args, progress))
        harness.use_link(None)
    progress("[4/4] simulator sweeps with the measured calibration")
    sweep_data = {
        "speedup_vs_rtt": sweeps.speedup_vs_rtt(calibration=calibration, k=k, tokens_per_device=tokens, seed=args.seed),
        "optimal_k_vs_rtt": sweeps.optimal_k_vs_rtt(calibration=calibration, seed=args.seed),
        "capacity_vs_devices": sweeps.capacity_vs_devices(calibration=calibration, link_mix="lan", k=k, seed=args.seed),
    }
    sweeps.plot_speedup_vs_rtt(sweep_data["speedup_vs_rtt"], out / "sim_speedup_vs_rtt.png")
    sweeps.plot_optimal_k(sweep_data["optimal_k_vs_rtt"], out / "sim_optimal_k_vs_rtt.png")
    sweeps.plot_capacity(sweep_data["capacity_vs_devices"], out / "sim_capacity_vs_devices.png")
    (out / "links.json").write_text(json.dumps({"profiles": rows, "simulator_sweeps": sweep_data}, indent=2, default=str))
    (out / "links.md").write_text(_markdown(rows, sessions, args, calibration))
    _plot_measured(rows, out)
    print(f"\nlinks report in {out}: links.md, links.json, calibration.json and plots")
    for row in rows:
        print(
            f"  {row['profile']:>10}: speedup {row['speedup']:.2f}x, best k {row['best_k']}, "
            f"sampling winner {row['sampling_winner']}, draft-ahead gain {row['draft_ahead_gain']:.2f}x, "
            f"sim error 1/{sessions} sessions {row['sim']['error_1']:+.0%}/{row['sim']['error_n']:+.0%}"
        )
    return 0


def _profile_row(harness: Harness, profile, prompts, greedy, k, sessions, calibration, args, progress) -> dict:
    few = prompts[:3]
    spec, cloud = harness.compare(few, dict(greedy, k=k), profile.name)
    spec_s, cloud_s = Summary.of(spec), Summary.of(cloud)
    k_rows = {}
    for arm in (*K_SWEEP, "auto"):
        k_rows[str(arm)] = Summary.of(harness.run(few[:2], dict(greedy, k=arm), f"{profile.name} k={arm}")).ms_per_token
    fixed = {int(a): v for a, v in k_rows.items() if a != "auto"}
    best_k = min(fixed, key=fixed.get)
    sampled = dict(greedy, temperature=0.8, k=k)
    exact = Summary.of(harness.run(few[:2], dict(sampled, mode="exact"), f"{profile.name} exact"))
    token = Summary.of(harness.run(few[:2], dict(sampled, mode="token"), f"{profile.name} token"))
    plain = Summary.of(harness.run(few[:2], dict(greedy, k=best_k), f"{profile.name} plain"))
    ahead = Summary.of(harness.run(few[:2], dict(greedy, k=best_k, draft_ahead=True), f"{profile.name} ahead"))
    progress(f"  {profile.name}: 1 and {sessions} concurrent sessions")
    # One session is a single generation per arm: average three (alternating arm order).
    singles = [
        measure_sessions(harness.address, harness.draft, [prompts[i % len(prompts)]], 1, dict(greedy, k=k), first_cloud=i % 2 == 1)
        for i in range(3)
    ]
    one = CapacityRow(
        sessions=1,
        speculative_tokens_per_s=statistics.mean(r.speculative_tokens_per_s for r in singles),
        cloud_only_tokens_per_s=statistics.mean(r.cloud_only_tokens_per_s for r in singles),
        speculative_ms_per_token=statistics.mean(r.speculative_ms_per_token for r in singles),
        cloud_only_ms_per_token=statistics.mean(r.cloud_only_ms_per_token for r in singles),
        batch_size_mean=1.0,
        batch_size_max=1,
        tau=statistics.mean(r.tau for r in singles),
    )
    many = measure_sessions(harness.address, harness.draft, prompts, sessions, dict(greedy, k=k), first_cloud=True)
    sim = _simulated(profile, calibration, k, greedy["max_new_tokens"], sessions, args.seed)
    measured = {
        "spec_1": one.speculative_ms_per_token,
        "cloud_1": one.cloud_only_ms_per_token,
        "spec_n": many.speculative_ms_per_token,
        "cloud_n": many.cloud_only_ms_per_token,
    }
    errors = {key: sim[key] / measured[key] - 1.0 for key in measured}
    return {
        "profile": profile.name,
        "rtt_ms": profile.rtt_ms,
        "speedup": cloud_s.ms_per_token / spec_s.ms_per_token,
        "speculative": spec_s.to_dict(),
        "cloud_only": cloud_s.to_dict(),
        "k_sweep_ms_per_token": k_rows,
        "best_k": best_k,
        "sampling": {
            "exact": {"ms_per_token": exact.ms_per_token, "bytes_per_round": exact.bytes_per_round, "tau": exact.tau},
            "token": {"ms_per_token": token.ms_per_token, "bytes_per_round": token.bytes_per_round, "tau": token.tau},
        },
        "sampling_winner": "exact" if exact.ms_per_token <= token.ms_per_token else "token",
        "draft_ahead_gain": plain.ms_per_token / ahead.ms_per_token,
        "measured_sessions": {"1": asdict(one), str(sessions): asdict(many)},
        "sim": {
            "predicted": sim,
            "measured": measured,
            "errors": errors,
            "error_1": max(abs(errors["spec_1"]), abs(errors["cloud_1"])) * _sign(errors, "1"),
            "error_n": max(abs(errors["spec_n"]), abs(errors["cloud_n"])) * _sign(errors, "n"),
        },
    }


def _sign(errors: dict, suffix: str) -> float:
    worst = max((errors[f"spec_{suffix}"], errors[f"cloud_{suffix}"]), key=abs)
    return 1.0 if worst >= 0 else -1.0


def _simulated(profile, calibration, k, tokens, sessions, seed) -> dict:
    out = {}
    for label, devices in (("1", 1), ("n", sessions)):
        result = simulate(FleetConfig(devices=devices, link_mix=profile, k=k, tokens_per_device=tokens, seed=seed), calibration)
        out[f"spec_{label}"] = result.speculative.mean_ms_per_token
        out[f"cloud_{label}"] = result.cloud_only.mean_ms_per_token
    return out


def _markdown(rows: list[dict], sessions: int, args, calibration) -> str:
    lines = [
        "# edgespec over network links",
        "",
        f"Target `{shown(args.target)}`, draft `{shown(args.draft)}`, {args.max_new_tokens} new tokens, greedy, k={args.k} unless noted. "
        "Links emulated in user space (`edgespec link`), RTTs from docs/links.md. Ratios measured within one run.",
        "",
        "| link | RTT ms | speculative ms/token | cloud-only ms/token | speedup | best k | exact vs token-only (ms/token, bytes/round) | draft-ahead gain |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        s = row["sampling"]
        lines.append(
            f"| {row['profile']} | {row['rtt_ms']:g} | {row['speculative']['ms_per_token']:.1f} | {row['cloud_only']['ms_per_token']:.1f} | "
            f"{row['speedup']:.2f}x | {row['best_k']} | {s['exact']['ms_per_token']:.1f} / {s['token']['ms_per_token']:.1f} ms, "
            f"{s['exact']['bytes_per_round']:.0f} / {s['token']['bytes_per_round']:.0f} B -> {row['sampling_winner']} | {row['draft_ahead_gain']:.2f}x |"
        )
    lines += [
        "",
        "## k sweep (speculative ms/token)",
        "",
        "| link | " + " | ".join(f"k={k}" for k in rows[0]["k_sweep_ms_per_token"]) + " |",
        "|---|" + "---|" * len(rows[0]["k_sweep_ms_per_token"]),
    ]
    for row in rows:
        lines.append(f"| {row['profile']} | " + " | ".join(f"{v:.1f}" for v in row["k_sweep_ms_per_token"].values()) + " |")
    lines += [
        "",
        f"## Simulator vs emulator (ms/token per session, 1 and {sessions} concurrent sessions)",
        "",
        f"Calibration: {calibration.source}.",
        "",
        "| link | path | sessions | emulated | simulated | error |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        sim = row["sim"]
        for path in ("spec", "cloud"):
            for label, count in (("1", 1), ("n", sessions)):
                key = f"{path}_{label}"
                lines.append(
                    f"| {row['profile']} | {'speculative' if path == 'spec' else 'cloud-only'} | {count} | "
                    f"{sim['measured'][key]:.1f} | {sim['predicted'][key]:.1f} | {sim['errors'][key]:+.1%} |"
                )
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
    rtts = [max(row["rtt_ms"], 0.1) for row in rows]
    left.plot(rtts, [row["speculative"]["ms_per_token"] for row in rows], "o-", label="speculative")
    left.plot(rtts, [row["cloud_only"]["ms_per_token"] for row in rows], "s-", label="cloud-only")
    left.set_xscale("log")
    left.set_xlabel("round-trip time (ms)")
    left.set_ylabel("ms per token")
    left.legend()
    left.set_title("Measured through the link emulator")
    right.plot(rtts, [row["best_k"] for row in rows], "o-")
    right.set_xscale("log")
    right.set_xlabel("round-trip time (ms)")
    right.set_ylabel("best fixed k (measured)")
    right.set_title("Best k vs RTT")
    for row, rtt in zip(rows, rtts):
        left.annotate(row["profile"], (rtt, row["speculative"]["ms_per_token"]), fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "measured_speedup_by_link.png", dpi=110)
    plt.close(fig)

