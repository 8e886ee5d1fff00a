"""A server on the node's own 127.0.0.1 that records every connection it gets: what a probe made from the node's
network namespace would reach. The tests of hostNetwork sandboxes aim every probe at it; it must never be reached
(tests/conftest.py holds one for the whole suite and checks, when the suite ends, that nothing connected)."""

from __future__ import annotations

import socket
import threading


class NodeLoopbackSentinel:
    def __init__(self) -> None:
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self.connections: list[tuple[str, int]] = []
        self._thread = threading.Thread(target=self._serve, name="node-loopback-sentinel", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, peer = self._listener.accept()
            except OSError:  # closed
                return
            self.connections.append(peer)
            with conn:  # answer as a web server would, so that a probe that got here would read a success
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nConnection: close\r\n\r\nnode secret\n")

    def close(self) -> None:
        self._listener.close()
        self._thread.join(timeout=5)
