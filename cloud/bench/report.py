"""Writing a bench report: report.json (everything), report.md (for people), PNG plots."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from edgespec.cloud.bench.harness import shown
from edgespec.cloud.bench.workflow import BenchReport


def write_report(report: BenchReport, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    data = asdict(report)
    (out / "report.json").write_text(json.dumps(data, indent=2, default=str))
    plots = write_plots(data, out)
    (out / "report.md").write_text(markdown(data, [p.name for p in plots]))
    return [out / "report.json", out / "report.md", *plots]


def write_plots(data: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    theory = data["theory"]
    rows = [r for r in data["sweeps"]["k"]["rows"] if r["k"] != "auto"]
    auto = next(r for r in data["sweeps"]["k"]["rows"] if r["k"] == "auto")
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ks = sorted(int(k) for k in theory["curve"])
    ax.plot(ks, [theory["curve"][k] for k in ks], "-", color="tab:blue",
            label=f"seeds' curve (a={theory['alpha']:.2f}, c={theory['c']:.1f})")
    ax.plot([r["k"] for r in rows], [r["speedup"] for r in rows], "o", color="tab:red", label="measured")
    ax.axhline(auto["speedup"], ls="--", color="tab:green", label=f"adaptive k (mean k {auto['speculative']['mean_k']:.1f})")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xlabel("k (drafted tokens per round)")
    ax.set_ylabel("speedup over cloud-only")
    ax.set_title("Speedup vs k")
    ax.legend()
    paths.append(_save(fig, out / "speedup_vs_k.png"))

    diagnosis = data["diagnosis"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    positions = sorted(int(p) for p in diagnosis["conditional_acceptance_by_position"])
    left.bar(positions, [diagnosis["conditional_acceptance_by_position"][p] for p in positions], color="tab:blue")
    left.set_xlabel("draft position")
    left.set_ylabel("acceptance (given reached)")
    left.set_ylim(0, 1)
    left.set_title("Acceptance by position")
    kinds = list(diagnosis["acceptance_by_kind"])
    right.bar(kinds, [diagnosis["acceptance_by_kind"][k]["acceptance"] for k in kinds], color="tab:orange")
    right.set_ylim(0, 1)
    right.set_title("Acceptance by token kind")
    right.tick_params(axis="x", rotation=40)
    paths.append(_save(fig, out / "acceptance.png"))

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8), sharey=True)
    for ax, name in zip(axes, ("temperature", "top_k", "mode")):
        sweep = data["sweeps"][name]
        labels = [row["label"] for row in sweep]
        ax.bar(labels, [row["speedup"] for row in sweep], color="tab:purple")
        for i, row in enumerate(sweep):
            ax.text(i, row["speedup"], f"tau {row['speculative']['tau']:.2f}", ha="center", va="bottom", fontsize=8)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_title(f"{name} sweep")
    axes[0].set_ylabel("speedup over cloud-only")
    paths.append(_save(fig, out / "sweeps.png"))
    return paths


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def summary_lines(data: dict) -> list[str]:
    base, limit, adaptive, validation = data["baseline"], data["limit"], data["adaptive"], data["validation"]
    return [
        f"baseline (greedy, k={data['config']['baseline_k']}): speedup {base['speedup']:.2f}x, "
        f"tau {base['speculative']['tau']:.2f}, acceptance {_pct(base['speculative']['acceptance_rate'])}, "
        f"{base['speculative']['ms_per_token']:.1f} vs {base['cloud_only']['ms_per_token']:.1f} ms/token, "
        f"{base['identical']}/{base['speculative']['generations']} outputs identical to cloud-only",
        f"best fixed k = {adaptive['best_fixed_k']} ({adaptive['best_fixed_speedup']:.2f}x); adaptive k "
        f"{adaptive['auto_speedup']:.2f}x = {_pct(adaptive['auto_over_best'])} of best",
        f"held-out validation (k={validation['k']}): {validation['speedup']:.2f}x (tuning set {validation['tuning_speedup']:.2f}x)",
        f"closeness to the limit: measured/ideal {limit['measured_over_ideal']:.2f}, "
        f"measured/cost model {limit['measured_over_cost_model']:.2f}",
    ] + _peer_lines(data.get("peers"))


def _peer_lines(peers: dict | None) -> list[str]:
    if not peers:
        return []
    arms, ours = peers["arms"], peers["edgespec_defaults"]["speculative"]["ms_per_token"]
    listed = ", ".join(f"{name} {arm['ms_per_token']:.2f}" for name, arm in arms.items())
    return [f"edgespec (defaults, Serve, loopback) {ours:.2f} ms/token vs transformers in one process: {listed} ms/token; "
            f"{peers['edgespec_over_prompt_lookup']:.2f}x faster than prompt-lookup decoding"]


def _peer_table(peers: dict | None) -> list[str]:
    if not peers:
        return []
    ours = peers["edgespec_defaults"]
    rows = [
        "## Peers: transformers' own generation on the same pair, in one process",
        "",
        "Same prompts, greedy, torch on one thread, no network (`edgespec.cloud.bench.peers`); edgespec with its "
        "defaults (k auto, send-ahead auto) through Serve on loopback, alternating with its own cloud-only arm.",
        "",
        "| arm | ms/token | identical to target-only |",
        "|---|---|---|",
    ]
    for name, arm in peers["arms"].items():
        rows.append(f"| transformers {name} | {arm['ms_per_token']:.2f} | {arm['identical_to_target_only']} |")
    rows += [
        f"| edgespec speculative (defaults) | {ours['speculative']['ms_per_token']:.2f} | {ours['identical']} (vs its cloud-only) |",
        f"| edgespec cloud-only | {ours['cloud_only']['ms_per_token']:.2f} | |",
        "",
        f"edgespec is {peers['edgespec_over_prompt_lookup']:.2f}x faster per token than prompt-lookup decoding.",
        "",
    ]
    return rows


def markdown(data: dict, plots: list[str]) -> str:
    cfg, base, diag = data["config"], data["baseline"], data["diagnosis"]
    server, costs, theory, limit = data["server"], data["costs"], data["theory"], data["limit"]
    lines = [
        "# edgespec bench report",
        "",
        f"Target `{shown(cfg['target'])}` ({server['target_params'] / 1e6:.1f}M params), draft `{shown(cfg['draft'])}`; "
        f"{cfg['prompts']} tuning prompts, {cfg['held_out_prompts']} held-out prompts, "
        f"{cfg['max_new_tokens']} new tokens each; link: {cfg.get('link') or 'loopback'}. "
        "Every speedup is cloud-only ms/token over speculative ms/token, both through the same Serve gRPC path, "
        "runs alternating prompt by prompt.",
        "",
        "## Summary",
        "",
        *[f"- {line}" for line in summary_lines(data)],
        "",
        "## Baseline",
        "",
        "| | speculative | cloud-only |",
        "|---|---|---|",
        f"| ms/token | {base['speculative']['ms_per_token']:.2f} | {base['cloud_only']['ms_per_token']:.2f} |",
        f"| target calls/token | {base['speculative']['rounds'] / max(base['speculative']['tokens'], 1):.3f} | 1.000 |",
        f"| mean acceptance length (tau) | {base['speculative']['tau']:.2f} | |",
        f"| acceptance rate | {_pct(base['speculative']['acceptance_rate'])} | |",
        f"| bytes per round | {base['speculative']['bytes_per_round']:.0f} | |",
        "",
        *_peer_table(data.get("peers")),
        "## Diagnosis",
        "",
        "Acceptance at each draft position, given every earlier draft of the block was accepted:",
        "",
        "| position | " + " | ".join(str(p) for p in diag["conditional_acceptance_by_position"]) + " |",
        "|---|" + "---|" * len(diag["conditional_acceptance_by_position"]),
        "| acceptance | " + " | ".join(f"{v:.2f}" for v in diag["conditional_acceptance_by_position"].values()) + " |",
        "",
        "By the kind of token the target emitted there:",
        "",
        "| kind | judged drafts | acceptance |",
        "|---|---|---|",
        *[f"| {kind} | {row['evaluated']} | {_pct(row['acceptance'])} |" for kind, row in diag["acceptance_by_kind"].items()],
        "",
        "Most-rejected tokens (the target's token where the draft guessed wrong):",
        "",
        "| token | rejections | rejection rate |",
        "|---|---|---|",
        *[f"| `{row['text']!r}` | {row['rejections']} | {_pct(row['rejection_rate'])} |" for row in diag["most_rejected"]],
        "",
        "## Sweeps",
        "",
        f"Seeds' curve from the measured a = {theory['alpha']:.3f} (per-token acceptance, pooled over the k sweep) "
        f"and c = {theory['c']:.1f} (cloud-only ms/token over draft ms/token).",
        "",
        "| k | speedup | seeds' curve | tau | acceptance | ms/token |",
        "|---|---|---|---|---|---|",
    ]
    for row in data["sweeps"]["k"]["rows"]:
        curve = theory["curve"].get(row["k"], theory["curve"].get(str(row["k"])))
        lines.append(
            f"| {row['k']} | {row['speedup']:.2f}x | {'' if curve is None else f'{curve:.2f}x'} | "
            f"{row['speculative']['tau']:.2f} | {_pct(row['speculative']['acceptance_rate'])} | {row['speculative']['ms_per_token']:.2f} |"
        )
    for name in ("temperature", "top_k", "mode", "draft"):
        if name not in data["sweeps"]:
            continue
        lines += ["", f"**{name}** (k={cfg['baseline_k']}):", "", "| setting | speedup | tau | acceptance | bytes/round |", "|---|---|---|---|---|"]
        for row in data["sweeps"][name]:
            s = row["speculative"]
            lines.append(f"| {row['label']} | {row['speedup']:.2f}x | {s['tau']:.2f} | {_pct(s['acceptance_rate'])} | {s['bytes_per_round']:.0f} |")
    validation = data["validation"]
    lines += [
        "",
        "## Validation on held-out prompts",
        "",
        f"Best k from the sweep: {validation['k']} ({validation['tuning_speedup']:.2f}x on the tuning prompts). "
        f"On held-out prompts: **{validation['speedup']:.2f}x**, tau {validation['speculative']['tau']:.2f}, "
        f"{validation['identical']}/{validation['speculative']['generations']} identical to cloud-only.",
        "",
        "## Costs",
        "",
        f"- draft on the device: {costs['draft_files_bytes'] / 1e6:.2f} MB of files, {costs['draft_rss_bytes'] / 1e6:.1f} MB resident, "
        f"{costs['draft_ms_per_token']:.2f} ms/token",
        f"- replica: {costs['replica_rss_bytes'] / 1e6:.0f} MB resident, {costs['target_params'] / 1e6:.1f}M target params, "
        f"KV cache {costs['kv_bytes_per_token'] / 1024:.1f} KiB per token per session",
        "- bytes per round: " + ", ".join(f"{k} {v:.0f}" for k, v in costs["bytes_per_round"].items())
        + f" (cloud-only: {costs['cloud_only_bytes_per_token']:.0f} per token)",
        "",
        "## Closeness to the limit",
        "",
        f"Measured {limit['measured_speedup']:.2f}x at tau {limit['tau']:.2f}, c {limit['c']:.1f}:",
        "",
        f"- the seeds' ideal tau / (1 + k/c) = {limit['predicted_ideal']:.2f}x (verification as cheap as one target step, free network): "
        f"measured/ideal **{limit['measured_over_ideal']:.2f}**",
        f"- the cost model (k x draft time + measured wait per round) / tau = {limit['predicted_cost_model']:.2f}x: "
        f"measured/cost model **{limit['measured_over_cost_model']:.2f}**",
        "",
        "## Plots",
        "",
        *[f"![{name}]({name})" for name in plots],
        "",
    ]
    return "\n".join(lines)
