"""A loopback TCP forwarder whose live connections a test can reset at will."""

from __future__ import annotations

import socket
import struct
import threading


class TcpCutter:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1"):
        self.upstream = (upstream_host, upstream_port)
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.port = self._listener.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self._connections: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        self.cuts = 0
        threading.Thread(target=self._accept_loop, daemon=True).start()

    def __enter__(self) -> "TcpCutter":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._connections += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut_all(self) -> None:
        """Resets (RST) every live connection; new connections are still accepted."""
        with self._lock:
            connections, self._connections = self._connections, []
        for sock in connections:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()
            except OSError:
                pass
        self.cuts += 1

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.cut_all()
