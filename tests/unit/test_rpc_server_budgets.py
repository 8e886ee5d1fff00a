"""What a client can make the server's HTTP/2 side hold, and the budgets that end an abusing connection
(shim/rpc/h2_server.py, shim/rpc/limits.py): sans-IO, on a fake clock, with frames built by hand (h2's client
would refuse to send most of them). The same attacks against the real daemon over its socket are in
tests/hardening/test_socket_abuse.py."""

from __future__ import annotations

import struct

import hpack
import pytest

from shim.rpc import h2_server as hc
from shim.rpc import limits
from shim.rpc.h2_server import ConnectionEnded, DataReceived, ServerConnection, StreamOpened, StreamReset, frame
from shim.rpc.limits import Budget, PingPolicy
from tests.support.h2_pair import parse_frames

REQUEST = [(":method", "POST"), (":scheme", "http"), (":path", "/p.S/M"), (":authority", "x"),
           ("content-type", "application/grpc"), ("te", "trailers")]
BLOCK = hpack.Encoder().encode(REQUEST)  # literals without indexing: the same bytes open any stream


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def server(clock) -> ServerConnection:
    connection = ServerConnection(clock=clock)
    assert connection.receive(hc.PREFACE + frame(hc.SETTINGS, 0, 0)) == []
    connection.data_to_send()
    connection.written()
    return connection


def headers(stream_id: int, *, end_stream: bool = False, block: bytes = BLOCK) -> bytes:
    """HEADERS, and CONTINUATIONs for a block over a frame's size."""
    size = hc.DEFAULT_FRAME_SIZE
    pieces = [block[offset:offset + size] for offset in range(0, len(block), size)]
    last = len(pieces) - 1
    flags = (hc.END_STREAM if end_stream else 0) | (hc.END_HEADERS if last == 0 else 0)
    return frame(hc.HEADERS, flags, stream_id, pieces[0]) + b"".join(
        frame(hc.CONTINUATION, hc.END_HEADERS if index == last else 0, stream_id, piece)
        for index, piece in enumerate(pieces) if index)


def rst(stream_id: int, code: int = hc.CANCEL) -> bytes:
    return frame(hc.RST_STREAM, 0, stream_id, struct.pack(">L", code))


def goaway(server: ServerConnection) -> tuple[int, bytes] | None:
    for kind, _, _, payload in parse_frames(server.data_to_send()):
        if kind == hc.GOAWAY:
            return struct.unpack(">L", payload[4:8])[0], payload[8:]
    return None


def ended(events) -> ConnectionEnded | None:
    return next((event for event in events if isinstance(event, ConnectionEnded)), None)


# --- the counters ---------------------------------------------------------------------------------------------------


def test_a_budget_allows_its_burst_then_refills_at_its_rate():
    budget = Budget(burst=3, per_second=2.0)
    assert [budget.spend(0.0) for _ in range(4)] == [True, True, True, False]
    assert budget.spend(1.0)  # two tokens back after a second, one of them owed
    assert not budget.spend(1.0)
    assert [budget.spend(100.0) for _ in range(4)] == [True, True, True, False]  # never more than the burst


def test_the_ping_policy_is_grpc_gos_two_strikes_then_out():
    policy = PingPolicy()
    assert policy.received(0.0, calls_open=True)  # the first ping is never a strike
    assert policy.received(1.0, calls_open=True)  # strike 1
    assert policy.received(2.0, calls_open=True)  # strike 2
    assert not policy.received(3.0, calls_open=True)


def test_pings_further_apart_than_the_minimum_are_no_strikes():
    policy = PingPolicy()
    now = 0.0
    for _ in range(10):
        assert policy.received(now, calls_open=True)
        now += limits.PING_MIN_INTERVAL_S
    # Without a call open, the minimum is grpc-go's two hours.
    assert policy.received(now + 1, calls_open=False)
    assert policy.received(now + 2, calls_open=False)
    assert not policy.received(now + 3, calls_open=False)


def test_data_sent_forgives_the_strikes_of_bandwidth_probing_pings():
    policy = PingPolicy()
    for second in range(100):  # grpc's BDP ping after each burst of data the server sent
        policy.sent_data()
        assert policy.received(float(second), calls_open=True)


# --- rapid reset, made-you-reset ------------------------------------------------------------------------------------


def test_rapid_reset_ends_the_connection_with_enhance_your_calm_after_the_burst(server):
    events = server.receive(b"".join(headers(2 * n + 1) + rst(2 * n + 1) for n in range(limits.RESET_BURST + 1)))
    assert ended(events).error_code == hc.ENHANCE_YOUR_CALM
    assert sum(isinstance(event, StreamReset) for event in events) == limits.RESET_BURST
    assert goaway(server)[0] == hc.ENHANCE_YOUR_CALM
    assert server.receive(headers(10_001)) == []  # nothing more is read


def test_resets_at_the_budgets_rate_go_on_for_ever(server, clock):
    stream_id = 1
    for _ in range(50):
        batch = b"".join(headers(stream_id + 2 * n) + rst(stream_id + 2 * n) for n in range(100))
        stream_id += 200
        assert ended(server.receive(batch)) is None
        clock.now += 100 / limits.RESETS_PER_S


def test_streams_the_client_makes_the_server_reset_count_against_the_same_budget(server):
    # WINDOW_UPDATE of 0 on an open stream: a stream error the server answers with RST_STREAM (made-you-reset).
    zero = struct.pack(">L", 0)
    data = b"".join(headers(2 * n + 1) + frame(hc.WINDOW_UPDATE, 0, 2 * n + 1, zero)
                    for n in range(limits.RESET_BURST + 1))
    events = server.receive(data)
    assert ended(events).error_code == hc.ENHANCE_YOUR_CALM
    assert {event.code for event in events if isinstance(event, StreamReset)} == {hc.PROTOCOL_ERROR}


def test_data_after_the_clients_end_of_stream_is_a_made_you_reset(server):
    data = b"".join(headers(2 * n + 1, end_stream=True) + frame(hc.DATA, 0, 2 * n + 1, b"x")
                    for n in range(limits.RESET_BURST + 1))
    events = server.receive(data)
    assert ended(events).error_code == hc.ENHANCE_YOUR_CALM
    assert {event.code for event in events if isinstance(event, StreamReset)} == {hc.STREAM_CLOSED}


def test_frames_in_flight_on_a_stream_just_reset_are_no_glitches(server):
    server.receive(headers(1) + rst(1))
    for _ in range(3 * limits.GLITCH_BURST):  # a large request's DATA, its WINDOW_UPDATEs and a late RST_STREAM
        assert server.receive(frame(hc.DATA, 0, 1, b"d" * 100) + frame(hc.WINDOW_UPDATE, 0, 1, b"\0\0\0\1")
                              + rst(1)) == []


# --- glitches -------------------------------------------------------------------------------------------------------

GLITCHES = {
    "SETTINGS": frame(hc.SETTINGS, 0, 0),
    "PRIORITY": frame(hc.PRIORITY, 0, 1, b"\0\0\0\0\x10"),
    "an unknown frame type": frame(0xEE, 0, 0, b""),
    "a PING acknowledgement never asked for": frame(hc.PING, hc.ACK, 0, b"\0" * 8),
}


@pytest.mark.parametrize("glitch", GLITCHES.values(), ids=GLITCHES.keys())
def test_a_flood_of_frames_that_do_nothing_ends_the_connection(server, glitch):
    events = server.receive(glitch * (limits.GLITCH_BURST + 1))
    assert ended(events).error_code == hc.ENHANCE_YOUR_CALM


def test_empty_data_frames_on_an_open_stream_end_the_connection(server):
    events = server.receive(headers(1) + frame(hc.DATA, 0, 1) * (limits.GLITCH_BURST + 1))
    assert ended(events).error_code == hc.ENHANCE_YOUR_CALM


def test_empty_continuation_frames_end_the_connection(server):
    events = server.receive(frame(hc.HEADERS, 0, 1, BLOCK) + frame(hc.CONTINUATION, 0, 1) * (limits.GLITCH_BURST + 1))
    assert ended(events).error_code == hc.ENHANCE_YOUR_CALM


def test_the_clients_first_settings_and_an_empty_data_that_ends_a_request_are_no_glitches(server):
    for n in range(2 * limits.GLITCH_BURST):
        events = server.receive(headers(2 * n + 1) + frame(hc.DATA, hc.END_STREAM, 2 * n + 1))
        assert ended(events) is None


# --- pings ----------------------------------------------------------------------------------------------------------


def test_the_third_ping_in_a_row_ends_the_connection_too_many_pings(server):
    ping = frame(hc.PING, 0, 0, b"12345678")
    assert ended(server.receive(ping * 3)) is None
    events = server.receive(ping)
    assert ended(events).error_code == hc.ENHANCE_YOUR_CALM
    assert goaway(server) == (hc.ENHANCE_YOUR_CALM, b"too_many_pings")


def test_pings_after_the_server_sent_data_are_answered_for_ever(server):
    server.receive(headers(1))
    for _ in range(20):
        server.send_headers(1, b"\x88")  # what the server sends forgives
        server.send_data(1, b"x")
        assert ended(server.receive(frame(hc.PING, 0, 0, b"12345678"))) is None
        assert (hc.PING, hc.ACK, 0, b"12345678") in parse_frames(server.data_to_send())


# --- what the client does not read ----------------------------------------------------------------------------------


def test_answers_a_client_leaves_unread_end_the_connection_past_the_induced_limit(server, clock):
    settings = frame(hc.SETTINGS, 0, 0)
    for _ in range(limits.INDUCED_FRAMES // 500):  # under the glitch budget's rate: only the unread answers count
        assert ended(server.receive(settings * 500)) is None
        clock.now += 500 / limits.GLITCHES_PER_S
    events = server.receive(settings)
    assert ended(events).error_code == hc.ENHANCE_YOUR_CALM


def test_answers_that_reached_the_socket_do_not_count(server, clock):
    settings = frame(hc.SETTINGS, 0, 0)
    for _ in range(3 * limits.INDUCED_FRAMES // 500):
        assert ended(server.receive(settings * 500)) is None
        server.data_to_send()
        server.written()
        clock.now += 500 / limits.GLITCHES_PER_S


# --- flow control ---------------------------------------------------------------------------------------------------


def test_the_windows_are_given_back_as_data_is_consumed_not_as_it_arrives(server):
    server.receive(headers(1))
    chunk = b"d" * hc.DEFAULT_FRAME_SIZE
    count = hc.STREAM_WINDOW // len(chunk)
    events = server.receive(frame(hc.DATA, 0, 1, chunk) * count)
    assert sum(len(event.data) for event in events if isinstance(event, DataReceived)) == hc.STREAM_WINDOW
    assert parse_frames(server.data_to_send()) == []  # nothing consumed: no WINDOW_UPDATE
    server.consume(1, hc.STREAM_WINDOW // 2)
    updates = [(stream, payload) for kind, _, stream, payload in parse_frames(server.data_to_send())
               if kind == hc.WINDOW_UPDATE]
    assert updates == [(1, struct.pack(">L", hc.STREAM_WINDOW // 2))]


def test_data_beyond_the_streams_window_resets_it(server):
    server.receive(headers(1))
    chunk = b"d" * hc.DEFAULT_FRAME_SIZE
    events = server.receive(frame(hc.DATA, 0, 1, chunk) * (hc.STREAM_WINDOW // len(chunk) + 1))
    assert [event.code for event in events if isinstance(event, StreamReset)] == [hc.FLOW_CONTROL_ERROR]


def test_data_beyond_the_connections_window_ends_the_connection(server):
    chunk = b"d" * hc.DEFAULT_FRAME_SIZE
    per_stream = hc.STREAM_WINDOW // len(chunk)
    data = b"".join(headers(2 * n + 1) + frame(hc.DATA, 0, 2 * n + 1, chunk) * per_stream
                    for n in range(hc.CONNECTION_WINDOW // hc.STREAM_WINDOW))
    assert ended(server.receive(data)) is None
    events = server.receive(headers(99) + frame(hc.DATA, 0, 99, b"x"))
    assert ended(events).error_code == hc.FLOW_CONTROL_ERROR


def test_a_window_update_wakes_only_the_stream_it_opens(server):
    server.receive(frame(hc.WINDOW_UPDATE, 0, 0, struct.pack(">L", 1 << 20)))  # only the streams' windows hold
    for stream_id in (1, 3, 5):
        server.receive(headers(stream_id))
        server.send_headers(stream_id, b"\x88")
        server.send_data(stream_id, b"x" * (hc.DEFAULT_WINDOW + 10))  # 10 bytes wait for the stream's window
    server.data_to_send()
    events = server.receive(frame(hc.WINDOW_UPDATE, 0, 3, struct.pack(">L", 100)))
    assert events == [hc.WindowOpened(3)]
    assert server.backlog(3) == 0 and server.backlog(1) == server.backlog(5) == 10


# --- the start, header lists ----------------------------------------------------------------------------------------


def test_a_preface_not_followed_by_settings_ends_the_connection():
    server = ServerConnection()
    events = server.receive(hc.PREFACE + frame(hc.PING, 0, 0, b"12345678"))
    assert ended(events).error_code == hc.PROTOCOL_ERROR


def test_a_header_list_over_the_limit_is_reported_with_its_size_and_the_hpack_table_stays_in_step(server):
    encoder = hpack.Encoder()
    # Over the limit decoded, in fields the dynamic table takes in: a decoder that stopped early would fall behind.
    big = [(f"x-big-{n}", "v" * 250) for n in range(300)]
    (opened,) = server.receive(headers(1, block=encoder.encode(REQUEST + big)))
    assert isinstance(opened, StreamOpened) and opened.header_list_size > limits.HEADER_LIST_BYTES
    block = encoder.encode(REQUEST + big[-3:])  # indexed: the last fields are in both tables
    assert len(block) < 50
    (second,) = server.receive(headers(3, block=block))
    assert second.headers[-3:] == [(name.encode(), value.encode()) for name, value in big[-3:]]
    assert second.header_list_size < 2000


def test_streams_the_server_refuses_over_its_calls_limit_count_against_the_reset_budget(server):
    opened = server.receive(b"".join(headers(2 * n + 1) for n in range(limits.RESET_BURST + 1)))
    for event in opened:
        server.refuse(event.stream_id)  # what server.py does past CONCURRENT_CALLS
    assert server.closed is not None and server.closed.error_code == hc.ENHANCE_YOUR_CALM
