"""``edgespec generate``: stream a completion from a server with an ONNX draft on this device."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from edgespec.edge.errors import EdgespecError
from edgespec.edge.params import MODES
from edgespec.edge.stops import StopMatcher


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", required=True, help="HOST:PORT of the edgespec gRPC endpoint")
    parser.add_argument("--draft", required=True, help="draft directory from `edgespec export-draft`")
    parser.add_argument("--prompt", help="prompt text (default: read stdin)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None,
                        help="sampling: replay a run's seed (printed with the stats); default: a fresh one from the OS")
    parser.add_argument("--k", default="auto", help="drafted tokens per round: a number or 'auto'")
    parser.add_argument("--mode", choices=MODES, default=None, help="verification mode (default: greedy at temperature 0, else exact)")
    parser.add_argument("--no-lookup", action="store_true",
                        help="draft with the model alone, no context lookup (see edgespec.edge.lookup)")
    parser.add_argument("--lookup-only", action="store_true", help="draft from context lookup alone, never run the draft model")
    parser.add_argument("--draft-temperature", default="auto",
                        help="sampling: the temperature the draft samples its q at, a number or 'auto' (docs/sampling.md)")
    parser.add_argument("--cloud-only", action="store_true", help="generate with the target alone (Generate RPC)")
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads for the draft")
    parser.add_argument("--execution-provider", action="append", dest="providers", default=None, metavar="NAME",
                        help="ONNX Runtime execution provider for the draft, e.g. CoreMLExecutionProvider; repeat for a "
                             "priority list (default: CPUExecutionProvider); an unavailable one is refused naming the available")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for any one reply")
    parser.add_argument("--api-key", default=None, help="the verifier's API key (default: $EDGESPEC_API_KEY)")
    parser.add_argument("--tls", action="store_true", help="connect with TLS (the system's roots, or --ca-cert)")
    parser.add_argument("--ca-cert", type=Path, default=None, help="PEM file of the CA that signed the server's certificate")
    parser.add_argument("--stop", action="append", default=[], metavar="TEXT",
                        help="end the text before the first occurrence of TEXT (repeat for several); finish reason 'stop'")
    parser.add_argument("--json", action="store_true", help="print one JSON object (text, token_ids, stats) last")


def run(args: argparse.Namespace) -> int:
    from edgespec.edge.client import EdgeClient

    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    params = dict(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
    )
    try:
        with EdgeClient(args.server, args.draft, timeout=args.timeout, draft_threads=args.threads, providers=args.providers, api_key=args.api_key,
                        tls=args.tls or args.ca_cert is not None, ca_cert=args.ca_cert) as client:
            matcher = StopMatcher(args.stop)
            if args.cloud_only:
                result = client.generate_cloud(prompt, **params)
                token_ids, segments = result.token_ids, result.segments
                pieces = [result.text]
            else:
                lookup = "only" if args.lookup_only else not args.no_lookup
                draft_temperature = args.draft_temperature if args.draft_temperature == "auto" else float(args.draft_temperature)
                pieces = client.stream(prompt, k=args.k, mode=args.mode, lookup=lookup, draft_temperature=draft_temperature,
                                       **params)
            with contextlib.nullcontext() if args.cloud_only else contextlib.closing(pieces):
                for piece in pieces:
                    out = matcher.feed(piece)
                    if out and not args.json:
                        sys.stdout.write(out)
                        sys.stdout.flush()
                    if matcher.stopped:
                        break  # closing the stream ends the generation
            tail = matcher.flush()
            if tail and not args.json:
                sys.stdout.write(tail)
            if not args.cloud_only:
                result, token_ids, segments = pieces.result, pieces.token_ids, pieces.segments
    except (EdgespecError, ValueError, FileNotFoundError) as exc:
        print(f"\nedgespec generate: {exc}", file=sys.stderr)
        return 1
    # Cut at a stop string, a stream ends before its result exists: its stats end with it.
    report = result.to_dict() if result is not None else {"token_ids": token_ids, "segments": [list(s) for s in segments]}
    if matcher.stopped:
        report.update(text=matcher.text, finish_reason="stop")
    if args.json:
        print(json.dumps(report))
    else:
        stats = result.stats.summary() if result is not None else f"{len(token_ids)} tokens, cut at a stop string"
        print(f"\n\n[{report['finish_reason']}] {stats}", file=sys.stderr)
    return 0
