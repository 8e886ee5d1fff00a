"""The daemon's gRPC client (shim/rpc/client.py): the life of its one connection to the runtime, through real
sockets against grpcio's aio server. Not listening -> UNAVAILABLE at once and retries spaced by the backoff (on the
loop's clock, moved by the test: no sleeps), a restarted runtime, a connection lost mid-call, GOAWAY.
"""

from __future__ import annotations

import asyncio
import shutil
import struct
import tempfile

import grpc
import pytest

from shim.rpc import client as client_module
from shim.rpc.client import Channel
from shim.rpc.client_rules import backoff_s, timeout_text
from shim.rpc.h2_frames import END_HEADERS, GOAWAY, HEADERS, PROTOCOL_ERROR, SETTINGS, frame
from tests.unit.test_rpc_client_channel import (
    UNARY, DialCounter, Methods, Parked, bounded, call_error, echo, rpc_error, run, runtime,
)


class LoopClock:
    """Moves the running loop's clock forward (its timers fire early, which these tests do not mind)."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._real = self._loop.time
        self._offset = 0.0
        self._loop.time = lambda: self._real() + self._offset  # type: ignore[method-assign]

    def now(self) -> float:
        return self._loop.time()

    def move_to(self, when: float) -> None:
        self._offset += max(0.0, when - self.now())


class Events:
    """Set when the channel's connections see a GOAWAY or are lost (wrapping the protocol's callbacks)."""

    def __init__(self, monkeypatch) -> None:
        self.goaway, self.lost = asyncio.Event(), asyncio.Event()
        ended, lost = client_module._Connection._ended, client_module._Connection.connection_lost

        def on_ended(connection, event):
            ended(connection, event)
            self.goaway.set()

        def on_lost(connection, exc):
            lost(connection, exc)
            self.lost.set()
        monkeypatch.setattr(client_module._Connection, "_ended", on_ended)
        monkeypatch.setattr(client_module._Connection, "connection_lost", on_lost)


@pytest.fixture
def sockdir():
    path = tempfile.mkdtemp(prefix="grpccli-")  # tmp_path can exceed a unix socket path's 108 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_runtime_not_listening_is_unavailable_at_once_and_retries_are_spaced_by_the_backoff(sockdir):
    async def scenario():
        clock, dials = LoopClock(), DialCounter()
        channel = Channel(f"unix:{sockdir}/absent.sock", jitter_source=lambda: 0.5)  # the middle: no jitter
        # The kubelet's CRI client: 100 ms, times 1.6, at most 3 s.
        expected_waits = [0.1, 0.16, 0.256, 0.4096, 0.65536, 1.048576, 1.6777216, 2.68435456, 3.0, 3.0]
        before = clock.now()
        error = await call_error(channel.unary(UNARY, b""))
        after = clock.now()  # the retry time is between before + wait and after + wait
        assert error.code is grpc.StatusCode.UNAVAILABLE and "absent.sock" in error.details
        assert dials.count == 1
        for attempt, wait in enumerate(expected_waits, start=2):
            clock.move_to(before + wait - 0.05)  # short of the retry time: failing at once, no connect
            assert (await call_error(channel.unary(UNARY, b""))).code is grpc.StatusCode.UNAVAILABLE
            assert dials.count == attempt - 1
            clock.move_to(after + wait)  # at it: one connect, failing again
            before = clock.now()
            assert (await call_error(channel.unary(UNARY, b""))).code is grpc.StatusCode.UNAVAILABLE
            after = clock.now()
            assert dials.count == attempt
        await channel.close()
    run(scenario())


def test_a_restarted_runtime_on_the_same_path_is_used_after_the_backoff(sockdir, monkeypatch):
    async def scenario():
        events = Events(monkeypatch)
        clock, dials = LoopClock(), DialCounter()
        async with runtime(Methods(unary=echo), directory=sockdir) as first:
            channel = Channel(first.target, jitter_source=lambda: 0.5)
            assert (await bounded(channel.unary(UNARY, b"1")))[1] == b"1"
            await first.server.stop(None)
            await bounded(events.lost.wait())
        error = await call_error(channel.unary(UNARY, b"2"))  # a new connection, refused
        assert error.code is grpc.StatusCode.UNAVAILABLE and dials.count == 2
        failed = clock.now()
        async with runtime(Methods(unary=echo), directory=sockdir):
            assert (await call_error(channel.unary(UNARY, b"3"))).code is grpc.StatusCode.UNAVAILABLE
            assert dials.count == 2  # still backing off: the runtime is not tried before its time
            clock.move_to(failed + backoff_s(1, 0.5) + 0.001)
            assert (await bounded(channel.unary(UNARY, b"4")))[1] == b"4"
            assert (await bounded(channel.unary(UNARY, b"5")))[1] == b"5"
            assert dials.count == 3
            await channel.close()
    run(scenario())


class Relay:
    """A unix socket that pipes each connection to the runtime's; `cut()` drops them all without a word."""

    def __init__(self, path: str, upstream: str) -> None:
        self.path, self._upstream = path, upstream
        self._transports: list[asyncio.BaseTransport] = []
        self._server: asyncio.AbstractServer | None = None

    async def __aenter__(self) -> Relay:
        self._server = await asyncio.start_unix_server(self._serve, self.path)
        return self

    async def __aexit__(self, *exc) -> None:
        self.cut()
        self._server.close()

    def cut(self) -> None:
        for transport in self._transports:
            transport.abort()
        self._transports.clear()

    async def _serve(self, reader, writer) -> None:
        up_reader, up_writer = await asyncio.open_unix_connection(self._upstream)
        self._transports += [writer.transport, up_writer.transport]
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer), return_exceptions=True)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


def test_a_connection_lost_mid_call_is_unavailable_as_grpcio_sees_it_and_the_next_call_reconnects(sockdir):
    parked, arrived, both_arrived = Parked(), [], asyncio.Event()

    async def handler(request, context):
        arrived.append(request)
        if len(arrived) == 2:
            both_arrived.set()
        return await parked.handle(request, context)

    async def scenario():
        async with runtime(Methods(unary=handler), directory=sockdir) as rt, \
                Relay(f"{sockdir}/relay.sock", rt.target[len("unix:"):]) as relay:
            channel = Channel(f"unix:{relay.path}")
            async with grpc.aio.insecure_channel(f"unix:{relay.path}") as reference:
                ours = asyncio.ensure_future(channel.unary(UNARY, b""))
                theirs = reference.unary_unary(UNARY)(b"")
                await bounded(both_arrived.wait())  # both calls reached the runtime
                relay.cut()
                error = await call_error(ours)
                reference_error = await rpc_error(theirs)
                assert error.code is reference_error.code() is grpc.StatusCode.UNAVAILABLE
                await bounded(parked.cancelled.wait())  # the runtime saw its connection go
                parked.release.set()
                assert (await bounded(channel.unary(UNARY, b"")))[1] == b"done"
            await channel.close()
    run(scenario())


def test_goaway_lets_the_call_in_flight_finish_and_the_next_call_opens_a_new_connection(sockdir, monkeypatch):
    parked = Parked()

    async def scenario():
        events, dials = Events(monkeypatch), DialCounter()
        async with runtime(Methods(unary=parked.handle), directory=sockdir) as first:
            channel = Channel(first.target)
            in_flight = asyncio.ensure_future(channel.unary(UNARY, b""))
            await bounded(parked.started.wait())
            stopping = asyncio.ensure_future(first.server.stop(grace=30))
            await bounded(events.goaway.wait())
            parked.release.set()
            assert (await bounded(in_flight))[1] == b"done"
            await bounded(stopping)
        async with runtime(Methods(unary=echo), directory=sockdir):
            assert (await bounded(channel.unary(UNARY, b"next")))[1] == b"next"
        assert dials.count == 2
        await channel.close()
    run(scenario())


def test_a_caller_cancelled_while_connecting_leaves_no_stale_connection_behind(sockdir, monkeypatch):
    async def scenario():
        events = Events(monkeypatch)
        loop = asyncio.get_running_loop()
        dial, dialing, gate = loop.create_unix_connection, asyncio.Event(), asyncio.Event()

        async def slow_dial(*args, **kwargs):
            dialing.set()
            await gate.wait()
            return await dial(*args, **kwargs)
        loop.create_unix_connection = slow_dial
        async with runtime(Methods(unary=echo), directory=sockdir) as first:
            channel = Channel(first.target)
            cancelled = asyncio.ensure_future(channel.unary(UNARY, b""))
            await bounded(dialing.wait())
            cancelled.cancel()
            with pytest.raises(asyncio.CancelledError):
                await cancelled
            gate.set()
            await bounded(asyncio.wait({channel._connecting}))  # the connection opens with no caller waiting
            await first.server.stop(None)
            await bounded(events.lost.wait())
        async with runtime(Methods(unary=echo), directory=sockdir):
            assert (await bounded(channel.unary(UNARY, b"after", timeout_s=5)))[1] == b"after"
        await channel.close()
    run(scenario())


def test_a_runtime_that_accepts_and_hangs_up_is_unavailable(sockdir):
    async def hang_up(reader, writer):
        writer.close()

    async def scenario():
        server = await asyncio.start_unix_server(hang_up, f"{sockdir}/rude.sock")
        channel = Channel(f"unix:{sockdir}/rude.sock")
        for _ in range(3):
            assert (await call_error(channel.unary(UNARY, b""))).code is grpc.StatusCode.UNAVAILABLE
        await channel.close()
        server.close()
    run(scenario())


def test_the_deadline_counts_the_time_spent_connecting(sockdir):
    async def scenario():
        loop = asyncio.get_running_loop()
        dialing = asyncio.Event()

        async def stuck_dial(*args, **kwargs):  # a runtime whose socket never accepts
            dialing.set()
            await asyncio.Event().wait()
        loop.create_unix_connection = stuck_dial
        channel = Channel(f"unix:{sockdir}/stuck.sock")
        started = loop.time()
        error = await call_error(channel.unary(UNARY, b"", timeout_s=0.2))
        assert error.code is grpc.StatusCode.DEADLINE_EXCEEDED and dialing.is_set()
        assert loop.time() - started < client_module.CONNECT_TIMEOUT_S
        await channel.close()
    run(scenario())


def test_the_backoff_grows_by_1_6_to_3_s_and_is_spread_by_20_percent():
    assert [round(backoff_s(failures, 0.5), 4) for failures in (1, 2, 3, 9, 10, 50)] == [
        0.1, 0.16, 0.256, 3.0, 3.0, 3.0]
    assert backoff_s(1, 0.0) == pytest.approx(0.08) and backoff_s(1, 0.999999) == pytest.approx(0.12)
    assert backoff_s(20, 0.0) == pytest.approx(2.4) and backoff_s(20, 0.999999) == pytest.approx(3.6)


def test_a_runtime_breaking_the_protocol_gets_goaway_protocol_error_and_the_call_unavailable(sockdir):
    received = bytearray()
    closed = asyncio.Event()

    async def rude(reader, writer):  # once a request is in: HEADERS on a stream the client never opened
        writer.write(frame(SETTINGS, 0, 0))
        while UNARY.encode() not in received and (data := await reader.read(65536)):  # literals: the path as is
            received.extend(data)
        writer.write(frame(HEADERS, END_HEADERS, 7, b"\x88"))
        while data := await reader.read(65536):
            received.extend(data)
        closed.set()

    async def scenario():
        server = await asyncio.start_unix_server(rude, f"{sockdir}/rude.sock")
        channel = Channel(f"unix:{sockdir}/rude.sock")
        error = await call_error(channel.unary(UNARY, b"", timeout_s=5))
        assert error.code is grpc.StatusCode.UNAVAILABLE and "GOAWAY 1" in error.details
        await bounded(closed.wait())
        goaway = received.find(bytes([GOAWAY, 0, 0, 0, 0, 0]), 3)  # type, flags, stream 0 after a 3-byte length
        assert goaway > 0 and received[goaway + 6 + 4:goaway + 6 + 8] == struct.pack(">L", PROTOCOL_ERROR)
        await channel.close()
        server.close()
    run(scenario())


def test_timeout_text_is_grpc_gos_for_the_seconds_rounded_to_nanoseconds():
    """The encoding is grpc_wire_rules.encode_timeout's (tested there); here the seconds it is given."""
    assert timeout_text(0.25) == b"250000u"
    assert timeout_text(0.067) == b"67000000n"  # 67000000.00000001 ns as a float: not rounded up to 67000001n
    assert timeout_text(0) == timeout_text(-1) == b"0n"
    assert timeout_text(10**12) == timeout_text(float("inf")) == b"2562048H"  # past a Go Duration: the longest
