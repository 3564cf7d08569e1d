"""``edgespec simulate``: a fleet of devices and replicas in simulated time (prints figures).

    edgespec simulate --devices 200 --link wifi:0.5,4g:0.3,5g:0.2 --replicas 2 --k auto \\
        [--calibration cal.json] [--duration 60 | --tokens-per-device 256] [--seed 0] \\
        [--out runs/sim] [--plots]

    edgespec simulate plan --devices 10000 --link wifi:0.5,5g:0.3,4g:0.2 --target-step-ms 12 \\
        [--per-row-ms 0.1 --per-token-ms 0.02 | --batch-curve curve.json] [--goal-ms-per-token 30] [--seed 0]

``plan``: replicas needed for a per-session goal, speculative vs cloud-only, and the autoscaling
policy (``edgespec.cloud.simulate.plan``, which explains the method); with ``--out DIR`` it
writes ``plan.json``. With ``--model``, the plan per link class in steady state at percentile
SLOs, both paths and both backends' KV policies, with what binds each row
(``edgespec.cloud.simulate.link_plan``):

    edgespec simulate plan --model llama-3-8b --gpu h100 --link wifi,5g,4g --slo-ms 20,30,50 \\
        [--percentile 90] [--prompt-tokens 512 --max-new-tokens 512] [--batch-curve measured.json] [--markdown]

A run with ``--out DIR`` writes ``result.json`` (figures and per-device ms/token) and the calibration
used; ``--plots`` adds the sweeps around this scenario (speedup vs RTT, best k vs RTT,
capacity vs fleet size) as PNG + JSON. ``--write-calibration FILE`` writes the calibration
(the placeholder default, or ``--calibration``) as an editable JSON template and exits.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from edgespec.cli.flags import add_deprecated
from edgespec.cloud.simulate.calibration import Calibration, VerifyModel
from edgespec.cloud.simulate.config import FleetConfig
from edgespec.cloud.simulate.engine import simulate
from edgespec.cloud.simulate.hardware import Hardware
from edgespec.cloud.simulate.link_plan import SteadyConfig, plan_links
from edgespec.cloud.simulate.memory import Workload
from edgespec.cloud.simulate.plan import PlanConfig, batch_curve, plan
from edgespec.cloud.simulate.result import finite_json
from edgespec.cloud.simulate import sweeps


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("what", nargs="?", default="run", choices=("run", "plan"),
                        help="run: simulate one fleet (default); plan: replicas needed for a goal, SD vs cloud-only")
    parser.add_argument("--devices", type=int, default=1, help="edge devices, one session each")
    parser.add_argument("--link", dest="link_mix", default=None,
                        help="the devices' link profiles: NAME or NAME:WEIGHT,... (edgespec link --help; default wifi; "
                             "plan --model: the link classes, default wifi,5g,4g)")
    add_deprecated(parser, "--link-mix", "--link", "link_mix")
    add_deprecated(parser, "--profile-mix", "--link", "link_mix")
    parser.add_argument("--replicas", type=int, default=1, help="verifier replicas (devices assigned round-robin)")
    parser.add_argument("--k", default=None, help="drafts per round, or 'auto' for the SDK's adaptive policy "
                        "(default 4; plan --model: auto)")
    parser.add_argument("--max-k", type=int, default=16, help="the server's max_k (default %(default)s)")
    add_deprecated(parser, "--k-max", "--max-k", "max_k", convert=int)
    parser.add_argument("--max-batch-size", type=int, default=None, help="most rows per replica forward (run: 32; plan: --max-sessions)")
    parser.add_argument("--batch-wait-timeout-s", type=float, default=0.005,
                        help="once the model is free, wait this long (seconds) for more open sessions (0: take what queued; "
                             "default %(default)s, the verifier's batch_wait_timeout_s)")
    add_deprecated(parser, "--batch-wait-ms", "--batch-wait-timeout-s", "batch_wait_timeout_s", convert=lambda ms: float(ms) / 1000.0,
                   note=" (seconds: --batch-wait-ms 5 is --batch-wait-timeout-s 0.005)")
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--duration", type=float, metavar="S", help="simulate S seconds of steady generation")
    budget.add_argument("--tokens-per-device", type=int, metavar="T", help="each device generates T tokens (default 256)")
    parser.add_argument("--draft-ahead", action="store_true", help="devices draft on while a block is in flight")
    parser.add_argument("--start-spread-ms", type=float, default=0.0, help="sessions open at random times in [0, this)")
    parser.add_argument("--calibration", type=Path, help="calibration JSON (schema: edgespec.cloud.simulate.calibration)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the cloud-only run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="directory for result.json (and plots)")
    parser.add_argument("--plots", action="store_true", help="with --out: sweeps around this scenario as PNG + JSON")
    parser.add_argument("--write-calibration", type=Path, metavar="FILE", help="write the calibration as JSON and exit")
    plan = parser.add_argument_group("plan")
    plan.add_argument("--target-step-ms", type=float, help="plan: the target's decode step at batch 1 (ms); with "
                      "--per-row-ms / --per-token-ms it replaces the calibration's batch curve")
    plan.add_argument("--per-row-ms", type=float, default=0.0, help="plan: what each further row adds to a forward (ms)")
    plan.add_argument("--per-token-ms", type=float, default=0.0, help="plan: what each further token of a row adds (ms)")
    plan.add_argument("--batch-curve", type=Path, help="plan: the batch curve as JSON (the calibration's 'verify' schema)")
    plan.add_argument("--draft-ms-per-token", type=float, help="plan: the devices' drafting time per token (ms)")
    plan.add_argument("--ingress-ms-per-message", type=float,
                      help="plan: the replica's ingress service time per message, both paths (ms)")
    plan.add_argument("--goal-ms-per-token", type=float, help="plan: per-session goal; without it a replica carries --max-sessions")
    plan.add_argument("--goal-stat", choices=("mean", "p90"), default="mean", help="plan: the goal holds for this statistic over sessions")
    plan.add_argument("--concurrency", type=float, default=1.0, help="plan: fraction of devices generating at once")
    plan.add_argument("--max-sessions", type=int, default=256, help="plan: most sessions one replica admits")
    plan.add_argument("--model", help="plan per link: target(s) by name, comma-separated (cloud/simulate/hardware.json: "
                      "llama-2-7b, llama-3-8b, llama-3-70b); the step is the roofline unless --batch-curve gives a measured table")
    plan.add_argument("--gpu", default="h100", help="plan per link: GPU(s) by name, comma-separated (h100, h200; default %(default)s)")
    plan.add_argument("--tensor-parallel-size", type=int, help="plan per link: GPUs a replica splits the target over "
                      "(default: the cluster/ layout's, 1 for a model it does not split)")
    plan.add_argument("--slo-ms", default="20,30,50", help="plan per link: SLOs in ms/token, comma-separated (default %(default)s)")
    plan.add_argument("--percentile", type=float, default=90.0, help="plan per link: the SLO holds for this percentile "
                      "of each session's 1 s windows of ms/token (default %(default)s)")
    plan.add_argument("--prompt-tokens", type=int, default=512, help="plan per link: a session's prompt (default %(default)s)")
    plan.add_argument("--max-new-tokens", type=int, default=512, help="plan per link: a session's max_new_tokens (default %(default)s)")
    plan.add_argument("--markdown", action="store_true", help="plan per link: print the compact markdown table too")


def run(args: argparse.Namespace) -> int:
    if args.what == "plan" and args.model:
        return link_plan_command(args)
    args.link_mix = args.link_mix or "wifi"
    args.k = args.k or "4"
    if args.what == "plan":
        return _plan(args)
    try:
        calibration = Calibration.load(args.calibration) if args.calibration else Calibration.default()
        if args.write_calibration:
            calibration.save(args.write_calibration)
            print(f"wrote {args.write_calibration}")
            return 0
        config = FleetConfig(
            devices=args.devices, link_mix=args.link_mix, replicas=args.replicas, k=args.k, k_max=args.max_k,
            tokens_per_device=args.tokens_per_device, duration_s=args.duration, max_batch_size=args.max_batch_size or 32,
            batch_wait_ms=args.batch_wait_timeout_s * 1000.0,
            draft_ahead=args.draft_ahead, start_spread_ms=args.start_spread_ms, seed=args.seed,
        )
    except (OSError, ValueError) as exc:
        print(f"edgespec simulate: {exc}", file=sys.stderr)
        return 2
    if args.plots and not args.out:
        print("edgespec simulate: --plots needs --out DIR", file=sys.stderr)
        return 2
    started = time.perf_counter()
    result = simulate(config, calibration, baseline=not args.no_baseline)
    print(result.table())
    print(f"(simulated in {time.perf_counter() - started:.1f} s wall)")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        result.save(args.out / "result.json")
        calibration.save(args.out / "calibration.json")
        print(f"wrote {args.out / 'result.json'}")
        if args.plots:
            _write_sweeps(config, calibration, args.out)
    return 0


def plan_calibration(args: argparse.Namespace) -> Calibration:
    """The calibration file (or the placeholder) with the plan's batch curve and drafting time."""
    calibration = Calibration.load(args.calibration) if args.calibration else Calibration.default()
    changes, notes = {}, []
    if args.batch_curve and args.target_step_ms is not None:
        raise ValueError("--batch-curve and --target-step-ms exclude each other: give one batch curve")
    if args.batch_curve:
        changes["verify"] = VerifyModel.from_dict(json.loads(args.batch_curve.read_text()))
        notes.append(f"batch curve {args.batch_curve}")
    elif args.target_step_ms is not None:
        changes["verify"] = batch_curve(args.target_step_ms, args.per_row_ms, args.per_token_ms)
        notes.append(f"step {args.target_step_ms:g} ms + {args.per_row_ms:g}/row + {args.per_token_ms:g}/row-token")
    if args.ingress_ms_per_message is not None:
        changes["ingress_ms_per_round_message"] = changes["ingress_ms_per_stream_message"] = args.ingress_ms_per_message
        notes.append(f"ingress {args.ingress_ms_per_message:g} ms/message")
    if args.draft_ms_per_token is not None:
        changes["draft_ms_per_token"] = args.draft_ms_per_token
        notes.append(f"draft {args.draft_ms_per_token:g} ms/token")
    if notes:
        changes["source"] = f"{calibration.source}; plan: " + ", ".join(notes)
    return dataclasses.replace(calibration, **changes)


def _plan(args: argparse.Namespace) -> int:
    try:
        calibration = plan_calibration(args)
        config = PlanConfig(
            devices=args.devices, link_mix=args.link_mix, concurrency=args.concurrency, goal_ms_per_token=args.goal_ms_per_token,
            goal_stat=args.goal_stat, max_sessions=args.max_sessions, max_batch_size=args.max_batch_size or args.max_sessions,
            batch_wait_ms=args.batch_wait_timeout_s * 1000.0, k=args.k, duration_s=args.duration or 10.0, seed=args.seed,
        )
    except (OSError, ValueError) as exc:
        print(f"edgespec simulate plan: {exc}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    result = plan(config, calibration)
    print(result.table())
    print(f"(planned in {time.perf_counter() - started:.1f} s wall)")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "plan.json").write_text(json.dumps(finite_json(result.to_dict()), indent=2) + "\n")
        print(f"wrote {args.out / 'plan.json'}")
    return 0


def link_plan_command(args: argparse.Namespace) -> int:
    """``plan --model``: the per-link steady-state plan for each model x GPU asked."""
    try:
        calibration = plan_calibration(args)
        measured = calibration.verify if (args.batch_curve or args.target_step_ms is not None) else None
        links = tuple(part.split(":")[0].strip() for part in (args.link_mix or "wifi,5g,4g").split(",") if part.strip())
        FleetConfig(link_mix=",".join(links))  # names checked against the profiles
        config = SteadyConfig(
            links=links, slos_ms=tuple(float(v) for v in args.slo_ms.split(",") if v.strip()), percentile=args.percentile,
            max_sessions=args.max_sessions, batch_wait_ms=args.batch_wait_timeout_s * 1000.0, k=args.k or "auto",
            workload=Workload(args.prompt_tokens, args.max_new_tokens), seed=args.seed,
            **({"measure_s": args.duration} if args.duration else {}),
        )
        hardware = Hardware.load()
        deployments = [hardware.deployment(m.strip(), g.strip(), args.tensor_parallel_size)
                       for m in args.model.split(",") for g in args.gpu.split(",")]
    except (OSError, ValueError) as exc:
        print(f"edgespec simulate plan: {exc}", file=sys.stderr)
        return 2
    started, plans = time.perf_counter(), []
    for deployment in deployments:
        result = plan_links(deployment, hardware, calibration, config, measured)
        plans.append(result.to_dict())
        print(result.table())
        if args.markdown:
            print(result.markdown())
        print()
    print(f"calibration: {calibration.source}")
    print(f"(planned in {time.perf_counter() - started:.1f} s wall)")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "plan.json").write_text(json.dumps(finite_json(plans), indent=2) + "\n")
        print(f"wrote {args.out / 'plan.json'}")
    return 0


def _write_sweeps(config: FleetConfig, calibration: Calibration, out: Path) -> None:
    common = {"calibration": calibration, "draft_ahead": config.draft_ahead, "seed": config.seed}
    speedup = sweeps.speedup_vs_rtt(k=config.k, **common)
    best_k = sweeps.optimal_k_vs_rtt(ks=range(1, config.k_max + 1), **common)
    counts = sorted({n for n in sweeps.DEFAULT_DEVICE_COUNTS if n <= max(config.devices, 32)} | {config.devices})
    capacity = sweeps.capacity_vs_devices(
        counts, link_mix=config.link_mix, replicas=config.replicas, k=config.k,
        max_batch_size=config.max_batch_size, batch_wait_ms=config.batch_wait_ms, duration_s=config.duration_s or 20.0, **common,
    )
    note = f"calibration: {calibration.source.split(':')[0][:40]}"
    paths = [
        sweeps.plot_speedup_vs_rtt(speedup, out / "speedup_vs_rtt.png", title=f"1 device, k={config.k}; {note}"),
        sweeps.plot_optimal_k(best_k, out / "optimal_k_vs_rtt.png", title=f"1 device; {note}"),
        sweeps.plot_capacity(capacity, out / "capacity_vs_devices.png", title=f"{config.replicas} replica(s), k={config.k}; {note}"),
    ]
    rows = {"speedup_vs_rtt": speedup, "optimal_k_vs_rtt": best_k, "capacity_vs_devices": capacity}
    (out / "sweeps.json").write_text(json.dumps(finite_json(rows), indent=2) + "\n")
    for path in paths + [out / "sweeps.json"]:
        print(f"wrote {path}")
