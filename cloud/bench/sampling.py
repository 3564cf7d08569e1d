"""``edgespec bench sampling``: what sampling pays, and what each drafter is worth.

1. temperature sweep: exact sampling at each temperature, *before* (the draft model alone,
   sampled at the target's temperature: what exact mode did without lookup) and *after*
   (the defaults: context lookup with point-mass q, the draft's own temperature), each
   against cloud-only Generate on the same prompts and seeds;
2. drafters, on the held-out prompts: lookup only (no draft model), model + lookup, model
   only, greedy and exact at ``drafter_temperature``, each against cloud-only.

Every arm runs on every prompt, the arm order rotated prompt by prompt, so all arms see the
same machine load: the speedups are ratios measured in one run.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from edgespec.cloud.bench.harness import Harness, Summary, switch_log

DRAFTERS = {"lookup only": {"lookup": "only"}, "model + lookup": {"lookup": True}, "model only": {"lookup": False}}


@dataclass
class SamplingBenchConfig:
    target: Path
    draft: Path
    prompts: list[str]
    held_out: list[str]
    temperatures: tuple[float, ...] = (0.3, 0.6, 0.8, 1.0, 1.2)
    k_values: tuple[int | str, ...] = ("auto",)
    drafter_k: int | str = 4
    drafter_temperature: float = 0.8
    max_new_tokens: int = 96
    seed: int = 0
    server: str | None = None
    extra: dict = field(default_factory=dict)  # GenerationParams for the "after" arm (e.g. lookup_weight)

    def __post_init__(self) -> None:
        if not self.prompts:
            raise ValueError("prompts: at least one prompt is needed")
        if not self.temperatures or min(self.temperatures) <= 0:
            raise ValueError(f"temperatures must be > 0, got {self.temperatures}")


def ms_per_token_by_prompt(results: list) -> list[float]:
    return [1000.0 * r.stats.wall_s / r.stats.generated if r.stats.generated else 0.0 for r in results]


def arm_row(label: str, params: dict, results: list, cloud: Summary) -> dict:
    summary = Summary.of(results)
    generated = sum(r.stats.generated for r in results)
    cloud_tokens = sum(r.stats.cloud_only_tokens for r in results)
    return {
        "label": label,
        "params": params,
        "speedup": cloud.ms_per_token / summary.ms_per_token if summary.ms_per_token else 0.0,
        "cloud_only_share": cloud_tokens / generated if generated else 0.0,
        "speculative": summary.to_dict(),
        "switch_logs": [switch_log(result) for result in results],  # k=auto's decisions, per prompt
        "ms_per_token_by_prompt": ms_per_token_by_prompt(results),
    }


def measure_arms(harness: Harness, prompts: list[str], arms: dict[str, dict], cloud_params: dict, progress, label: str) -> dict:
    """Every arm and cloud-only on every prompt, the order rotated per prompt.

    Each arm has a client of its own: a client's planner (speculate or stream cloud-only, send-
    ahead depth) learns from every generation it runs, so arms sharing one would steer each
    other. Each is warmed up with one short generation of its own settings first. On an emulated
    link every arm's run of a text starts from the same random draws (common random numbers: a
    loss one arm meets, the others meet at the same chunk)."""
    names = [*arms, "cloud-only"]
    results: dict[str, list] = {name: [] for name in names}
    clients = {name: harness.new_client() for name in arms}
    try:
        for name, client in clients.items():
            client.generate(prompts[0], **(arms[name] | {"max_new_tokens": 16}))
        for i, prompt in enumerate(prompts):
            for name in names[i % len(names):] + names[: i % len(names)]:
                harness.pair_draws(f"{label}/prompt {i}")
                if name == "cloud-only":
                    results[name].append(harness.cloud_only(prompt, cloud_params))
                else:
                    results[name].append(clients[name].generate(prompt, **arms[name]))
            progress(f"  {label} prompt {i + 1}/{len(prompts)}")
    finally:
        for client in clients.values():
            client.close()
    cloud = Summary.of(results["cloud-only"])
    return {"cloud_only": cloud.to_dict(), "cloud_only_by_prompt": ms_per_token_by_prompt(results["cloud-only"]),
            "arms": [arm_row(name, arms[name], results[name], cloud) for name in arms]}


def run_sampling_bench(config: SamplingBenchConfig, progress: Callable[[str], None] = print) -> dict:
    common = dict(max_new_tokens=config.max_new_tokens, stop_token_ids=(), seed=config.seed)
    report: dict = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()
                               if k not in ("prompts", "held_out")} | {"prompts": len(config.prompts),
                                                                       "held_out_prompts": len(config.held_out)}}
    with Harness(config.target, config.draft, server=config.server, progress=progress) as harness:
        harness.warm_up(config.prompts[0])
        report["server"] = asdict(harness.info)
        sweep = []
        for t in config.temperatures:
            sampled = dict(common, temperature=t, mode="exact")
            arms = {}
            for k in config.k_values:
                before = dict(sampled, k=k, lookup=False, draft_temperature=t)
                arms[f"before k={k}"] = before
                arms[f"after k={k}"] = dict(sampled, k=k, **config.extra)
            sweep.append({"temperature": t} | measure_arms(harness, config.prompts, arms, sampled, progress, f"T={t}"))
        report["temperature_sweep"] = sweep
        held_out = config.held_out or config.prompts
        drafters = []
        for t in (0.0, config.drafter_temperature):
            params = dict(common, temperature=t, k=config.drafter_k, speculate=True)
            arms = {name: dict(params, **extra) for name, extra in DRAFTERS.items()}
            drafters.append({"temperature": t} | measure_arms(harness, held_out, arms, params, progress, f"drafters T={t}"))
        report["drafters"] = drafters
    return report


def summary_lines(report: dict) -> list[str]:
    lines = ["temperature sweep (exact sampling; speedup over cloud-only, tau, ms/token, share of tokens cloud-only):"]
    for row in report["temperature_sweep"]:
        cells = [f"{a['label']} {a['speedup']:.2f}x tau {a['speculative']['tau']:.2f} {a['speculative']['ms_per_token']:.1f} ms"
                 f" ({a['cloud_only_share']:.0%})" for a in row["arms"]]
        lines.append(f"  T={row['temperature']}: cloud-only {row['cloud_only']['ms_per_token']:.1f} ms; " + "; ".join(cells))
    lines.append(f"drafters (held-out prompts, k={report['config']['drafter_k']}):")
    for row in report["drafters"]:
        cells = [f"{a['label']} tau {a['speculative']['tau']:.2f} {a['speculative']['ms_per_token']:.1f} ms ({a['speedup']:.2f}x)"
                 for a in row["arms"]]
        mode = "greedy" if row["temperature"] == 0 else f"exact T={row['temperature']}"
        lines.append(f"  {mode}: cloud-only {row['cloud_only']['ms_per_token']:.1f} ms; " + "; ".join(cells))
    return lines


def write_sampling(report: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "sampling.json").write_text(json.dumps(report, indent=2, default=str))
    (out / "sampling.md").write_text("# edgespec bench sampling\n\n" + "\n".join(f"    {line}" for line in summary_lines(report)) + "\n")
    return [out / "sampling.json", out / "sampling.md"]
