"""The daemon's gRPC server: a grpc.aio.Server for unix sockets, served by one asyncio protocol per connection.

It replaces `grpc.aio.server()` in the daemon because of what a call costs: grpcio serves each call through its
C core, a completion queue polled from a thread of its own and the Cython glue that wakes the event loop, about
0.4 ms of CPU per unary call on a 2-core machine, before the handler runs. A bridged probe is one such call
(the kubelet's ExecSync) and the daemon's whole budget for it is 0.4 ms. Here a call is one read and one write on
the event loop's thread: HTTP/2 in h2_server.py (sans-IO), gRPC's rules in grpc_wire.py, the handler's run in
call.py. Measured: bench/profiles/2026-11-27-grpc-server/README.md.

What a client can make it hold is bounded (limits.py): calls per connection and across connections, connections,
request bytes a connection's calls hold, and budgets that end an abusing connection (h2_server.py). When the socket
does not take what the server writes (the client does not read), the connection stops reading until it does; a
connection that sends no preface in PREFACE_TIMEOUT_S, or has no call for IDLE_TIMEOUT_S, is told GOAWAY and
closed, and a connection that must close is closed within CLOSE_GRACE_S even when the client reads nothing.

Handlers are registered as on grpcio (`add_generic_rpc_handlers`, `add_registered_method_handlers`), so the
generated servicers, grpcio's health and reflection servicers and the CRI proxy run on it unchanged; clients are
any gRPC client (the kubelet's and crictl's grpc-go, probectl's grpcio).
`stop(grace)`: no new connection, GOAWAY to every client (its calls in flight go on), then after `grace` seconds
what still runs is cancelled and the connections closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat

import grpc
import grpc.aio

from probe_api.defaults import MAX_MESSAGE_BYTES
from shim.rpc import grpc_wire
from shim.rpc.call import ServerCall
from shim.rpc.h2_frames import ENHANCE_YOUR_CALM, NO_ERROR
from shim.rpc.h2_server import (
    ConnectionEnded, DataReceived, ServerConnection, StreamEnded, StreamOpened, StreamReset, WindowOpened,
)
from shim.rpc.limits import (
    CLOSE_GRACE_S, CONCURRENT_CALLS, CONNECTION_INBOUND_BYTES, CONNECTION_WRITE_BACKLOG, HEADER_LIST_BYTES,
    IDLE_TIMEOUT_S, PREFACE_TIMEOUT_S, SERVER_CALLS, SERVER_CONNECTIONS, WRITE_BUFFER_HIGH,
)

log = logging.getLogger(__name__)

LISTEN_BACKLOG = 128


class _CallDetails(grpc.HandlerCallDetails):
    __slots__ = ("method", "invocation_metadata")

    def __init__(self, method: str, invocation_metadata) -> None:
        self.method = method
        self.invocation_metadata = invocation_metadata


class GrpcConnection(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self._server = server
        self.loop = asyncio.get_running_loop()
        self.h2 = ServerConnection()
        self.paused = False  # the socket's write buffer is over its high-water mark
        self.blocked_writers: set[ServerCall] = set()  # calls waiting in write() for the socket or a window
        self._transport: asyncio.Transport | None = None
        self._calls: dict[int, ServerCall] = {}
        self._inbound = 0  # request bytes the calls hold (limits.CONNECTION_INBOUND_BYTES)
        self._timer: asyncio.TimerHandle | None = None  # the preface's, then the idle watch, then the close's
        self._idle_since = 0.0  # when the last call ended (the idle watch reads it: no timer is moved per call)
        self._lost = False
        self._rejected = False  # over the connections limit
        self._arrived = 0.0

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)  # type: ignore[attr-defined]
        server = self._server
        if len(server._connections) >= SERVER_CONNECTIONS:
            # Closed once the client's first bytes are read: a unix socket closed with bytes unread resets its
            # peer, which could then miss the GOAWAY that says why.
            self._rejected = True
            self.h2.go_away(ENHANCE_YOUR_CALM, "too many connections")
            self.flush()
            self._timer = self.loop.call_later(CLOSE_GRACE_S, self._close)
            return
        server._connections.add(self)
        if server._stopping:
            self.h2.go_away()
        self._timer = self.loop.call_later(PREFACE_TIMEOUT_S, self._preface_expired)
        self.flush()

    def data_received(self, data: bytes) -> None:
        h2 = self.h2
        if self._rejected:
            self._close()  # over the connections limit: its first bytes are read, it is closed
            return
        was_connected = h2.connected
        self._arrived = self.loop.time()  # when the calls this read opens began: their deadlines count from it
        for event in h2.receive(data):
            kind = type(event)
            if kind is DataReceived:
                call = self._calls.get(event.stream_id)
                if call is not None:
                    call.on_data(event.data, event.ended)
                else:  # a stream refused or answered already: its bytes go back to the windows at once
                    h2.consume(event.stream_id, len(event.data))
            elif kind is StreamOpened:
                self._open(event)
            elif kind is WindowOpened:
                if (call := self._calls.get(event.stream_id)) is not None:
                    call.on_writable()
            elif kind is StreamEnded:
                if (call := self._calls.get(event.stream_id)) is not None:
                    call.on_end()
            elif kind is StreamReset:
                if (call := self._calls.get(event.stream_id)) is not None:
                    call.on_reset()
            elif kind is ConnectionEnded:
                if event.error_code:
                    log.warning("gRPC connection ended: %s (HTTP/2 error %d%s)", event.reason, event.error_code,
                                ", by the client" if event.by_peer else "")
        if h2.connected and not was_connected:
            self._cancel_timer()  # the preface's
            self._idle_since = self._arrived
            self._timer = self.loop.call_later(IDLE_TIMEOUT_S, self._idle_check)
        if self.blocked_writers and not self.write_blocked:  # the client's windows let the queue go down
            for call in list(self.blocked_writers):
                call.on_writable()
        self.flush()
        self._close_if_done()
        self._server._check_drained()  # a WINDOW_UPDATE may have let the last answer out

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._cancel_timer()
        self._server._connections.discard(self)
        for call in list(self._calls.values()):
            call.on_reset()
        self._server._check_drained()

    def pause_writing(self) -> None:
        # The client does not read what it is sent: nothing more of it is read either (its requests, its control
        # frames), until it does. gRPC clients read their socket whatever their calls do, so none waits on this.
        self.paused = True
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        self.paused = False
        self.h2.written()
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()
        for call in list(self.blocked_writers):
            call.on_writable()

    # for the calls
    @property
    def write_blocked(self) -> bool:
        """A streaming handler's write() waits: the client does not read, or the calls queued too much for its
        windows."""
        return self.paused or self.h2.queued_bytes > CONNECTION_WRITE_BACKLOG

    def flush(self) -> None:
        data = self.h2.data_to_send()
        transport = self._transport
        if data and transport is not None and not transport.is_closing():
            transport.write(data)
            if not transport.get_write_buffer_size():  # all in the socket: the client reads what it is sent
                self.h2.written()

    def hold(self, delta: int) -> bool:
        """A call holds `delta` more (or fewer) request bytes; True when the connection's total is over its limit."""
        self._inbound += delta
        return delta > 0 and self._inbound > CONNECTION_INBOUND_BYTES

    def call_ended(self, stream_id: int) -> None:
        if self._calls.pop(stream_id, None) is not None:
            self._server._live_calls -= 1
            if not self._calls:
                self._idle_since = self.loop.time()
        self._close_if_done()
        self._server._check_drained()

    def go_away(self) -> None:
        self.h2.go_away()
        self.flush()
        self._close_if_done()

    def abort(self) -> None:
        for call in list(self._calls.values()):
            call.on_reset()
        self._close()

    # internals
    def _open(self, event: StreamOpened) -> None:
        stream_id = event.stream_id
        if event.header_list_size > HEADER_LIST_BYTES:  # grpc core's answer to metadata over its limit
            self._refuse(stream_id, grpc.StatusCode.RESOURCE_EXHAUSTED,
                         f"received metadata size exceeds limit ({event.header_list_size} vs. {HEADER_LIST_BYTES})")
            return
        if len(self._calls) >= CONCURRENT_CALLS:  # handlers of reset streams still ending: Go's rule
            self.h2.refuse(stream_id)
            return
        if self._server._live_calls >= SERVER_CALLS:
            self._refuse(stream_id, grpc.StatusCode.RESOURCE_EXHAUSTED, "the server has too many calls in flight")
            return
        head = grpc_wire.call_head(event.headers)
        if isinstance(head, grpc_wire.BadRequest):
            self._refuse(stream_id, head.code, head.details, head.http_status)
            return
        handler = self._server._handler(head)
        if handler is None:
            self._refuse(stream_id, grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
            return
        deadline = None if head.timeout_s is None else self._arrived + head.timeout_s
        if deadline is not None and deadline <= self.loop.time():  # 0n, 1n: over before it could run (grpc core)
            self._refuse(stream_id, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
            return
        call = ServerCall(self, stream_id, head, handler, self._server._max_message, deadline)
        self._calls[stream_id] = call
        self._server._live_calls += 1
        if event.ended:
            call.on_end()

    def _refuse(self, stream_id: int, code: grpc.StatusCode, details: str, http_status: bytes = b"200") -> None:
        block = grpc_wire.trailers(code, details, trailers_only=True, http_status=http_status)
        self.h2.send_headers(stream_id, block, end_stream=True)
        self.h2.finish_stream(stream_id)

    def _close_if_done(self) -> None:
        """After a GOAWAY either way the connection ends with its last call, once its answers are out; after a
        broken rule at once, cancelling what still runs."""
        ended = self.h2.closed
        if ended is None or self._transport is None:
            return
        if ended.error_code:
            self.abort()
        elif not self._calls and not self.h2.sending:
            self._close()

    def _close(self) -> None:
        """Closes the socket once what is queued is written, or after CLOSE_GRACE_S if the client does not read."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        self.flush()
        transport.close()
        self._cancel_timer()
        if not self._lost:
            self._timer = self.loop.call_later(CLOSE_GRACE_S, transport.abort)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _preface_expired(self) -> None:
        self._timer = None
        if not self.h2.connected:
            log.warning("gRPC connection closed: no HTTP/2 preface within %.0f s", PREFACE_TIMEOUT_S)
            self.h2.go_away(NO_ERROR, "no preface")
            self._close()

    def _idle_check(self) -> None:
        """The idle watch: GOAWAY once no call has been open for IDLE_TIMEOUT_S, else looked at again when that
        could next be true."""
        self._timer = None
        if self.h2.closed is not None or self._lost:
            return
        idle_for = self.loop.time() - self._idle_since
        if not self._calls and idle_for >= IDLE_TIMEOUT_S:
            self.go_away()
            return
        wait = IDLE_TIMEOUT_S if self._calls else IDLE_TIMEOUT_S - idle_for
        self._timer = self.loop.call_later(wait, self._idle_check)

    @property
    def draining(self) -> bool:
        """Calls still run or answers still wait for the client's windows."""
        return bool(self._calls) or self.h2.sending


class Server(grpc.aio.Server):
    """A grpc.aio.Server on unix sockets only (the daemon's; config refuses anything else)."""

    def __init__(self, *, max_receive_message_length: int = MAX_MESSAGE_BYTES) -> None:
        self._max_message = max_receive_message_length
        self._generic: list[grpc.GenericRpcHandler] = []
        self._registered: dict[str, grpc.RpcMethodHandler] = {}
        self._sockets: list[socket.socket] = []
        self._listeners: list[asyncio.AbstractServer] = []
        self._connections: set[GrpcConnection] = set()
        self._live_calls = 0  # calls whose handler runs, across connections (limits.SERVER_CALLS)
        self._stopping = False
        self._drained: asyncio.Event | None = None  # while stopping: set once every connection is drained
        self._terminated: asyncio.Event | None = None

    # --- grpc.aio.Server -------------------------------------------------------------------------------------

    def add_generic_rpc_handlers(self, generic_rpc_handlers) -> None:
        self._generic.extend(generic_rpc_handlers)

    def add_registered_method_handlers(self, service_name: str, method_handlers) -> None:
        for method, handler in method_handlers.items():
            self._registered[f"/{service_name}/{method}"] = handler

    def add_insecure_port(self, address: str) -> int:
        """Binds now (under the caller's umask); connections are accepted from start()."""
        path = _unix_path(address)
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.stat(path).st_mode):  # a stale socket of an earlier run; never another file
                os.unlink(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            sock.listen(LISTEN_BACKLOG)
        except OSError:
            sock.close()
            raise
        self._sockets.append(sock)
        return 1

    def add_secure_port(self, address: str, server_credentials) -> int:
        raise NotImplementedError("the daemon serves unix sockets only, without TLS")

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._terminated = asyncio.Event()
        for sock in self._sockets:
            self._listeners.append(await loop.create_unix_server(lambda: GrpcConnection(self), sock=sock))

    async def stop(self, grace: float | None) -> None:
        self._stopping = True
        for listener in self._listeners:
            listener.close()
        for connection in list(self._connections):
            connection.go_away()
        self._drained = asyncio.Event()
        self._check_drained()
        if grace:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained.wait(), grace)
        for connection in list(self._connections):
            connection.abort()
        for listener in self._listeners:
            await listener.wait_closed()
        if self._terminated is not None:
            self._terminated.set()

    async def wait_for_termination(self, timeout: float | None = None) -> bool:
        if self._terminated is None:
            return True
        try:
            await asyncio.wait_for(self._terminated.wait(), timeout)
        except TimeoutError:
            return False
        return True

    # --- for the connections -------------------------------------------------------------------------------

    def _handler(self, head: grpc_wire.CallHead) -> grpc.RpcMethodHandler | None:
        handler = self._registered.get(head.path)
        if handler is not None:
            return handler
        details = _CallDetails(head.path, head.metadata)
        for generic in self._generic:
            handler = generic.service(details)
            if handler is not None:
                return handler
        return None

    def _check_drained(self) -> None:
        """While stopping: whether no call runs and every answer is out (a slow reader holds its connection)."""
        if self._drained is not None and not any(c.draining for c in self._connections):
            self._drained.set()


def _unix_path(address: str) -> str:
    for prefix in ("unix://", "unix:"):
        if address.startswith(prefix):
            return address[len(prefix):]
    raise ValueError(f"only unix: addresses are served, not {address!r}")
