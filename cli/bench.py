"""``edgespec bench MODE``: measure and tune a draft/target pair through the real Serve gRPC path.

    edgespec bench report --target DIR --draft DIR --prompts FILE [--held-out FILE] [--out DIR]
    edgespec bench capacity --target DIR --draft DIR --prompts FILE --sessions 1,4,16,32
    edgespec bench links --target DIR --draft DIR --prompts FILE --link loopback,wifi,4g
    edgespec bench simcheck --target DIR --draft DIR --prompts FILE [--link ...] [--sessions 16]
    edgespec bench ingress --target DIR --draft DIR --prompts FILE --ingresses haproxy,proxy,direct
    edgespec bench load --target DIR --draft DIR --sessions 64 --rounds 200
    edgespec bench kill --target DIR --draft DIR --max-new-tokens 300
    edgespec bench device-server --target DIR --draft DIR --prompts FILE
    edgespec bench spread --target DIR --draft DIR --prompts FILE --replicas 2 --sessions 16
    edgespec bench overhead --sessions 64 [--rounds 60]
    edgespec bench sampling --target DIR --draft DIR --prompts FILE --held-out FILE --temperatures 0.3,0.6,0.8,1.0,1.2
    edgespec bench planner --target DIR --draft DIR --prompts FILE --link wifi,4g [--load 2] [--temperature 0.8] [--control]

Each mode takes only its own flags (``edgespec bench MODE --help``). The modes that can measure
an existing deployment take --server HOST:PORT (its target must be the one --target names) with
--api-key, --tls and --ca-cert; without --server they start a local Ray Serve with the target on
CPU, whose replica logs stay in Ray's log folder, off the terminal.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from edgespec.cli.flags import add_connection, add_deprecated, parse_counts, parse_fixed_k, parse_k
from edgespec.cloud.bench.harness import BACKEND_ENV
from edgespec.cloud.serving.config import BACKENDS

REPO = Path(__file__).resolve().parents[1]

# mode -> one-line help
MODES = {
    "report": "the tuning workflow: k, modes, sampling and drafters against cloud-only, with a report",
    "capacity": "concurrent sessions: speculative vs cloud-only throughput per session count",
    "links": "per network link profile, through the link emulator, with the fleet simulator beside it",
    "simcheck": "the fleet simulator against the link emulator only: its calibration, then 1 and N sessions per link (minutes)",
    "ingress": "Serve's gRPC ingresses side by side on one replica",
    "load": "many raw sessions, outputs checked; latency and memory before, during and after",
    "kill": "a replica SIGKILLed under a generating device",
    "device-server": "the OpenAI-compatible device server against calling the SDK",
    "spread": "sessions per replica and batch sizes with several replicas",
    "overhead": "the replica's CPU per verify message by phase (a featherweight target)",
    "sampling": "exact sampling per temperature, and lookup-only vs model + lookup vs model-only drafts",
    "planner": "k=auto against cloud-only and always speculating, per link, arms rotated prompt by prompt",
    "backends": "the transformers and vLLM backends on the same prompts: cloud-only, speculative, concurrent sessions",
    "eviction": "vLLM backend: sessions whose contexts exceed the engine's KV space, exact and at what cost",
}
SERVER_HELP = "measure an existing deployment at HOST:PORT (default: start a local Ray Serve)"


def with_default_mode(argv: list[str]) -> list[str]:
    """``edgespec bench --target ...`` (no mode) is the report, as it was before modes were subcommands."""
    if argv and argv[0] not in MODES and argv[0] not in ("-h", "--help"):
        print("edgespec bench: give the mode first; running `edgespec bench report`", file=sys.stderr)
        return ["report", *argv]
    return argv


def _pair(parser: argparse.ArgumentParser, *, prompts: bool = True) -> None:
    parser.add_argument("--target", type=Path, default=REPO / "models" / "demo" / "target", help="target model directory")
    parser.add_argument("--draft", type=Path, default=REPO / "models" / "demo" / "draft", help="ONNX draft directory")
    parser.add_argument("--backend", choices=BACKENDS, default=None,
                        help=f"the verifier's engine when the bench starts Serve (default {BACKENDS[0]}; also {BACKEND_ENV})")
    if prompts:
        parser.add_argument("--prompts", type=Path, default=REPO / "prompts" / "tuning.jsonl", help="tuning prompts (JSONL or text; a JSONL record with messages is rendered with the draft's chat template)")
        parser.add_argument("--prompt-limit", type=int, default=8, help="prompts per setting")
    parser.add_argument("--out", type=Path, default=None, help="report folder (default runs/bench-MODE-TIME)")
    parser.add_argument("--seed", type=int, default=0)


def _max_new_tokens(parser: argparse.ArgumentParser, default: int = 96) -> None:
    parser.add_argument("--max-new-tokens", type=int, default=default, help="tokens generated per prompt (default %(default)s)")


def _k(parser: argparse.ArgumentParser, *, fixed: bool = False, default: str = "4") -> None:
    if fixed:
        parser.add_argument("--k", type=parse_fixed_k, default=int(default), help="drafts per raw round (a number)")
    else:
        parser.add_argument("--k", type=parse_k, default=parse_k(default), help="drafts per round: a number or 'auto'")


def _sessions(parser: argparse.ArgumentParser, default: str, help_text: str) -> None:
    parser.add_argument("--sessions", type=parse_counts, default=parse_counts(default), help=f"{help_text} (default {default})")


def _links(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument("--link", dest="links", default=default,
                        help="link profiles to compare, comma-separated (edgespec link --help; default %(default)s)")
    add_deprecated(parser, "--profiles", "--link", "links")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="what", metavar="MODE", required=True)
    modes = {name: sub.add_parser(name, help=help_text, description=help_text) for name, help_text in MODES.items()}

    report = modes["report"]
    _pair(report)
    add_connection(report, server_help=SERVER_HELP, required=False)
    report.add_argument("--held-out", type=Path, default=None, help="held-out prompts, never used for tuning")
    report.add_argument("--draft-hf", type=Path, default=REPO / "models" / "demo" / "draft-hf",
                        help="the draft's Hugging Face weights, for transformers' assisted generation (peers)")
    report.add_argument("--no-peers", action="store_true", help="skip the transformers in-process peers")
    _max_new_tokens(report)
    report.add_argument("--k-values", default="1,2,3,4,5,6,7,8", help="the k swept (default %(default)s)")
    report.add_argument("--baseline-k", type=int, default=4)
    report.add_argument("--link", default=None, help="run every measurement through this link profile")

    capacity = modes["capacity"]
    _pair(capacity)
    add_connection(capacity, server_help=SERVER_HELP, required=False)
    _sessions(capacity, "1,4,16,32", "concurrent session counts")
    _k(capacity)
    _max_new_tokens(capacity)

    links = modes["links"]
    _pair(links)
    add_connection(links, server_help=SERVER_HELP, required=False)
    _links(links, "loopback,lan,wifi,5g,4g,satellite")
    _sessions(links, "1,4,16,32", "concurrent sessions: the largest is used")
    _max_new_tokens(links)
    links.add_argument("--other-ingresses", default="proxy",
                       help="also measure the headline speedup through these ingresses ('' for none)")

    simcheck = modes["simcheck"]
    _pair(simcheck)
    add_connection(simcheck, server_help=SERVER_HELP, required=False)
    _links(simcheck, "loopback,lan,wifi,5g,4g,satellite")
    _sessions(simcheck, "16", "concurrent sessions: the largest is used")
    _k(simcheck, fixed=True)
    _max_new_tokens(simcheck)

    ingress = modes["ingress"]  # starts each ingress itself: no --server
    _pair(ingress)
    ingress.add_argument("--ingresses", default="haproxy,proxy,direct", help="which to compare, in this order")
    _sessions(ingress, "16", "concurrent sessions: the largest is used")
    _k(ingress, fixed=True)
    ingress.add_argument("--rounds", type=int, default=200, help="raw rounds per session")
    _max_new_tokens(ingress)

    load = modes["load"]  # starts its own server, so it can watch the replica's memory: no --server
    _pair(load)
    _sessions(load, "64", "concurrent raw sessions: the largest is used")
    _k(load, fixed=True)
    load.add_argument("--rounds", type=int, default=200, help="raw rounds per session")

    kill = modes["kill"]  # SIGKILLs a replica it started: no --server
    _pair(kill)
    _max_new_tokens(kill, 300)

    device = modes["device-server"]
    _pair(device)
    add_connection(device, server_help=SERVER_HELP, required=False)
    _max_new_tokens(device)

    spread = modes["spread"]
    _pair(spread)
    add_connection(spread, server_help=SERVER_HELP, required=False)
    spread.add_argument("--replicas", type=int, default=2, help="verifier replicas started on this machine")
    _sessions(spread, "16", "concurrent sessions: the largest is used")
    spread.add_argument("--generations", type=int, default=3, help="generations per device")
    _k(spread)
    _max_new_tokens(spread)

    overhead = modes["overhead"]  # its own featherweight target: no pair, no prompts
    _sessions(overhead, "64", "concurrent sessions: the largest is used")
    overhead.add_argument("--rounds", type=int, default=60, help="raw rounds per session")
    _k(overhead, fixed=True)
    overhead.add_argument("--out", type=Path, default=None, help="working folder (default runs/bench-overhead)")

    sampling = modes["sampling"]
    _pair(sampling)
    add_connection(sampling, server_help=SERVER_HELP, required=False)
    sampling.add_argument("--held-out", type=Path, default=None, help="held-out prompts, never used for tuning")
    sampling.add_argument("--temperatures", default="0.3,0.6,0.8,1.0,1.2", help="the temperatures swept")
    sampling.add_argument("--k-values", default="auto", help="k of the temperature sweep's arms (comma list, numbers or auto)")
    add_deprecated(sampling, "--sweep-k", "--k-values", "k_values")
    _k(sampling)
    sampling.add_argument("--lookup-weight", type=float, default=None, help="lookup_weight of the 'after' arms")
    sampling.add_argument("--draft-temperature", default=None, help="draft_temperature of the 'after' arms (a number or auto)")
    _max_new_tokens(sampling)


    backends = modes["backends"]
    _pair(backends)
    _k(backends, default="auto")
    _max_new_tokens(backends, 64)
    _sessions(backends, "16", "concurrent speculative devices")
    backends.add_argument("--backends", default=",".join(BACKENDS), help="which, in this order (default %(default)s)")

    eviction = modes["eviction"]
    _pair(eviction)
    _sessions(eviction, "64", "sessions on the engine")
    eviction.add_argument("--context", type=int, default=1024, help="tokens of each session's context (default %(default)s)")
    eviction.add_argument("--rounds", type=int, default=2, help="rounds of each session, round-robin (default %(default)s)")
    eviction.add_argument("--kv-bytes", type=int, default=256 << 20, help="the small KV space, bytes (default %(default)s)")

    planner = modes["planner"]
    _pair(planner)
    add_connection(planner, server_help=SERVER_HELP, required=False)
    _links(planner, "loopback,lan,wifi,5g,4g,satellite")
    _max_new_tokens(planner, default=128)
    planner.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); > 0: sampled requests, with a k=4 arm")
    planner.add_argument("--load", type=int, default=0, help="busy processes loading the cores for the whole run (default 0)")
    planner.add_argument("--control", action="store_true",
                         help="add an A/A arm (the send-ahead arm again, scored as k=auto is but left out of the faster): this run's noise floor")


def _register_connection(args: argparse.Namespace) -> None:
    """The key and TLS of --server, for every client the mode opens (cloud/bench/connection.py)."""
    if getattr(args, "server", None) is None:
        if getattr(args, "tls", False) or getattr(args, "ca_cert", None) is not None:
            raise ValueError("--tls/--ca-cert are for --server (without it the bench starts its own plaintext verifier)")
        return
    from edgespec.cloud.bench.connection import Connection, register

    register(args.server, Connection(api_key=args.api_key, tls=args.tls or args.ca_cert is not None, ca_cert=args.ca_cert))


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if getattr(args, "backend", None):  # read where the bench starts Serve, in this process or a child
        os.environ[BACKEND_ENV] = args.backend
    if args.what == "overhead":  # its own target: no draft, no prompts
        from edgespec.cloud.bench.overhead import run_overhead

        return run_overhead(sessions=max(args.sessions), rounds=args.rounds, k=args.k, work=args.out or REPO / "runs" / "bench-overhead",
                            progress=lambda message: print(message, flush=True))
    try:
        from edgespec.cloud.bench.harness import load_prompts
        from edgespec.edge.eos import chat_template_of

        _register_connection(args)
        # A chat record (``messages``) is timed as the device server would send it: rendered with
        # the draft's chat template, where it has one (a chat model's users send no plain text).
        template = chat_template_of(args.draft)
        prompts = load_prompts(args.prompts, args.prompt_limit, chat_template=template)
        held_out = load_prompts(args.held_out, args.prompt_limit, chat_template=template) if getattr(args, "held_out", None) else []
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
        return _links_mode(args, prompts, out, progress)
    if args.what == "simcheck":
        return _simcheck(args, prompts, out, progress)
    if args.what in ("load", "kill"):
        return _robustness(args, prompts, out, progress)
    if args.what == "sampling":
        return _sampling(args, prompts, held_out, out, progress)
    if args.what == "spread":
        return _spread(args, prompts, out, progress)
    if args.what == "planner":
        return _planner(args, prompts, out, progress)
    if args.what == "backends":
        return _backends(args, prompts, out, progress)
    if args.what == "eviction":
        return _eviction(args, prompts, out, progress)
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


def _backends(args, prompts, out, progress) -> int:
    from edgespec.cloud.bench.backends import BackendsConfig, run_backends

    names = tuple(name.strip() for name in args.backends.split(",") if name.strip())
    unknown = [name for name in names if name not in BACKENDS]
    if unknown or not names:
        print(f"edgespec bench backends: --backends {args.backends!r}: choose from {', '.join(BACKENDS)}", file=sys.stderr)
        return 2
    config = BackendsConfig(target=args.target, draft=args.draft, prompts=prompts, backends=names, k=args.k,
                            max_new_tokens=args.max_new_tokens, sessions=max(args.sessions))
    report = run_backends(config, out, progress)
    print(f"\nbackends report: {out / 'backends.md'}\n")
    print((out / "backends.md").read_text())
    return 0 if not any(row["concurrent_errors"] for row in report["rows"]) else 1


def _eviction(args, prompts, out, progress) -> int:
    from edgespec.cloud.bench.eviction import EvictionConfig, run_eviction
    from edgespec.edge.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(args.target)
    config = EvictionConfig(target=args.target, prompts=[tokenizer.encode(p).ids for p in prompts], sessions=max(args.sessions),
                            context=args.context, rounds=args.rounds, kv_bytes=args.kv_bytes)
    run_eviction(config, out, progress)
    print(f"\neviction report: {out / 'eviction.md'}\n")
    print((out / "eviction.md").read_text())
    return 0


def _spread(args, prompts, out, progress) -> int:
    from edgespec.cloud.bench.spread import SpreadConfig, run_spread, summary_lines, write_spread

    try:
        config = SpreadConfig(target=args.target, draft=args.draft, prompts=prompts, replicas=args.replicas,
                              sessions=max(args.sessions), generations=args.generations,
                              max_new_tokens=args.max_new_tokens, k=str(args.k), server=args.server)
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

    counts = args.sessions
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
            k=args.k, rounds=args.rounds, sessions=max(args.sessions),
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
            target=args.target, draft=args.draft, prompts=prompts, sessions=max(args.sessions),
            rounds=args.rounds, k=args.k), progress)
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
            target=args.target, draft=args.draft, prompts=prompts, profiles=tuple(args.links.split(",")),
            sessions=max(args.sessions), max_new_tokens=args.max_new_tokens,
            k=args.k, server=args.server, seed=args.seed,
        )
    except ValueError as exc:
        print(f"edgespec bench simcheck: {exc}", file=sys.stderr)
        return 2
    report = run_simcheck(config, out, progress)
    print(f"\nsimulator check in {out}: simcheck.md, simcheck.json, calibration.json; "
          f"{report['within']}/{report['cells']} cells within 10% ({report['wall_s']:.0f} s)")
    return 0


def _links_mode(args, prompts, out, progress) -> int:
    from edgespec.cloud.bench.links import LinksConfig, run_links, summary_lines

    try:
        config = LinksConfig(
            target=args.target, draft=args.draft, prompts=prompts, profiles=tuple(args.links.split(",")),
            sessions=max(args.sessions), max_new_tokens=args.max_new_tokens,
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


def _planner(args, prompts, out, progress) -> int:
    from edgespec.cloud.bench.planner_check import PlannerCheckConfig, row_line, run_planner_check, write_report

    try:
        config = PlannerCheckConfig(
            target=args.target, draft=args.draft, prompts=prompts, profiles=tuple(args.links.split(",")),
            max_new_tokens=args.max_new_tokens, temperature=args.temperature, load=args.load, control=args.control,
            server=args.server, seed=args.seed,
        )
    except ValueError as exc:
        print(f"edgespec bench planner: {exc}", file=sys.stderr)
        return 2
    report = run_planner_check(config, progress)
    write_report(report, out)
    print(f"\nplanner check in {out}: planner.md, planner.json")
    for row in report["profiles"]:
        print(f"  {row_line(row)}")
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
            k_values=tuple(parse_k(k) for k in args.k_values.split(",")),
            drafter_k=args.k, max_new_tokens=args.max_new_tokens,
            seed=args.seed, server=args.server, extra=extra,
        )
    except (ValueError, argparse.ArgumentTypeError) as exc:
        print(f"edgespec bench sampling: {exc}", file=sys.stderr)
        return 2
    report = run_sampling_bench(config, progress)
    paths = write_sampling(report, out)
    print(f"\nsampling report in {out}: " + ", ".join(p.name for p in paths))
    for line in summary_lines(report):
        print(f"  {line}")
    return 0
