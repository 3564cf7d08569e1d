"""``edgespec device-server``: an OpenAI-compatible HTTP server on the device (``edgespec.edge.openai_server``).

    edgespec device-server --server HOST:PORT --draft DIR [--host 127.0.0.1] [--port 8080] [--api-key KEY] [--tls]
        [--max-concurrent 4] [--max-queue 16] [--queue-timeout 30] [--cors-origin ORIGIN ...]

Then any OpenAI client works against http://127.0.0.1:8080/v1 (``/v1/models``,
``/v1/completions``, ``/v1/chat/completions``, streaming included; ``/health``); one access-log
line per request on stderr. What is supported and refused: docs/device-server.md.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", required=True, help="HOST:PORT of the edgespec verifier")
    parser.add_argument("--draft", required=True, type=Path, help="draft directory from `edgespec export-draft`")
    parser.add_argument("--host", default="127.0.0.1", help="interface the HTTP server listens on (default: this device only)")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--model-name", default=None, help="the model id /v1/models answers (default: the verifier's)")
    parser.add_argument("--api-key", default=None, help="the verifier's API key (default: $EDGESPEC_API_KEY)")
    parser.add_argument("--tls", action="store_true", help="connect to the verifier with TLS")
    parser.add_argument("--ca-cert", type=Path, default=None, help="PEM CA of the verifier's certificate")
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads for the draft")
    parser.add_argument("--execution-provider", action="append", dest="providers", default=None, metavar="NAME",
                        help="ONNX Runtime execution provider for the draft, e.g. CoreMLExecutionProvider; repeat for a "
                             "priority list (default: CPUExecutionProvider); an unavailable one is refused naming the available")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for any one reply from the verifier")
    parser.add_argument("--max-concurrent", type=int, default=4,
                        help="generations at once, each on its own draft cache (default: 4)")
    parser.add_argument("--max-queue", type=int, default=16,
                        help="requests that may wait for a generation slot; more are answered 429 (default: 16)")
    parser.add_argument("--queue-timeout", type=float, default=30.0,
                        help="seconds a request may wait for a slot before a 503 with Retry-After (default: 30)")
    parser.add_argument("--cors-origin", action="append", dest="cors_origins", default=[], metavar="ORIGIN",
                        help="an origin browser or Electron apps may call from, e.g. http://localhost:3000; repeat for "
                             "more; '*' allows any (default: none, CORS off)")


def run(args: argparse.Namespace) -> int:
    from edgespec.edge.client import EdgeClient
    from edgespec.edge.errors import EdgespecError
    from edgespec.edge.openai_server import ACCESS_LOG, DeviceServer, DeviceServerConfig

    client = None
    try:
        config = DeviceServerConfig(max_concurrent=args.max_concurrent, max_queue=args.max_queue,
                                    queue_timeout_s=args.queue_timeout, cors_origins=tuple(args.cors_origins))
        client = EdgeClient(args.server, args.draft, api_key=args.api_key, tls=args.tls or args.ca_cert is not None, ca_cert=args.ca_cert,
                            draft_threads=args.threads, providers=args.providers, timeout=args.timeout)
        server = DeviceServer((args.host, args.port), client, args.draft, model_name=args.model_name, config=config)
    except (EdgespecError, OSError, ValueError) as exc:
        print(f"edgespec device-server: {exc}", file=sys.stderr)
        if client is not None:
            client.close()
        return 1
    handler = logging.StreamHandler(sys.stderr)  # the access log: no prompt or generated text in it
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    ACCESS_LOG.addHandler(handler)
    ACCESS_LOG.setLevel(logging.INFO)
    print(f"edgespec device-server: OpenAI-compatible API on {server.url}/v1 (model {server.model_name!r}), "
          f"verifier {args.server} (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        client.close()
    return 0
