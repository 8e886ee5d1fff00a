"""One call on the daemon's gRPC server: the grpc.aio ServicerContext its handler gets, and the run of the handler.

Handlers are grpcio's own `RpcMethodHandler`s (the generated `add_*Servicer_to_server`, the health and reflection
servicers, the CRI proxy's generic handler), so they run here unchanged. What a handler sees is what grpc.aio gives
it: invocation metadata, time_remaining, abort (grpc.aio.AbortError), send_initial_metadata,
set_trailing_metadata, set_code/set_details, read/write for streams; its request already decoded by the method's
deserializer. The statuses of the server itself follow grpc core's: a deadline that passes ends the handler
(cancelled) with DEADLINE_EXCEEDED "Deadline Exceeded"; an exception that escapes is UNKNOWN "Unexpected <class>:
<text>"; a request that cannot be decoded is INTERNAL.

A call always ends, and ends once (`_release`): at the end of its handler's run, or, when the run never got there
(a cancellation before the handler ever ran: a client that resets at once; or while it ran), in the task's done
callback. The
server's own endings (the deadline, a request over the limits) answer the client at that moment and cancel the
handler; the call keeps its place among the connection's calls until the handler has really ended.

The request's bytes go back to the client's windows as the handler takes them (`_credit`): a whole message when it
is read, the part of a message still arriving as it arrives while the handler waits for it (else a message larger
than the window could never complete). What a call holds is counted on its connection, which bounds the total.
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
PREFIX = 5  # a message's length prefix on the wire


class _PeerGone(Exception):
    """The client reset the stream or went away: nothing more can be sent."""


class ServerCall(grpc.aio.ServicerContext):
    def __init__(self, connection: GrpcConnection, stream_id: int, head: CallHead,
                 handler: grpc.RpcMethodHandler, max_message: int, deadline: float | None = None) -> None:
        self._connection = connection
        self._stream_id = stream_id
        self._head = head
        self._handler = handler
        self._reader = grpc_wire.MessageReader(max_message, head.encoding)
        self._inbox: deque[bytes] = deque()
        self._unread = 0  # wire bytes of the messages in the inbox
        self._received = 0  # request bytes arrived
        self._credited = 0  # ... given back to the client's windows
        self._held = 0  # ... counted on the connection as held by this call
        self._remote_done = False
        self._waiter: asyncio.Future[None] | None = None
        self._headers_sent = False
        self._trailing: tuple = ()
        self._code: grpc.StatusCode | None = None
        self._details = ""
        self._ended_by: tuple[grpc.StatusCode, str] | None = None  # the server ended the call (deadline, overflow)
        self._answered = False  # the status went out (or cannot any more)
        self._gone = False
        self._done = False
        self._done_callbacks: list[Callable[[ServerCall], None]] = []
        loop = connection.loop
        if deadline is None and head.timeout_s is not None:
            deadline = loop.time() + head.timeout_s
        self._deadline = deadline  # on the loop's clock, from when the request arrived
        self._timer = None if deadline is None else loop.call_at(deadline, self._expire)
        self.task = loop.create_task(self._run())
        self.task.add_done_callback(self._task_done)

    # --- from the connection -------------------------------------------------------------------------------------

    def on_data(self, data: bytes, ended: bool) -> None:
        if self._ended_by is not None or self._gone:
            self._connection.h2.consume(self._stream_id, len(data))  # nobody reads it any more
        else:
            self._received += len(data)
            try:
                for message in self._reader.feed(data):
                    self._inbox.append(message)
                    self._unread += len(message) + PREFIX
            except MessageTooLarge as error:
                self._end_by(grpc.StatusCode.RESOURCE_EXHAUSTED, str(error))
            except BadMessage as error:
                self._end_by(grpc.StatusCode.INTERNAL, str(error))
            else:
                if self._reader.buffered or self._held:  # whole messages wait in the inbox for their take
                    self._credit()
        if ended:
            self.on_end()
        else:
            self._wake()

    def on_end(self) -> None:
        self._remote_done = True
        if self._reader.partial and self._ended_by is None:
            self._end_by(grpc.StatusCode.INTERNAL, "the request ended inside a message")
        self._wake()

    def on_reset(self) -> None:
        """The client reset the stream, or the connection is gone: no answer, the handler is cancelled."""
        self._gone = self._answered = True
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
        while connection.h2.backlog(self._stream_id) > WRITE_BACKLOG or connection.write_blocked:
            # Woken by a window opening for this stream (WindowOpened), by the socket draining or the connection's
            # queue going down, nothing else.
            connection.blocked_writers.add(self)
            try:
                await self._wait()
            finally:
                connection.blocked_writers.discard(self)
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
        """The handler's run, and the call's end with the status it ends in (none when the client is gone)."""
        handler = self._handler
        outcome: tuple[grpc.StatusCode, str] | None
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
            outcome = self._code or grpc.StatusCode.OK, self._details
        except grpc.aio.AbortError:
            outcome = self._code or grpc.StatusCode.UNKNOWN, self._details
        except _Status as status:
            outcome = status.code, status.details
        except _PeerGone:
            outcome = None
        except Exception as error:  # noqa: BLE001 - a handler's bug becomes a status, as in grpc core
            log.exception("handler of %s failed", self._head.path)
            outcome = grpc.StatusCode.UNKNOWN, f"Unexpected {type(error)}: {error}"
        # Ended in the handler's own step: the answer goes out now, not a loop turn later in a done callback.
        self._end(outcome)

    def _task_done(self, task: asyncio.Task) -> None:
        """Whatever ended the task, the call ends: here when the handler was cancelled before or while it ran (or
        escaped with a BaseException), which `_run` does not survive to end it itself."""
        if self._done:
            return
        outcome = None
        if not task.cancelled() and task.exception() is not None:  # SystemExit...: the client still gets an answer
            outcome = grpc.StatusCode.UNKNOWN, "the handler did not end normally"
        self._end(outcome)

    def _end(self, outcome: tuple[grpc.StatusCode, str] | None) -> None:
        if outcome is not None:
            self._answer(*outcome)
        elif not self._answered:  # cancelled by the server stopping: as grpc core, the client hears CANCELLED
            self._answer(grpc.StatusCode.CANCELLED, "Cancelled")
        self._release()

    def _answer(self, code: grpc.StatusCode, details: str) -> None:
        """The call's status to the client, once; a status the server decided (deadline, limits) comes first."""
        if self._answered:
            return
        self._answered = True
        if self._ended_by is not None:
            code, details = self._ended_by
        h2 = self._connection.h2
        if self._headers_sent:
            h2.send_headers(self._stream_id, grpc_wire.trailers(code, details, self._trailing), end_stream=True)
        else:
            h2.send_headers(self._stream_id, grpc_wire.trailers(code, details, self._trailing, trailers_only=True),
                            end_stream=True)
        h2.finish_stream(self._stream_id)
        self._connection.flush()

    def _release(self) -> None:
        self._done = True
        self.task.remove_done_callback(self._task_done)  # ended in its own step: no loop callback to schedule
        if self._timer is not None:
            self._timer.cancel()
        self._inbox.clear()
        self._unread = 0
        self._reader = _DONE
        self._credit_all()
        self._connection.call_ended(self._stream_id)
        for callback in self._done_callbacks:
            try:
                callback(self)
            except Exception:  # noqa: BLE001
                log.exception("done callback of %s failed", self._head.path)

    def _expire(self) -> None:
        self._end_by(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def _end_by(self, code: grpc.StatusCode, details: str) -> None:
        """The server ends the call: the client gets this status now, the handler is cancelled, what the call
        holds of the request is dropped."""
        if self._ended_by is None:
            self._ended_by = (code, details)
        self._answer(code, details)
        self._inbox.clear()
        self._unread = 0
        self._reader = _DONE  # a message it was reading is dropped
        self._credit_all()
        if not self.task.done():
            self.task.cancel()

    # --- flow control --------------------------------------------------------------------------------------------

    def _credit(self) -> None:
        """Gives the client's windows back what the handler took, and counts what the call holds. Of a message still
        arriving, its bytes go back as they arrive while the handler waits for it (nothing else is unread)."""
        partial = self._reader.buffered
        unconsumed = self._unread + (partial if self._inbox else 0)
        due = self._received - self._credited - unconsumed
        if due > 0:
            self._credited += due
            self._connection.h2.consume(self._stream_id, due)
        # Held: the part of a message still arriving, whose bytes went back to the windows. Whole messages in the
        # inbox have not (they go back when taken), so the connection's window bounds those already.
        held = partial
        if held != self._held:
            over = self._connection.hold(held - self._held)
            self._held = held
            if over:
                self._end_by(grpc.StatusCode.RESOURCE_EXHAUSTED,
                             "the connection's calls hold more request bytes than the server allows")

    def _credit_all(self) -> None:
        """Nothing more will be read: everything received goes back to the windows, nothing is held."""
        due = self._received - self._credited
        if due > 0:
            self._credited += due
            self._connection.h2.consume(self._stream_id, due)
        if self._held:
            self._connection.hold(-self._held)
            self._held = 0

    # --- messages ------------------------------------------------------------------------------------------------

    async def _unary_request(self) -> bytes:
        while not self._remote_done:
            await self._wait()
        if len(self._inbox) != 1:
            raise _Status(grpc.StatusCode.INTERNAL if self._inbox else grpc.StatusCode.UNIMPLEMENTED,
                          f"expected one request message, got {len(self._inbox)}")
        return self._take()

    async def _next_message(self) -> bytes | None:
        while not self._inbox:
            if self._remote_done:
                return None
            await self._wait()
        return self._take()

    def _take(self) -> bytes:
        message = self._inbox.popleft()
        self._unread -= len(message) + PREFIX
        self._credit()
        self._connection.flush()  # a WINDOW_UPDATE it made
        return message

    async def _requests(self) -> AsyncIterator[Any]:
        while (raw := await self._next_message()) is not None:
            yield self._decode(raw)

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


_DONE = grpc_wire.MessageReader(0)  # the reader of a call that reads nothing more: it holds no bytes


class _Status(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details
