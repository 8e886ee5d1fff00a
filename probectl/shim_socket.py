"""One connection to the shim for unary calls: probectl/unary_h2.py's Connection over a socket (unix or TCP),
opened by its first call, one call at a time, each bounded by its deadline. The client (probectl/client.py) keeps
one while it is alive and opens another when it is not.
"""

from __future__ import annotations

import socket
import sys
import time

from probe_api.defaults import MAX_MESSAGE_BYTES
from probectl import unary_h2

USER_AGENT = f"probectl python/{sys.version_info.major}.{sys.version_info.minor}".encode("ascii")


class ShimSocket:
    """A connection to the shim for unary calls: unary_h2.Connection over a socket, opened by its first call.
    Not usable once the peer closed or went away, or after a call that ended without its answer."""

    def __init__(self, target: str) -> None:
        self._target = target
        self._unix = target.startswith("unix:")
        self._sock: socket.socket | None = None
        self._h2 = unary_h2.Connection(authority=b"localhost" if self._unix else target.encode("idna"),
                                       user_agent=USER_AGENT, max_message=MAX_MESSAGE_BYTES)
        self.usable = True
        self._calls = 0

    def call(self, path: str, request: bytes, timeout_s: float, metadata) -> unary_h2.Answer:
        """The call's answer; OSError if the socket cannot be connected."""
        deadline = time.monotonic() + timeout_s
        if self._sock is None:
            try:
                self._sock = self._connect(timeout_s)
            except TimeoutError:
                self.usable = False
                return unary_h2.Answer(unary_h2.DEADLINE_EXCEEDED, "Deadline Exceeded")
            except OSError:
                self.usable = False
                raise
        h2 = self._h2
        reused, self._calls = self._calls > 0, self._calls + 1
        h2.call(path, request, timeout_s=timeout_s, metadata=metadata)
        written = False
        try:
            while h2.answer is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                self._sock.settimeout(remaining)  # for the writes too: alive() left the socket non-blocking
                self._sock.sendall(h2.data_to_send())
                written = True
                data = self._sock.recv(1 << 16)
                if not data:
                    self.usable = False
                    return h2.ended("Socket closed")
                h2.receive(data)
            self._sock.sendall(h2.data_to_send())  # acknowledgements
        except TimeoutError:
            h2.cancel()
            try:
                self._sock.sendall(h2.data_to_send())
            except OSError:
                self.usable = False
        except OSError as exc:
            self.usable = False
            # A reused connection the shim closed just before the call was written: it never saw the call.
            return h2.ended(f"Socket closed: {exc.strerror or exc}", unprocessed=reused and not written)
        if h2.closed:
            self.usable = False
        return h2.answer

    def alive(self) -> bool:
        """Whether this idle connection can take another call, once what the peer sent meanwhile is read."""
        if self._sock is None or not self.usable:
            return False
        try:
            self._sock.setblocking(False)  # a socket with a timeout would wait for it, whatever the flags say
            while data := self._sock.recv(1 << 16):
                self._h2.receive(data)
            return False  # the peer closed it
        except BlockingIOError:
            return self.usable and not self._h2.closed
        except OSError:
            return False

    def _connect(self, timeout_s: float) -> socket.socket:
        if self._unix:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(timeout_s)
                sock.connect(self._target[len("unix:"):])
            except BaseException:
                sock.close()
                raise
            return sock
        host, _, port = self._target.rpartition(":")
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def close(self) -> None:
        self.usable = False
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)  # wakes a call blocked on it in another thread
            except OSError:
                pass
            self._sock.close()
