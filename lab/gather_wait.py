"""The replica's gather, before and after it waited only for sessions on their way back.

One local Serve on the demo pair, the replica redeployed between the two rules of
``batch_wait_for`` ("all": every open session; "returning": only the sessions whose next draft is
expected within the wait, ``cloud/serving/scheduler.py``). Per link, through the link emulator,
N replayed devices at once (``cloud/bench/replay.py``: the drafts a real device would send, every
output checked), then as many Generate streams, under each rule in turn, ABBA, so both rules
see the same machine. Each cell: verified tokens/s of the speculative arm and the replica's mean
forward wait (the model free with rows queued, waiting for more: ``GatherStats``, read through a
Serve handle around each arm), and the same for the cloud-only arm.

    .venv/bin/python lab/gather_wait.py --links wifi,4g --sessions 16 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from edgespec.cloud.bench.harness import Harness, free_port, load_prompts
from edgespec.cloud.bench.replay import make_scripts, measure_replay
from edgespec.cloud.link.profiles import get_profile
from edgespec.cloud.serving.app import APP_NAME, init_ray, serve_verifier, stop_serving
from edgespec.cloud.serving.config import BATCH_WAIT_FOR, DeploymentOptions, VerifierConfig

BEFORE, AFTER = "all", "returning"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="models/demo/target")
    parser.add_argument("--draft", default="models/demo/draft")
    parser.add_argument("--prompts", default="prompts/tuning.jsonl")
    parser.add_argument("--prompt-limit", type=int, default=8)
    parser.add_argument("--links", default="wifi,4g")
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--k", type=int, default=4, help="drafts per replayed round")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="ABBA pairs of arms per link")
    parser.add_argument("--out", default=f"runs/gather-wait-{time.strftime('%Y%m%d-%H%M%S')}")
    return parser.parse_args()


class Replica:
    """The local Serve, redeployed with one rule or the other."""

    def __init__(self, args: argparse.Namespace):
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        init_ray(num_cpus=max(2, os.cpu_count() or 2), log_to_driver=False)
        self.args, self.rule = args, None
        self.ports = free_port(), free_port()
        self.address = ""

    def use(self, rule: str) -> None:
        if rule == self.rule:
            return
        config = VerifierConfig(model=self.args.target, device="cpu", torch_threads=1, max_sessions=self.args.sessions + 8,
                                max_batch_size=self.args.sessions + 8, max_new_tokens=8192, batch_wait_for=rule)
        started = time.perf_counter()
        self.address = serve_verifier(config, DeploymentOptions(num_cpus=1, num_replicas=1), grpc_port=self.ports[0],
                                      http_port=self.ports[1], timeout_s=600)
        print(f"  replica with batch_wait_for={rule} after {time.perf_counter() - started:.0f}s", flush=True)
        self.rule = rule

    def gather_stats(self) -> dict:
        from ray import serve

        stats = serve.get_app_handle(APP_NAME).gather_stats.remote().result(timeout_s=60)
        assert stats["batch_wait_for"] == self.rule, stats
        return stats


def between(before: dict, after: dict) -> dict:
    """The gathers between two readings: how many, their mean wait and forward, how many waited it all out."""
    gathers = after["gathers"] - before["gathers"]
    mean = lambda key: 1000.0 * (after[key] - before[key]) / gathers if gathers else 0.0  # noqa: E731
    return {"forwards": gathers, "wait_ms": mean("waited_s"), "forward_ms": mean("forward_s"),
            "full_waits": after["full_waits"] - before["full_waits"]}


def one_cell(harness: Harness, replica: Replica, scripts, args) -> dict:
    readings = [replica.gather_stats()]
    row = measure_replay(harness.address, harness.info.tokenizer_fingerprint, scripts, args.sessions, args.k,
                         cloud_first=True, between=lambda: readings.append(replica.gather_stats()))
    readings.append(replica.gather_stats())
    cloud, spec = between(readings[0], readings[1]), between(readings[1], readings[2])
    return {"verified_tokens_per_s": row.speculative_tokens_per_s, "forward_wait_ms": spec["wait_ms"],
            "forward_ms": spec["forward_ms"], "forwards": spec["forwards"], "full_waits": spec["full_waits"],
            "batch_mean": row.batch_size_mean, "tau": row.tau, "exact": row.exact,
            "cloud_only_tokens_per_s": row.cloud_only_tokens_per_s, "cloud_only_forward_wait_ms": cloud["wait_ms"],
            "cloud_only_batch_mean": row.cloud_only_batch_mean, "load_1min": os.getloadavg()[0]}


def summary(cells: list[dict]) -> dict:
    keys = ("verified_tokens_per_s", "forward_wait_ms", "forward_ms", "batch_mean", "cloud_only_tokens_per_s", "cloud_only_forward_wait_ms",
            "cloud_only_batch_mean")
    out = {key: statistics.fmean(c[key] for c in cells) for key in keys}
    out["verified_tokens_per_s_each"] = [round(c["verified_tokens_per_s"], 1) for c in cells]
    out["cloud_only_tokens_per_s_each"] = [round(c["cloud_only_tokens_per_s"], 1) for c in cells]
    out["full_wait_share"] = sum(c["full_waits"] for c in cells) / max(sum(c["forwards"] for c in cells), 1)
    out["exact"] = all(c["exact"] for c in cells)
    return out


def table(results: dict, args) -> str:
    lines = [f"{args.sessions} replayed sessions, k={args.k}, {args.max_new_tokens} tokens each, demo pair, "
             f"{args.repeats} ABBA pairs per link (mean over cells)", "",
             "| link | rule | verified tokens/s | mean forward wait ms | forwards that waited it all out | mean forward ms | "
             "mean batch | cloud-only tokens/s | cloud-only mean batch | cloud-only forward wait ms |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for link, by_rule in results.items():
        for rule in (BEFORE, AFTER):
            s = by_rule[rule]["summary"]
            lines.append(f"| {link} | {rule} | {s['verified_tokens_per_s']:.1f} {s['verified_tokens_per_s_each']} | "
                         f"{s['forward_wait_ms']:.2f} | {s['full_wait_share']:.0%} | {s['forward_ms']:.1f} | {s['batch_mean']:.2f} | "
                         f"{s['cloud_only_tokens_per_s']:.1f} {s['cloud_only_tokens_per_s_each']} | {s['cloud_only_batch_mean']:.2f} | "
                         f"{s['cloud_only_forward_wait_ms']:.2f} |")
        ratio = by_rule[AFTER]["summary"]["verified_tokens_per_s"] / by_rule[BEFORE]["summary"]["verified_tokens_per_s"]
        lines.append(f"| {link} | after/before | {ratio:.3f}x | | | | | | | |")
    return "\n".join(lines)


def main() -> int:
    args = parse_args()
    assert set(BATCH_WAIT_FOR) == {BEFORE, AFTER}
    prompts = load_prompts(args.prompts, args.prompt_limit)
    replica = Replica(args)
    results: dict = {}
    try:
        replica.use(BEFORE)
        with Harness(args.target, args.draft, server=replica.address) as harness:
            harness.warm_up(prompts[0])
            scripts = make_scripts(harness.client, prompts, args.max_new_tokens)
            for link in args.links.split(","):
                harness.use_link(get_profile(link))
                cells: dict = {BEFORE: [], AFTER: []}
                for repeat in range(args.repeats):
                    for rule in (BEFORE, AFTER) if repeat % 2 == 0 else (AFTER, BEFORE):
                        if rule != replica.rule:
                            replica.use(rule)
                            harness.warm_up(prompts[0])
                        cell = one_cell(harness, replica, scripts, args)
                        cells[rule].append(cell)
                        print(f"  {link} {rule}: {cell['verified_tokens_per_s']:.1f} verified tokens/s, forward wait "
                              f"{cell['forward_wait_ms']:.2f} ms over {cell['forwards']} forwards of {cell['forward_ms']:.1f} ms; cloud-only "
                              f"{cell['cloud_only_tokens_per_s']:.1f} tokens/s; load {cell['load_1min']:.2f}", flush=True)
                results[link] = {rule: {"cells": cells[rule], "summary": summary(cells[rule])} for rule in cells}
    finally:
        stop_serving()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gather_wait.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    text = table(results, args)
    (out / "gather_wait.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
