"""``edgespec generate``: stream a completion from a server with an ONNX draft on this device."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from edgespec.edge.errors import EdgespecError
from edgespec.edge.params import MODES


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
            if args.cloud_only:
                result = client.generate_cloud(prompt, **params)
                if not args.json:
                    sys.stdout.write(result.text)
            else:
                lookup = "only" if args.lookup_only else not args.no_lookup
                draft_temperature = args.draft_temperature if args.draft_temperature == "auto" else float(args.draft_temperature)
                stream = client.stream(prompt, k=args.k, mode=args.mode, lookup=lookup, draft_temperature=draft_temperature,
                                       **params)
                for piece in stream:
                    if not args.json:
                        sys.stdout.write(piece)
                        sys.stdout.flush()
                result = stream.result
    except (EdgespecError, ValueError, FileNotFoundError) as exc:
        print(f"\nedgespec generate: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        print(f"\n\n[{result.finish_reason}] {result.stats.summary()}", file=sys.stderr)
    return 0
