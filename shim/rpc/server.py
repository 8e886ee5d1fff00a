"""The daemon's gRPC server: a grpc.aio.Server for unix sockets, served by one asyncio protocol per connection.

It replaces `grpc.aio.server()` in the daemon because of what a call costs: grpcio serves each call through its
C core, a completion queue polled from a thread of its own and the Cython glue that wakes the event loop, about
0.4 ms of CPU per unary call on a 2-core machine, before the handler runs. A bridged probe is one such call
(the kubelet's ExecSync) and the daemon's whole budget for it is 0.4 ms. Here a call is one read and one write on
the event loop's thread: HTTP/2 in h2_connection.py (sans-IO), gRPC's rules in grpc_wire.py, the handler's run in
call.py. Measured: bench/profiles/2026-11-27-grpc-server/README.md.

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
from shim.rpc.h2_connection import (
    ConnectionEnded, DataReceived, ServerConnection, StreamEnded, StreamOpened, StreamReset,
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
        self.paused = False
        self._transport: asyncio.Transport | None = None
        self._calls: dict[int, ServerCall] = {}

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._server._connections.add(self)
        if self._server._stopping:
            self.h2.go_away()
        self.flush()

    def data_received(self, data: bytes) -> None:
        for event in self.h2.receive(data):
            if type(event) is DataReceived:
                call = self._calls.get(event.stream_id)
                if call is not None:
                    call.on_data(event.data, event.ended)
            elif type(event) is StreamOpened:
                self._open(event)
            elif type(event) is StreamEnded:
                if (call := self._calls.get(event.stream_id)) is not None:
                    call.on_end()
            elif type(event) is StreamReset:
                if (call := self._calls.get(event.stream_id)) is not None:
                    call.on_reset()
            elif type(event) is ConnectionEnded:
                if event.error_code:
                    log.warning("gRPC connection ended: %s (HTTP/2 error %d%s)", event.reason, event.error_code,
                                ", by the client" if event.by_peer else "")
        for call in self._calls.values():  # a WINDOW_UPDATE may have made room for a waiting writer
            call.on_writable()
        self.flush()
        self._close_if_done()
        self._server._check_drained()  # a WINDOW_UPDATE may have let the last answer out

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._server._connections.discard(self)
        for call in list(self._calls.values()):
            call.on_reset()
        self._server._check_drained()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        for call in self._calls.values():
            call.on_writable()

    # for the calls
    def flush(self) -> None:
        data = self.h2.data_to_send()
        if data and self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def call_ended(self, stream_id: int) -> None:
        self._calls.pop(stream_id, None)
        self._close_if_done()
        self._server._check_drained()

    def go_away(self) -> None:
        self.h2.go_away()
        self.flush()
        self._close_if_done()

    def abort(self) -> None:
        for call in list(self._calls.values()):
            call.on_reset()
        if self._transport is not None:
            self._transport.close()

    # internals
    def _open(self, event: StreamOpened) -> None:
        head = grpc_wire.call_head(event.headers)
        if isinstance(head, grpc_wire.BadRequest):
            self._refuse(event.stream_id, head.code, head.details, head.http_status)
            return
        handler = self._server._handler(head)
        if handler is None:
            self._refuse(event.stream_id, grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
            return
        call = ServerCall(self, event.stream_id, head, handler, self._server._max_message)
        self._calls[event.stream_id] = call
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
            self.flush()
            self.abort()
        elif not self._calls and not self.h2.sending:
            self.flush()
            self._transport.close()

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
