"""One call on the daemon's gRPC server: the grpc.aio ServicerContext its handler gets, and the run of the handler.

Handlers are grpcio's own `RpcMethodHandler`s (the generated `add_*Servicer_to_server`, the health and reflection
servicers, the CRI proxy's generic handler), so they run here unchanged. What a handler sees is what grpc.aio gives
it: invocation metadata, time_remaining, abort (grpc.aio.AbortError), send_initial_metadata,
set_trailing_metadata, set_code/set_details, read/write for streams; its request already decoded by the method's
deserializer. The statuses of the server itself follow grpc core's: a deadline that passes ends the handler
(cancelled) with DEADLINE_EXCEEDED "Deadline Exceeded"; an exception that escapes is UNKNOWN "Unexpected <class>:
<text>"; a request that cannot be decoded is INTERNAL.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from shim.rpc import grpc_wire
from shim.rpc.grpc_wire import BadMessage, CallHead, MessageTooLarge

if TYPE_CHECKING:
    from shim.rpc.server import GrpcConnection

log = logging.getLogger(__name__)

WRITE_BACKLOG = 1 << 20  # bytes a streaming handler may have queued before write() waits for the client
UNREAD_MESSAGES = 2  # in max_message units: what a client may send ahead of its handler's reads before it is refused


class _PeerGone(Exception):
    """The client reset the stream or went away: nothing more can be sent."""


class ServerCall(grpc.aio.ServicerContext):
    def __init__(self, connection: GrpcConnection, stream_id: int, head: CallHead,
                 handler: grpc.RpcMethodHandler, max_message: int) -> None:
        self._connection = connection
        self._stream_id = stream_id
        self._head = head
        self._handler = handler
        self._reader = grpc_wire.MessageReader(max_message, head.encoding)
        self._inbox: deque[bytes] = deque()
        self._unread = 0  # bytes in the inbox
        self._unread_limit = UNREAD_MESSAGES * max_message
        self._remote_done = False
        self._inbox_error: tuple[grpc.StatusCode, str] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._headers_sent = False
        self._trailing: tuple = ()
        self._code: grpc.StatusCode | None = None
        self._details = ""
        self._ended_by: tuple[grpc.StatusCode, str] | None = None  # the server ended the call (deadline, overflow)
        self._gone = False
        self._done = False
        self._done_callbacks: list[Callable[[ServerCall], None]] = []
        loop = connection.loop
        self._deadline = None if head.timeout_s is None else loop.time() + head.timeout_s
        self._timer = None if head.timeout_s is None else loop.call_later(head.timeout_s, self._expire)
        self.task = loop.create_task(self._run())

    # --- from the connection -------------------------------------------------------------------------------------

    def on_data(self, data: bytes, ended: bool) -> None:
        if self._inbox_error is None:
            try:
                for message in self._reader.feed(data):
                    self._inbox.append(message)
                    self._unread += len(message)
                if self._unread > self._unread_limit:  # the window is given back as data arrives: this is the bound
                    self._inbox.clear()
                    self._inbox_error = (grpc.StatusCode.RESOURCE_EXHAUSTED,
                                         "the client sent more than the call reads")
                    self._end_by(*self._inbox_error)
            except MessageTooLarge as error:
                self._inbox_error = (grpc.StatusCode.RESOURCE_EXHAUSTED, str(error))
            except BadMessage as error:
                self._inbox_error = (grpc.StatusCode.INTERNAL, str(error))
        if ended:
            self.on_end()
        else:
            self._wake()

    def on_end(self) -> None:
        self._remote_done = True
        if self._reader.partial and self._inbox_error is None:
            self._inbox_error = (grpc.StatusCode.INTERNAL, "the request ended inside a message")
        self._wake()

    def on_reset(self) -> None:
        """The client reset the stream, or the connection is gone."""
        self._gone = True
        if not self.task.done():
            self.task.cancel()

    def on_writable(self) -> None:
        self._wake()

    # --- grpc.aio.ServicerContext --------------------------------------------------------------------------------

    def invocation_metadata(self):
        return self._head.metadata

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(self._deadline - self._connection.loop.time(), 0.0)

    async def send_initial_metadata(self, initial_metadata) -> None:
        if self._headers_sent:
            raise grpc.aio.UsageError("initial metadata already sent")
        self._send_headers(initial_metadata)  # _Status for metadata grpc core refuses, which ends the call
        self._connection.flush()

    def set_trailing_metadata(self, trailing_metadata) -> None:
        self._trailing = tuple(trailing_metadata or ())

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata=()):
        if code is grpc.StatusCode.OK:
            raise grpc.aio.UsageError("abort with OK")
        self._code, self._details = code, details
        if trailing_metadata:
            self._trailing = tuple(trailing_metadata)
        raise grpc.aio.AbortError()

    async def abort_with_status(self, status) -> None:
        await self.abort(status.code, status.details, status.trailing_metadata)

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def set_details(self, details: str) -> None:
        self._details = details

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def details(self) -> str:
        return self._details

    async def read(self):
        raw = await self._next_message()
        return grpc.aio.EOF if raw is None else self._decode(raw)

    async def write(self, message) -> None:
        connection = self._connection
        while connection.h2.backlog(self._stream_id) > WRITE_BACKLOG or connection.paused:
            await self._wait()
        self._send_message(self._encode(message))
        connection.flush()

    def peer(self) -> str:
        return "unix:"

    def peer_identities(self):
        return None

    def peer_identity_key(self):
        return None

    def auth_context(self):
        return {}

    def set_compression(self, compression) -> None:
        pass  # answers are sent uncompressed

    def disable_next_message_compression(self) -> None:
        pass

    def cancelled(self) -> bool:
        return self._gone or self._ended_by is not None

    def done(self) -> bool:
        return self._done

    def add_done_callback(self, callback: Callable[[ServerCall], None]) -> None:
        self._done_callbacks.append(callback)

    # --- the run -------------------------------------------------------------------------------------------------

    async def _run(self) -> None:
        handler = self._handler
        code, details = grpc.StatusCode.OK, ""
        try:
            if handler.request_streaming:
                request: Any = self._requests()
            else:
                request = self._decode(await self._unary_request())
            if handler.response_streaming:
                behavior = handler.stream_stream if handler.request_streaming else handler.unary_stream
                result = behavior(request, self)
                if hasattr(result, "__aiter__"):
                    async for response in result:
                        await self.write(response)
                else:
                    await result
            else:
                behavior = handler.stream_unary if handler.request_streaming else handler.unary_unary
                response = await behavior(request, self)
                self._send_message(self._encode(response))
            code, details = self._code or grpc.StatusCode.OK, self._details
        except grpc.aio.AbortError:
            code, details = self._code or grpc.StatusCode.UNKNOWN, self._details
        except _Status as status:
            code, details = status.code, status.details
        except (asyncio.CancelledError, _PeerGone):
            if self._ended_by is None or self._gone:
                self._end()
                return
            code, details = self._ended_by
        except Exception as error:  # noqa: BLE001 - a handler's bug becomes a status, as in grpc core
            log.exception("handler of %s failed", self._head.path)
            code, details = grpc.StatusCode.UNKNOWN, f"Unexpected {type(error)}: {error}"
        self._finish(code, details)

    def _finish(self, code: grpc.StatusCode, details: str) -> None:
        h2 = self._connection.h2
        if self._headers_sent:
            h2.send_headers(self._stream_id, grpc_wire.trailers(code, details, self._trailing), end_stream=True)
        else:
            h2.send_headers(self._stream_id, grpc_wire.trailers(code, details, self._trailing, trailers_only=True),
                            end_stream=True)
        h2.finish_stream(self._stream_id)
        self._connection.flush()
        self._end()

    def _end(self) -> None:
        self._done = True
        if self._timer is not None:
            self._timer.cancel()
        self._connection.call_ended(self._stream_id)
        for callback in self._done_callbacks:
            try:
                callback(self)
            except Exception:  # noqa: BLE001
                log.exception("done callback of %s failed", self._head.path)

    def _expire(self) -> None:
        self._end_by(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def _end_by(self, code: grpc.StatusCode, details: str) -> None:
        """The server ends the call: the handler is cancelled and the client gets this status."""
        if self._ended_by is None:
            self._ended_by = (code, details)
        if not self.task.done():
            self.task.cancel()

    # --- messages ------------------------------------------------------------------------------------------------

    async def _unary_request(self) -> bytes:
        while not self._remote_done and self._inbox_error is None:
            await self._wait()
        self._raise_inbox_error()
        if len(self._inbox) != 1:
            raise _Status(grpc.StatusCode.INTERNAL if self._inbox else grpc.StatusCode.UNIMPLEMENTED,
                          f"expected one request message, got {len(self._inbox)}")
        return self._take()

    async def _next_message(self) -> bytes | None:
        while not self._inbox:
            self._raise_inbox_error()
            if self._remote_done:
                return None
            await self._wait()
        return self._take()

    def _take(self) -> bytes:
        message = self._inbox.popleft()
        self._unread -= len(message)
        return message

    async def _requests(self) -> AsyncIterator[Any]:
        while (raw := await self._next_message()) is not None:
            yield self._decode(raw)

    def _raise_inbox_error(self) -> None:
        if self._inbox_error is not None:
            raise _Status(*self._inbox_error)

    def _decode(self, raw: bytes):
        deserializer = self._handler.request_deserializer
        if deserializer is None:
            return raw
        try:
            return deserializer(raw)
        except Exception:  # noqa: BLE001 - grpc core's answer to an undecodable request
            raise _Status(grpc.StatusCode.INTERNAL, "Exception deserializing request!") from None

    def _encode(self, response) -> bytes:
        serializer = self._handler.response_serializer
        try:
            payload = response if serializer is None else serializer(response)
        except Exception:  # noqa: BLE001
            log.exception("cannot serialize the response of %s", self._head.path)
            raise _Status(grpc.StatusCode.INTERNAL, "Exception serializing response!") from None
        if not isinstance(payload, bytes | bytearray):
            raise _Status(grpc.StatusCode.INTERNAL, "Exception serializing response!")
        return payload

    def _send_headers(self, initial_metadata=()) -> None:
        if self._gone:
            raise _PeerGone()
        try:
            block = grpc_wire.response_headers(initial_metadata)
        except grpc_wire.InvalidMetadata:  # grpc core's answer to metadata it cannot send
            raise _Status(grpc.StatusCode.INTERNAL, "Invalid metadata") from None
        self._headers_sent = True
        self._connection.h2.send_headers(self._stream_id, block)

    def _send_message(self, payload: bytes) -> None:
        if not self._headers_sent:
            self._send_headers()
        if self._gone:
            raise _PeerGone()
        self._connection.h2.send_data(self._stream_id, grpc_wire.message(payload))

    async def _wait(self) -> None:
        if self._gone:
            raise _PeerGone()
        self._waiter = self._connection.loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _Status(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details
