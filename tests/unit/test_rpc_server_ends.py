"""Every call on the daemon's gRPC server ends, and ends once, and what a connection may hold is bounded
(shim/rpc/call.py, shim/rpc/server.py, shim/rpc/limits.py): a call cancelled before its handler ran, a grpc-timeout
of 0 or 1n, a deadline a handler ignores, a connection closed under its calls; the limits on calls, connections,
request bytes and metadata; the preface and idle timeouts. python-hyper's h2 is the client (tests/support), so that
a call can be opened and reset in one write; the limits are lowered by monkeypatching where the real ones would take
thousands of calls (the real ones are attacked in tests/hardening/test_socket_abuse.py)."""

from __future__ import annotations

import asyncio

import grpc
import h2.errors
import h2.events
import pytest

from shim.rpc import limits
from shim.rpc import server as server_module
from tests.support.h2_socket_client import H2SocketClient
from tests.unit.test_rpc_server_calls import Parked, bounded, echo, run, serving

ECHO, PARK = "/t.T/Echo", "/t.T/Park"


def handlers(parked: Parked | None = None) -> dict:
    return {ECHO: grpc.unary_unary_rpc_method_handler(echo),
            PARK: grpc.unary_unary_rpc_method_handler(parked or Parked())}


async def park(client: H2SocketClient, count: int, extra: list | None = None) -> list[int]:
    """`count` calls to the parked handler, sent."""
    stream_ids = []
    for _ in range(count):
        stream_ids.append(client.open(PARK, extra))
        client.message(stream_ids[-1], b"")
    await client.send()
    return stream_ids


async def echoed(client: H2SocketClient, payload: bytes = b"ping") -> dict[bytes, bytes]:
    stream_id = client.open(ECHO)
    client.message(stream_id, payload)
    await client.send()
    return await client.answer(stream_id)


def test_calls_reset_in_the_write_that_opens_them_end_without_their_handler_and_leave_nothing():
    parked = Parked()

    async def scenario():
        async with serving(handlers(parked)) as served:
            client = await H2SocketClient.connect(served.path)
            for _ in range(500):
                stream_id = client.open(PARK, end_stream=True)
                client.h2.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
            await client.send()
            assert (await echoed(client))[b"grpc-status"] == b"0"  # after the resets, in order: the barrier
            assert served.server._live_calls == 0
            assert not parked.started.is_set()
            await client.close()

    run(scenario())


@pytest.mark.parametrize("timeout", ["0n", "1n", "1u"])
def test_a_deadline_over_before_the_handler_runs_is_answered_deadline_exceeded(timeout):
    async def scenario():
        async with serving(handlers()) as served:
            client = await H2SocketClient.connect(served.path)
            stream_ids = []
            for _ in range(limits.CONCURRENT_CALLS + 200):  # more than a connection's calls at once
                stream_id = client.open(PARK, [("grpc-timeout", timeout)])
                client.message(stream_id, b"")
                stream_ids.append(stream_id)
                if len(stream_ids) % 500 == 0:
                    await client.send()
            await client.send()
            answers = [await client.answer(stream_id) for stream_id in stream_ids]
            assert {(a[b"grpc-status"], a[b"grpc-message"]) for a in answers} == {(b"4", b"Deadline Exceeded")}
            assert (await echoed(client))[b"grpc-status"] == b"0"  # not refused: no slot was kept
            assert served.server._live_calls == 0
            await client.close()

    run(scenario())


def test_a_handler_that_ignores_its_deadline_is_answered_at_the_deadline_and_keeps_its_slot_till_it_ends():
    release = asyncio.Event()
    started = asyncio.Event()

    async def stubborn(request, context):
        started.set()
        while True:
            try:
                await release.wait()
                return b"late"
            except asyncio.CancelledError:
                continue  # a handler that swallows its cancellation

    async def scenario():
        async with serving({PARK: grpc.unary_unary_rpc_method_handler(stubborn)}) as served:
            client = await H2SocketClient.connect(served.path)
            stream_id = client.open(PARK, [("grpc-timeout", "50m")])
            client.message(stream_id, b"")
            await client.send()
            answer = await client.answer(stream_id)
            assert answer[b"grpc-status"] == b"4"
            assert served.server._live_calls == 1  # still running: it counts (Go's rule for reset handlers)
            release.set()
            await client.sync()
            await client.sync()
            assert served.server._live_calls == 0
            await client.close()

    run(scenario())


def test_a_connection_closed_under_parked_calls_cancels_and_releases_them_all():
    parked = Parked()

    async def scenario():
        async with serving(handlers(parked)) as served:
            client = await H2SocketClient.connect(served.path)
            await park(client, 50, [("grpc-timeout", "100S")])
            await client.sync()
            assert served.server._live_calls == 50
            await client.close()
            await bounded(parked.cancelled.wait())
            other = await H2SocketClient.connect(served.path)
            await other.sync()  # the loop went round: every cancelled handler ended
            assert served.server._live_calls == 0
            assert len(served.server._connections) == 1
            await other.close()

    run(scenario())


def test_calls_beyond_the_connections_limit_are_refused_and_the_others_go_on(monkeypatch):
    monkeypatch.setattr(server_module, "CONCURRENT_CALLS", 3)

    async def scenario():
        async with serving(handlers()) as served:
            client = await H2SocketClient.connect(served.path)
            *_, refused = await park(client, 4)
            while not (resets := [e for e in client.events
                                  if isinstance(e, h2.events.StreamReset) and e.stream_id == refused]):
                await client.read_once()
            assert [e.error_code for e in resets] == [h2.errors.ErrorCodes.REFUSED_STREAM]
            await client.close()

    run(scenario())


def test_calls_beyond_the_servers_limit_are_answered_resource_exhausted(monkeypatch):
    monkeypatch.setattr(server_module, "SERVER_CALLS", 4)

    async def scenario():
        async with serving(handlers()) as served:
            first, second = await H2SocketClient.connect(served.path), await H2SocketClient.connect(served.path)
            for client in (first, second):
                await park(client, 2)
                await client.sync()
            answer = await echoed(second)
            assert answer[b"grpc-status"] == b"8"
            assert answer[b"grpc-message"] == b"the server has too many calls in flight"
            await first.close()
            await second.close()

    run(scenario())


def test_connections_beyond_the_limit_get_goaway_enhance_your_calm_and_are_closed(monkeypatch):
    monkeypatch.setattr(server_module, "SERVER_CONNECTIONS", 2)

    async def scenario():
        async with serving(handlers()) as served:
            kept = [await H2SocketClient.connect(served.path) for _ in range(2)]
            for client in kept:
                await client.sync()
            extra = await H2SocketClient.connect(served.path)
            while not extra.closed:
                await extra.read_once()
            (goaway,) = [e for e in extra.events if isinstance(e, h2.events.ConnectionTerminated)]
            assert goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
            assert goaway.additional_data == b"too many connections"
            assert (await echoed(kept[0]))[b"grpc-status"] == b"0"
            for client in kept:
                await client.close()

    run(scenario())


def test_metadata_over_the_limit_ends_that_call_alone():
    async def scenario():
        async with serving(handlers()) as served:
            client = await H2SocketClient.connect(served.path)
            await client.sync()
            big = client.open(ECHO, [(f"x-m{n}", "v" * 1000) for n in range(100)])  # 100 KiB decoded
            client.message(big, b"")
            await client.send()
            answer = await client.answer(big)
            assert answer[b"grpc-status"] == b"8"
            assert answer[b"grpc-message"].startswith(b"received metadata size exceeds limit")
            assert (await echoed(client))[b"grpc-status"] == b"0"  # the connection goes on
            await client.close()

    run(scenario())


def test_request_bytes_a_connection_holds_are_bounded_the_call_crossing_the_limit_ends(monkeypatch):
    monkeypatch.setattr(server_module, "CONNECTION_INBOUND_BYTES", 300_000)
    chunk = b"p" * 16_000

    async def scenario():
        async with serving(handlers()) as served:
            client = await H2SocketClient.connect(served.path)
            await client.sync()  # the server's windows are known
            stream_ids = []
            for _ in range(4):  # each sends 100 KB of a 1 MB message, and waits
                stream_id = client.open(ECHO)
                client.h2.send_data(stream_id, b"\0" + (1_000_000).to_bytes(4, "big"))
                for _ in range(6):
                    client.h2.send_data(stream_id, chunk)
                stream_ids.append(stream_id)
            await client.send()
            await client.sync()
            answer = await client.answer(stream_ids[3])
            assert answer[b"grpc-status"] == b"8"
            assert b"hold more request bytes" in answer[b"grpc-message"]
            assert (await echoed(client))[b"grpc-status"] == b"0"
            await client.close()

    run(scenario())


def test_a_client_that_sends_no_preface_is_closed_after_the_preface_timeout(monkeypatch):
    monkeypatch.setattr(server_module, "PREFACE_TIMEOUT_S", 0.2)

    async def scenario():
        async with serving(handlers()) as served:
            reader, writer = await asyncio.open_unix_connection(served.path)
            while await bounded(reader.read(4096)):  # the server's SETTINGS, then its GOAWAY, then the end
                pass
            writer.close()

    run(scenario())


def test_an_idle_connection_is_told_goaway_and_closed_and_a_busy_one_is_not(monkeypatch):
    monkeypatch.setattr(server_module, "IDLE_TIMEOUT_S", 0.3)
    parked = Parked()

    async def scenario():
        async with serving(handlers(parked)) as served:
            busy = await H2SocketClient.connect(served.path)
            await park(busy, 1)
            idle = await H2SocketClient.connect(served.path)
            await idle.sync()
            while not idle.closed:
                await idle.read_once()
            (goaway,) = [e for e in idle.events if isinstance(e, h2.events.ConnectionTerminated)]
            assert goaway.error_code == h2.errors.ErrorCodes.NO_ERROR
            assert (await echoed(busy))[b"grpc-status"] == b"0"  # its parked call kept it from being idle
            await busy.close()

    run(scenario())


def test_server_streams_to_a_client_that_opens_no_window_queue_at_most_the_connections_write_backlog():
    message = b"m" * 65_536
    started = []

    async def chatty(request, context):
        started.append(True)
        while True:
            yield message

    async def scenario():
        async with serving({PARK: grpc.unary_stream_rpc_method_handler(chatty)}) as served:
            client = await H2SocketClient.connect(served.path)  # h2 opens no window beyond the first 64 KiB
            for _ in range(64):
                client.message(client.open(PARK), b"")
            await client.send()
            await client.sync()
            assert len(started) == 64
            (connection,) = served.server._connections
            # Without the connection's bound: 64 handlers x 1 MiB of their own backlog.
            assert connection.h2.queued_bytes <= limits.CONNECTION_WRITE_BACKLOG + len(message) + 5
            assert len(connection.blocked_writers) == 64
            await client.close()

    run(scenario())
