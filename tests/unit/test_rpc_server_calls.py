"""Calls through the daemon's gRPC server (shim/rpc) on a real unix socket, with grpcio's aio client: the four
call kinds, what a handler sees and what the client gets back (statuses, details, metadata), deadlines and
cancellation reaching the handler, compression. The statuses are grpc core's (grpcio's own server answers the same,
checked by hand against it: tests say where they differ on purpose)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from dataclasses import dataclass

import grpc
import grpc.aio
import h2.config
import h2.connection
import h2.events
import pytest
from grpc_health.v1 import health_pb2

from shim.rpc import grpc_wire
from shim.rpc import h2_server as hc
from shim.rpc.call import WRITE_BACKLOG
from shim.rpc.server import Server
from tests.support.h2_socket_client import H2SocketClient

BOUND = 10.0  # seconds for what must happen; a hang fails the test instead of blocking the suite


class _Methods(grpc.GenericRpcHandler):
    def __init__(self, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self._handlers = handlers

    def service(self, handler_call_details):
        return self._handlers.get(handler_call_details.method)


@dataclass
class Served:
    server: Server
    channel: grpc.aio.Channel
    path: str


@contextlib.asynccontextmanager
async def serving(handlers: dict[str, grpc.RpcMethodHandler], *, channel_options=(), compression=None, **options):
    directory = tempfile.mkdtemp(prefix="grpcsrv-")  # tmp_path can exceed a unix socket path's 108 bytes
    server = Server(**options)
    server.add_generic_rpc_handlers((_Methods(handlers),))
    path = f"{directory}/server.sock"
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix:{path}", options=channel_options,
                                             compression=compression) as channel:
            yield Served(server, channel, path)
    finally:
        await server.stop(None)
        shutil.rmtree(directory, ignore_errors=True)


def run(scenario):
    return asyncio.run(asyncio.wait_for(scenario, 60))


def unary_status(handler) -> tuple[grpc.StatusCode, str]:
    """The status a grpcio client gets from a unary call answered by `handler`."""
    async def scenario():
        async with serving({"/t.T/U": grpc.unary_unary_rpc_method_handler(handler)}) as served:
            error = await rpc_error(served.channel.unary_unary("/t.T/U")(b""))
        return error.code(), error.details()

    return run(scenario())


async def bounded(awaitable):
    return await asyncio.wait_for(awaitable, BOUND)


async def rpc_error(awaitable) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await bounded(awaitable)
    return caught.value


class Parked:
    """A handler that waits until cancelled, and says when it started and when its CancelledError arrived."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def __call__(self, request, context):
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


async def echo(request, context):
    return request


# --- the four kinds of call ---------------------------------------------------------------------------------------


def test_unary_call_and_the_metadata_the_handler_sees():
    seen = []

    async def handler(request, context):
        seen.append(tuple(context.invocation_metadata()))
        return request[::-1]

    async def scenario():
        async with serving({"/t.T/U": grpc.unary_unary_rpc_method_handler(handler)}) as served:
            answer = await bounded(served.channel.unary_unary("/t.T/U")(
                b"abc", metadata=(("x-a", "1"), ("x-b-bin", b"\x00\xff"), ("x-a", "2"))))
            assert answer == b"cba"
        (metadata,) = seen
        assert metadata[0][0] == "user-agent" and metadata[0][1].startswith("grpc-python-asyncio/")
        # In the order grpcio's client sends them (it groups a key's values), as grpcio's server hands them on.
        assert metadata[1:] == (("x-a", "1"), ("x-a", "2"), ("x-b-bin", b"\x00\xff"))

    run(scenario())


def test_server_streaming_over_a_mib_to_a_slow_reader_is_held_back_by_flow_control():
    size, count = 64 * 1024, 400  # 25 MiB: far more than the client's window plus the server's write backlog
    produced = []

    async def handler(request, context):
        for index in range(count):
            produced.append(index)
            yield index.to_bytes(4, "big") * (size // 4)

    async def scenario():
        async with serving({"/t.T/S": grpc.unary_stream_rpc_method_handler(handler)}) as served:
            client = await H2SocketClient.connect(served.path)
            stream_id = client.open("/t.T/S")
            client.message(stream_id, b"")
            await client.send()
            body = bytearray()
            while len(body) < 65_535:  # h2's default window, which it does not reopen by itself: all it may get
                body += b"".join(e.data for e in await client.read_once() if isinstance(e, h2.events.DataReceived))
            await client.sync()
            # What the handler wrote is held by the window and the write backlog (1 MiB), no more.
            assert len(produced) <= (65_535 + WRITE_BACKLOG) // size + 2
            client.h2.acknowledge_received_data(len(body), stream_id)
            await client.send()
            while len(body) < count * (size + 5):
                for event in await client.read_once():
                    if isinstance(event, h2.events.DataReceived):
                        body += event.data
                        client.h2.acknowledge_received_data(event.flow_controlled_length, stream_id)
                await client.send()
            answer = await client.answer(stream_id)
            await client.close()
        assert answer[b"grpc-status"] == b"0"
        expected = b"".join(grpc_wire.message(index.to_bytes(4, "big") * (size // 4)) for index in range(count))
        assert bytes(body) == expected

    run(scenario())


def test_client_streaming():
    async def handler(request_iterator, context):
        return b"|".join([message async for message in request_iterator])

    async def scenario():
        async with serving({"/t.T/C": grpc.stream_unary_rpc_method_handler(handler)}) as served:
            call = served.channel.stream_unary("/t.T/C")()
            for part in (b"a", b"", b"b" * 100_000, b"c"):
                await bounded(call.write(part))
            await call.done_writing()
            assert await bounded(call) == b"a||" + b"b" * 100_000 + b"|c"

    run(scenario())


def test_client_streaming_of_24_mib_keeps_the_receive_windows_open():
    async def handler(request_iterator, context):
        sizes = [len(message) async for message in request_iterator]
        return f"{len(sizes)} {sum(sizes)}".encode()

    async def scenario():
        async with serving({"/t.T/C": grpc.stream_unary_rpc_method_handler(handler)}) as served:
            call = served.channel.stream_unary("/t.T/C")()
            for _ in range(24):
                await bounded(call.write(b"m" * (1 << 20)))
            await call.done_writing()
            assert await bounded(call) == f"24 {24 << 20}".encode()

    run(scenario())


def test_client_streaming_of_no_message():
    async def handler(request_iterator, context):
        return str(len([message async for message in request_iterator])).encode()

    async def scenario():
        async with serving({"/t.T/C": grpc.stream_unary_rpc_method_handler(handler)}) as served:
            call = served.channel.stream_unary("/t.T/C")()
            await call.done_writing()
            assert await bounded(call) == b"0"

    run(scenario())


def test_bidi_streaming_answers_each_message_before_the_next_is_sent():
    async def handler(request_iterator, context):
        async for message in request_iterator:
            yield message.upper()

    async def scenario():
        async with serving({"/t.T/B": grpc.stream_stream_rpc_method_handler(handler)}) as served:
            call = served.channel.stream_stream("/t.T/B")()
            for word in (b"one", b"two", b"three"):
                await bounded(call.write(word))
                assert await bounded(call.read()) == word.upper()
            await call.done_writing()
            assert await bounded(call.read()) is grpc.aio.EOF
            assert await call.code() == grpc.StatusCode.OK

    run(scenario())


def test_bidi_streaming_with_context_read_and_write():
    async def handler(request_iterator, context):
        while (message := await context.read()) is not grpc.aio.EOF:
            await context.write(message * 2)
        await context.write(b"end")

    async def scenario():
        async with serving({"/t.T/B": grpc.stream_stream_rpc_method_handler(handler)}) as served:
            call = served.channel.stream_stream("/t.T/B")()
            await bounded(call.write(b"x"))
            assert await bounded(call.read()) == b"xx"
            await call.done_writing()
            assert await bounded(call.read()) == b"end"
            assert await bounded(call.read()) is grpc.aio.EOF

    run(scenario())


# --- statuses, details and metadata -------------------------------------------------------------------------------

DETAILS = "nicht gefunden: 100% \u00e9\u65e5 \U0001f600"
TRAILING = (("x-text", "t"), ("x-blob-bin", b"\x00\xff\x80"))


def test_abort_brings_code_details_and_trailing_metadata_to_the_client():
    async def handler(request, context):
        await context.abort(grpc.StatusCode.NOT_FOUND, DETAILS, trailing_metadata=TRAILING)

    async def scenario():
        async with serving({"/t.T/U": grpc.unary_unary_rpc_method_handler(handler)}) as served:
            error = await rpc_error(served.channel.unary_unary("/t.T/U")(b""))
        assert (error.code(), error.details()) == (grpc.StatusCode.NOT_FOUND, DETAILS)
        assert tuple(error.trailing_metadata()) == TRAILING

    run(scenario())


def test_abort_after_streamed_messages_ends_the_stream_with_the_status():
    async def handler(request, context):
        yield b"1"
        yield b"2"
        await context.abort(grpc.StatusCode.ABORTED, DETAILS, trailing_metadata=TRAILING)

    async def scenario():
        async with serving({"/t.T/S": grpc.unary_stream_rpc_method_handler(handler)}) as served:
            call = served.channel.unary_stream("/t.T/S")(b"")
            assert [await bounded(call.read()), await bounded(call.read())] == [b"1", b"2"]
            error = await rpc_error(call.read())
        assert (error.code(), error.details()) == (grpc.StatusCode.ABORTED, DETAILS)
        assert tuple(error.trailing_metadata()) == TRAILING

    run(scenario())


def test_initial_and_trailing_metadata_of_a_successful_call():
    async def handler(request, context):
        await context.send_initial_metadata((("x-initial", "i"), ("x-initial-bin", b"\x01\x02")))
        context.set_trailing_metadata(TRAILING)
        return b"ok"

    async def scenario():
        async with serving({"/t.T/U": grpc.unary_unary_rpc_method_handler(handler)}) as served:
            call = served.channel.unary_unary("/t.T/U")(b"")
            assert await bounded(call) == b"ok"
            assert tuple(await call.initial_metadata()) == (("x-initial", "i"), ("x-initial-bin", b"\x01\x02"))
            assert tuple(await call.trailing_metadata()) == TRAILING

    run(scenario())


def test_metadata_over_16_kib_both_ways_crosses_in_continuation_frames():
    big = tuple((f"x-key-{index}", "v" * 200) for index in range(100))  # ~22 KiB: over one frame of 16 KiB

    async def handler(request, context):
        received = tuple(context.invocation_metadata())[1:]
        context.set_trailing_metadata(big)
        return b"same" if received == big else b"different"

    async def scenario():
        async with serving({"/t.T/U": grpc.unary_unary_rpc_method_handler(handler)},
                           channel_options=[("grpc.max_metadata_size", 64 * 1024)]) as served:
            call = served.channel.unary_unary("/t.T/U")(b"", metadata=big)
            assert await bounded(call) == b"same"
            assert tuple(await call.trailing_metadata()) == big

    run(scenario())


def test_set_code_and_details_without_abort():
    async def handler(request, context):
        context.set_code(grpc.StatusCode.FAILED_PRECONDITION)
        context.set_details("not yet")
        return b""

    assert unary_status(handler) == (grpc.StatusCode.FAILED_PRECONDITION, "not yet")


def test_exception_in_a_handler_is_unknown():
    async def handler(request, context):
        raise RuntimeError("boom")

    assert unary_status(handler) == (grpc.StatusCode.UNKNOWN, "Unexpected <class 'RuntimeError'>: boom")


def test_undecodable_request_is_internal_and_the_handler_is_not_called():
    called = []

    async def handler(request, context):
        called.append(request)
        return request

    handlers = {"/t.T/U": grpc.unary_unary_rpc_method_handler(
        handler, request_deserializer=health_pb2.HealthCheckRequest.FromString,
        response_serializer=health_pb2.HealthCheckRequest.SerializeToString)}

    async def scenario():
        async with serving(handlers) as served:
            error = await rpc_error(served.channel.unary_unary("/t.T/U")(b"\xff\xff\xff"))
        # grpcio's aio server says UNKNOWN "Unexpected <DecodeError>"; grpc core's sync servers INTERNAL, as here.
        assert (error.code(), error.details()) == (grpc.StatusCode.INTERNAL, "Exception deserializing request!")
        assert called == []

    run(scenario())


def test_unknown_method_is_unimplemented():
    async def scenario():
        async with serving({}) as served:
            error = await rpc_error(served.channel.unary_unary("/t.T/Nope")(b""))
        assert (error.code(), error.details()) == (grpc.StatusCode.UNIMPLEMENTED, "Method not found!")

    run(scenario())


def test_request_over_max_receive_message_length_is_resource_exhausted():
    called = []

    async def handler(request, context):
        called.append(len(request))
        return b""

    async def scenario():
        async with serving({"/t.T/U": grpc.unary_unary_rpc_method_handler(handler)},
                           max_receive_message_length=1000) as served:
            error = await rpc_error(served.channel.unary_unary("/t.T/U")(b"x" * 1001))
            assert await bounded(served.channel.unary_unary("/t.T/U")(b"x" * 1000)) == b""
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "1001 vs. 1000" in error.details()
        assert called == [1000]

    run(scenario())


def test_trailing_metadata_grpc_core_refuses_is_internal_invalid_metadata():
    async def handler(request, context):
        context.set_trailing_metadata((("x-t", "v\u00e9\u20ac"),))
        return b""

    assert unary_status(handler) == (grpc.StatusCode.INTERNAL, "Invalid metadata")


def test_initial_metadata_grpc_core_refuses_is_internal_invalid_metadata():
    async def handler(request, context):
        await context.send_initial_metadata((("x-t", "v\u00e9"),))
        return b""

    assert unary_status(handler) == (grpc.StatusCode.INTERNAL, "Invalid metadata")


# --- deadlines and cancellation -----------------------------------------------------------------------------------


def test_handler_outliving_the_client_timeout_is_cancelled_and_the_client_gets_deadline_exceeded():
    parked = Parked()

    async def scenario():
        async with serving({"/t.T/U": grpc.unary_unary_rpc_method_handler(parked)}) as served:
            error = await rpc_error(served.channel.unary_unary("/t.T/U")(b"", timeout=0.3))
            assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await bounded(parked.cancelled.wait())

    run(scenario())


def test_time_remaining_reflects_grpc_timeout():
    async def handler(request, context):
        remaining = context.time_remaining()
        return b"none" if remaining is None else str(remaining).encode()

    async def scenario():
        async with serving({"/t.T/U": grpc.unary_unary_rpc_method_handler(handler)}) as served:
            remaining = float(await bounded(served.channel.unary_unary("/t.T/U")(b"", timeout=20)))
            # grpc core rounds the grpc-timeout it sends up, "arbitrarily" (timeout_encoding.h; seen: 20.1 s for 20 s).
            assert 15 < remaining <= 22
            assert await bounded(served.channel.unary_unary("/t.T/U")(b"")) == b"none"

    run(scenario())


async def raw_call(path: str, method: str, headers: list, body: bytes) -> list[tuple[bytes, bytes]]:
    """A call by python-hyper's h2 over the socket (no client deadline of its own): the response's header blocks,
    trailers included, in one list."""
    reader, writer = await asyncio.open_unix_connection(path)
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    client.initiate_connection()
    stream_id = client.get_next_available_stream_id()
    client.send_headers(stream_id, [(":method", "POST"), (":scheme", "http"), (":path", method),
                                    (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers")]
                        + headers)
    client.send_data(stream_id, grpc_wire.message(body), end_stream=True)
    writer.write(client.data_to_send())
    received: list[tuple[bytes, bytes]] = []
    try:
        while True:
            data = await bounded(reader.read(65536))
            assert data, "the server closed the connection before the call ended"
            for event in client.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                    received += event.headers
                if isinstance(event, h2.events.StreamEnded):
                    return received
            writer.write(client.data_to_send())
    finally:
        writer.close()


def test_server_ends_a_call_at_its_grpc_timeout_with_deadline_exceeded():
    parked = Parked()

    async def scenario():
        async with serving({"/t.T/U": grpc.unary_unary_rpc_method_handler(parked)}) as served:
            headers = await raw_call(served.path, "/t.T/U", [("grpc-timeout", "200m")], b"")
            await bounded(parked.cancelled.wait())
        assert (b"grpc-status", b"4") in headers and (b"grpc-message", b"Deadline Exceeded") in headers

    run(scenario())


def test_client_cancelling_a_call_cancels_the_handler():
    parked = Parked()

    async def scenario():
        async with serving({"/t.T/U": grpc.unary_unary_rpc_method_handler(parked)}) as served:
            call = served.channel.unary_unary("/t.T/U")(b"")
            await bounded(parked.started.wait())
            call.cancel()
            await bounded(parked.cancelled.wait())
            assert await call.code() == grpc.StatusCode.CANCELLED

    run(scenario())


def test_client_cancelling_a_stream_cancels_a_handler_waiting_to_write():
    cancelled = asyncio.Event()

    async def handler(request, context):
        try:
            while True:  # far more than the windows hold: it ends up waiting in write()
                await context.write(b"w" * 65536)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def scenario():
        async with serving({"/t.T/S": grpc.unary_stream_rpc_method_handler(handler)}) as served:
            call = served.channel.unary_stream("/t.T/S")(b"")
            assert await bounded(call.read()) == b"w" * 65536
            call.cancel()
            await bounded(cancelled.wait())

    run(scenario())


def test_done_callbacks_run_when_a_call_ends_answered_or_cancelled():
    ended = []
    all_ended = asyncio.Event()
    parked = Parked()

    def on_done(context):
        ended.append((context.done(), context.cancelled()))
        if len(ended) == 2:
            all_ended.set()

    async def answered(request, context):
        context.add_done_callback(on_done)
        return b"ok"

    async def cancelled(request, context):
        context.add_done_callback(on_done)
        await parked(request, context)

    handlers = {"/t.T/A": grpc.unary_unary_rpc_method_handler(answered),
                "/t.T/C": grpc.unary_unary_rpc_method_handler(cancelled)}

    async def scenario():
        async with serving(handlers) as served:
            assert await bounded(served.channel.unary_unary("/t.T/A")(b"")) == b"ok"
            call = served.channel.unary_unary("/t.T/C")(b"")
            await bounded(parked.started.wait())
            call.cancel()
            await bounded(all_ended.wait())
        assert ended == [(True, False), (True, True)]

    run(scenario())


# --- compression --------------------------------------------------------------------------------------------------


def test_gzip_compressed_requests_from_grpcio_are_inflated():
    seen = []

    async def unary(request, context):
        seen.append(request)
        return request[:10]

    async def streamed(request_iterator, context):
        return b"".join([message async for message in request_iterator])

    handlers = {"/t.T/U": grpc.unary_unary_rpc_method_handler(unary),
                "/t.T/C": grpc.stream_unary_rpc_method_handler(streamed)}
    body = b"compressible probe output " * 20_000

    async def scenario():
        async with serving(handlers, compression=grpc.Compression.Gzip) as served:
            assert await bounded(served.channel.unary_unary("/t.T/U")(body)) == body[:10]
            call = served.channel.stream_unary("/t.T/C")()
            for part in (body, b"tail"):
                await bounded(call.write(part))
            await call.done_writing()
            assert await bounded(call) == body + b"tail"
        assert seen == [body]

    run(scenario())


def test_a_client_sending_ahead_of_a_handler_that_does_not_read_is_held_back_by_the_windows():
    # The windows are given back as the handler takes messages: a client can never have more sent ahead than the
    # stream's window (4 MiB), and once the handler reads, the rest goes through.
    reading = asyncio.Event()

    async def handler(request_iterator, context):
        await reading.wait()
        return str(sum([len(message) async for message in request_iterator])).encode()

    async def scenario():
        async with serving({"/t.T/S": grpc.stream_unary_rpc_method_handler(handler)}) as served:
            client = await H2SocketClient.connect(served.path)
            await client.sync()
            stream_id = client.open("/t.T/S")
            message, sent = b"x" * 60_000, 0
            while client.h2.local_flow_control_window(stream_id) >= len(message) + 5:
                client.message(stream_id, message, end_stream=False)
                sent += len(message)
                await client.sync()  # the server had every chance to give the window back: it did not
            assert sent < hc.STREAM_WINDOW
            reading.set()
            for _ in range(100):  # 6 MB more: past the stream's window, which the handler's reads reopen
                while client.h2.local_flow_control_window(stream_id) < len(message) + 5:
                    await client.read_once()
                client.message(stream_id, message, end_stream=False)
                await client.send()
            client.h2.end_stream(stream_id)
            await client.send()
            answer = await client.answer(stream_id)
            await client.close()
        assert answer[b"grpc-status"] == b"0"

    run(scenario())
