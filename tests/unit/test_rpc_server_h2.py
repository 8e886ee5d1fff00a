"""The daemon's HTTP/2 state machine (shim/rpc/h2_server.py) against python-hyper's h2 as the client.

No sockets: every byte the server queues goes into h2's `receive_data`, which raises on anything RFC 9113 forbids,
and what h2's client sends goes into the server's `receive`. Frames h2 will not send (protocol violations) are
built by hand with `frame()`.
"""

from __future__ import annotations

import struct

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
import hpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shim.rpc import h2_server as hc
from shim.rpc.h2_server import (
    ConnectionEnded, DataReceived, ServerConnection, StreamEnded, StreamOpened, StreamReset, frame,
)
from shim.rpc.limits import HEADER_BLOCK_BYTES
from tests.support.h2_pair import PumpedPair, parse_frames

REQUEST = [(":method", "POST"), (":scheme", "http"), (":path", "/pkg.Service/Method"), (":authority", "localhost"),
           ("content-type", "application/grpc"), ("te", "trailers")]
RESPONSE = b"\x88"  # ":status: 200", indexed: the smallest response header block
TRAILERS = b"\x00\x0bgrpc-status\x010"  # a literal without indexing, new name


class Pair(PumpedPair):
    """A ServerConnection and h2's client. The server's side consumes the DATA it reads, as a handler that reads
    every message does (`consuming=False`: one that reads nothing)."""

    def __init__(self, *, client_settings: dict | None = None, consuming: bool = True, **server_options) -> None:
        super().__init__()
        self.consuming = consuming
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.client = h2.connection.H2Connection(config)
        self.client.initiate_connection()
        if client_settings:
            self.client.update_settings(client_settings)
        self.server = ServerConnection(**server_options)

    def to_server(self, data: bytes) -> list:
        events = self.server.receive(data)
        if self.consuming:
            for event in events:
                if isinstance(event, DataReceived):
                    self.server.consume(event.stream_id, len(event.data))
        return events

    def to_client(self, data: bytes) -> list:
        return self.client.receive_data(data)

    def raw_to_server(self, data: bytes) -> list:
        """Bytes h2 would not send; the server's events for them (what it answers stays queued)."""
        events = self.server.receive(data)
        self.server_events += events
        return events

    def server_output_frames(self) -> list[tuple[int, int, int, bytes]]:
        return parse_frames(self.server.data_to_send())

    def open(self, *, end_stream: bool = False, extra: list | None = None) -> int:
        stream_id = self.client.get_next_available_stream_id()
        self.client.send_headers(stream_id, REQUEST + (extra or []), end_stream=end_stream)
        self.pump()
        return stream_id


def goaway_code(frames) -> int:
    (goaway,) = [payload for kind, _, _, payload in frames if kind == hc.GOAWAY]
    return struct.unpack(">L", goaway[4:8])[0]


@pytest.fixture
def pair() -> Pair:
    connected = Pair()
    connected.pump()
    return connected


def connected_raw() -> ServerConnection:
    """A server past the preface and the client's (empty) SETTINGS, its own output drained."""
    server = ServerConnection()
    assert server.receive(hc.PREFACE + frame(hc.SETTINGS, 0, 0)) == []
    server.data_to_send()
    return server


def encode(headers) -> bytes:
    return hpack.Encoder().encode(headers)


# --- the connection's start ---------------------------------------------------------------------------------------


def test_preface_and_settings_are_exchanged_and_acknowledged():
    connected = Pair()
    connected.pump()
    (server_settings,) = connected.take_client(h2.events.RemoteSettingsChanged)
    changed = {key: setting.new_value for key, setting in server_settings.changed_settings.items()}
    assert changed[h2.settings.SettingCodes.INITIAL_WINDOW_SIZE] == hc.STREAM_WINDOW
    assert changed[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] == hc.CONCURRENT_STREAMS
    assert changed[h2.settings.SettingCodes.ENABLE_PUSH] == 0
    assert connected.take_client(h2.events.SettingsAcknowledged)  # the server acknowledged the client's SETTINGS
    assert connected.client.outbound_flow_control_window == hc.CONNECTION_WINDOW
    assert connected.server_events == []


def test_preface_can_arrive_a_byte_at_a_time():
    server = ServerConnection()
    for byte in hc.PREFACE:
        assert server.receive(bytes((byte,))) == []
    assert server.receive(frame(hc.SETTINGS, 0, 0)) == []
    assert (hc.SETTINGS, hc.ACK, 0, b"") in parse_frames(server.data_to_send())


def test_ping_is_answered_with_the_same_payload(pair):
    pair.client.ping(b"12345678")
    pair.pump()
    (ack,) = pair.take_client(h2.events.PingAckReceived)
    assert ack.ping_data == b"12345678"


def test_ping_ack_from_the_client_is_not_answered():
    server = connected_raw()
    assert server.receive(frame(hc.PING, hc.ACK, 0, b"abcdefgh")) == []
    assert server.data_to_send() == b""


# --- requests and responses ---------------------------------------------------------------------------------------


def test_request_with_end_stream_on_headers_and_a_trailers_only_answer(pair):
    stream_id = pair.open(end_stream=True)
    (opened,) = pair.take_server(StreamOpened)
    assert opened.stream_id == stream_id and opened.ended
    assert (b":path", b"/pkg.Service/Method") in opened.headers
    pair.server.send_headers(stream_id, RESPONSE + TRAILERS, end_stream=True)
    pair.pump()
    (response,) = pair.take_client(h2.events.ResponseReceived)
    assert (b"grpc-status", b"0") in response.headers
    assert pair.take_client(h2.events.StreamEnded)
    assert not pair.server.is_open(stream_id)


def test_request_with_data_then_headers_data_and_trailers(pair):
    stream_id = pair.open()
    pair.client.send_data(stream_id, b"hello")
    pair.client.send_data(stream_id, b"world", end_stream=True)
    pair.pump()
    assert [(e.data, e.ended) for e in pair.take_server(DataReceived)] == [(b"hello", False), (b"world", True)]
    pair.server.send_headers(stream_id, RESPONSE)
    pair.server.send_data(stream_id, b"answer")
    pair.server.send_headers(stream_id, TRAILERS, end_stream=True)
    pair.pump()
    assert pair.take_client(h2.events.ResponseReceived)
    assert b"".join(e.data for e in pair.take_client(h2.events.DataReceived)) == b"answer"
    (trailers,) = pair.take_client(h2.events.TrailersReceived)
    assert trailers.headers == [(b"grpc-status", b"0")]
    assert pair.take_client(h2.events.StreamEnded)
    assert pair.server.open_streams == 0


def test_client_trailers_end_its_side(pair):
    stream_id = pair.open()
    pair.client.send_headers(stream_id, [("x-trailer", "1")], end_stream=True)
    pair.pump()
    assert [e.stream_id for e in pair.take_server(StreamEnded)] == [stream_id]


def test_padded_headers_and_data_are_unpadded(pair):
    stream_id = pair.client.get_next_available_stream_id()
    block = encode(REQUEST)
    padded_headers = bytes((7,)) + block + b"\0" * 7
    events = pair.raw_to_server(frame(hc.HEADERS, hc.END_HEADERS | hc.PADDED, stream_id, padded_headers))
    assert [type(e) for e in events] == [StreamOpened]
    events = pair.raw_to_server(frame(hc.DATA, hc.PADDED | hc.END_STREAM, stream_id, b"\x03abc\0\0\0"))
    assert [(e.data, e.ended) for e in events] == [(b"abc", True)]


def test_headers_with_priority_fields_are_read_past_them(pair):
    stream_id = pair.client.get_next_available_stream_id()
    priority = struct.pack(">LB", 0, 15)
    events = pair.raw_to_server(
        frame(hc.HEADERS, hc.END_HEADERS | hc.PRIORITY_FLAG | hc.PADDED | hc.END_STREAM, stream_id,
              b"\x02" + priority + encode(REQUEST) + b"\0\0"))
    (opened,) = events
    assert opened.ended and (b":method", b"POST") in opened.headers


def test_padding_as_long_as_the_frame_is_a_protocol_error():
    server = connected_raw()
    server.receive(frame(hc.HEADERS, hc.END_HEADERS, 1, encode(REQUEST)))
    (ended,) = server.receive(frame(hc.DATA, hc.PADDED, 1, b"\x03ab"))
    assert isinstance(ended, ConnectionEnded) and ended.error_code == hc.PROTOCOL_ERROR
    assert goaway_code(parse_frames(server.data_to_send())) == hc.PROTOCOL_ERROR


def test_request_header_block_over_16_kib_arrives_in_continuation_frames(pair):
    metadata = [(f"x-key-{index}", "v" * 100) for index in range(200)]  # ~22 KiB: HEADERS + CONTINUATION
    stream_id = pair.open(end_stream=True, extra=metadata)
    (opened,) = pair.take_server(StreamOpened)
    assert opened.stream_id == stream_id
    assert [(k.decode(), v.decode()) for k, v in opened.headers if k.startswith(b"x-key-")] == metadata


def test_response_header_block_over_the_peer_frame_size_is_split_into_continuation(pair):
    stream_id = pair.open(end_stream=True)
    big = b"".join(b"\x00\x05x-big" + b"\x7f\x7f" + b"v" * 254 for _ in range(80))  # ~21 KiB of literals
    pair.server.send_headers(stream_id, RESPONSE + big + TRAILERS, end_stream=True)
    frames = parse_frames(pair.server.data_to_send())
    assert [kind for kind, *_ in frames] == [hc.HEADERS, hc.CONTINUATION]
    assert all(len(payload) <= hc.DEFAULT_FRAME_SIZE for *_, payload in frames)
    events = pair.client.receive_data(b"".join(frame(*f) for f in frames))
    (response,) = [e for e in events if isinstance(e, h2.events.ResponseReceived)]
    assert response.headers.count((b"x-big", b"v" * 254)) == 80
    assert any(isinstance(e, h2.events.StreamEnded) for e in events)


def test_interleaved_frame_inside_a_header_block_ends_the_connection(pair):
    block = encode(REQUEST)
    pair.raw_to_server(frame(hc.HEADERS, 0, 1, block[:5]))
    (ended,) = pair.raw_to_server(frame(hc.PING, 0, 0, b"12345678"))
    assert ended.error_code == hc.PROTOCOL_ERROR
    assert goaway_code(pair.server_output_frames()) == hc.PROTOCOL_ERROR


def test_continuation_of_another_stream_ends_the_connection(pair):
    block = encode(REQUEST)
    pair.raw_to_server(frame(hc.HEADERS, 0, 1, block[:5]))
    (ended,) = pair.raw_to_server(frame(hc.CONTINUATION, hc.END_HEADERS, 3, block[5:]))
    assert ended.error_code == hc.PROTOCOL_ERROR


# --- flow control -------------------------------------------------------------------------------------------------


def test_response_over_the_client_window_waits_for_window_update_and_trailers_come_last():
    connected = Pair(client_settings={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 20_000})
    connected.pump()
    stream_id = connected.open(end_stream=True)
    body = bytes(range(256)) * 400  # 102,400 bytes: over the client's stream window and connection window
    connected.server.send_headers(stream_id, RESPONSE)
    connected.server.send_data(stream_id, body)
    connected.server.send_headers(stream_id, TRAILERS, end_stream=True)
    frames = connected.server_output_frames()
    data_frames = [payload for kind, _, _, payload in frames if kind == hc.DATA]
    assert sum(map(len, data_frames)) == 20_000  # the stream's window, not more
    assert all(len(payload) <= hc.DEFAULT_FRAME_SIZE for payload in data_frames)
    assert [kind for kind, *_ in frames].count(hc.HEADERS) == 1  # no trailers yet
    assert connected.server.backlog(stream_id) == len(body) - 20_000
    connected.client_events += connected.client.receive_data(b"".join(frame(*f) for f in frames))

    received = bytearray(b"".join(e.data for e in connected.take_client(h2.events.DataReceived)))
    acknowledged = 0
    for _ in range(100):  # the client reads and gives its windows back, in rounds
        connected.client.acknowledge_received_data(len(received) - acknowledged, stream_id)
        acknowledged = len(received)
        connected.pump()
        received += b"".join(e.data for e in connected.take_client(h2.events.DataReceived))
        if connected.take_client(h2.events.StreamEnded):
            break
    assert bytes(received) == body  # and h2 raises on DATA after the trailers' END_STREAM
    assert [e.headers for e in connected.take_client(h2.events.TrailersReceived)] == [[(b"grpc-status", b"0")]]
    assert connected.server.backlog(stream_id) == 0 and not connected.server.is_open(stream_id)


def test_sending_while_data_or_trailers_wait_for_a_window(pair):
    stream_id = pair.open(end_stream=True)
    pair.server.send_headers(stream_id, RESPONSE)
    pair.server.send_data(stream_id, b"p" * 70_000)
    assert pair.server.sending
    pair.server.send_headers(stream_id, TRAILERS, end_stream=True)
    pair.pump()
    assert pair.server.sending and not pair.take_client(h2.events.TrailersReceived)
    pair.client.increment_flow_control_window(4_464)
    pair.client.increment_flow_control_window(4_464, stream_id)
    pair.pump()
    assert pair.server.backlog(stream_id) == 1 and pair.server.sending  # one byte and the trailers wait
    pair.client.increment_flow_control_window(1)
    pair.client.increment_flow_control_window(1, stream_id)
    pair.pump()
    assert not pair.server.sending and pair.take_client(h2.events.TrailersReceived)
    stream_id = pair.open(end_stream=True)
    pair.server.send_headers(stream_id, RESPONSE)
    pair.server.send_data(stream_id, b"p")  # the connection's window is spent
    assert pair.server.sending


def test_data_is_split_at_the_peer_max_frame_size():
    connected = Pair(client_settings={h2.settings.SettingCodes.MAX_FRAME_SIZE: 20_000,
                                      h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20})
    connected.pump()
    connected.client.increment_flow_control_window(1 << 20)
    stream_id = connected.open(end_stream=True)
    connected.server.send_headers(stream_id, RESPONSE)
    connected.server.send_data(stream_id, b"x" * 50_000)
    frames = connected.server_output_frames()
    assert [len(payload) for kind, _, _, payload in frames if kind == hc.DATA] == [20_000, 20_000, 10_000]
    connected.client.receive_data(b"".join(frame(*f) for f in frames))


def test_connection_window_holds_data_of_all_streams(pair):
    first, second = pair.open(end_stream=True), pair.open(end_stream=True)
    for stream_id in (first, second):
        pair.server.send_headers(stream_id, RESPONSE)
        pair.server.send_data(stream_id, b"y" * 40_000)
    pair.pump()
    received = sum(len(e.data) for e in pair.take_client(h2.events.DataReceived))
    assert received == hc.DEFAULT_WINDOW  # the client's connection window, shared
    pair.client.increment_flow_control_window(100_000)
    pair.client.increment_flow_control_window(100_000, first)
    pair.client.increment_flow_control_window(100_000, second)
    pair.pump()
    assert received + sum(len(e.data) for e in pair.take_client(h2.events.DataReceived)) == 80_000


def test_client_initial_window_size_change_applies_to_open_streams(pair):
    stream_id = pair.open(end_stream=True)
    pair.client.increment_flow_control_window(1 << 20)
    pair.pump()
    pair.server.send_headers(stream_id, RESPONSE)
    pair.server.send_data(stream_id, b"z" * 100_000)
    pair.pump()
    assert sum(len(e.data) for e in pair.take_client(h2.events.DataReceived)) == hc.DEFAULT_WINDOW
    pair.client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 200_000})
    pair.pump()  # the stream's window grows by the difference: the rest goes out without a WINDOW_UPDATE
    assert sum(len(e.data) for e in pair.take_client(h2.events.DataReceived)) == 100_000 - hc.DEFAULT_WINDOW
    assert pair.server.backlog(stream_id) == 0


def test_client_window_shrinking_below_zero_holds_data_until_it_recovers(pair):
    stream_id = pair.open(end_stream=True)
    pair.server.send_headers(stream_id, RESPONSE)
    pair.server.send_data(stream_id, b"q" * 30_000)
    pair.pump()
    pair.client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 10_000})  # the window: -20,000
    pair.pump()
    pair.server.send_data(stream_id, b"r" * 100)
    pair.pump()
    assert pair.server.backlog(stream_id) == 100
    pair.client.increment_flow_control_window(20_050, stream_id)
    pair.pump()
    data = b"".join(e.data for e in pair.take_client(h2.events.DataReceived))
    assert data == b"q" * 30_000 + b"r" * 50 and pair.server.backlog(stream_id) == 50


def test_client_can_send_20_mib_over_one_connection(pair):
    stream_id = pair.open()
    chunk = b"m" * hc.DEFAULT_FRAME_SIZE
    received = 0
    for _ in range(20 * 64):  # 20 MiB in 16 KiB frames; h2 raises if it sends past a window
        pair.client.send_data(stream_id, chunk)
        pair.pump()
        received += sum(len(e.data) for e in pair.take_server(DataReceived))
    assert received == 20 * 1024 * 1024
    assert pair.client.local_flow_control_window(stream_id) > 0


def test_many_streams_over_one_connection_keep_the_connection_window_open(pair):
    body = b"s" * 1_000_000
    for _ in range(40):  # 40 MB in all, each stream under its own window
        stream_id = pair.open()
        for offset in range(0, len(body), hc.DEFAULT_FRAME_SIZE):
            pair.client.send_data(stream_id, body[offset:offset + hc.DEFAULT_FRAME_SIZE])
        pair.client.end_stream(stream_id)
        pair.pump()
        assert sum(len(e.data) for e in pair.take_server(DataReceived)) == len(body)
        pair.take_server(StreamOpened)


# --- resets and the end of the connection -------------------------------------------------------------------------


def test_client_reset_is_an_event_and_later_data_is_ignored_but_counted(pair):
    stream_id = pair.open()
    pair.client.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
    pair.pump()
    assert [(e.stream_id, e.code) for e in pair.take_server(StreamReset)] == [(stream_id, hc.CANCEL)]
    assert not pair.server.is_open(stream_id)
    for _ in range(hc.CONNECTION_WINDOW // 2 // hc.DEFAULT_FRAME_SIZE + 1):  # DATA in flight on the reset stream,
        # over half the connection window: given back at once
        assert pair.raw_to_server(frame(hc.DATA, 0, stream_id, b"d" * hc.DEFAULT_FRAME_SIZE)) == []
    frames = pair.server_output_frames()
    assert [(kind, stream) for kind, _, stream, _ in frames] == [(hc.WINDOW_UPDATE, 0)]
    pair.server.send_data(stream_id, b"late")  # a handler writing after the reset: nothing goes out
    pair.server.send_headers(stream_id, TRAILERS, end_stream=True)
    assert pair.server.data_to_send() == b""


def test_client_goaway_is_an_event(pair):
    pair.client.close_connection(error_code=h2.errors.ErrorCodes.ENHANCE_YOUR_CALM, additional_data=b"bye")
    pair.pump()
    (ended,) = pair.take_server(ConnectionEnded)
    assert ended.by_peer and ended.error_code == hc.ENHANCE_YOUR_CALM and ended.reason == "bye"


def test_streams_in_flight_go_on_after_the_client_goaway(pair):
    stream_id = pair.open(end_stream=True)
    # By hand: h2's client, once it sent GOAWAY, accepts no more frames itself.
    (ended,) = pair.raw_to_server(frame(hc.GOAWAY, 0, 0, struct.pack(">LL", 0, hc.NO_ERROR)))
    assert ended.by_peer
    pair.server.send_headers(stream_id, RESPONSE)
    pair.server.send_data(stream_id, b"w" * 100_000)
    pair.server.send_headers(stream_id, TRAILERS, end_stream=True)
    pair.pump()
    pair.raw_to_server(frame(hc.WINDOW_UPDATE, 0, 0, struct.pack(">L", 100_000))
                       + frame(hc.WINDOW_UPDATE, 0, stream_id, struct.pack(">L", 100_000)))
    frames = pair.server_output_frames()
    assert sum(len(payload) for kind, _, _, payload in frames if kind == hc.DATA) == 100_000 - hc.DEFAULT_WINDOW
    assert frames[-1][:3] == (hc.HEADERS, hc.END_STREAM | hc.END_HEADERS, stream_id)


def test_after_the_server_goaway_calls_in_flight_still_receive_and_new_streams_are_ignored(pair):
    stream_id = pair.open()
    ended = pair.server.go_away()
    assert ended.error_code == hc.NO_ERROR and not ended.by_peer
    pair.pump()
    (goaway,) = pair.take_client(h2.events.ConnectionTerminated)
    assert goaway.last_stream_id == stream_id
    # The request's body was in flight when the GOAWAY went out: it is still read, and pings still answered.
    events = pair.raw_to_server(frame(hc.DATA, hc.END_STREAM, stream_id, b"body") + frame(hc.PING, 0, 0, b"pingpong"))
    assert [(e.data, e.ended) for e in events] == [(b"body", True)]
    assert (hc.PING, hc.ACK, 0, b"pingpong") in pair.server_output_frames()
    # A stream the client opened before it saw the GOAWAY is not served; its header block still decoded.
    assert pair.raw_to_server(frame(hc.HEADERS, hc.END_HEADERS | hc.END_STREAM, stream_id + 2, encode(REQUEST))) == []
    assert pair.server.data_to_send() == b""


def test_finish_stream_resets_with_no_error_a_client_still_sending(pair):
    stream_id = pair.open()
    pair.server.send_headers(stream_id, RESPONSE + TRAILERS, end_stream=True)
    pair.server.finish_stream(stream_id)
    pair.pump()
    (reset,) = pair.take_client(h2.events.StreamReset)
    assert reset.stream_id == stream_id and reset.error_code == h2.errors.ErrorCodes.NO_ERROR
    assert pair.take_client(h2.events.StreamEnded)
    assert pair.server.open_streams == 0


def test_finish_stream_of_a_stream_the_client_ended_sends_nothing_more(pair):
    stream_id = pair.open(end_stream=True)
    pair.server.send_headers(stream_id, RESPONSE + TRAILERS, end_stream=True)
    pair.server.finish_stream(stream_id)
    assert [kind for kind, *_ in pair.server_output_frames()] == [hc.HEADERS]


def test_finish_stream_with_trailers_waiting_for_a_window_does_not_cut_them(pair):
    stream_id = pair.open()
    pair.server.send_headers(stream_id, RESPONSE)
    pair.server.send_data(stream_id, b"t" * 70_000)
    pair.server.send_headers(stream_id, TRAILERS, end_stream=True)
    pair.server.finish_stream(stream_id)
    pair.pump()
    assert not pair.take_client(h2.events.StreamReset)
    pair.client.increment_flow_control_window(10_000)
    pair.client.increment_flow_control_window(10_000, stream_id)
    pair.pump()
    assert pair.take_client(h2.events.TrailersReceived)


def test_reset_by_the_server_sends_rst_stream(pair):
    stream_id = pair.open()
    pair.server.reset(stream_id)
    pair.pump()
    (reset,) = pair.take_client(h2.events.StreamReset)
    assert reset.error_code == h2.errors.ErrorCodes.CANCEL
    assert not pair.server.is_open(stream_id)


def test_streams_far_over_max_concurrent_streams_are_refused():
    # The server counts its calls as it dispatches them (server.py); its stream table refuses at twice the limit.
    connected = Pair(max_concurrent_streams=1)
    connected.pump()
    first, second = connected.open(), 3
    events = connected.raw_to_server(frame(hc.HEADERS, hc.END_HEADERS, second, encode(REQUEST))
                                     + frame(hc.HEADERS, hc.END_HEADERS, 5, encode(REQUEST)))
    assert [e.stream_id for e in events] == [second]
    frames = connected.server_output_frames()
    assert frames == [(hc.RST_STREAM, 0, 5, struct.pack(">L", hc.REFUSED_STREAM))]
    assert [e.stream_id for e in connected.take_server(StreamOpened)] == [first, second]
    assert connected.raw_to_server(frame(hc.DATA, hc.END_STREAM, 5, b"x")) == []  # the refused one's DATA: dropped


# --- protocol errors: GOAWAY with the code ------------------------------------------------------------------------


def test_bad_preface_ends_the_connection():
    server = ServerConnection()
    server.data_to_send()
    (ended,) = server.receive(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert ended.error_code == hc.PROTOCOL_ERROR and not ended.by_peer
    assert goaway_code(parse_frames(server.data_to_send())) == hc.PROTOCOL_ERROR
    assert server.receive(hc.PREFACE) == []  # nothing more is read


VIOLATIONS = {
    "data on stream 0": (frame(hc.DATA, 0, 0, b"x"), hc.PROTOCOL_ERROR),
    "data on an idle stream": (frame(hc.DATA, 0, 7, b"x"), hc.PROTOCOL_ERROR),
    "even stream id": (frame(hc.HEADERS, hc.END_HEADERS, 2, encode(REQUEST)), hc.PROTOCOL_ERROR),
    "headers on stream 0": (frame(hc.HEADERS, hc.END_HEADERS, 0, encode(REQUEST)), hc.PROTOCOL_ERROR),
    "decreasing stream id": (frame(hc.HEADERS, hc.END_HEADERS, 5, encode(REQUEST))
                             + frame(hc.HEADERS, hc.END_HEADERS, 3, b"\x82"), hc.PROTOCOL_ERROR),
    "frame over 16 KiB": (frame(hc.DATA, 0, 1, b"x" * (hc.DEFAULT_FRAME_SIZE + 1)), hc.FRAME_SIZE_ERROR),
    "frame head announcing over 16 KiB": (struct.pack(">HBBBL", 0x40, 0x01, hc.DATA, 0, 1), hc.FRAME_SIZE_ERROR),
    "push promise": (frame(hc.PUSH_PROMISE, hc.END_HEADERS, 1, struct.pack(">L", 2) + b"\x82"), hc.PROTOCOL_ERROR),
    "continuation without headers": (frame(hc.CONTINUATION, hc.END_HEADERS, 1, b"\x82"), hc.PROTOCOL_ERROR),
    "settings length not a multiple of 6": (frame(hc.SETTINGS, 0, 0, b"\0" * 5), hc.FRAME_SIZE_ERROR),
    "settings ack with a payload": (frame(hc.SETTINGS, hc.ACK, 0, b"\0" * 6), hc.FRAME_SIZE_ERROR),
    "settings on a stream": (frame(hc.SETTINGS, 0, 1), hc.PROTOCOL_ERROR),
    "initial window over 2^31-1": (frame(hc.SETTINGS, 0, 0, hc.settings_payload({hc.INITIAL_WINDOW_SIZE: 2**31})),
                                   hc.FLOW_CONTROL_ERROR),
    "max frame size under 16 KiB": (frame(hc.SETTINGS, 0, 0, hc.settings_payload({hc.MAX_FRAME_SIZE: 16_383})),
                                    hc.PROTOCOL_ERROR),
    "max frame size over 2^24-1": (frame(hc.SETTINGS, 0, 0, hc.settings_payload({hc.MAX_FRAME_SIZE: 2**24})),
                                   hc.PROTOCOL_ERROR),
    "enable push 2": (frame(hc.SETTINGS, 0, 0, hc.settings_payload({hc.ENABLE_PUSH: 2})), hc.PROTOCOL_ERROR),
    "ping of 7 bytes": (frame(hc.PING, 0, 0, b"1234567"), hc.FRAME_SIZE_ERROR),
    "ping on a stream": (frame(hc.PING, 0, 1, b"12345678"), hc.PROTOCOL_ERROR),
    "window update of 3 bytes": (frame(hc.WINDOW_UPDATE, 0, 0, b"\0\0\1"), hc.FRAME_SIZE_ERROR),
    "window update of 0": (frame(hc.WINDOW_UPDATE, 0, 0, struct.pack(">L", 0)), hc.PROTOCOL_ERROR),
    "connection window over 2^31-1": (frame(hc.WINDOW_UPDATE, 0, 0, struct.pack(">L", 2**31 - 1)),
                                      hc.FLOW_CONTROL_ERROR),
    "rst_stream of 3 bytes": (frame(hc.RST_STREAM, 0, 1, b"\0\0\0"), hc.FRAME_SIZE_ERROR),
    "rst_stream on stream 0": (frame(hc.RST_STREAM, 0, 0, b"\0\0\0\0"), hc.PROTOCOL_ERROR),
    "rst_stream of an idle stream": (frame(hc.RST_STREAM, 0, 9, b"\0\0\0\0"), hc.PROTOCOL_ERROR),
    "goaway on a stream": (frame(hc.GOAWAY, 0, 1, b"\0" * 8), hc.PROTOCOL_ERROR),
    "hpack garbage": (frame(hc.HEADERS, hc.END_HEADERS, 1, b"\xff\xff\xff\xff\xff\xff"), hc.COMPRESSION_ERROR),
    "hpack index out of the table": (frame(hc.HEADERS, hc.END_HEADERS, 1, b"\xfe"), hc.COMPRESSION_ERROR),
    "header block over the limit": (frame(hc.HEADERS, 0, 1, b"\0" * hc.DEFAULT_FRAME_SIZE)
                                    + frame(hc.CONTINUATION, 0, 1, b"\0" * hc.DEFAULT_FRAME_SIZE)
                                    * (HEADER_BLOCK_BYTES // hc.DEFAULT_FRAME_SIZE),
                                    hc.ENHANCE_YOUR_CALM),
}


@pytest.mark.parametrize("frames,code", VIOLATIONS.values(), ids=VIOLATIONS.keys())
def test_protocol_violation_ends_the_connection_with_goaway_and_its_code(frames, code):
    server = connected_raw()
    events = server.receive(frames)
    assert [type(e) for e in events if not isinstance(e, StreamOpened)] == [ConnectionEnded]
    assert events[-1].error_code == code and not events[-1].by_peer
    out = parse_frames(server.data_to_send())
    assert goaway_code(out) == code
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    (terminated,) = [e for e in client.receive_data(b"".join(frame(*f) for f in out))
                     if isinstance(e, h2.events.ConnectionTerminated)]
    assert terminated.error_code == code
    assert server.receive(frame(hc.PING, 0, 0, b"12345678")) == []  # nothing more is read after it


def test_window_update_overflowing_a_stream_window_resets_the_stream(pair):
    stream_id = pair.open()
    events = pair.raw_to_server(frame(hc.WINDOW_UPDATE, 0, stream_id, struct.pack(">L", 2**31 - 1)))
    assert [(type(e), e.stream_id, e.code) for e in events] == [(StreamReset, stream_id, hc.FLOW_CONTROL_ERROR)]
    assert pair.server_output_frames() == [(hc.RST_STREAM, 0, stream_id, struct.pack(">L", hc.FLOW_CONTROL_ERROR))]


def test_window_update_of_zero_on_a_stream_resets_it_with_protocol_error(pair):
    stream_id = pair.open()
    events = pair.raw_to_server(frame(hc.WINDOW_UPDATE, 0, stream_id, struct.pack(">L", 0)))
    assert [(type(e), e.code) for e in events] == [(StreamReset, hc.PROTOCOL_ERROR)]
    assert pair.server_output_frames() == [(hc.RST_STREAM, 0, stream_id, struct.pack(">L", hc.PROTOCOL_ERROR))]


def test_data_after_the_client_ended_its_side_resets_the_stream(pair):
    stream_id = pair.open(end_stream=True)
    events = pair.raw_to_server(frame(hc.DATA, 0, stream_id, b"more"))
    assert [(type(e), e.code) for e in events] == [(StreamReset, hc.STREAM_CLOSED)]
    assert pair.server_output_frames() == [(hc.RST_STREAM, 0, stream_id, struct.pack(">L", hc.STREAM_CLOSED))]


def test_unknown_frame_types_and_priority_are_ignored(pair):
    assert pair.raw_to_server(frame(0x42, 0, 0, b"whatever") + frame(hc.PRIORITY, 0, 1, b"\0" * 5)) == []
    assert pair.server.data_to_send() == b""
    pair.open(end_stream=True)
    assert pair.take_server(StreamOpened)


# --- anything a client sends ----------------------------------------------------------------------------------------

_FRAMES = st.builds(
    frame,
    st.sampled_from([hc.DATA, hc.HEADERS, hc.PRIORITY, hc.RST_STREAM, hc.SETTINGS, hc.PUSH_PROMISE, hc.PING,
                     hc.GOAWAY, hc.WINDOW_UPDATE, hc.CONTINUATION, 0x42]),
    st.sampled_from([0, hc.END_STREAM, hc.END_HEADERS, hc.END_STREAM | hc.END_HEADERS, hc.PADDED,
                     hc.PRIORITY_FLAG | hc.END_HEADERS, 0xFF]),
    st.sampled_from([0, 1, 2, 3, 5, 2**31 - 1]),
    st.one_of(st.binary(max_size=24), st.just(encode(REQUEST)), st.binary(min_size=4, max_size=4)))


@settings(max_examples=300, deadline=None)
@given(st.lists(_FRAMES, max_size=8), st.integers(min_value=0, max_value=200))
def test_any_frames_give_events_or_a_goaway_never_an_exception(frames, cut):
    server = ServerConnection()
    data = hc.PREFACE + b"".join(frames)
    events = server.receive(data[:cut]) + server.receive(data[cut:])
    server.send_headers(1, RESPONSE)
    server.send_data(1, b"x" * 100)
    server.send_headers(1, TRAILERS, end_stream=True)
    server.finish_stream(1)
    out = parse_frames(server.data_to_send())
    assert all(len(payload) <= hc.DEFAULT_FRAME_SIZE for *_, payload in out)
    broken = [e for e in events if isinstance(e, ConnectionEnded) and e.error_code and not e.by_peer]
    if broken:
        assert goaway_code(out) == broken[0].error_code
        assert server.receive(frame(hc.PING, 0, 0, b"12345678")) == []
