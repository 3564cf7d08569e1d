"""``edgespec bench planner``: does k=auto pick the faster path? Per link profile, through the
link emulator, arms rotated prompt by prompt (every arm sees the same load):

- cloud-only streaming (Generate);
- k=auto, the default (the planner chooses the path and k);
- always speculating with adaptive k, one block in flight, and with send-ahead.

The figure of merit is k=auto over the faster of cloud-only and the best always-speculating arm
(goal: at least 0.95), and k=auto over cloud-only. Each arm has a client of its own, warmed up
with one short generation (``sampling.measure_arms``): its planner learns only from its own
runs. ``load`` busy processes (one torch thread each, a matmul loop) can load the cores for the
whole run, as a second benchmark on the same machine would. ``temperature`` > 0 measures
sampled requests (exact mode's default, coupled) instead of greedy ones, with a k=4 arm beside.

``control`` adds an A/A arm: the send-ahead arm's settings again (``TWIN``), on a client of its
own, left out of "the faster". Its ratio to its twin is what one run's noise alone makes of two
identical arms, and its own ratio to the faster is the headline statistic for a policy that is
one of the candidates: a k=auto ratio no lower says nothing about the planner. Each ratio also
gets an interval over the prompts (``paired_interval``: the prompts resampled, every arm's run of
a prompt kept together), which one slow prompt of one arm widens.
"""

from __future__ import annotations

import json
import multiprocessing
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from edgespec.cloud.bench.harness import Harness
from edgespec.cloud.bench.links import decision_text
from edgespec.cloud.bench.sampling import measure_arms
from edgespec.cloud.link.profiles import get_profile

ALWAYS = {
    "always, adaptive k": dict(k="auto", speculate=True, send_ahead=1),
    "always, adaptive k + send-ahead": dict(k="auto", speculate=True, send_ahead="auto"),
}
# The arm the A/A arm repeats: send-ahead, the faster always-speculating arm from WiFi out and
# the same rounds as one block in flight on near links (blocks go ahead only where they pay), so
# its twin prices the noise of "the faster" on every link.
TWIN = "always, adaptive k + send-ahead"
CONTROL = "control: always, adaptive k + send-ahead again"
RESAMPLES = 2000  # bootstrap resamples of the prompts (``paired_interval``)


@dataclass
class PlannerCheckConfig:
    target: Path
    draft: Path
    prompts: list[str]
    profiles: tuple[str, ...] = ("loopback", "lan", "wifi", "5g", "4g", "satellite")
    max_new_tokens: int = 128
    temperature: float = 0.0
    load: int = 0  # busy processes loading the cores for the whole run
    control: bool = False  # an A/A arm: the send-ahead arm (TWIN) twice
    server: str | None = None
    seed: int = 0
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.prompts:
            raise ValueError("prompts: at least one prompt is needed")
        if self.load < 0 or self.temperature < 0 or self.max_new_tokens < 8:
            raise ValueError("load and temperature must be >= 0 and max_new_tokens >= 8")
        for name in self.profiles:
            get_profile(name)  # a ValueError naming the profiles for an unknown one


def paired_interval(numerator: list[float], denominators: list[list[float]], *, level: float = 0.9,
                    seed: int = 0) -> tuple[float, float]:
    """A bootstrap interval of min(mean of each denominator) / mean(numerator) over prompts: the
    prompts are resampled with replacement, each keeping every arm's run of it (the arms ran the
    same texts on the same link draws), so what moves the ratio is which texts and which stalls
    a run happened to get. Per-prompt ms/token weigh equally (every prompt runs the same
    max_new_tokens). ``level``: the interval's coverage; (0, 0) without prompts."""
    n = len(numerator)
    if n == 0 or any(len(d) != n for d in denominators):
        return 0.0, 0.0
    rng, ratios = random.Random(seed), []
    for _ in range(RESAMPLES):
        picks = [rng.randrange(n) for _ in range(n)]
        top = min(sum(d[i] for i in picks) for d in denominators)
        bottom = sum(numerator[i] for i in picks)
        ratios.append(top / bottom if bottom else 0.0)
    ratios.sort()
    tail = (1.0 - level) / 2
    return ratios[int(tail * RESAMPLES)], ratios[min(int((1.0 - tail) * RESAMPLES), RESAMPLES - 1)]


def _busy(stop) -> None:
    """One core's worth of load: small matmuls on one torch thread until ``stop`` is set."""
    import torch

    torch.set_num_threads(1)
    a = torch.randn(256, 256)
    while not stop.is_set():
        a = torch.tanh(a @ a)


class Load:
    """``n`` busy processes for the duration of a ``with``."""

    def __init__(self, n: int):
        context = multiprocessing.get_context("spawn")
        self.stop = context.Event()
        self.processes = [context.Process(target=_busy, args=(self.stop,), daemon=True) for _ in range(n)]

    def __enter__(self) -> "Load":
        for process in self.processes:
            process.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop.set()
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()


def _arms(config: PlannerCheckConfig) -> tuple[dict[str, dict], dict]:
    common = dict(max_new_tokens=config.max_new_tokens, stop_token_ids=(), seed=config.seed, **config.extra)
    if config.temperature > 0:
        common.update(temperature=config.temperature)
    arms = {"auto": dict(common)} | {name: dict(common, **params) for name, params in ALWAYS.items()}
    if config.temperature > 0:
        arms["k=4"] = dict(common, k=4, speculate=True)
    if config.control:
        arms[CONTROL] = dict(common, **ALWAYS[TWIN])
    return arms, common


def profile_row(harness: Harness, config: PlannerCheckConfig, name: str, progress) -> dict:
    """One link: every arm on every prompt, with k=auto's switch log per prompt."""
    harness.use_link(get_profile(name))
    arms, cloud_params = _arms(config)
    measured = measure_arms(harness, config.prompts, arms, cloud_params, progress, name)
    rows = {arm["label"]: arm for arm in measured["arms"]}
    cloud = measured["cloud_only"]["ms_per_token"]
    always = {label: rows[label]["speculative"]["ms_per_token"] for label in rows if label not in ("auto", CONTROL)}
    best_label = min(always, key=lambda label: always[label])
    auto = rows["auto"]["speculative"]["ms_per_token"]
    best = min(cloud, always[best_label])
    by_prompt = {label: rows[label]["ms_per_token_by_prompt"] for label in rows}
    faster = [measured["cloud_only_by_prompt"]] + [by_prompt[label] for label in always]
    control = {}
    if CONTROL in rows:
        control_ms = rows[CONTROL]["speculative"]["ms_per_token"]
        # The control scored as k=auto is: a policy that is one of the candidates, against the
        # fastest of them on this run. Its distance from 1 is the headline ratio's own noise (each
        # candidate's noise, and the pick of the luckiest: two arms that run the same rounds,
        # as both always-speculating arms do on a near link, make "the faster" the luckier).
        control = {"control_ms": control_ms, "a_over_a": always[TWIN] / control_ms if control_ms else 0.0,
                   "a_over_a_interval": paired_interval(by_prompt[CONTROL], [by_prompt[TWIN]]),
                   "control_over_best": best / control_ms if control_ms else 0.0,
                   "control_over_best_interval": paired_interval(by_prompt[CONTROL], faster)}
    return control | {
        "profile": name,
        "cloud_only_ms": cloud,
        "auto_ms": auto,
        "always_ms": always,
        "best_always": best_label,
        "auto_over_best": best / auto if auto else 0.0,
        "auto_over_best_interval": paired_interval(by_prompt["auto"], faster),
        "auto_over_cloud": cloud / auto if auto else 0.0,
        "auto_cloud_only_share": rows["auto"]["cloud_only_share"],
        "cloud_only_ms_by_prompt": measured["cloud_only_by_prompt"],
        "switch_logs": rows["auto"].get("switch_logs", []),
        "arms": measured["arms"],
    }


def run_planner_check(config: PlannerCheckConfig, progress: Callable[[str], None] = print) -> dict:
    rows = []
    with Harness(config.target, config.draft, server=config.server, progress=progress) as harness:
        harness.warm_up(config.prompts[0])
        with Load(config.load):
            for index, name in enumerate(config.profiles):
                progress(f"[{index + 1}/{len(config.profiles)}] link {name}" + (f", {config.load} busy process(es)" if config.load else ""))
                rows.append(profile_row(harness, config, name, progress))
                progress("  " + row_line(rows[-1]))
        harness.use_link(None)
    settings = {"target": str(config.target), "draft": str(config.draft), "prompts": len(config.prompts),
                "max_new_tokens": config.max_new_tokens, "temperature": config.temperature, "load": config.load,
                "control": config.control}
    return {"config": settings, "profiles": rows}


def row_line(row: dict) -> str:
    return (f"{row['profile']}: cloud-only {row['cloud_only_ms']:.1f}, best always-speculating {row['always_ms'][row['best_always']]:.1f} "
            f"({row['best_always']}), k=auto {row['auto_ms']:.1f} ms/token: {row['auto_over_best']:.2f}x the faster "
            f"({_interval(row['auto_over_best_interval'])} over prompts), "
            f"{row['auto_over_cloud']:.2f}x cloud-only, {row['auto_cloud_only_share']:.0%} of its tokens cloud-only"
            + (f"; A/A {row['a_over_a']:.2f} ({_interval(row['a_over_a_interval'])}), the control over the faster "
               f"{row['control_over_best']:.2f} ({_interval(row['control_over_best_interval'])})" if "a_over_a" in row else ""))


def _interval(bounds) -> str:
    return f"{bounds[0]:.2f}-{bounds[1]:.2f}"


def markdown(report: dict) -> str:
    c = report["config"]
    kind = "greedy" if not c["temperature"] else f"sampled at T={c['temperature']}"
    lines = [
        "# Does k=auto pick the faster path?", "",
        f"Target `{c['target']}`, draft `{c['draft']}`, {c['prompts']} prompts of {c['max_new_tokens']} tokens, {kind}; "
        + (f"the cores loaded by {c['load']} busy process(es)" if c["load"] else "no added load")
        + ". Arms rotated prompt by prompt, a client each (`edgespec bench planner`).", "",
    ]
    control = bool(c.get("control"))
    head = ("| link | cloud-only ms/token | best always-speculating ms/token | k=auto ms/token | **k=auto / faster** | "
            "90% over prompts | k=auto / cloud-only | k=auto tokens cloud-only |")
    lines += [head + (" A/A (90% over prompts) | control / faster (90% over prompts) |" if control else ""),
              "|---|---|---|---|---|---|---|---|" + ("---|---|" if control else "")]
    for row in report["profiles"]:
        lines.append(f"| {row['profile']} | {row['cloud_only_ms']:.1f} | {row['always_ms'][row['best_always']]:.1f} ({row['best_always']}) | "
                     f"{row['auto_ms']:.1f} | **{row['auto_over_best']:.2f}x** | {_interval(row['auto_over_best_interval'])} | "
                     f"{row['auto_over_cloud']:.2f}x | {row['auto_cloud_only_share']:.0%} |"
                     + (f" {row['a_over_a']:.2f} ({_interval(row['a_over_a_interval'])}) | {row['control_over_best']:.2f} "
                        f"({_interval(row['control_over_best_interval'])}) |" if control else ""))
    lines += ["", "90% over prompts: the ratio's bootstrap interval, the prompts resampled with every arm's run of "
              "each kept together (one slow prompt of one arm widens it)."]
    if control:
        lines += [f"A/A: `{TWIN}` over its twin `{CONTROL}` (same settings, a client each). "
                  "Its distance from 1 is this run's noise. Control / faster: the twin scored as k=auto is, against the "
                  "fastest of cloud-only and the always-speculating arms, the same statistic for a policy that is one of "
                  "them: a k=auto ratio no lower says nothing."]
    order = [arm["label"] for arm in report["profiles"][0]["arms"] if arm["label"] != "auto"] if report["profiles"] else []
    lines += ["", f"Per prompt, ms/token (cloud-only / {' / '.join(order)} / k=auto):", ""]
    for row in report["profiles"]:
        arms = {arm["label"]: arm["ms_per_token_by_prompt"] for arm in row["arms"]}
        always = [label for label in arms if label != "auto"]
        for i, cloud in enumerate(row["cloud_only_ms_by_prompt"]):
            cells = " / ".join(f"{arms[label][i]:.1f}" for label in always)
            lines.append(f"- {row['profile']}, prompt {i + 1}: {cloud:.1f} / {cells} / {arms['auto'][i]:.1f}")
    lines += ["", "k=auto's decisions (each request's start and every switch, with the two predictions, ms/token):", ""]
    for row in report["profiles"]:
        for i, log in enumerate(row["switch_logs"]):
            lines.append(f"- {row['profile']}, prompt {i + 1}: " + "; ".join(decision_text(d) for d in log))
    return "\n".join(lines) + "\n"


def write_report(report: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "planner.json").write_text(json.dumps(report, indent=2, default=str))
    (out / "planner.md").write_text(markdown(report))
    return [out / "planner.json", out / "planner.md"]

