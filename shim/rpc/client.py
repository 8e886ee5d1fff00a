"""A gRPC client for bytes in, bytes out: how the CRI proxy forwards calls to the runtime without grpcio's client.

Why: the proxy adds a server and a client leg to every CRI call it forwards; grpcio's client leg costs what its
server did (a C core call, a completion queue polled by a thread of its own, the Cython glue waking the event
loop), and the proxy's budget is 0.4 ms per call. Here a call is one write and the reads of its answer on the
event loop's thread (h2_client.py, grpc_wire.py).

`Channel(target)`: one HTTP/2 connection to the runtime at a time (unix:PATH or host:port, as
probe_api.endpoints.upstream_target writes it), opened on the first call and again after it is lost or the runtime
sent GOAWAY; while it cannot be opened, calls fail UNAVAILABLE at once and the next try waits as the kubelet's CRI
client does (100 ms, times 1.6 up to 3 s, each wait +-20%). `unary()` and `stream()` carry metadata, a deadline
(grpc-timeout, and a local timer that resets the stream) and cancellation (RST_STREAM), and end in the runtime's
status, details and trailing metadata exactly, or in the status grpc's own clients give for a failure of the
transport.
"""

from __future__ import annotations

import asyncio
import collections
import random
import sys
from collections.abc import AsyncIterator, Callable

import grpc

from probe_api.defaults import MAX_MESSAGE_BYTES
from shim.rpc import grpc_wire
from shim.rpc.client_rules import HTTP_STATUS_CODES, CallError, backoff_s, status_error, timeout_text
from shim.rpc.h2_client import ClientConnection, ResponseHeaders
from shim.rpc.h2_frames import CANCEL, REFUSED_STREAM, STREAM_WINDOW, ConnectionEnded, DataReceived, StreamReset

USER_AGENT = f"cri-probe-shim python/{sys.version_info.major}.{sys.version_info.minor}"
CONNECT_TIMEOUT_S = 5.0
PREFIX = 5  # a message's length prefix on the wire
# What an answer may hold of the runtime's stream window before its part of a message still arriving goes back
# (a message larger than the window must, or it never completes); the usual answer of a few KiB is given back
# whole when its call ends, with no bookkeeping per DATA frame.
CREDIT_STEP = STREAM_WINDOW // 4


class Call:
    """One call's answer as it arrives: initial metadata, messages, then the status."""

    def __init__(self, connection: _Connection, stream_id: int, timeout_s: float | None) -> None:
        self._connection = connection
        self.stream_id = stream_id
        loop = connection.loop
        self._reader = grpc_wire.MessageReader(MAX_MESSAGE_BYTES)
        self._messages: collections.deque[bytes] = collections.deque()
        self._unread = 0  # wire bytes of the messages not yet read
        self._received = 0  # answer bytes arrived
        self._credited = 0  # ... given back to the runtime's windows
        self._headers: asyncio.Future[tuple] = loop.create_future()
        self._status: asyncio.Future[None] = loop.create_future()
        self._waiter: asyncio.Future[None] | None = None
        self._trailing: tuple = ()
        self._error: CallError | None = None
        self._timer = None if timeout_s is None else loop.call_later(timeout_s, self._expire)

    async def initial_metadata(self) -> tuple:
        return await asyncio.shield(self._headers)

    async def read(self) -> bytes | None:
        """The next message; None after the last one of a call that ended OK (else CallError)."""
        while not self._messages:
            if self._status.done():
                self._raise_error()
                return None
            self._waiter = self._connection.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        message = self._messages.popleft()
        self._unread -= len(message) + PREFIX
        self._credit()
        self._connection.flush()
        return message

    async def trailing_metadata(self) -> tuple:
        await asyncio.shield(self._status)
        return self._trailing

    def cancel(self) -> None:
        if not self._status.done():
            self._connection.reset(self.stream_id)
            self._end(CallError(grpc.StatusCode.CANCELLED, "Cancelled on the client side"))

    # --- from the connection ---------------------------------------------------------------------------------

    def on_headers(self, headers: list[tuple[bytes, bytes]], ended: bool) -> None:
        try:
            metadata = grpc_wire.response_metadata(headers)
        except grpc_wire.InvalidMetadata as error:
            self._fail(CallError(grpc.StatusCode.INTERNAL, str(error), self._initial()))
            return
        if not self._headers.done():
            status = next((value for name, value in headers if name == b":status"), b"")
            if status != b"200":  # grpc-go's rule (the kubelet's): the HTTP status wins over a grpc-status
                code = HTTP_STATUS_CODES.get(status, grpc.StatusCode.UNKNOWN)
                self._fail(CallError(code, f"Received http2 header with status: {status.decode('latin-1')}"))
                return
            content_type = next((value for name, value in headers if name == b"content-type"), None)
            if content_type is not None and not content_type.startswith(grpc_wire.GRPC_CONTENT_TYPE):
                self._fail(CallError(grpc.StatusCode.UNKNOWN, f"unexpected content-type {content_type!r}"))
                return
            encoding = next((value for name, value in headers if name == b"grpc-encoding"), b"identity")
            self._reader = grpc_wire.MessageReader(MAX_MESSAGE_BYTES, encoding)
            if not ended:  # else Trailers-Only: no initial metadata, only trailers
                self._headers.set_result(metadata)
                return
            self._headers.set_result(())
        if not ended:
            return
        self._trailing = metadata
        code_text = next((value for name, value in headers if name == b"grpc-status"), None)
        details = grpc_wire.percent_decoded(next((value for name, value in headers if name == b"grpc-message"), b""))
        error = status_error(code_text, details)
        if error is not None:
            self._end(CallError(error.code, error.details, self._initial(), metadata))
        elif self._reader.partial:
            self._end(CallError(grpc.StatusCode.INTERNAL, "the answer ended inside a message"))
        else:
            self._end(None)

    def on_data(self, data: bytes) -> None:
        if self._status.done():
            self._connection.h2.consume(self.stream_id, len(data))
            return
        self._received += len(data)
        try:
            for message in self._reader.feed(data):
                self._messages.append(message)
                self._unread += len(message) + PREFIX
            if self._received - self._credited >= CREDIT_STEP:  # else the call's end or a read() gives it back
                self._credit()
        except grpc_wire.MessageTooLarge as error:
            self._connection.reset(self.stream_id)
            self._end(CallError(grpc.StatusCode.RESOURCE_EXHAUSTED, str(error)))
        except grpc_wire.BadMessage as error:
            self._connection.reset(self.stream_id)
            self._end(CallError(grpc.StatusCode.INTERNAL, str(error)))
        self._wake()

    def on_reset(self, code: int) -> None:
        status = {REFUSED_STREAM: grpc.StatusCode.UNAVAILABLE, CANCEL: grpc.StatusCode.CANCELLED}.get(
            code, grpc.StatusCode.INTERNAL)
        self._end(CallError(status, f"Received RST_STREAM with error code {code}"))

    def on_lost(self, details: str) -> None:
        self._end(CallError(grpc.StatusCode.UNAVAILABLE, details))

    # --- internals -----------------------------------------------------------------------------------------------

    def _initial(self) -> tuple:
        return self._headers.result() if self._headers.done() and not self._headers.cancelled() else ()

    def _expire(self) -> None:
        if not self._status.done():
            self._connection.reset(self.stream_id)
            self._end(CallError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))

    def _fail(self, error: CallError) -> None:
        """Ends the call before the runtime did: the rest of its answer is refused."""
        self._connection.reset(self.stream_id)
        self._end(error)

    def _credit(self) -> None:
        """The runtime's windows get back what the caller read (for the proxy: what it wrote on downstream), and
        the part of a message still arriving while the caller waits for it (nothing else is unread)."""
        unconsumed = self._unread + (self._reader.buffered if self._messages else 0)
        due = self._received - self._credited - unconsumed
        if due > 0:
            self._credited += due
            self._connection.h2.consume(self.stream_id, due)

    def _end(self, error: CallError | None) -> None:
        if self._status.done():
            return
        if self._timer is not None:
            self._timer.cancel()
        # The stream is over: its bytes go back to the connection's window (what is unread is bounded by the
        # stream's window, and read, or dropped, soon).
        self._connection.h2.consume(self.stream_id, self._received - self._credited)
        self._credited = self._received
        self._error = error
        if not self._headers.done():
            self._headers.set_result(())
        self._status.set_result(None)
        self._connection.forget(self.stream_id)
        self._wake()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.h2 = ClientConnection()
        self.calls: dict[int, Call] = {}
        self.usable = True
        self._transport: asyncio.Transport | None = None
        self._stream_freed: asyncio.Future[None] | None = None  # for callers waiting for the server's stream limit

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self.flush()

    def data_received(self, data: bytes) -> None:
        for event in self.h2.receive(data):
            kind = type(event)
            if kind is DataReceived:
                if (call := self.calls.get(event.stream_id)) is not None:
                    call.on_data(event.data)
            elif kind is ResponseHeaders:
                if (call := self.calls.get(event.stream_id)) is not None:
                    call.on_headers(event.headers, event.ended)
            elif kind is StreamReset:
                if (call := self.calls.get(event.stream_id)) is not None:
                    call.on_reset(event.code)
            elif kind is ConnectionEnded:
                self._ended(event)
        self.flush()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.usable = False
        for call in list(self.calls.values()):
            call.on_lost(f"the runtime's connection was lost: {exc or 'closed'}")
        self._wake()

    def open(self, block: bytes, body: bytes, timeout_s: float | None) -> Call:
        stream_id = self.h2.open_stream(block, body)
        call = self.calls[stream_id] = Call(self, stream_id, timeout_s)
        if self.h2.streams_left < 1:
            self.usable = False
        self.flush()
        return call

    def reset(self, stream_id: int) -> None:
        self.h2.reset(stream_id, CANCEL)
        self.flush()

    def forget(self, stream_id: int) -> None:
        self.calls.pop(stream_id, None)
        if not self.usable and not self.calls:
            self.close()
        self._wake()

    async def stream_freed(self) -> None:
        """Returns when a stream has ended or the connection can no longer be used."""
        if self._stream_freed is None:
            self._stream_freed = self.loop.create_future()
        await asyncio.shield(self._stream_freed)  # shared: one waiter's cancellation must not end the others' wait

    def _wake(self) -> None:
        if self._stream_freed is not None:
            self._stream_freed.set_result(None)
            self._stream_freed = None

    def flush(self) -> None:
        data = self.h2.data_to_send()
        if data and self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self.usable = False
        if self._transport is not None:
            self.flush()  # a GOAWAY this side queued goes out first
            self._transport.close()

    def _ended(self, event: ConnectionEnded) -> None:
        self.usable = False
        # Streams the runtime never saw (above its last one) may be tried again; grpc says UNAVAILABLE for them.
        last = event.last_stream_id if event.by_peer else self.h2.last_stream_id
        for stream_id, call in list(self.calls.items()):
            if stream_id > last or event.error_code:
                call.on_lost(f"the runtime ended the connection (GOAWAY {event.error_code}: {event.reason})")
        if not self.calls:
            self.close()
        self._wake()


class Channel:
    def __init__(self, target: str, *, user_agent: str = USER_AGENT,
                 jitter_source: Callable[[], float] = random.random) -> None:
        self._target = target
        self._connection: _Connection | None = None
        self._connecting: asyncio.Task[_Connection] | None = None
        self._failures = 0  # connects failed in a row
        self._retry_at = 0.0
        self._random = jitter_source
        self._last_error = ""
        self._user_agent = user_agent.encode()
        self._heads: dict[str, bytes] = {}

    async def unary(self, path: str, request: bytes, metadata=(), timeout_s: float | None = None,
                    ) -> tuple[tuple, bytes, tuple]:
        """(initial metadata, the response, trailing metadata), or CallError."""
        call = await self._start(path, request, metadata, timeout_s)
        try:
            await asyncio.shield(call._status)
        except asyncio.CancelledError:
            call.cancel()
            raise
        call._raise_error()
        if len(call._messages) != 1:  # a cardinality violation: UNIMPLEMENTED (grpc's doc/statuscodes.md)
            raise CallError(grpc.StatusCode.UNIMPLEMENTED, f"expected one response message, got "
                            f"{len(call._messages)}", call._initial(), call._trailing)
        return call._initial(), call._messages[0], call._trailing

    async def stream(self, path: str, request: bytes, metadata=(), timeout_s: float | None = None) -> Call:
        """A call whose messages are read one by one (server streaming); cancel() it when not read to the end."""
        return await self._start(path, request, metadata, timeout_s)

    def unary_unary(self, path: str, request_serializer: Callable[[object], bytes],
                    response_deserializer: Callable[[bytes], object]) -> UnaryMethod:
        """A typed unary method on this channel, called as grpc.aio's are (`await method(request, timeout=...)`):
        the daemon's own calls to the runtime (sandboxes, containers) share the proxy's connection."""
        return UnaryMethod(self, path, request_serializer, response_deserializer)

    async def close(self) -> None:
        if self._connecting is not None:
            self._connecting.cancel()
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    # --- internals -----------------------------------------------------------------------------------------------

    async def _start(self, path: str, request: bytes, metadata, timeout_s: float | None) -> Call:
        if len(request) > MAX_MESSAGE_BYTES:
            raise CallError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"Sent message larger than max ({len(request)} vs. {MAX_MESSAGE_BYTES})")
        connection = self._connection
        if connection is None or not connection.usable or not connection.h2.may_open:
            connection, timeout_s = await self._wait_for_stream(timeout_s)
        head = self._heads.get(path)
        if head is None:
            head = self._heads[path] = self._request_head(path)
        block = head + grpc_wire.metadata_block(metadata)
        if timeout_s is not None:
            block += grpc_wire.literal(b"grpc-timeout", timeout_text(timeout_s))
        return connection.open(block, grpc_wire.message(request), timeout_s)

    def _request_head(self, path: str) -> bytes:
        if len(self._heads) > 256:  # unknown methods are forwarded too: a bound, not a cache of every name
            self._heads.clear()
        return b"".join(grpc_wire.literal(name, value) for name, value in (
            (b":method", b"POST"), (b":scheme", b"http"), (b":path", path.encode("latin-1")),
            (b":authority", b"localhost"), (b"content-type", grpc_wire.GRPC_CONTENT_TYPE), (b"te", b"trailers"),
            (b"user-agent", self._user_agent)))

    async def _wait_for_stream(self, timeout_s: float | None) -> tuple[_Connection, float | None]:
        """Rarely: a connection to open, or a stream the server's limit lets open; within the deadline. Returns the
        connection, checked last with no await before the caller opens its stream, and the time left."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while True:
            try:
                connection = await asyncio.wait_for(self._ready_connection(), timeout_s)
            except TimeoutError:
                raise CallError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
            if deadline is not None:
                timeout_s = deadline - loop.time()
            if connection.usable and connection.h2.may_open:  # others woken with this caller may have opened first
                return connection, timeout_s

    async def _ready_connection(self) -> _Connection:
        while True:
            connection = self._connection
            if connection is None or not connection.usable:
                connection = await self._connect()
            if connection.h2.may_open:
                return connection
            await connection.stream_freed()

    async def _connect(self) -> _Connection:
        connecting = self._connecting
        if connecting is None:
            loop = asyncio.get_running_loop()
            if loop.time() < self._retry_at:
                raise CallError(grpc.StatusCode.UNAVAILABLE, f"the runtime is unreachable: {self._last_error}")
            connecting = self._connecting = loop.create_task(self._dial())
        # Shielded: a caller cancelled meanwhile leaves the dial to the others (or to the next call).
        connection = await asyncio.shield(connecting)
        if isinstance(connection, CallError):
            raise CallError(connection.code, connection.details)  # one each: a raise adds to its traceback
        if not connection.usable:  # lost, or sent GOAWAY, before this caller resumed: nothing was sent on it
            raise CallError(grpc.StatusCode.UNAVAILABLE, "the runtime's connection closed as it opened")
        return connection

    async def _dial(self) -> _Connection | CallError:
        """The new connection, or the error every caller waiting for it gets (returned: nobody may be waiting)."""
        loop = asyncio.get_running_loop()
        try:
            if self._target.startswith("unix:"):
                connecting = loop.create_unix_connection(_Connection, self._target[len("unix:"):])
            else:
                host, _, port = self._target.rpartition(":")
                connecting = loop.create_connection(_Connection, host.strip("[]"), int(port))
            _, connection = await asyncio.wait_for(connecting, CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError, ValueError) as error:
            self._last_error = f"failed to connect to {self._target}: {error}"
            self._failures += 1
            self._retry_at = loop.time() + backoff_s(self._failures, self._random())
            return CallError(grpc.StatusCode.UNAVAILABLE, self._last_error)
        finally:
            self._connecting = None  # done: the next call that needs a connection dials again
        self._failures = 0
        self._connection = connection
        return connection


class UnaryMethod:
    """One typed unary method (Channel.unary_unary); raises CallError, with grpc's status code and details."""

    def __init__(self, channel: Channel, path: str, serializer: Callable[[object], bytes],
                 deserializer: Callable[[bytes], object]) -> None:
        self._channel, self._path = channel, path
        self._serializer, self._deserializer = serializer, deserializer

    async def __call__(self, request, *, timeout: float | None = None, metadata=()):
        _, response, _ = await self._channel.unary(self._path, self._serializer(request), metadata, timeout)
        try:
            return self._deserializer(response)
        except Exception:  # noqa: BLE001 - grpc's clients' answer to a response they cannot decode
            raise CallError(grpc.StatusCode.INTERNAL, "Exception deserializing response!") from None


async def messages(call: Call) -> AsyncIterator[bytes]:
    while (message := await call.read()) is not None:
        yield message
