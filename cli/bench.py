"""``edgespec bench``: measure and tune a draft/target pair through the real Serve gRPC path.

    edgespec bench --target DIR --draft DIR --prompts FILE [--held-out FILE] [--out DIR]
    edgespec bench capacity --target DIR --draft DIR --prompts FILE --sessions 1,4,16,32
    edgespec bench links --target DIR --draft DIR --prompts FILE --profiles loopback,wifi,4g
    edgespec bench simcheck --target DIR --draft DIR --prompts FILE [--profiles ...] [--sessions 16]
    edgespec bench ingress --target DIR --draft DIR --prompts FILE --ingresses haproxy,proxy,direct
    edgespec bench load --target DIR --draft DIR --sessions 64 --rounds 200
    edgespec bench kill --target DIR --draft DIR --max-new-tokens 300
    edgespec bench device-server --target DIR --draft DIR --prompts FILE
    edgespec bench spread --target DIR --draft DIR --prompts FILE --replicas 2 --sessions 16
    edgespec bench overhead --sessions 64 [--rounds 60]
    edgespec bench sampling --target DIR --draft DIR --prompts FILE --held-out FILE --temperatures 0.3,0.6,0.8,1.0,1.2

Without --server a local Ray Serve is started with the target on CPU; with --server HOST:PORT
an existing deployment is measured (its target must be the one --target names).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("what", nargs="?", default="report", choices=("report", "capacity", "links", "simcheck", "ingress", "load", "kill", "device-server", "sampling", "spread",
                                 "overhead"),
                        help="report: the tuning workflow (default); capacity: concurrent sessions; links: per network "
                             "profile; simcheck: only the fleet simulator against the link emulator (its calibration, "
                             "then 1 and N sessions per profile; minutes); ingress: Serve's gRPC ingresses side by side; "
                             "load: many raw sessions, outputs "
                             "checked, latency and memory before/during/after; kill: a replica SIGKILLed under a "
                             "generating device; device-server: the OpenAI-compatible device server against the SDK; "
                             "sampling: exact sampling before/after per temperature, and lookup-only vs model + lookup vs "
                             "model-only drafts; spread: sessions per replica and batch sizes with --replicas; overhead: "
                             "the replica's CPU per verify message by phase (a featherweight target, --sessions N)")
    parser.add_argument("--target", type=Path, default=REPO / "models" / "demo" / "target")
    parser.add_argument("--draft", type=Path, default=REPO / "models" / "demo" / "draft")
    parser.add_argument("--draft-hf", type=Path, default=REPO / "models" / "demo" / "draft-hf",
                        help="report: the draft's Hugging Face weights, for transformers' assisted generation (peers)")
    parser.add_argument("--no-peers", action="store_true", help="report: skip the transformers in-process peers")
    parser.add_argument("--prompts", type=Path, default=REPO / "prompts" / "tuning.jsonl", help="tuning prompts (JSONL or text)")
    parser.add_argument("--held-out", type=Path, default=None, help="held-out prompts, never used for tuning")
    parser.add_argument("--out", type=Path, default=None, help="report folder (default runs/bench-<what>-<time>)")
    parser.add_argument("--server", default=None, help="measure an existing deployment at HOST:PORT")
    parser.add_argument("--prompt-limit", type=int, default=8, help="prompts per setting")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--k-values", default="1,2,3,4,5,6,7,8")
    parser.add_argument("--baseline-k", type=int, default=4)
    parser.add_argument("--sessions", default="1,4,16,32", help="capacity: concurrent session counts")
    parser.add_argument("--k", default="4", help="capacity/links: k (a number or auto)")
    parser.add_argument("--link", default=None, help="report: run every measurement through this link profile")
    parser.add_argument("--profiles", default="loopback,lan,wifi,5g,4g,satellite", help="links: profiles to compare")
    parser.add_argument("--ingresses", default="haproxy,proxy,direct", help="ingress: which to compare, in this order")
    parser.add_argument("--other-ingresses", default="proxy",
                        help="links: also measure the headline speedup through these ingresses ('' for none)")
    parser.add_argument("--rounds", type=int, default=200, help="ingress/load: raw rounds per session")
    parser.add_argument("--api-key", default=os.environ.get("EDGESPEC_API_KEY"), help="load: key for --server (default $EDGESPEC_API_KEY)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replicas", type=int, default=2, help="spread: verifier replicas started on this machine")
    parser.add_argument("--generations", type=int, default=3, help="spread: generations per device")
    parser.add_argument("--temperatures", default="0.3,0.6,0.8,1.0,1.2", help="sampling: the temperatures swept")
    parser.add_argument("--sweep-k", default="auto", help="sampling: k of the temperature sweep's arms (comma list, numbers or auto)")
    parser.add_argument("--lookup-weight", type=float, default=None, help="sampling: lookup_weight of the 'after' arms")
    parser.add_argument("--draft-temperature", default=None, help="sampling: draft_temperature of the 'after' arms (a number or auto)")


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if args.what == "overhead":  # its own target: no draft, no prompts
        from edgespec.cloud.bench.overhead import run_overhead

        sessions = max(int(n) for n in args.sessions.split(","))
        rounds = args.rounds if args.rounds != 200 else 60
        return run_overhead(sessions=sessions, rounds=rounds, k=int(args.k), work=args.out or REPO / "runs" / "bench-overhead",
                            progress=lambda message: print(message, flush=True))
    try:
        from edgespec.cloud.bench.harness import load_prompts

        prompts = load_prompts(args.prompts, args.prompt_limit)
        held_out = load_prompts(args.held_out, args.prompt_limit) if args.held_out else []
        for name, path in (("target", args.target / "config.json"), ("draft", args.draft / "manifest.json")):
            if not path.is_file():
                raise FileNotFoundError(f"--{name}: {path} not found")
    except (FileNotFoundError, ValueError) as exc:
        print(f"edgespec bench: {exc}", file=sys.stderr)
        return 2
    out = args.out or REPO / "runs" / f"bench-{args.what}-{time.strftime('%Y%m%d-%H%M%S')}"
    progress = lambda message: print(message, flush=True)  # noqa: E731
    if args.what == "capacity":
        return _capacity(args, prompts, out, progress)
    if args.what == "ingress":
        return _ingress(args, prompts, out, progress)
    if args.what == "links":
        return _links(args, prompts, out, progress)
    if args.what == "simcheck":
        return _simcheck(args, prompts, out, progress)
    if args.what in ("load", "kill"):
        return _robustness(args, prompts, out, progress)
    if args.what == "sampling":
        return _sampling(args, prompts, held_out, out, progress)
    if args.what == "spread":
        return _spread(args, prompts, out, progress)
    if args.what == "device-server":
        import json

        from edgespec.cloud.bench.device_server import run_device_bench

        report = run_device_bench(args.target, args.draft, prompts, args.max_new_tokens, args.server, progress)
        out.mkdir(parents=True, exist_ok=True)
        (out / "device_server.json").write_text(json.dumps(report, indent=2))
        print(json.dumps(report, indent=2))
        return 0
    from edgespec.cloud.bench.report import summary_lines, write_report
    from edgespec.cloud.bench.workflow import BenchConfig, run_bench

    config = BenchConfig(
        target=args.target, draft=args.draft, prompts=prompts, held_out=held_out, out=out, server=args.server,
        max_new_tokens=args.max_new_tokens, k_values=tuple(int(k) for k in args.k_values.split(",")),
        baseline_k=args.baseline_k, seed=args.seed, link=args.link,
        draft_hf=args.draft_hf if args.draft_hf and args.draft_hf.is_dir() else None, peers=not args.no_peers,
    )
    started = time.perf_counter()
    report = run_bench(config, progress)
    paths = write_report(report, out)
    from dataclasses import asdict

    print(f"\nbench finished in {time.perf_counter() - started:.0f}s; report in {out}:")
    for path in paths:
        print(f"  {path}")
    print()
    for line in summary_lines(asdict(report)):
        print(f"  {line}")
    return 0


def _spread(args, prompts, out, progress) -> int:
    from edgespec.cloud.bench.spread import SpreadConfig, run_spread, summary_lines, write_spread

    try:
        config = SpreadConfig(target=args.target, draft=args.draft, prompts=prompts, replicas=args.replicas,
                              sessions=max(int(n) for n in args.sessions.split(",")), generations=args.generations,
                              max_new_tokens=args.max_new_tokens, k=args.k, server=args.server)
    except ValueError as exc:
        print(f"edgespec bench spread: {exc}", file=sys.stderr)
        return 2
    report = run_spread(config, progress)
    path = write_spread(report, out)
    print(f"\nspread report: {path}")
    for line in summary_lines(report):
        print(f"  {line}")
    return 0


def _capacity(args, prompts, out, progress) -> int:
    from edgespec.cloud.bench.capacity import run_capacity, write_capacity
    from edgespec.cloud.bench.harness import Harness

    counts = [int(n) for n in args.sessions.split(",")]
    params = dict(max_new_tokens=args.max_new_tokens, k=args.k, stop_token_ids=(), seed=args.seed)
    with Harness(args.target, args.draft, server=args.server, progress=progress, max_sessions=max(counts) + 8) as harness:
        harness.warm_up(prompts[0])
        rows = run_capacity(harness.server, args.draft, prompts, counts, params, progress)
    paths = write_capacity(rows, out, f"{args.target.name} + {args.draft.name}, k={args.k}, {args.max_new_tokens} tokens")
    print(f"\ncapacity report in {out}: " + ", ".join(p.name for p in paths))
    return 0


def _ingress(args, prompts, out, progress) -> int:
    from edgespec.cloud.bench.ingress import IngressBenchConfig, run_ingress_bench, write_ingress_report

    try:
        config = IngressBenchConfig(
            target=args.target, draft=args.draft, prompts=prompts, ingresses=tuple(args.ingresses.split(",")),
            k=int(args.k), rounds=args.rounds, sessions=max(int(n) for n in args.sessions.split(",")),
            max_new_tokens=args.max_new_tokens, seed=args.seed,
        )
    except ValueError as exc:
        print(f"edgespec bench ingress: {exc}", file=sys.stderr)
        return 2
    rows = run_ingress_bench(config, progress)
    paths = write_ingress_report(rows, config, out)
    print(f"\ningress report in {out}: " + ", ".join(p.name for p in paths))
    return 0


def _robustness(args, prompts, out, progress) -> int:
    import json

    from edgespec.cloud.bench import robustness

    if args.what == "load":
        report = robustness.run_load(robustness.LoadConfig(
            target=args.target, draft=args.draft, prompts=prompts, sessions=max(int(n) for n in args.sessions.split(",")),
            rounds=args.rounds, k=int(args.k), api_key=args.api_key), progress)
    else:
        report = robustness.run_kill(robustness.KillConfig(
            target=args.target, draft=args.draft, prompts=prompts, max_new_tokens=args.max_new_tokens), progress)
    path = robustness.write(report, out, args.what)
    print(json.dumps(report, indent=2, default=str))
    print(f"\n{args.what} report: {path}")
    return 0


def _simcheck(args, prompts, out, progress) -> int:
    from edgespec.cloud.bench.simcheck import SimcheckConfig, run_simcheck

    try:
        config = SimcheckConfig(
            target=args.target, draft=args.draft, prompts=prompts, profiles=tuple(args.profiles.split(",")),
            sessions=max(int(n) for n in args.sessions.split(",")), max_new_tokens=args.max_new_tokens,
            k=int(args.k), server=args.server, seed=args.seed,
        )
    except ValueError as exc:
        print(f"edgespec bench simcheck: {exc}", file=sys.stderr)
        return 2
    report = run_simcheck(config, out, progress)
    print(f"\nsimulator check in {out}: simcheck.md, simcheck.json, calibration.json; "
          f"{report['within']}/{report['cells']} cells within 10% ({report['wall_s']:.0f} s)")
    return 0


def _links(args, prompts, out, progress) -> int:
    from edgespec.cloud.bench.links import LinksConfig, run_links, summary_lines

    try:
        config = LinksConfig(
            target=args.target, draft=args.draft, prompts=prompts, profiles=tuple(args.profiles.split(",")),
            sessions=max(int(n) for n in args.sessions.split(",")), max_new_tokens=args.max_new_tokens,
            other_ingresses=tuple(name for name in args.other_ingresses.split(",") if name), server=args.server, seed=args.seed,
        )
    except ValueError as exc:
        print(f"edgespec bench links: {exc}", file=sys.stderr)
        return 2
    report = run_links(config, out, progress)
    print(f"\nlinks report in {out}: links.md, links.json, calibration.json and plots")
    for line in summary_lines(report):
        print(f"  {line}")
    return 0


def _sampling(args, prompts, held_out, out, progress) -> int:
    from edgespec.cloud.bench.sampling import SamplingBenchConfig, run_sampling_bench, summary_lines, write_sampling

    extra = {}
    if args.lookup_weight is not None:
        extra["lookup_weight"] = args.lookup_weight
    if args.draft_temperature is not None:
        extra["draft_temperature"] = args.draft_temperature if args.draft_temperature == "auto" else float(args.draft_temperature)
    try:
        config = SamplingBenchConfig(
            target=args.target, draft=args.draft, prompts=prompts, held_out=held_out,
            temperatures=tuple(float(t) for t in args.temperatures.split(",")),
            k_values=tuple(k if k == "auto" else int(k) for k in args.sweep_k.split(",")),
            drafter_k=args.k if args.k == "auto" else int(args.k), max_new_tokens=args.max_new_tokens,
            seed=args.seed, server=args.server, extra=extra,
        )
    except ValueError as exc:
        print(f"edgespec bench sampling: {exc}", file=sys.stderr)
        return 2
    report = run_sampling_bench(config, progress)
    paths = write_sampling(report, out)
    print(f"\nsampling report in {out}: " + ", ".join(p.name for p in paths))
    for line in summary_lines(report):
        print(f"  {line}")
    return 0
