"""How the benchmarks reach a deployment named with ``--server``: its API key and TLS.

``edgespec bench MODE --server HOST:PORT --api-key KEY --tls [--ca-cert FILE]`` registers the
connection once; every client and raw gRPC channel the benchmarks open to that address takes
its key and credentials from here. A bench without ``--server`` starts its own local verifier,
which has neither: addresses never registered connect in plaintext, without a key (the SDK still
reads $EDGESPEC_API_KEY, as it always does).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from edgespec.edge.aclient import channel_credentials


@dataclass(frozen=True)
class Connection:
    api_key: str | None = None
    tls: bool = False
    ca_cert: Path | None = None

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for EdgeClient / AsyncEdgeClient."""
        options: dict[str, Any] = {"tls": self.tls, "ca_cert": self.ca_cert}
        if self.api_key:
            options["api_key"] = self.api_key
        return options

    def metadata(self) -> tuple[tuple[str, str], ...] | None:
        """Call metadata for raw stubs: the key, as the SDK sends it."""
        return (("authorization", f"Bearer {self.api_key}"),) if self.api_key else None

    def aio_channel(self, address: str) -> grpc.aio.Channel:
        credentials = channel_credentials(self.tls, self.ca_cert)
        if credentials is None:
            return grpc.aio.insecure_channel(address)
        return grpc.aio.secure_channel(address, credentials)


_REGISTERED: dict[str, Connection] = {}


def register(address: str, connection: Connection) -> None:
    """Connections to ``address`` use this key and TLS from now on (the CLI calls it once)."""
    _REGISTERED[address] = connection


def connection_to(address: str) -> Connection:
    return _REGISTERED.get(address, Connection())
