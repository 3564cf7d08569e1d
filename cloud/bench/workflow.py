"""The seeds' tuning workflow as one run: baseline, diagnosis, sweeps, validation, costs.

1. baseline: speculative (greedy, k=4) vs cloud-only Generate on the same prompts, alternating;
2. diagnosis: acceptance by draft position and by token kind, the most-rejected tokens;
3. sweeps, one variable at a time: k (1..8 and adaptive), temperature, top-k, verification mode,
   greedy drafting with and without context lookup;
   the speedup-vs-k plot draws the seeds' curve from the measured a and c;
4. validation: the best setting re-measured on held-out prompts no sweep has seen;
5. costs: draft memory and ms/token on the device, replica memory, bytes per round;
6. closeness to the limit: measured speedup over the speedup predicted from tau and timings.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from edgespec.cloud.bench.diagnosis import Diagnosis
from edgespec.cloud.bench.harness import Harness, Summary
from edgespec.cloud.bench.theory import RoundCosts, alpha_from_rounds, predicted_speedups, seeds_speedup


@dataclass
class BenchConfig:
    target: Path
    draft: Path
    prompts: list[str]
    held_out: list[str]
    out: Path
    server: str | None = None
    max_new_tokens: int = 96
    k_values: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)
    temperatures: tuple[float, ...] = (0.3, 0.6, 1.0, 1.3)
    top_ks: tuple[int, ...] = (0, 10, 50)
    sampling_temperature: float = 0.8
    baseline_k: int = 4
    seed: int = 0
    link: str | None = None  # a link profile name; runs go through the link emulator
    draft_hf: Path | None = None  # the draft's Hugging Face weights, for transformers' assisted generation
    peers: bool = True  # measure transformers' own generation on the same prompts (``peers.py``)

    def __post_init__(self) -> None:
        if not self.prompts:
            raise ValueError("prompts: at least one prompt is needed")
        if self.max_new_tokens < 8:
            raise ValueError(f"max_new_tokens must be >= 8, got {self.max_new_tokens}")


@dataclass
class Comparison:
    """One setting, speculative vs cloud-only on the same prompts."""

    label: str
    params: dict
    speculative: Summary
    cloud_only: Summary
    identical: int = 0  # greedy: generations token-identical to cloud-only

    @property
    def speedup(self) -> float:
        return self.cloud_only.ms_per_token / self.speculative.ms_per_token if self.speculative.ms_per_token else 0.0

    def to_dict(self) -> dict:
        return {
            "label": self.label,
            "params": self.params,
            "speedup": self.speedup,
            "identical": self.identical,
            "speculative": self.speculative.to_dict(),
            "cloud_only": self.cloud_only.to_dict(),
        }


@dataclass
class BenchReport:
    config: dict
    server: dict
    baseline: dict = field(default_factory=dict)
    diagnosis: dict = field(default_factory=dict)
    sweeps: dict = field(default_factory=dict)
    theory: dict = field(default_factory=dict)
    validation: dict = field(default_factory=dict)
    adaptive: dict = field(default_factory=dict)
    costs: dict = field(default_factory=dict)
    limit: dict = field(default_factory=dict)
    peers: dict = field(default_factory=dict)


def compare(harness: Harness, prompts: list[str], params: dict, label: str) -> Comparison:
    spec, cloud = harness.compare(prompts, params, label)
    identical = sum(s.token_ids == c.token_ids for s, c in zip(spec, cloud))
    return Comparison(label, params, Summary.of(spec), Summary.of(cloud), identical)


def run_bench(config: BenchConfig, progress: Callable[[str], None] = print) -> BenchReport:
    with Harness(config.target, config.draft, server=config.server, progress=progress) as harness:
        if config.link:
            from edgespec.cloud.link.profiles import get_profile

            harness.use_link(get_profile(config.link))
        return _run(harness, config, progress)


def _run(harness: Harness, config: BenchConfig, progress: Callable[[str], None]) -> BenchReport:
    info = harness.info
    greedy = dict(max_new_tokens=config.max_new_tokens, stop_token_ids=(), seed=config.seed)
    sampled = dict(greedy, temperature=config.sampling_temperature, mode="exact")
    report = BenchReport(
        config={k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items() if k not in ("prompts", "held_out")}
        | {"prompts": len(config.prompts), "held_out_prompts": len(config.held_out)},
        server=asdict(info),
    )
    harness.warm_up(config.prompts[0])

    progress(f"[1/6] baseline: speculative greedy k={config.baseline_k} vs cloud-only, {len(config.prompts)} prompts")
    spec, cloud = harness.compare(config.prompts, dict(greedy, k=config.baseline_k), "baseline")
    baseline = Comparison("baseline", dict(greedy, k=config.baseline_k), Summary.of(spec), Summary.of(cloud))
    baseline.identical = sum(s.token_ids == c.token_ids for s, c in zip(spec, cloud))
    report.baseline = baseline.to_dict()

    if config.peers:
        progress("[1b/6] peers: transformers' generation in this process, and edgespec with its defaults")
        report.peers = _peers(harness, config, greedy, progress)

    progress("[2/6] diagnosis: acceptance by position and token kind")
    diagnosis = Diagnosis()
    decode = lambda ids: harness.client.draft.tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    for result in spec:
        diagnosis.add(decode, result.prompt_ids, result.token_ids, result.rounds)
    report.diagnosis = {
        "conditional_acceptance_by_position": diagnosis.by_position(),
        "acceptance_by_kind": diagnosis.by_kind(),
        "most_rejected": diagnosis.most_rejected(decode),
    }

    progress("[3/6] sweeps (one variable at a time)")
    report.sweeps["k"] = _k_sweep(harness, config, greedy, progress)
    report.sweeps["temperature"] = [
        compare(harness, config.prompts, dict(sampled, temperature=t, k=config.baseline_k), f"T={t}").to_dict()
        for t in config.temperatures
    ]
    report.sweeps["top_k"] = [
        compare(harness, config.prompts, dict(sampled, top_k=top_k, k=config.baseline_k), f"top_k={top_k}").to_dict()
        for top_k in config.top_ks
    ]
    report.sweeps["mode"] = [
        compare(harness, config.prompts, dict(greedy, k=config.baseline_k), "greedy").to_dict(),
        compare(harness, config.prompts, dict(sampled, k=config.baseline_k), "exact").to_dict(),
        compare(harness, config.prompts, dict(sampled, mode="token", k=config.baseline_k), "token").to_dict(),
    ]
    report.sweeps["draft"] = [
        compare(harness, config.prompts, dict(greedy, k=config.baseline_k), "model + context lookup").to_dict(),
        compare(harness, config.prompts, dict(greedy, k=config.baseline_k, lookup=False), "model only").to_dict(),
    ]
    report.theory = _theory(report.sweeps["k"], config)
    report.adaptive = _adaptive_vs_best(report.sweeps["k"])

    progress("[4/6] validation: the best setting on held-out prompts")
    best = max((row for row in report.sweeps["k"]["rows"]), key=lambda row: row["speedup"])
    held_out = config.held_out or config.prompts
    validation = compare(harness, held_out, dict(greedy, k=best["k"]), f"held-out k={best['k']}")
    report.validation = validation.to_dict() | {"tuning_speedup": best["speedup"], "k": best["k"], "held_out_is_separate": bool(config.held_out)}

    progress("[5/6] costs")
    report.costs = _costs(harness, report)

    progress("[6/6] closeness to the limit")
    report.limit = _limit(baseline, config.baseline_k)
    return report


def _peers(harness: Harness, config: BenchConfig, greedy: dict, progress) -> dict:
    from edgespec.cloud.bench.peers import measure_peers, peers_dict

    arms = measure_peers(config.target, config.draft_hf, config.prompts, config.max_new_tokens, progress)
    defaults = compare(harness, config.prompts, dict(greedy), "defaults (k auto)")
    lookup = arms["prompt_lookup"].ms_per_token
    return {
        "arms": peers_dict(arms),
        "edgespec_defaults": defaults.to_dict(),
        "edgespec_over_prompt_lookup": lookup / defaults.speculative.ms_per_token if defaults.speculative.ms_per_token else 0.0,
    }


def _k_sweep(harness: Harness, config: BenchConfig, greedy: dict, progress) -> dict:
    """All k values (and auto) per prompt, rotated, with one cloud-only run per prompt."""
    arms: list[int | str] = [*config.k_values, "auto"]
    spec: dict = {arm: [] for arm in arms}
    cloud = []
    for i, prompt in enumerate(config.prompts):
        order = arms[i % len(arms):] + arms[: i % len(arms)]
        cloud_first = i % 2 == 1
        if cloud_first:
            cloud.append(harness.cloud_only(prompt, greedy))
        for arm in order:
            spec[arm].append(harness.speculative(prompt, dict(greedy, k=arm)))
        if not cloud_first:
            cloud.append(harness.cloud_only(prompt, greedy))
        progress(f"  k sweep prompt {i + 1}/{len(config.prompts)}")
    cloud_summary = Summary.of(cloud)
    rows = []
    for arm in arms:
        summary = Summary.of(spec[arm])
        rows.append(
            {
                "k": arm,
                "speedup": cloud_summary.ms_per_token / summary.ms_per_token,
                "speculative": summary.to_dict(),
                "round_pairs": [(r.k, r.accepted) for res in spec[arm] for r in res.rounds],
            }
        )
    return {"cloud_only": cloud_summary.to_dict(), "rows": rows}


def _theory(k_sweep: dict, config: BenchConfig) -> dict:
    fixed = [row for row in k_sweep["rows"] if row["k"] != "auto"]
    pairs = [tuple(pair) for row in fixed for pair in row["round_pairs"]]
    for row in k_sweep["rows"]:
        row.pop("round_pairs")
    alpha = alpha_from_rounds(pairs)
    draft_ms = sum(r["speculative"]["draft_ms_per_token"] for r in fixed) / len(fixed)
    c = k_sweep["cloud_only"]["ms_per_token"] / draft_ms if draft_ms else float("inf")
    return {
        "alpha": alpha,
        "c": c,
        "curve": {k: seeds_speedup(alpha, k, c) for k in range(1, max(config.k_values) + 1)},
        "measured": {row["k"]: row["speedup"] for row in fixed},
    }


def _adaptive_vs_best(k_sweep: dict) -> dict:
    fixed = [row for row in k_sweep["rows"] if row["k"] != "auto"]
    best = max(fixed, key=lambda row: row["speedup"])
    auto = next(row for row in k_sweep["rows"] if row["k"] == "auto")
    return {
        "best_fixed_k": best["k"],
        "best_fixed_speedup": best["speedup"],
        "auto_speedup": auto["speedup"],
        "auto_over_best": auto["speedup"] / best["speedup"],
        "auto_mean_k": auto["speculative"]["mean_k"],
    }


def _costs(harness: Harness, report: BenchReport) -> dict:
    draft_dir = harness.draft
    onnx_bytes = sum(p.stat().st_size for p in draft_dir.iterdir() if p.is_file())
    return {
        "draft_files_bytes": onnx_bytes,
        "draft_rss_bytes": _draft_rss(draft_dir),
        "draft_ms_per_token": report.baseline["speculative"]["draft_ms_per_token"],
        "replica_rss_bytes": harness.client.info(refresh=True).replica_rss_bytes,
        "target_params": harness.info.target_params,
        "kv_bytes_per_token": harness.info.kv_bytes_per_token,
        "bytes_per_round": {row["label"]: row["speculative"]["bytes_per_round"] for row in report.sweeps["mode"]},
        "cloud_only_bytes_per_token": report.baseline["cloud_only"]["bytes_per_round"],
    }


def _draft_rss(draft_dir: Path) -> int:
    """Resident memory a fresh process needs to hold the draft session (measured, not estimated)."""
    import subprocess
    import sys

    script = (
        "import os\n"
        "def rss():\n return int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE')\n"
        "import numpy, onnxruntime, tokenizers\n"
        "from edgespec.edge.draft import DraftModel\n"
        "before = rss()\n"
        f"model = DraftModel({str(draft_dir)!r})\n"
        "model.reset([1, 2, 3]); model.propose(4)\n"
        "print(rss() - before)\n"
    )
    try:
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=os.environ)
        return int(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError):
        return 0


def _limit(baseline: Comparison, k: int) -> dict:
    spec = baseline.speculative
    costs = RoundCosts(
        draft_ms_per_token=spec.draft_ms_per_token,
        wait_ms=spec.wait_ms_per_round,
        target_ms_per_token=baseline.cloud_only.ms_per_token,
    )
    predicted = predicted_speedups(spec.tau, k, costs)
    return {
        "measured_speedup": baseline.speedup,
        "tau": spec.tau,
        "c": predicted["c"],
        "predicted_ideal": predicted["ideal"],
        "predicted_cost_model": predicted["cost_model"],
        "measured_over_ideal": baseline.speedup / predicted["ideal"],
        "measured_over_cost_model": baseline.speedup / predicted["cost_model"],
    }
