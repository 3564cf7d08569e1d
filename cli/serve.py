"""``edgespec serve``: run the verifier on Ray Serve behind its gRPC ingress.

Starts a local Ray instance (or joins the cluster at --address / RAY_ADDRESS), deploys the
verifier, prints where devices connect, and serves until interrupted.

Exposure: without API keys the gRPC listener binds loopback only; binding another interface
needs keys (--api-keys) or --allow-unauthenticated. With --tls-cert/--tls-key an HAProxy
terminates TLS on --host:--tls-port and the plaintext ingress stays on loopback.

The server owns its ingress (cloud/serving/haproxy_owner.py): Serve's HAProxy gets its own
files and stats/metrics ports (free ones unless --haproxy-stats-port/--haproxy-metrics-port;
on loopback unless --expose-haproxy-stats), stops with the server on SIGTERM or Ctrl-C, and
one left by a SIGKILLed server is ended when the next one starts. Two servers on one machine
need only different --grpc-port values.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import signal
import sys
import threading
from pathlib import Path

import ray  # noqa: F401  (fail early, with the CLI's "install the cloud extra" hint)

from edgespec.cli.flags import add_deprecated
from edgespec.cloud.serving.app import DEFAULT_GRPC_PORT, init_ray, serve_config, serve_verifier, stop_serving
from edgespec.cloud.serving.config import DeploymentOptions, VerifierConfig, model_max_context
from edgespec.cloud.serving.haproxy_owner import HAProxyOwner, free_port
from edgespec.cloud.serving.ingress import DEFAULT_INGRESS, INGRESSES, resolve_ingress
from edgespec.edge.settings import load_settings

# CLI flag -> VerifierConfig field, for the knobs worth a flag; --config sets any field.
CONFIG_FLAGS = {
    "max_k": int,
    "max_context": int,
    "max_new_tokens": int,
    "max_sessions": int,
    "max_batch_size": int,
    "batch_wait_timeout_s": float,
    "torch_threads": int,
    "dtype": str,
    "device": str,
    "api_keys_file": str,
    "api_keys_env": str,
    "first_message_timeout_s": float,  # --first-message-timeout-s: a stream's Open must arrive within it
    "allowed_origins": lambda text: tuple(origin.strip() for origin in text.split(",") if origin.strip()),  # web pages on the WebSocket route
    "backend": str,  # --backend transformers|vllm (VerifierConfig.backend)
    "tensor_parallel_size": int,  # vllm: GPUs per replica within a node
    "pipeline_parallel_size": int,  # vllm: pipeline stages, across nodes
}
FLAG_NAMES = {"api_keys_file": "--api-keys", "api_keys_env": "--api-keys-env", "torch_threads": "--threads"}
FLAG_HELP = {"allowed_origins": "web origins (comma-separated, or *) whose pages may use the WebSocket route"}
DEPRECATED_FLAGS = {"--torch-threads": "torch_threads"}  # old spelling -> field
DEFAULT_TLS_PORT = 9443
DEFAULT_WSS_PORT = 8443


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="local Hugging Face causal-LM directory (the target)")
    parser.add_argument("--config", type=Path, help="YAML or JSON file of verifier settings (flags override it)")
    parser.add_argument("--num-replicas", type=int, default=None, help="a fixed number of replicas (default 1)")
    parser.add_argument("--autoscale", metavar="MIN:MAX", default=None,
                        help="let Serve's autoscaling keep MIN..MAX replicas on the sessions' load "
                             "(target_ongoing_requests = min(0.75 * max_sessions, max_batch_size))")
    parser.add_argument("--num-gpus", type=float, default=0.0, help="GPUs per replica (0 = CPU)")
    parser.add_argument("--num-cpus", type=float, default=1.0, help="CPUs reserved per replica")
    parser.add_argument("--grpc-port", type=int, default=DEFAULT_GRPC_PORT)
    parser.add_argument("--http-port", type=int, default=None,
                        help="Serve's HTTP port: the WebSocket session route (ws://HOST:PORT/v1/session) and /v1/info "
                             "(default: a free one outside Ray's port ranges)")
    parser.add_argument("--haproxy-stats-port", type=int, default=None,
                        help="HAProxy's stats page (local Ray, HAProxy ingress; default: a free port)")
    parser.add_argument("--haproxy-metrics-port", type=int, default=None,
                        help="HAProxy's Prometheus metrics (local Ray, HAProxy ingress; default: a free port)")
    parser.add_argument("--expose-haproxy-stats", action="store_true",
                        help="bind HAProxy's stats and metrics ports on all interfaces (default: loopback)")
    parser.add_argument("--ingress", choices=INGRESSES, default=DEFAULT_INGRESS,
                        help="Serve's gRPC ingress for a local Ray (default %(default)s; see cloud/serving/ingress.py)")
    parser.add_argument("--host", default=None,
                        help="interface devices connect on (default: 0.0.0.0 with API keys, else 127.0.0.1)")
    parser.add_argument("--allow-unauthenticated", action="store_true",
                        help="serve a non-loopback --host without API keys (anyone who can reach it may use it)")
    parser.add_argument("--tls-cert", type=Path, help="PEM certificate chain: terminate TLS (HAProxy) on --host:--tls-port")
    parser.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    parser.add_argument("--tls-port", type=int, default=DEFAULT_TLS_PORT)
    parser.add_argument("--wss-port", type=int, default=DEFAULT_WSS_PORT,
                        help="with --tls-cert: where HAProxy terminates TLS for the WebSocket route (wss://HOST:PORT/v1/session)")
    parser.add_argument("--address", default=None, help="Ray cluster address (default: RAY_ADDRESS, else a local instance)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the deployment to run")
    for name, kind in CONFIG_FLAGS.items():
        parser.add_argument(FLAG_NAMES.get(name, "--" + name.replace("_", "-")), dest=name, type=kind, default=None,
                            help=FLAG_HELP.get(name, f"the config key {name}"))
    for old, name in DEPRECATED_FLAGS.items():
        add_deprecated(parser, old, FLAG_NAMES[name], name, convert=CONFIG_FLAGS[name])
    parser.add_argument("--detach", action="store_true", help="return once deployed (the Ray cluster keeps serving)")
    parser.add_argument("--print-config", action="store_true",
                        help="print the `serve deploy` config for these settings (like `serve build`) and exit: "
                             "the verifier's settings under args, replicas/autoscaling/resources under deployments")


def config_from_args(args: argparse.Namespace) -> VerifierConfig:
    values: dict = load_settings(args.config) if args.config else {}
    values["model"] = args.model
    for name in CONFIG_FLAGS:
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    if getattr(args, "allow_unauthenticated", False):
        values["allow_unauthenticated"] = True
    return VerifierConfig.from_dict(values, source=str(args.config or "edgespec serve"))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def exposure(args: argparse.Namespace, config: VerifierConfig) -> tuple[str, str]:
    """(the host devices connect on, the host the plaintext ingress binds); refuses an exposed,
    unauthenticated listener unless asked for explicitly."""
    keyed = bool(config.api_keys_file or config.api_keys_env)
    host = args.host or ("0.0.0.0" if keyed else "127.0.0.1")
    if not is_loopback(host) and not keyed and not args.allow_unauthenticated:
        raise ValueError(
            f"--host {host} without API keys would let anyone who reaches it use the verifier: configure keys "
            "(--api-keys FILE, see `edgespec keys new`) or pass --allow-unauthenticated"
        )
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    return host, ("127.0.0.1" if args.tls_cert else host)


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    try:
        config = config_from_args(args)
        options = DeploymentOptions(num_replicas=args.num_replicas, num_cpus=args.num_cpus, num_gpus=args.num_gpus,
                                    autoscaling_config=_autoscale(args.autoscale))
        host, ingress_host = exposure(args, config)
    except ValueError as exc:
        print(f"edgespec serve: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        import yaml

        text = serve_config(config, options, grpc_port=args.grpc_port, http_port=args.http_port or 8000, host=ingress_host)
        print(yaml.safe_dump(text, sort_keys=False), end="")
        return 0
    if not args.address and config.device in ("cuda", "auto") and args.num_gpus == 0:
        config = dataclasses.replace(config, device="cpu")
    # The transport refuses larger messages before anything parses them (read at Ray's start).
    os.environ.setdefault("RAY_SERVE_GRPC_MAX_MESSAGE_SIZE", str(config.message_cap(model_max_context(config))))
    # From here on SIGTERM and Ctrl-C both end the server through the one path below.
    stop = threading.Event()
    stopping = _install_stop_handlers(stop)
    haproxy = None
    if not (args.address or os.environ.get("RAY_ADDRESS")) and resolve_ingress(args.ingress) == "haproxy":
        own_ports = (args.grpc_port, args.http_port, args.tls_port if args.tls_cert else None, args.wss_port if args.tls_cert else None)
        haproxy = HAProxyOwner.claim(stats_port=args.haproxy_stats_port, metrics_port=args.haproxy_metrics_port,
                                     expose_stats=args.expose_haproxy_stats, avoid=own_ports)
    terminator = None
    try:
        init_ray(args.address, ingress=args.ingress, haproxy=haproxy)
        _install_stop_handlers(stop, stopping)  # again: Ray's start put its own (C++, stack-printing) SIGTERM handler in
        http_port = args.http_port if args.http_port is not None else free_port()
        address = serve_verifier(
            config, options, grpc_port=args.grpc_port, http_port=http_port,
            host=ingress_host, timeout_s=args.timeout, progress=lambda message: print(message, flush=True),
        )
        http_address = f"{'127.0.0.1' if ingress_host in ('0.0.0.0', '::') else ingress_host}:{http_port}"
        if args.tls_cert:
            from edgespec.cloud.serving.tls import TlsTerminator

            terminator = TlsTerminator(args.tls_cert, args.tls_key, upstream=address, listen_port=args.tls_port,
                                       listen_host=host, http_upstream=http_address, http_listen_port=args.wss_port).start()
        where = f"TLS on {host}:{args.tls_port} (plaintext ingress {address}, loopback)" if terminator else f"{host}:{args.grpc_port}"
        socket_url = f"wss://{host}:{args.wss_port}/v1/session" if terminator else f"ws://{host}:{http_port}/v1/session"
        auth = "API keys required" if config.api_keys_file or config.api_keys_env else "NO API keys: loopback only" \
            if is_loopback(host) else "NO API keys (--allow-unauthenticated)"
        if haproxy is not None:
            pids = haproxy.record_running()
            print(f"edgespec: HAProxy pid(s) {pids}: stats :{haproxy.stats_port}, metrics :{haproxy.metrics_port} "
                  f"({'all interfaces' if haproxy.expose_stats else 'loopback'}); its files in {haproxy.directory}", flush=True)
        print(f"edgespec: serving {config.model_id} on gRPC {where} and WebSocket {socket_url}; {auth} (Ctrl-C to stop)",
              flush=True)
        if args.detach:
            return 0
        stop.wait()
        return 0
    except _Stopped:
        return 0
    except (TimeoutError, RuntimeError, FileNotFoundError) as exc:
        print(f"edgespec serve: {exc}", file=sys.stderr)
        return 1
    finally:
        if not args.detach:
            stopping.set()
            if terminator is not None:
                terminator.stop()
            stop_serving()
            print("edgespec: stopped", flush=True)


class _Stopped(BaseException):
    """A stop signal arrived (a BaseException, like KeyboardInterrupt, so no ``except Exception``
    on the way swallows it)."""


def _install_stop_handlers(stop: threading.Event, stopping: threading.Event | None = None) -> threading.Event:
    """SIGTERM and SIGINT set ``stop`` and interrupt whatever the main thread waits on (the
    start included). Returns an event that, once set, makes further signals wait for the
    shutdown already under way."""
    stopping = stopping or threading.Event()

    def on_signal(_signum, _frame):
        if stopping.is_set() or stop.is_set():
            return  # already shutting down: a second Ctrl-C must not leave HAProxy behind
        stop.set()
        raise _Stopped

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stopping


def _autoscale(value: str | None) -> dict | None:
    """``MIN:MAX`` -> Serve's autoscaling bounds (ValueError names the form)."""
    if value is None:
        return None
    try:
        low, high = (int(part) for part in value.split(":"))
    except ValueError:
        raise ValueError(f"--autoscale {value!r}: give MIN:MAX replicas, e.g. 1:4") from None
    if not 0 <= low <= high or high < 1:
        raise ValueError(f"--autoscale {value!r}: need 0 <= MIN <= MAX and MAX >= 1")
    return {"min_replicas": low, "max_replicas": high}
