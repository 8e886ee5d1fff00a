"""A bounded HTTP/1.1 server on asyncio streams, framed by h11 (sans-IO): what the daemon's /metrics endpoint
(shim/observe/metrics_http.py) and the admission webhook (shim/webhook/server.py) both serve with. Each brings its
own Bounds and its own handler (Prometheus text; AdmissionReviews over TLS); this owns the connection: reading a
request within its bounds, answering the errors, keeping it alive or closing it, and stopping.

Every resource a client can make it hold is bounded (Go's net/http server is the reference for each):
- connections: at most `max_connections` at once; one more is closed at once, unanswered (Go's LimitListener);
- the request head: at most `max_head_bytes`, else 431 and close (Go's MaxHeaderBytes): h11's
  max_incomplete_event_size, and a head is read no further than a byte past the bound (see _read_size);
- the body: at most `max_body_bytes`; a larger Content-Length is answered 413 from the head alone, before a byte
  of the body is read, and a chunked body is cut with 413 once past it (Go's MaxBytesReader). With
  `max_body_bytes=None` the body is never read: the request is answered from its head and the connection closed;
- time: a request's first byte within `idle_timeout_s` (kept-alive connections; Go's IdleTimeout), then the whole
  request within `request_timeout_s` of it (like Go's ReadTimeout); with `idle_timeout_s=None` the request timeout runs
  from the connection's start (Go's ReadHeaderTimeout for a one-request connection). A request not read in time
  gets `timeout_status` (408), or is cut unanswered when that is None (as Go's server does). Writing an answer
  must finish within `write_timeout_s` (Go's WriteTimeout): a client that never reads is cut and its unsent bytes
  dropped (a transport closed gently would hold them, and the socket, until the client reads);
- closing: a plain TCP connection is half-closed and what the client still sends is drained for at most `linger_s`
  and `linger_bytes` (Go's closeWriteAndWait: closing with unread input sends a reset that can destroy the answer
  before the client reads it); a TLS connection closes with TLS's own close_notify;
- stopping: close() stops listening and closes idle (and closing) connections at once; requests in flight get
  `stop_grace_s` to finish (and are answered with `connection: close`), then are cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import h11

log = logging.getLogger(__name__)

# Why a connection was refused or cut, as the servers' metrics label it: fixed words, never the client's bytes.
TOO_MANY_CONNECTIONS = "too many connections"
BAD_REQUEST = "bad request"            # 400, or 431 for a head over max_head_bytes
BODY_TOO_LARGE = "body too large"
REQUEST_TIMEOUT = "request timeout"
WRITE_TIMEOUT = "write timeout"

CLOSE_WAIT_S = 1.0  # how long stopping waits for the listener to close


@dataclass(frozen=True)
class Bounds:
    """What one server lets a client hold (the module's docstring says what each is)."""
    max_connections: int
    max_head_bytes: int
    max_body_bytes: int | None
    request_timeout_s: float
    write_timeout_s: float
    idle_timeout_s: float | None = None
    keep_alive: bool = False
    timeout_status: int | None = None
    linger_s: float = 1.0
    linger_bytes: int = 256 * 1024
    stop_grace_s: float = 0.0
    read_chunk: int = 65536


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    headers: dict[bytes, bytes]    # names lower-cased (h11); a repeated header keeps its last value
    body: bytes = b""

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]


@dataclass(frozen=True)
class Response:
    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)  # content-length and connection are added
    body: bytes = b""
    close: bool = False


Handler = Callable[[Request], Awaitable[Response]]


class _Refused(Exception):
    """A request answered with an error and the connection closed."""

    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class Http1Server:
    """Serves `handler` under `bounds`. `on_refused(reason)` is told of each refusal or cut (the module's words)."""

    def __init__(self, handler: Handler, bounds: Bounds, *,
                 on_refused: Callable[[str], None] = lambda reason: None) -> None:
        self.bounds = bounds
        self._handler = handler
        self._on_refused = on_refused
        self._server: asyncio.Server | None = None
        self._idle: set[asyncio.Task] = set()
        self._busy: set[asyncio.Task] = set()
        self._left_busy = asyncio.Event()  # set whenever a connection's request is done (stopping awaits it)
        self._stopping = False

    async def start(self, host: str, port: int, **listen) -> None:
        """Listens; `listen` goes to asyncio.start_server (ssl=, ssl_handshake_timeout=, ...)."""
        self._server = await asyncio.start_server(self._connection, host, port, limit=self.bounds.read_chunk,
                                                  **listen)

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """(host, port) of each bound socket; the port is the real one when 0 was asked."""
        assert self._server is not None
        return [sock.getsockname()[:2] for sock in self._server.sockets]

    @property
    def connections(self) -> int:
        return len(self._idle) + len(self._busy)

    def close(self) -> None:
        """Stops listening and closes idle connections; requests in flight get stop_grace_s (wait_closed)."""
        self._stopping = True
        if self._server is not None:
            self._server.close()
        for task in [*self._idle, *(self._busy if self.bounds.stop_grace_s <= 0 else ())]:
            task.cancel()

    async def wait_closed(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.bounds.stop_grace_s):
                while self._busy:
                    self._left_busy.clear()
                    await self._left_busy.wait()
        tasks = [*self._idle, *self._busy]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(self.bounds.stop_grace_s, CLOSE_WAIT_S)):
                    await self._server.wait_closed()

    # --- one connection ---

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if self.connections >= self.bounds.max_connections or self._stopping:
            if not self._stopping:
                self._on_refused(TOO_MANY_CONNECTIONS)
            writer.close()
            return
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.bounds.max_head_bytes)
        self._idle.add(task)
        answered = False  # the last thing done was answering: the close lingers for the answer's sake
        try:
            while not self._stopping:
                answered = False
                if self.bounds.idle_timeout_s is not None:
                    async with asyncio.timeout(self.bounds.idle_timeout_s):
                        if not await _first_bytes(conn, reader, self._read_size(conn, True)):
                            return
                self._idle.discard(task)
                self._busy.add(task)
                keep, answered = await self._one_request(conn, reader, writer)
                if not keep:
                    return
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
                self._not_busy(task)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, h11.LocalProtocolError):
            answered = False  # the client went away or stalled: nothing to answer, nothing to linger for
        except asyncio.CancelledError:
            # close() cancelled it. Ending normally matters: asyncio (3.11) logs a spurious error for a cancelled
            # client_connected_cb task.
            answered = False
            if not self._stopping:
                raise
        finally:
            # Still counted while closing (a socket that lingers is one the cap must see), as idle: nothing is in
            # flight, so stopping need not wait for it.
            self._not_busy(task)
            try:
                await _close(reader, writer, self.bounds, linger=answered)
            finally:
                self._idle.discard(task)

    def _not_busy(self, task: asyncio.Task) -> None:
        self._busy.discard(task)
        self._idle.add(task)
        self._left_busy.set()

    async def _one_request(self, conn: h11.Connection, reader: asyncio.StreamReader,
                           writer: asyncio.StreamWriter) -> tuple[bool, bool]:
        """Reads one request within the request timeout and answers it: whether the connection may be kept, and
        whether it was answered."""
        try:
            async with asyncio.timeout(self.bounds.request_timeout_s):
                request = await self._read(conn, reader)
        except TimeoutError:
            self._on_refused(REQUEST_TIMEOUT)
            if self.bounds.timeout_status is None:
                return False, False
            await self._send(conn, writer, _error(self.bounds.timeout_status, "request not received in time"))
            return False, True
        except _Refused as exc:
            self._on_refused(exc.reason)
            await self._send(conn, writer, _error(exc.status, str(exc)))
            return False, True
        if request is None:
            return False, False
        try:
            response = await self._handler(request)
        except Exception:  # noqa: BLE001 - a handler's bug answers 500, it does not hang or drop the client
            log.exception("handler failed", extra={"method": request.method, "path": request.path})
            response = _error(500, "internal error")
        keep = self.bounds.keep_alive and self.bounds.max_body_bytes is not None and not response.close
        await self._send(conn, writer, response if keep else _closing(response))
        return keep, True

    async def _read(self, conn: h11.Connection, reader: asyncio.StreamReader) -> Request | None:
        """One request, its body read within max_body_bytes (or not at all); None when the client closed first."""
        head, body, limit = None, bytearray(), self.bounds.max_body_bytes
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                message = (f"request head larger than {self.bounds.max_head_bytes} bytes"
                           if exc.error_status_hint == 431 else f"bad request: {exc}")
                raise _Refused(exc.error_status_hint, message, BAD_REQUEST) from None
            if event is h11.NEED_DATA:
                data = await reader.read(self._read_size(conn, head is None))
                conn.receive_data(data)
                if not data and conn.their_state is not h11.DONE:
                    return None
            elif isinstance(event, h11.Request):
                head = event
                if limit is None:
                    return _request(head, b"")
                length = dict(event.headers).get(b"content-length")
                if length is not None and length.isdigit() and int(length) > limit:
                    raise _Refused(413, f"request body larger than {limit} bytes", BODY_TOO_LARGE)
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > limit:
                    raise _Refused(413, f"request body larger than {limit} bytes", BODY_TOO_LARGE)
            elif isinstance(event, h11.EndOfMessage):
                return _request(head, bytes(body))
            else:
                return None  # ConnectionClosed

    def _read_size(self, conn: h11.Connection, in_head: bool) -> int:
        """h11 bounds only a head still incomplete: one that arrives whole in a read is parsed whatever its size.
        So a head is read no further than one byte past the bound, and one not complete by then is 431. (Bytes
        pipelined behind a kept-alive request were read with its body: at most one read_chunk.)"""
        if not in_head:
            return self.bounds.read_chunk
        buffered = len(conn.trailing_data[0])
        return max(1, min(self.bounds.read_chunk, self.bounds.max_head_bytes + 1 - buffered))

    async def _send(self, conn: h11.Connection, writer: asyncio.StreamWriter, response: Response) -> None:
        headers = [*response.headers, ("content-length", str(len(response.body)))]
        if response.close or self._stopping:
            headers.append(("connection", "close"))
        try:
            data = conn.send(h11.Response(status_code=response.status, headers=headers))
            data += conn.send(h11.Data(data=response.body)) + conn.send(h11.EndOfMessage())
        except h11.LocalProtocolError:
            return  # the request was too broken to answer in HTTP: the connection just closes
        writer.write(data)
        try:
            async with asyncio.timeout(self.bounds.write_timeout_s):
                await writer.drain()
        except TimeoutError:
            self._on_refused(WRITE_TIMEOUT)
            writer.transport.abort()  # the unsent answer is dropped, not held for a client that never reads
            raise


def _request(head: h11.Request, body: bytes) -> Request:
    return Request(head.method.decode("latin-1"), head.target.decode("latin-1"), dict(head.headers), body)


def _error(status: int, message: str) -> Response:
    return Response(status, [("content-type", "text/plain; charset=utf-8")], f"{message}\n".encode(), close=True)


def _closing(response: Response) -> Response:
    return response if response.close else Response(response.status, response.headers, response.body, close=True)


async def _first_bytes(conn: h11.Connection, reader: asyncio.StreamReader, chunk: int) -> bool:
    """Waits for the next request's first bytes (data already buffered by h11 counts); False at EOF."""
    if conn.trailing_data[0]:
        return True
    data = await reader.read(chunk)
    conn.receive_data(data)
    return bool(data)


async def _close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, bounds: Bounds, *,
                 linger: bool) -> None:
    if writer.transport.is_closing():
        return
    try:
        if linger and writer.can_write_eof():  # plain TCP: half-close, drain what the client still sends, bounded
            with contextlib.suppress(OSError, TimeoutError):
                writer.write_eof()
                async with asyncio.timeout(bounds.linger_s):
                    budget = bounds.linger_bytes
                    while budget > 0:
                        chunk = await reader.read(min(bounds.read_chunk, budget))
                        if not chunk:
                            break
                        budget -= len(chunk)
        writer.close()  # flushes what is left of the answer (TLS: and sends close_notify), within the write timeout
        async with asyncio.timeout(bounds.write_timeout_s):
            await writer.wait_closed()
    except (Exception, asyncio.CancelledError):  # noqa: BLE001 - stalled, failed or stopped: the socket goes now
        # A cancellation (close()) ends the connection as asked; the task returns right after.
        writer.transport.abort()
