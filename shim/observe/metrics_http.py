"""The HTTP endpoint that serves the daemon's metrics (GET /metrics), on the daemon's event loop.

Hand-written on h11 rather than prometheus_client's own server (start_http_server), because of hardening: that
server is a ThreadingHTTPServer with one thread per connection and no read deadline, so a client that opens
connections and sends a byte a minute holds a thread each, without bound, inside the daemon that runs every probe
of the node. This one caps connections (MAX_CONNECTIONS), the request head (MAX_REQUEST_HEAD), the time to read it
and to write the answer, and drains a closing client with a bound (tests/hardening/test_access.py holds it to
that). The exposition itself is prometheus_client's (choose_encoder, gzip), rendered in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

import h11
from prometheus_client.exposition import gzip_accepted

from shim.config import ConfigError

if TYPE_CHECKING:
    from shim.observe.metrics import ShimMetrics

# The endpoint's bounds against a misbehaving client (it may be bound beyond loopback).
MAX_CONNECTIONS = 16
MAX_REQUEST_HEAD = 16 * 1024
REQUEST_TIMEOUT_S = 10.0
WRITE_TIMEOUT_S = 30.0
LINGER_S = 1.0
LINGER_BYTES = 256 * 1024


def parse_listen(listen: str) -> tuple[str, int]:
    """ "127.0.0.1:9555", "[::1]:9555", "localhost:9555" -> (host, port).

    The host is required: an empty host would mean every interface, and the
    endpoint must bind only where the operator said (0.0.0.0 if that is meant).
    """
    host, sep, port = listen.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ConfigError(f"metrics listen address {listen!r}: write an IPv6 address in brackets, e.g. [::1]:9555")
    if not sep or not host:
        raise ConfigError(
            f"metrics listen address {listen!r}: must be host:port, e.g. 127.0.0.1:9555 "
            "(0.0.0.0:9555 for every interface; an empty value turns the endpoint off)"
        )
    if not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"metrics listen address {listen!r}: port must be a number from 0 to 65535")
    return host, int(port)


class MetricsServer:
    """A small asyncio HTTP/1.1 server (h11 framing) on the daemon's event loop.

    One request per connection, every read and write bounded in size and time,
    at most MAX_CONNECTIONS at once. Rendering runs in a thread so a large
    exposition never stalls probing; prometheus_client's metrics are thread-safe.
    """

    def __init__(self, metrics: ShimMetrics) -> None:
        self._metrics = metrics
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task] = set()
        self._closing = False

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._on_connection, host, port, reuse_address=True)

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """(host, port) of each bound socket; the port is the real one when 0 was asked."""
        assert self._server is not None
        return [sock.getsockname()[:2] for sock in self._server.sockets]

    def close(self) -> None:
        self._closing = True
        if self._server is not None:
            self._server.close()
        for task in self._connections:
            task.cancel()

    async def wait_closed(self) -> None:
        if self._server is not None:
            await self._server.wait_closed()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        try:
            if len(self._connections) >= MAX_CONNECTIONS:
                return
            self._connections.add(task)
            await self._serve_one(reader, writer)
        except (ConnectionError, TimeoutError, h11.LocalProtocolError):
            pass  # the client went away or stalled: nothing to answer
        except asyncio.CancelledError:
            # close() cancelled it. Ending normally matters: asyncio (3.11) logs a
            # spurious error for a cancelled client_connected_cb task.
            if not self._closing:
                raise
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await writer.wait_closed()

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_HEAD)
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                request = await _read_request(reader, conn)
        except h11.RemoteProtocolError as exc:
            # 400, or 431 for a head over MAX_REQUEST_HEAD
            status = exc.error_status_hint
            headers, body = [("content-type", "text/plain; charset=utf-8")], f"{status} bad request\n".encode()
        else:
            if request is None:
                return
            status, headers, body = await self._answer(request)
        headers = [*headers, ("content-length", str(len(body))), ("connection", "close")]
        data = conn.send(h11.Response(status_code=status, headers=headers))
        data += conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
        writer.write(data)
        async with asyncio.timeout(WRITE_TIMEOUT_S):
            await writer.drain()
        await _close_gently(reader, writer)

    async def _answer(self, request: h11.Request) -> tuple[int, list[tuple[str, str]], bytes]:
        path = request.target.split(b"?", 1)[0]
        if path != b"/metrics":
            return 404, [("content-type", "text/plain; charset=utf-8")], b"404 page not found\n"
        if request.method != b"GET":
            return 405, [("allow", "GET"), ("content-type", "text/plain; charset=utf-8")], b"405 method not allowed\n"
        request_headers = dict(request.headers)  # h11 lower-cases names
        accept = request_headers.get(b"accept", b"").decode("latin-1")
        compress = gzip_accepted(request_headers.get(b"accept-encoding", b"").decode("latin-1"))
        # ~0.1 s of CPU for 750 probes: off the event loop.
        body, content_type = await asyncio.to_thread(self._metrics.render_for, accept, compress=compress)
        headers = [("content-type", content_type)]
        if compress:
            headers.append(("content-encoding", "gzip"))
        return 200, headers, body


async def _close_gently(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Half-closes, then drains what the client still sends (bounded), like Go's
    closeWriteAndWait: closing with unread input would make the kernel send a
    reset, and the client could lose the response it has not read yet."""
    if not writer.can_write_eof():
        return
    writer.write_eof()
    with contextlib.suppress(ConnectionError, TimeoutError):
        async with asyncio.timeout(LINGER_S):
            budget = LINGER_BYTES
            while budget > 0:
                chunk = await reader.read(min(65536, budget))
                if not chunk:
                    break
                budget -= len(chunk)


async def _read_request(reader: asyncio.StreamReader, conn: h11.Connection) -> h11.Request | None:
    """The request head, or None when the client closed first. The head is
    bounded by h11 (max_incomplete_event_size); a body, if any, is never read."""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await reader.read(8192))
            continue
        if isinstance(event, h11.Request):
            return event
        return None  # ConnectionClosed
