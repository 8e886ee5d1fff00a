"""The client side of the daemon's HTTP/2 connection (shim/rpc/h2_client.py) against python-hyper's h2 as the
server (the reference peer).

No sockets: what the client queues goes into h2's `receive_data`, which raises on anything RFC 9113 forbids, and
what h2's server sends goes into the client's `receive`. Frames h2 will not send (a server breaking the rules) are
built by hand with `frame()`.
"""

from __future__ import annotations

import struct

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
import pytest

from shim.rpc import grpc_wire
from shim.rpc import h2_frames as frames
from shim.rpc import h2_server as hc
from shim.rpc.h2_client import ClientConnection, ResponseHeaders
from shim.rpc.h2_server import ConnectionEnded, DataReceived, StreamReset, frame
from tests.support.h2_pair import PumpedPair, parse_frames

Codes = h2.settings.SettingCodes
REQUEST = b"".join(grpc_wire.literal(name, value) for name, value in (
    (b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/pkg.Service/Method"), (b":authority", b"localhost"),
    (b"content-type", b"application/grpc"), (b"te", b"trailers")))
RESPONSE_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]


class Pair(PumpedPair):
    """A ClientConnection and h2's server. The client's side consumes the DATA it reads, as a caller that reads
    every message does."""

    def __init__(self, *, server_settings: dict | None = None, consuming: bool = True) -> None:
        super().__init__()
        self.consuming = consuming
        self.server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        if server_settings:  # announced in the server's first SETTINGS
            self.server.local_settings = h2.settings.Settings(client=False, initial_values=server_settings)
        self.server.initiate_connection()
        self.client = ClientConnection()

    def to_server(self, data: bytes) -> list:
        return self.server.receive_data(data)

    def to_client(self, data: bytes) -> list:
        events = self.client.receive(data)
        if self.consuming:
            for event in events:
                if isinstance(event, DataReceived):
                    self.client.consume(event.stream_id, len(event.data))
        return events

    def request(self, body: bytes = b"\x00\x00\x00\x00\x02hi", block: bytes = REQUEST) -> int:
        stream_id = self.client.open_stream(block, body)
        self.pump()
        return stream_id

    def received_body(self, stream_id: int) -> bytes:
        return b"".join(e.data for e in self.take_server(h2.events.DataReceived) if e.stream_id == stream_id)


@pytest.fixture
def pair() -> Pair:
    connected = Pair()
    connected.pump()
    connected.take_server(h2.events.RemoteSettingsChanged)
    connected.take_server(h2.events.SettingsAcknowledged)
    connected.take_server(h2.events.WindowUpdated)
    return connected


# --- the connection's start ---------------------------------------------------------------------------------------


def test_the_client_sends_the_preface_then_settings_and_both_sides_acknowledge():
    connected = Pair()
    first = connected.client.data_to_send()
    assert first.startswith(hc.PREFACE)
    assert parse_frames(first[len(hc.PREFACE):])[0][0] == hc.SETTINGS
    connected.server_events += connected.server.receive_data(first)
    connected.pump()
    (client_settings,) = connected.take_server(h2.events.RemoteSettingsChanged)
    changed = {key: setting.new_value for key, setting in client_settings.changed_settings.items()}
    assert changed[Codes.ENABLE_PUSH] == 0
    assert changed[Codes.INITIAL_WINDOW_SIZE] == frames.STREAM_WINDOW
    assert connected.take_server(h2.events.SettingsAcknowledged)  # the client acknowledged the server's SETTINGS
    assert connected.server.outbound_flow_control_window == frames.CONNECTION_WINDOW
    assert connected.client_events == []


def test_ping_from_the_server_is_acknowledged_with_its_payload(pair):
    pair.server.ping(b"87654321")
    pair.pump()
    (ack,) = pair.take_server(h2.events.PingAckReceived)
    assert ack.ping_data == b"87654321"


# --- requests -----------------------------------------------------------------------------------------------------


def test_a_request_is_headers_then_data_with_end_stream(pair):
    stream_id = pair.request(b"\x00\x00\x00\x00\x05hello")
    assert stream_id == 1
    (received,) = pair.take_server(h2.events.RequestReceived)
    assert received.stream_id == 1 and (b":path", b"/pkg.Service/Method") in received.headers
    assert received.stream_ended is None  # the request goes on in DATA
    assert pair.received_body(1) == b"\x00\x00\x00\x00\x05hello"
    (ended,) = pair.take_server(h2.events.StreamEnded)
    assert ended.stream_id == 1


def test_streams_are_odd_and_increasing(pair):
    before = pair.client.streams_left
    assert [pair.request() for _ in range(3)] == [1, 3, 5]
    assert pair.client.streams_left == before - 3
    assert sorted(e.stream_id for e in pair.take_server(h2.events.StreamEnded)) == [1, 3, 5]


def test_new_streams_keep_to_the_server_max_concurrent_streams():
    connected = Pair(server_settings={Codes.MAX_CONCURRENT_STREAMS: 2})
    assert connected.client.may_open  # before the server's SETTINGS: no limit known
    connected.pump()
    first, _ = connected.request(), connected.request()
    assert not connected.client.may_open
    connected.server.send_headers(first, RESPONSE_HEADERS + [(b"grpc-status", b"0")], end_stream=True)
    connected.pump()
    assert connected.client.may_open  # the first stream closed on both sides


def test_stream_ids_used_up_is_a_connection_error_the_caller_sees():
    client = ClientConnection()
    client._next_stream_id = hc.MAX_WINDOW + 2  # past 2^31-1: no id left
    with pytest.raises(hc.ConnectionError_):
        client.open_stream(REQUEST, b"x")


def test_a_body_over_the_server_window_waits_for_window_update_and_ends_on_its_last_data():
    connected = Pair(server_settings={Codes.INITIAL_WINDOW_SIZE: 20_000})
    connected.pump()
    body = bytes(range(256)) * 400  # 102,400 bytes: over the stream window and the connection's 65,535
    stream_id = connected.client.open_stream(REQUEST, body)
    frames = parse_frames(connected.client.data_to_send())
    data = [(flags, payload) for kind, flags, _, payload in frames if kind == hc.DATA]
    assert [len(payload) for _, payload in data] == [16_384, 20_000 - 16_384]  # the window, split at 16 KiB
    assert not any(flags & hc.END_STREAM for flags, _ in data)
    connected.server_events += connected.server.receive_data(b"".join(frame(*f) for f in frames))
    received = connected.received_body(stream_id)
    while len(received) < len(body):
        connected.server.increment_flow_control_window(20_000, stream_id)
        connected.server.increment_flow_control_window(20_000)
        connected.pump()
        more = connected.received_body(stream_id)
        assert more, "the client sent nothing though the windows opened"
        received += more
    assert received == body
    (ended,) = connected.take_server(h2.events.StreamEnded)
    assert ended.stream_id == stream_id


def test_data_is_split_at_the_server_max_frame_size():
    connected = Pair(server_settings={Codes.INITIAL_WINDOW_SIZE: 1 << 20})
    connected.server.update_settings({Codes.MAX_FRAME_SIZE: 40_000})  # h2 reads larger frames once acknowledged
    connected.pump()
    connected.server.increment_flow_control_window(1 << 20)
    connected.pump()
    connected.client.open_stream(REQUEST, b"z" * 100_000)
    frames = parse_frames(connected.client.data_to_send())
    data = [(flags, len(payload)) for kind, flags, _, payload in frames if kind == hc.DATA]
    assert data == [(0, 40_000), (0, 40_000), (hc.END_STREAM, 20_000)]
    connected.server.receive_data(b"".join(frame(*f) for f in frames))  # h2 accepts the frames as they are


# --- responses ----------------------------------------------------------------------------------------------------


def test_response_headers_data_and_trailers_are_events_in_order(pair):
    stream_id = pair.request()
    pair.server.send_headers(stream_id, RESPONSE_HEADERS + [(b"x-initial", b"a")])
    pair.server.send_data(stream_id, b"\x00\x00\x00\x00\x03abc")
    pair.server.send_headers(stream_id, [(b"grpc-status", b"0"), (b"x-trailing", b"b")], end_stream=True)
    pair.pump()
    kinds = [(type(e).__name__, getattr(e, "ended", None)) for e in pair.client_events]
    assert kinds == [("ResponseHeaders", False), ("DataReceived", False), ("ResponseHeaders", True)]
    headers, data, trailers = pair.client_events
    assert (b"x-initial", b"a") in headers.headers
    assert data.data == b"\x00\x00\x00\x00\x03abc"
    assert (b"x-trailing", b"b") in trailers.headers and (b"grpc-status", b"0") in trailers.headers
    assert pair.client.open_streams == 0  # both sides ended


def test_trailers_only_is_one_ended_block(pair):
    stream_id = pair.request()
    pair.server.send_headers(stream_id, RESPONSE_HEADERS + [(b"grpc-status", b"5"), (b"grpc-message", b"gone")],
                             end_stream=True)
    pair.pump()
    (only,) = pair.client_events
    assert isinstance(only, ResponseHeaders) and only.ended and only.stream_id == stream_id
    assert (b"grpc-status", b"5") in only.headers


def test_a_response_header_block_in_continuation_frames_is_one_event(pair):
    stream_id = pair.request()
    big = [(b"x-big-%d" % index, b"v" * 200) for index in range(120)]  # ~25 KiB: HEADERS + CONTINUATION
    pair.server.send_headers(stream_id, RESPONSE_HEADERS + big)
    out = pair.server.data_to_send()
    assert hc.CONTINUATION in [kind for kind, *_ in parse_frames(out)]
    (headers,) = pair.client.receive(out)
    assert headers.headers[2:] == big and not headers.ended


def test_response_data_over_the_client_windows_keeps_them_open(pair):
    stream_id = pair.request()
    pair.server.send_headers(stream_id, RESPONSE_HEADERS)
    total = 20 * 1024 * 1024  # over the stream window (4 MiB) and the connection's (16 MiB)
    sent = 0
    chunk = b"d" * 16_384
    while sent < total:
        room = min(pair.server.local_flow_control_window(stream_id), total - sent)
        assert room > 0, f"the server's windows stayed shut after {sent} bytes"
        while room > 0:
            size = min(room, len(chunk))
            pair.server.send_data(stream_id, chunk[:size])
            room -= size
            sent += size
        pair.pump()
    received = sum(len(e.data) for e in pair.take_client(DataReceived))
    assert received == total


def test_server_reset_is_an_event_with_its_code(pair):
    stream_id = pair.request()
    pair.server.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
    pair.pump()
    assert pair.client_events == [StreamReset(stream_id, hc.REFUSED_STREAM)]
    assert pair.client.open_streams == 0


def test_frames_of_a_stream_the_client_reset_are_dropped(pair):
    stream_id = pair.request()
    pair.client.reset(stream_id)
    pair.server.send_headers(stream_id, RESPONSE_HEADERS)  # in flight before the server saw the reset
    pair.server.send_data(stream_id, b"late")
    pair.pump()
    assert pair.client_events == []
    assert pair.take_server(h2.events.StreamReset)[0].error_code == h2.errors.ErrorCodes.CANCEL


def test_goaway_from_the_server_carries_its_last_stream_id(pair):
    first, second = pair.request(), pair.request()
    pair.server.close_connection(error_code=h2.errors.ErrorCodes.NO_ERROR, last_stream_id=first)
    pair.pump()
    (ended,) = pair.client_events
    assert ended == ConnectionEnded(hc.NO_ERROR, "", by_peer=True, last_stream_id=first)
    assert second > ended.last_stream_id  # the caller retries what the server never served


def test_streams_the_goaway_served_still_get_their_response(pair):
    stream_id = pair.request()
    # By hand: h2 itself sends nothing more after its GOAWAY, as a graceful server does (grpc's, h2_server's).
    goaway = frame(hc.GOAWAY, 0, 0, struct.pack(">LL", stream_id, hc.NO_ERROR))
    pair.client_events += pair.client.receive(goaway)
    pair.server.send_headers(stream_id, RESPONSE_HEADERS + [(b"grpc-status", b"0")], end_stream=True)
    pair.pump()
    ended, response = pair.client_events
    assert isinstance(ended, ConnectionEnded) and isinstance(response, ResponseHeaders) and response.ended


# --- a server breaking the rules ------------------------------------------------------------------------------------


def goaway_of(data: bytes) -> tuple[int, int]:
    """(last stream id, error code) of the one GOAWAY in `data`."""
    (payload,) = [payload for kind, _, _, payload in parse_frames(data) if kind == hc.GOAWAY]
    return struct.unpack(">L", payload[:4])[0] & 0x7FFFFFFF, struct.unpack(">L", payload[4:8])[0]


@pytest.mark.parametrize("bad", [
    frame(hc.HEADERS, hc.END_HEADERS, 7, b"\x88"),  # odd, never opened
    frame(hc.HEADERS, hc.END_HEADERS, 2, b"\x88"),  # even: the server opens no stream (push is off)
    frame(hc.DATA, 0, 9, b"\x00" * 5),
    frame(hc.DATA, 0, 2, b"\x00" * 5),  # even, below the client's last stream: still never opened
], ids=["headers-odd", "headers-even", "data-odd", "data-even"])
def test_a_frame_on_a_stream_never_opened_ends_the_connection_with_protocol_error(pair, bad):
    pair.request(), pair.request()
    events = pair.client.receive(bad)
    assert [(type(e), e.error_code, e.by_peer) for e in events] == [(ConnectionEnded, hc.PROTOCOL_ERROR, False)]
    out = pair.client.data_to_send()
    # The GOAWAY's last stream id names the last stream the *server* opened: none.
    assert goaway_of(out) == (0, hc.PROTOCOL_ERROR)
    terminated = [e for e in pair.server.receive_data(out) if isinstance(e, h2.events.ConnectionTerminated)]
    assert terminated[0].error_code == h2.errors.ErrorCodes.PROTOCOL_ERROR
    assert pair.client.receive(frame(hc.PING, 0, 0, b"12345678")) == []  # nothing more is read


def test_headers_after_the_response_ended_end_the_connection(pair):
    connected = Pair(server_settings={Codes.INITIAL_WINDOW_SIZE: 10})  # the request body stays queued
    connected.pump()
    stream_id = connected.request(b"x" * 1000)
    connected.server.send_headers(stream_id, RESPONSE_HEADERS + [(b"grpc-status", b"0")], end_stream=True)
    connected.pump()
    events = connected.client.receive(frame(hc.HEADERS, hc.END_HEADERS | hc.END_STREAM, stream_id, b"\x88"))
    assert [type(e) for e in events] == [ConnectionEnded]
    assert goaway_of(connected.client.data_to_send())[1] == hc.PROTOCOL_ERROR


def test_push_promise_is_a_protocol_error(pair):
    stream_id = pair.request()
    events = pair.client.receive(frame(hc.PUSH_PROMISE, hc.END_HEADERS, stream_id, struct.pack(">L", 2) + b"\x88"))
    assert [(type(e), e.error_code) for e in events] == [(ConnectionEnded, hc.PROTOCOL_ERROR)]


def test_the_runtimes_windows_are_given_back_only_as_the_caller_consumes_the_data():
    # A caller that reads nothing (a relay whose downstream does not read) holds back the runtime's stream: the
    # runtime can send the stream's window, no more, until the caller consumes.
    pair = Pair(consuming=False)
    pair.pump()
    stream_id = pair.request()
    pair.server.send_headers(stream_id, RESPONSE_HEADERS)
    sent, chunk = 0, b"d" * 16_384
    while (room := pair.server.local_flow_control_window(stream_id)) > 0:
        pair.server.send_data(stream_id, chunk[:room])
        sent += min(room, len(chunk))
        pair.pump()
    assert sent == frames.STREAM_WINDOW
    received = sum(len(e.data) for e in pair.take_client(DataReceived))
    assert received == frames.STREAM_WINDOW
    pair.client.consume(stream_id, received)
    pair.pump()
    assert pair.server.local_flow_control_window(stream_id) == frames.STREAM_WINDOW
