"""The daemon's gRPC client (shim/rpc/client.py) through real sockets, against grpcio's aio server as the
runtime: what a call returns is compared with what grpcio's own client gets from the same server in the same test.
The connection's life (backoff, restarts, GOAWAY, a lost connection) is in test_rpc_client_connections.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import grpc.aio
import pytest

from probe_api.defaults import MAX_MESSAGE_BYTES
from shim.rpc.client import Call, CallError, Channel, messages

BOUND = 10.0  # seconds for what must happen; a hang fails the test instead of blocking the suite
UNARY, STREAM = "/test.Runtime/Unary", "/test.Runtime/Stream"


class Methods(grpc.GenericRpcHandler):
    """Handlers by path; `unary` and `stream` are the two call kinds the client makes."""

    def __init__(self, unary=None, stream=None) -> None:
        self._handlers = {}
        if unary is not None:
            self._handlers[UNARY] = grpc.unary_unary_rpc_method_handler(unary)
        if stream is not None:
            self._handlers[STREAM] = grpc.unary_stream_rpc_method_handler(stream)

    def service(self, handler_call_details):
        return self._handlers.get(handler_call_details.method)


@dataclass
class Runtime:
    server: grpc.aio.Server
    target: str  # as Channel and grpcio both take it
    directory: str


@contextlib.asynccontextmanager
async def runtime(methods: Methods, *, transport: str = "unix", directory: str | None = None,
                  **server_kwargs) -> AsyncIterator[Runtime]:
    """A grpcio server on a unix socket (in `directory`, made when None) or on TCP loopback."""
    own_directory = directory is None
    directory = directory or tempfile.mkdtemp(prefix="grpccli-")  # tmp_path can exceed 108 bytes
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    server = grpc.aio.server(options=options, **server_kwargs)
    server.add_generic_rpc_handlers((methods,))
    if transport == "unix":
        target = f"unix:{directory}/runtime.sock"
        server.add_insecure_port(target)
    else:
        target = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    try:
        yield Runtime(server, target, directory)
    finally:
        await server.stop(None)
        if own_directory:
            shutil.rmtree(directory, ignore_errors=True)


@contextlib.asynccontextmanager
async def channels(target: str) -> AsyncIterator[tuple[Channel, grpc.aio.Channel]]:
    """The client under test and grpcio's, to the same target."""
    ours = Channel(target)
    async with grpc.aio.insecure_channel(target, options=[("grpc.max_receive_message_length", -1)]) as reference:
        try:
            yield ours, reference
        finally:
            await ours.close()


def run(scenario) -> None:
    asyncio.run(asyncio.wait_for(scenario, 60))


async def bounded(awaitable):
    return await asyncio.wait_for(awaitable, BOUND)


async def collect(iterator) -> list:
    return [item async for item in iterator]


async def call_error(awaitable) -> CallError:
    with pytest.raises(CallError) as caught:
        await bounded(awaitable)
    return caught.value


async def rpc_error(awaitable) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await bounded(awaitable)
    return caught.value


class Parked:
    """A handler that waits until released or cancelled, and says when it started and when it was cancelled."""

    def __init__(self, answer: bytes = b"done") -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = asyncio.Event()
        self._answer = answer

    async def handle(self, request, context):  # a method: grpcio awaits only what is a coroutine function
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return self._answer


async def echo(request, context):
    return request


class DialCounter:
    """Counts the connections the channel tries to open (both kinds of target), by wrapping the loop's methods."""

    def __init__(self) -> None:
        self.count = 0
        loop = asyncio.get_running_loop()
        for name in ("create_unix_connection", "create_connection"):
            setattr(loop, name, self._counting(getattr(loop, name)))

    def _counting(self, dial):
        async def counted(*args, **kwargs):
            self.count += 1
            return await dial(*args, **kwargs)
        return counted


# --- calls ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_unary_call_over_unix_and_tcp(transport):
    async def scenario():
        async with runtime(Methods(unary=echo), transport=transport) as rt, channels(rt.target) as (ours, _):
            initial, response, trailing = await bounded(ours.unary(UNARY, b"hello"))
            assert (initial, response, trailing) == ((), b"hello", ())
            assert (await bounded(ours.unary(UNARY, b"")))[1] == b""  # an empty message is a message
    run(scenario())


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_server_streaming_of_many_messages_over_a_mib_arrives_in_order(transport):
    sizes = [1, 0, 70_000] + [8_192] * 300 + [3 * 1024 * 1024]  # ~5.5 MiB: over every window, several times

    async def stream(request, context):
        for index, size in enumerate(sizes):
            yield bytes([index % 256]) * size

    async def scenario():
        async with runtime(Methods(stream=stream), transport=transport) as rt, channels(rt.target) as (ours, ref):
            call = await bounded(ours.stream(STREAM, b""))
            received = await bounded(collect(messages(call)))
            assert [len(message) for message in received] == sizes
            assert received == [message async for message in ref.unary_stream(STREAM)(b"")]
            assert await call.trailing_metadata() == ()
    run(scenario())


TEXT = (("x-text", "a b%41 ~"), ("x-empty", ""))
BINARY = (("x-raw-bin", b"\x00\xff\x80 %41"), ("x-empty-bin", b""))
DETAILS = "nön-ASCII 100% ✓ %41 \t\n end"  # '%' itself, UTF-8, control characters: all percent-encoded


def talkative(seen: list):
    async def handler(request, context):
        seen.append(tuple((key, value) for key, value in context.invocation_metadata() if key != "user-agent"))
        await context.send_initial_metadata(TEXT + BINARY)
        context.set_trailing_metadata((("x-trailer", "t"), ("x-trailer-bin", b"\x01\x02\x03\x04")))
        if request == b"fail":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, DETAILS)
        return b"answer"
    return handler


def test_metadata_and_an_ok_status_arrive_as_grpcio_sees_them():
    seen: list = []

    async def scenario():
        async with runtime(Methods(unary=talkative(seen))) as rt, channels(rt.target) as (ours, ref):
            sent = (("x-request", "r%41"), ("x-request-bin", b"\xfe\x00"))
            initial, response, trailing = await bounded(ours.unary(UNARY, b"ok", sent))
            reference = ref.unary_unary(UNARY)(b"ok", metadata=sent)
            assert response == await bounded(reference) == b"answer"
            assert initial == tuple(await reference.initial_metadata()) == TEXT + BINARY
            assert trailing == tuple(await reference.trailing_metadata())
            assert ("x-trailer-bin", b"\x01\x02\x03\x04") in trailing
            assert seen[0] == seen[1] and sent[0] in seen[0] and sent[1] in seen[0]
    run(scenario())


def test_an_error_status_details_and_metadata_arrive_as_grpcio_sees_them():
    async def scenario():
        async with runtime(Methods(unary=talkative([]))) as rt, channels(rt.target) as (ours, ref):
            error = await call_error(ours.unary(UNARY, b"fail"))
            reference = await rpc_error(ref.unary_unary(UNARY)(b"fail"))
            assert error.code is reference.code() is grpc.StatusCode.FAILED_PRECONDITION
            assert error.details == reference.details() == DETAILS
            assert error.initial_metadata == tuple(reference.initial_metadata()) == TEXT + BINARY
            assert error.trailing_metadata == tuple(reference.trailing_metadata())
    run(scenario())


def test_an_unknown_method_is_unimplemented_as_grpcio_sees_it():
    async def scenario():
        async with runtime(Methods(unary=echo)) as rt, channels(rt.target) as (ours, ref):
            error = await call_error(ours.unary("/test.Runtime/Missing", b""))
            reference = await rpc_error(ref.unary_unary("/test.Runtime/Missing")(b""))
            assert (error.code, error.details) == (reference.code(), reference.details())
            assert error.code is grpc.StatusCode.UNIMPLEMENTED
    run(scenario())


def test_gzip_compressed_responses_arrive_inflated(monkeypatch):
    encodings = []
    on_headers = Call.on_headers

    def spy(self, headers, ended):
        encodings.extend(value for name, value in headers if name == b"grpc-encoding")
        on_headers(self, headers, ended)
    monkeypatch.setattr(Call, "on_headers", spy)

    async def stream(request, context):
        for index in range(3):
            yield bytes([index]) * 200_000

    async def scenario():
        methods = Methods(unary=echo, stream=stream)
        async with runtime(methods, compression=grpc.Compression.Gzip) as rt, channels(rt.target) as (ours, _):
            assert (await bounded(ours.unary(UNARY, b"z" * 100_000)))[1] == b"z" * 100_000
            call = await bounded(ours.stream(STREAM, b""))
            assert await bounded(collect(messages(call))) == [bytes([index]) * 200_000 for index in range(3)]
        assert encodings == [b"gzip", b"gzip"]  # the answers were compressed on the wire
    run(scenario())


def failing_stream(count: int):
    async def stream(request, context):
        if count:
            await context.send_initial_metadata((("x-initial", "i"),))
        for index in range(count):
            yield b"%d" % index
        context.set_trailing_metadata((("x-trailer-bin", b"\xff"),))
        await context.abort(grpc.StatusCode.NOT_FOUND, "gone 100%")
    return stream


@pytest.mark.parametrize("count", [0, 3], ids=["trailers-only", "after-messages"])
def test_a_stream_that_fails_gives_its_messages_then_the_status_as_grpcio_sees_them(count):
    async def scenario():
        async with runtime(Methods(stream=failing_stream(count))) as rt, channels(rt.target) as (ours, ref):
            call = await bounded(ours.stream(STREAM, b""))
            initial = await bounded(call.initial_metadata())
            received = [await bounded(call.read()) for _ in range(count)]
            error = await call_error(call.read())
            reference = ref.unary_stream(STREAM)(b"")
            theirs = []
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for message in reference:
                    theirs.append(message)
            assert received == theirs == [b"%d" % index for index in range(count)]
            assert initial == tuple(await reference.initial_metadata())
            assert (error.code, error.details) == (caught.value.code(), caught.value.details())
            assert error.trailing_metadata == tuple(caught.value.trailing_metadata())
            assert await call.trailing_metadata() == error.trailing_metadata
    run(scenario())


def test_closing_the_channel_ends_its_calls_unavailable():
    parked = Parked()

    async def scenario():
        async with runtime(Methods(unary=parked.handle)) as rt, channels(rt.target) as (ours, _):
            in_flight = asyncio.ensure_future(ours.unary(UNARY, b""))
            await bounded(parked.started.wait())
            await ours.close()
            assert (await call_error(in_flight)).code is grpc.StatusCode.UNAVAILABLE
            await bounded(parked.cancelled.wait())
    run(scenario())


# --- deadlines and cancellation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["unary", "stream"])
def test_deadline_is_deadline_exceeded_and_the_handler_is_cancelled(kind):
    parked = Parked()

    async def stream(request, context):  # a message, then the wait
        yield b"first"
        await parked.handle(request, context)

    async def scenario():
        async with runtime(Methods(unary=parked.handle, stream=stream)) as rt, channels(rt.target) as (ours, _):
            if kind == "unary":
                error = await call_error(ours.unary(UNARY, b"", timeout_s=0.3))
            else:
                call = await bounded(ours.stream(STREAM, b"", timeout_s=0.3))
                assert await bounded(call.read()) == b"first"
                error = await call_error(call.read())
            assert error.code is grpc.StatusCode.DEADLINE_EXCEEDED
            await bounded(parked.cancelled.wait())
    run(scenario())


def test_cancelling_a_stream_cancels_the_handler_and_ends_the_call_cancelled():
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def stream(request, context):
        yield b"first"
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def scenario():
        async with runtime(Methods(stream=stream)) as rt, channels(rt.target) as (ours, _):
            call = await bounded(ours.stream(STREAM, b""))
            assert await bounded(call.read()) == b"first"
            await bounded(started.wait())
            call.cancel()
            await bounded(cancelled.wait())
            assert (await call_error(call.read())).code is grpc.StatusCode.CANCELLED
    run(scenario())


def test_cancelling_the_task_of_a_unary_call_cancels_the_handler():
    parked = Parked()

    async def scenario():
        async with runtime(Methods(unary=parked.handle)) as rt, channels(rt.target) as (ours, _):
            task = asyncio.ensure_future(ours.unary(UNARY, b""))
            await bounded(parked.started.wait())
            task.cancel()
            await bounded(parked.cancelled.wait())
            with pytest.raises(asyncio.CancelledError):
                await task
    run(scenario())


# --- limits and concurrency -------------------------------------------------------------------------------------


def test_a_response_over_16_mib_is_resource_exhausted_and_the_connection_goes_on():
    async def big(request, context):
        return b"b" * (MAX_MESSAGE_BYTES + int(request or b"1"))

    async def scenario():
        async with runtime(Methods(unary=big)) as rt, channels(rt.target) as (ours, _):
            dials = DialCounter()
            error = await call_error(ours.unary(UNARY, b"1"))
            assert error.code is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert len((await bounded(ours.unary(UNARY, b"-1")))[1]) == MAX_MESSAGE_BYTES - 1
            assert dials.count == 1  # the same connection
    run(scenario())


def test_a_request_over_16_mib_is_resource_exhausted_without_connecting():
    async def scenario():
        async with runtime(Methods(unary=echo)) as rt, channels(rt.target) as (ours, _):
            dials = DialCounter()
            error = await call_error(ours.unary(UNARY, b"r" * (MAX_MESSAGE_BYTES + 1)))
            assert error.code is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert dials.count == 0
            assert (await bounded(ours.unary(UNARY, b"r" * MAX_MESSAGE_BYTES)))[1] == b"r" * MAX_MESSAGE_BYTES
    run(scenario())


def test_100_concurrent_calls_share_one_connection():
    async def slow_echo(request, context):
        await asyncio.sleep(0)  # answers interleave
        return request

    async def scenario():
        async with runtime(Methods(unary=slow_echo)) as rt, channels(rt.target) as (ours, _):
            dials = DialCounter()
            requests = [b"%d" % index * (index * 300) for index in range(100)]
            answers = await bounded(asyncio.gather(*(ours.unary(UNARY, request) for request in requests)))
            assert [response for _, response, _ in answers] == requests
            assert dials.count == 1
    run(scenario())



def test_typed_methods_decode_as_grpcios_and_a_response_they_cannot_decode_is_internal():
    from grpc_health.v1 import health_pb2

    async def health(request, context):
        return b"\x08\x01" if request == b"" else b"\xff\xff"  # SERVING, or bytes no message decodes

    async def scenario():
        async with runtime(Methods(unary=health)) as rt, channels(rt.target) as (ours, reference):
            ours_check = ours.unary_unary(UNARY, health_pb2.HealthCheckRequest.SerializeToString,
                                          health_pb2.HealthCheckResponse.FromString)
            grpcio_check = reference.unary_unary(UNARY, health_pb2.HealthCheckRequest.SerializeToString,
                                                 health_pb2.HealthCheckResponse.FromString)
            request = health_pb2.HealthCheckRequest()
            assert await bounded(ours_check(request, timeout=5)) == await bounded(grpcio_check(request, timeout=5))
            # grpcio's sync client's status and words (its aio client logs the failure and returns None).
            error = await call_error(ours_check(health_pb2.HealthCheckRequest(service="x"), timeout=5))
            assert (error.code, error.details) == (grpc.StatusCode.INTERNAL, "Exception deserializing response!")
    run(scenario())
