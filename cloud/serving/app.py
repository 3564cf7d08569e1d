"""Building and starting the Serve application.

Two ways in, one application:

- ``edgespec serve`` (or ``serve_verifier`` from Python) starts Ray and Serve with a gRPC
  ingress (``ingress.py``: HAProxy by default) and deploys the verifier, waiting (with a
  deadline) until the endpoint answers;
- ``serve deploy cluster/serve.yaml`` imports ``edgespec.cloud.serving.app:build`` with the YAML's
  ``args`` (the VerifierConfig fields plus the deployment options).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, fields
from typing import Any, Callable

from edgespec.cloud.serving.config import DeploymentOptions, VerifierConfig, max_ongoing_requests
from edgespec.cloud.serving.haproxy_owner import HAProxyOwner, end_processes
from edgespec.cloud.serving.ingress import configure_ingress, direct_endpoints, ingress_from_environment, resolve_ingress
from edgespec.cloud.serving.servicers import SERVICER_FUNCTIONS

log = logging.getLogger(__name__)

APP_NAME = "edgespec"
DEFAULT_GRPC_PORT = 9000
# What the gRPC ingress registers (see servicers.py); the deployment implements their methods.
GRPC_SERVICER_FUNCTIONS = SERVICER_FUNCTIONS
# The HAProxy of the local Ray instance init_ray started (None: no local instance, or another ingress).
_haproxy: HAProxyOwner | None = None
_joined_cluster = False  # init_ray joined a running cluster rather than starting Ray here


def build_app(config: VerifierConfig, options: DeploymentOptions | None = None):
    """The Serve application: one Verifier deployment configured from ``config``."""
    from edgespec.cloud.serving.deployment import ingress_deployment

    options = options or DeploymentOptions()
    actor_options = replica_actor_options(config, options)
    actor_options["runtime_env"] = replica_runtime_env(actor_options.get("runtime_env"))
    autoscaling = options.autoscaling(config)
    placement: dict[str, Any] = {"autoscaling_config": autoscaling} if autoscaling else {"num_replicas": options.num_replicas or 1}
    return ingress_deployment().options(
        **placement,
        **gpu_placement(config, options),
        max_ongoing_requests=max_ongoing_requests(config, options),
        # Requests beyond max_ongoing_requests wait, a bounded few; the rest are refused at once.
        max_queued_requests=options.max_queued_requests,
        # A stopped replica's sessions move at their next round (drain.py); this bounds the wait.
        graceful_shutdown_timeout_s=options.graceful_shutdown_timeout_s,
        graceful_shutdown_wait_loop_s=options.graceful_shutdown_wait_loop_s,
        ray_actor_options=actor_options,
    ).bind(config.to_dict())


# Serve runs a replica's user code on a second event loop in its own thread by default, so each
# message hops between the gRPC server's loop and that one (twice per round, under the GIL). The
# verifier never blocks its loop (forwards run on the model thread), so one loop is enough:
# ``bench overhead`` measured the hops at most of the replica's CPU per message.
REPLICA_ENV = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0"}


def replica_runtime_env(runtime_env: dict[str, Any] | None) -> dict[str, Any]:
    """``runtime_env`` with REPLICA_ENV under its env_vars (values already there win)."""
    runtime_env = dict(runtime_env or {})
    runtime_env["env_vars"] = {**REPLICA_ENV, **runtime_env.get("env_vars", {})}
    return runtime_env


def build(args: dict[str, Any]):
    """Application builder for ``serve deploy``/``serve run``: ``edgespec.cloud.serving.app:build``."""
    args = dict(args)
    option_names = {f.name for f in fields(DeploymentOptions)}
    options = DeploymentOptions(**{k: args.pop(k) for k in list(args) if k in option_names})
    return build_app(VerifierConfig.from_dict(args), options)


def gpu_placement(config: VerifierConfig, options: DeploymentOptions) -> dict[str, Any]:
    """A replica whose target spans several GPUs (vLLM, tensor x pipeline parallel) reserves one
    placement-group bundle per GPU, as ``ray.serve.llm`` does: the replica's own CPUs share the
    first, and vLLM's Ray executor places one worker in each. Tensor parallelism stays inside a
    node (STRICT_PACK); pipeline stages may span nodes (PACK). Empty for a one-GPU target."""
    gpus = config.gpus_per_replica
    if gpus <= 1 or config.device == "cpu":  # a CPU engine's workers are processes of the replica's node
        return {}
    return {
        "placement_group_bundles": [{"CPU": options.num_cpus, "GPU": 1.0}] + [{"GPU": 1.0} for _ in range(gpus - 1)],
        "placement_group_strategy": "STRICT_PACK" if config.pipeline_parallel_size == 1 else "PACK",
    }


def replica_actor_options(config: VerifierConfig, options: DeploymentOptions) -> dict[str, Any]:
    """The replica actor's resources: its own GPU, or none where its workers hold the bundles' GPUs."""
    gpus = 0.0 if config.gpus_per_replica > 1 else options.num_gpus
    return {"num_cpus": options.num_cpus, "num_gpus": gpus, **options.ray_actor_options}


def deployment_override(config: VerifierConfig, options: DeploymentOptions) -> dict[str, Any]:
    """The verifier's entry under a Serve config's ``deployments:``: the replica count or
    autoscaling, resources and the drain bound. Serve applies a change to ``num_replicas`` or
    ``autoscaling_config`` here in place (replicas added or removed, the others untouched);
    a change under the application's ``args`` is a new version that replaces every replica."""
    from edgespec.cloud.serving.deployment import DEPLOYMENT_NAME

    autoscaling = options.autoscaling(config)
    placement: dict[str, Any] = {"autoscaling_config": autoscaling} if autoscaling else {"num_replicas": options.num_replicas or 1}
    return {
        "name": DEPLOYMENT_NAME,
        **placement,
        **gpu_placement(config, options),
        "max_ongoing_requests": max_ongoing_requests(config, options),
        "max_queued_requests": options.max_queued_requests,
        "graceful_shutdown_timeout_s": options.graceful_shutdown_timeout_s,
        "ray_actor_options": replica_actor_options(config, options),
    }


def serve_config(config: VerifierConfig, options: DeploymentOptions, *, grpc_port: int = DEFAULT_GRPC_PORT,
                 http_port: int = 8000, host: str = "127.0.0.1") -> dict[str, Any]:
    """The ``serve deploy`` config (what ``serve build`` writes) for what ``serve_verifier``
    starts: the verifier's settings as the application's ``args``, placement under
    ``deployments:`` (see ``deployment_override``)."""
    defaults = VerifierConfig(model=config.model).to_dict()
    args = {name: value for name, value in config.to_dict().items() if name == "model" or value != defaults.get(name)}
    return {
        "proxy_location": "HeadOnly",
        "http_options": {"host": host, "port": http_port},
        "grpc_options": {k: v for k, v in grpc_options(grpc_port).items() if v is not None},
        "applications": [{
            "name": APP_NAME,
            "route_prefix": "/",
            "import_path": "edgespec.cloud.serving.app:build",
            "args": args,
            "deployments": [deployment_override(config, options)],
        }],
    }


def grpc_options(port: int = DEFAULT_GRPC_PORT, request_timeout_s: float | None = None) -> dict[str, Any]:
    # Serve's own reflection is off: the deployment answers reflection itself, behind the API key.
    return {"port": port, "grpc_servicer_functions": GRPC_SERVICER_FUNCTIONS, "request_timeout_s": request_timeout_s,
            "enable_reflection": False}


def init_ray(
    address: str | None = None,
    num_cpus: int | None = None,
    metrics_export_port: int | None = None,
    log_to_driver: bool = True,
    ingress: str | None = None,
    haproxy: HAProxyOwner | None = None,
) -> None:
    """Connects to ``address`` (or RAY_ADDRESS), else starts a fresh local Ray instance.

    ``metrics_export_port``: where a local instance serves Prometheus metrics (``/metrics``).
    ``log_to_driver``: False keeps replica logs in Ray's log folder, off this terminal.
    ``ingress``: for a local instance, the Serve gRPC ingress its processes start with (None:
    the flags already in the environment, else the default); a running cluster keeps the
    flags it was started with.
    ``haproxy``: for a local instance with the HAProxy ingress, the owner of its ports and
    files (default: claimed here, ports chosen free, stats on loopback); ``stop_serving``
    ends it with Ray.
    """
    global _haproxy, _joined_cluster
    address = address or os.environ.get("RAY_ADDRESS")
    import ray

    if ray.is_initialized():
        return
    if not address:
        chosen = resolve_ingress(ingress)
        configure_ingress(chosen)
        if chosen == "haproxy":
            # Read at import by every Ray process: set before Ray starts.
            _haproxy = haproxy or HAProxyOwner.claim()
            os.environ.update(_haproxy.environment())
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray waits 30 s for a local head's GCS to bind its port; on a busy machine (2 cores, Ray
    # processes of the instance before still exiting) that start once took longer, and the
    # serve failed. Waiting longer costs nothing when the GCS is quick.
    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", "120")
    _joined_cluster = bool(address)
    if address:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=log_to_driver)
    else:
        # "local" never attaches to a stale cluster left on this machine.
        _start_local_ray(
            num_cpus=num_cpus,
            include_dashboard=False,
            logging_level=logging.WARNING,
            log_to_driver=log_to_driver,
            _metrics_export_port=metrics_export_port,
        )


# Ray's local head waits a fixed 30 s for its raylet to register with the GCS. On a loaded
# 2-core machine it once did not (the raylet had written no log at all), and the serve failed:
# the start is tried once more, after the failed one's processes are stopped. Once the GCS
# itself never wrote its port (no log either: its process, forked while other threads were in
# gRPC, never reached exec), which the same second try gets past.
LOCAL_START_ATTEMPTS = 2
RETRIED_STARTS = ("timed out during startup", "Timed out waiting for file")


def _start_local_ray(**init_args) -> None:
    import ray

    for attempt in range(1, LOCAL_START_ATTEMPTS + 1):
        begun = time.time()
        try:
            ray.init(address="local", **init_args)
            return
        except Exception as exc:  # Ray raises a bare Exception for this
            if not any(words in str(exc) for words in RETRIED_STARTS) or attempt == LOCAL_START_ATTEMPTS:
                raise
            log.warning("Ray's local node did not start (%s); stopping what it started and trying again", exc)
            _stop_failed_local_session(begun)


def _stop_failed_local_session(begun: float) -> None:
    """Kills the processes of the session this process began at or after ``begun``: a head
    that fails in ``ray.init`` leaves its GCS, monitors and dashboard running (none of them
    know the driver gave up). They carry the session's name (``session_<time>_<pid>``) in
    their command lines; a child forked for one that never reached exec is a copy of this
    process (its command line)."""
    import glob

    import psutil
    from ray._common.utils import get_default_ray_temp_dir  # RAY_TMPDIR, TMPDIR or /tmp, as Ray chooses

    pattern = os.path.join(get_default_ray_temp_dir(), f"session_*_{os.getpid()}")
    names = {os.path.basename(path) for path in glob.glob(pattern) if os.path.getmtime(path) >= begun - 1}
    doomed = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        command = " ".join(process.info["cmdline"] or ())
        if process.pid != os.getpid() and any(name in command for name in names):
            doomed.append(process)
    me = psutil.Process()
    mine = me.cmdline()
    for child in me.children():
        try:
            if child.cmdline() == mine and child.create_time() >= begun - 1:
                doomed.append(child)
        except psutil.Error:
            continue
    end_processes(doomed)


def serve_verifier(
    config: VerifierConfig,
    options: DeploymentOptions | None = None,
    *,
    grpc_port: int = DEFAULT_GRPC_PORT,
    http_port: int | None = None,
    host: str = "127.0.0.1",
    timeout_s: float = 300.0,
    progress: Callable[[str], None] | None = None,
) -> str:
    """Starts Serve with its gRPC ingress and deploys the verifier; returns the address clients
    connect to (HOST:PORT) once the endpoint answers health checks.

    ``host``: the interface the gRPC listener binds (with the HAProxy ingress it comes from
    Serve's ``http_options``). Raises TimeoutError after ``timeout_s`` (a deployment whose
    resources cannot be met would otherwise wait forever) and RuntimeError when it fails.
    """
    from ray import serve

    progress = progress or (lambda message: log.info(message))
    deadline = time.monotonic() + timeout_s
    http_options = {"host": host, "port": http_port if http_port is not None else 8000}
    serve.start(http_options=http_options, grpc_options=grpc_options(grpc_port))
    app = build_app(config, options)
    progress(f"deploying {config.model_id} ({options.replicas if options else 1} replica(s))")
    # A route prefix makes the app an endpoint, which the gRPC ingress needs to route to it.
    serve._run(app, name=APP_NAME, route_prefix="/", _blocking=False)
    wait_until_running(APP_NAME, timeout_s=timeout_s, progress=progress)
    if ingress_from_environment() == "direct":
        address = direct_endpoints(APP_NAME)[0]
    else:
        address = f"{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{grpc_port}"
    wait_until_serving(address, timeout_s=max(deadline - time.monotonic(), 5.0))
    return address


def stop_serving() -> None:
    """Ends what ``init_ray``/``serve_verifier`` started, quickly and quietly.

    A local instance: Ray is shut down (its replicas with it; there is nowhere for their
    sessions to move) and then its HAProxy, which Ray's shutdown leaves running. A cluster
    (``--address``): only this application is deleted; the cluster keeps its Serve.
    """
    global _haproxy
    import ray

    if ray.is_initialized():
        if _joined_cluster:
            from ray import serve

            serve.delete(APP_NAME, _blocking=False)
        ray.shutdown()
    if _haproxy is not None:
        _haproxy.stop()
        _haproxy = None


def wait_until_serving(address: str, *, timeout_s: float) -> None:
    """Waits until the gRPC health check at ``address`` answers SERVING (the ingress may lag
    the application's RUNNING state by a moment while HAProxy picks up the replica)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout_s
    last_error = "no answer"
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                request = health_pb2.HealthCheckRequest(service="edgespec.v1.Speculative")
                reply = stub.Check(request, timeout=5)  # pyright: ignore[reportAttributeAccessIssue] (the stub class is untyped)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last_error = f"status {reply.status}"
            except grpc.RpcError as exc:
                last_error = f"{exc.code().name}: {exc.details()}"
            time.sleep(0.25)
    raise TimeoutError(f"the verifier at {address} did not answer health checks within {timeout_s:g}s ({last_error})")


def wait_until_running(app_name: str, *, timeout_s: float, progress: Callable[[str], None]) -> None:
    from ray import serve

    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        status = serve.status().applications.get(app_name)
        state = str(status.status) if status else "NOT_STARTED"
        if state.endswith("RUNNING"):
            return
        if state.endswith("DEPLOY_FAILED") or state.endswith("UNHEALTHY"):
            raise RuntimeError(f"application {app_name} {state}: {status.message if status else ''}")
        if state != last:
            progress(f"application {app_name}: {state}")
            last = state
        if time.monotonic() > deadline:
            detail = status.message if status else ""
            raise TimeoutError(
                f"application {app_name} not running after {timeout_s:g}s (state {state}). {detail} "
                "Check that the cluster has the CPUs/GPUs the deployment asks for (num_cpus, num_gpus)."
            )
        time.sleep(0.5)


def describe(config: VerifierConfig, options: DeploymentOptions) -> dict[str, Any]:
    return {"verifier": config.to_dict(), "deployment": asdict(options)}
