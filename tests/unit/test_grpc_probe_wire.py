"""The HTTP/2 side of a gRPC probe connection, without sockets.

The peer is a real HTTP/2 server implementation (h2, server side) fed with our
bytes, or frames built with hyperframe/hpack for what no sane server sends.
"""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack
import hyperframe.frame as frames
import pytest
from h2.frame_buffer import FrameBuffer

from cri_proto import grpc_health_pb2 as health_pb
from probe_api import grpc_codes as codes
from probe_api.grpc_wire_rules import frame_message
from probe_worker.probes.grpc import rules, unary_call, wire

AUTHORITY, UA, SECOND = "198.18.0.2:9090", "kube-probe/1.37", 1_000_000_000
SERVING = frame_message(health_pb.HealthCheckResponse(status=health_pb.HealthCheckResponse.SERVING)
                              .SerializeToString())


def request(service: str = "") -> wire.Request:
    return wire.Request.build(AUTHORITY, UA, service)


class Server:
    """An h2 server connection wired to a wire.Connection, byte for byte."""

    def __init__(self, client: wire.Connection, **settings: int) -> None:
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        if settings:
            self.h2.local_settings = h2.settings.Settings(
                client=False, initial_values={getattr(h2.settings.SettingCodes, k): v for k, v in settings.items()})
        self.client = client
        self.events: list[h2.events.Event] = []
        self.h2.initiate_connection()
        self.receive(wire.OPENING)

    def receive(self, data: bytes) -> None:
        self.events += self.h2.receive_data(data)

    def send(self, remaining_ns: int = SECOND) -> None:
        """Everything the server has queued goes to the client; the client's answer comes back."""
        self.client.receive(self.h2.data_to_send(), remaining_ns)
        self.receive(self.client.data_to_send())

    def request(self) -> h2.events.RequestReceived:
        return next(e for e in self.events if isinstance(e, h2.events.RequestReceived))

    def body(self) -> bytes:
        return b"".join(e.data for e in self.events if isinstance(e, h2.events.DataReceived))


def frames_of(data: bytes) -> list[frames.Frame]:
    buffer = FrameBuffer()
    buffer.max_frame_size = 16384
    buffer.add_data(data)
    return list(buffer)


def ready_client(service: str = "", **settings: int) -> tuple[wire.Connection, Server]:
    client = wire.Connection(request(service))
    server = Server(client, **settings)
    server.send()
    return client, server


def settings_frame(values: dict[int, int]) -> frames.SettingsFrame:
    frame = frames.SettingsFrame(0)
    frame.settings = values
    return frame


def raw(*parts: frames.Frame) -> bytes:
    return b"".join(p.serialize() for p in parts)


def headers_frame(fields, stream_id: int = 1, end_stream: bool = False, encoder: hpack.Encoder | None = None):
    flags = ["END_HEADERS"] + (["END_STREAM"] if end_stream else [])
    return frames.HeadersFrame(stream_id, data=(encoder or hpack.Encoder()).encode(fields), flags=flags)


# ---------------------------------------------------------------- the request


def test_the_request_is_what_grpc_go_sends_and_a_real_server_reads_it():
    client, server = ready_client("db")
    assert client.ready
    assert server.request().headers == [(k.encode(), v.encode()) for k, v in
                                        rules.request_headers(AUTHORITY, UA, SECOND)]
    assert server.body() == rules.check_request("db")
    assert any(isinstance(e, h2.events.StreamEnded) for e in server.events)


def test_the_ack_and_the_whole_request_go_out_together_once_the_server_is_ready():
    client = wire.Connection(request())
    server = Server(client)
    assert client.data_to_send() == b""  # nothing before the server's SETTINGS, as grpc-go
    client.receive(server.h2.data_to_send(), SECOND)
    sent = frames_of(client.data_to_send())
    assert [type(f).__name__ for f in sent] == ["SettingsFrame", "HeadersFrame", "DataFrame"]
    assert "ACK" in sent[0].flags and "END_STREAM" in sent[2].flags


def test_only_the_timeout_changes_between_calls_and_it_leaves_the_table_alone():
    req = request()
    first, second = req.headers(SECOND, 4096, 16384), req.headers(SECOND // 2, 4096, 16384)
    assert first != second and first[9:9 + len(req.header_block)] == second[9:9 + len(req.header_block)]
    decoder = hpack.Decoder()
    assert decoder.decode(frames_of(first)[0].data, raw=True)[-1] == (b"grpc-timeout", b"1000000u")
    assert decoder.decode(frames_of(second)[0].data, raw=True)[-1] == (b"grpc-timeout", b"500000u")


def test_a_server_that_shrinks_its_hpack_table_gets_the_size_update_first():
    client = wire.Connection(request())
    server = Server(client, HEADER_TABLE_SIZE=0)
    client.receive(server.h2.data_to_send(), SECOND)
    sent = client.data_to_send()
    block = next(f for f in frames_of(sent) if isinstance(f, frames.HeadersFrame)).data
    assert block[0] == 0x20  # a dynamic table size update to 0 (RFC 7541 §6.3) opens the block
    server.receive(sent)
    assert server.request().headers == [(k.encode(), v.encode()) for k, v in
                                        rules.request_headers(AUTHORITY, UA, SECOND)]


def test_a_small_stream_window_releases_the_body_as_the_server_grants_it():
    client, server = ready_client("s" * 100, INITIAL_WINDOW_SIZE=4)
    assert len(server.body()) == 4
    while not any(isinstance(e, h2.events.StreamEnded) for e in server.events):
        granted = len(server.body())
        server.h2.increment_flow_control_window(4, stream_id=1)
        server.send()
        assert len(server.body()) == granted + 4 or len(server.body()) == len(rules.check_request("s" * 100))
    assert server.body() == rules.check_request("s" * 100)


def test_no_stream_quota_holds_the_call_back_until_the_server_allows_one():
    client, server = ready_client(MAX_CONCURRENT_STREAMS=0)
    assert not any(isinstance(e, h2.events.RequestReceived) for e in server.events)
    server.h2.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 1})
    server.send()
    assert server.request().stream_id == wire.STREAM_ID


# ---------------------------------------------------------------- the answer


def answer(server: Server, respond) -> None:
    respond(server.h2)
    server.send()


def test_a_serving_answer_is_the_message():
    client, server = ready_client()

    def respond(conn):
        conn.send_headers(1, [(":status", "200"), ("content-type", "application/grpc")])
        conn.send_data(1, SERVING)
        conn.send_headers(1, [("grpc-status", "0")], end_stream=True)

    answer(server, respond)
    assert client.call.result == SERVING[5:]


def test_a_trailers_only_answer_is_its_status():
    client, server = ready_client()
    answer(server, lambda conn: conn.send_headers(1, [(":status", "200"), ("content-type", "application/grpc"),
                                                      ("grpc-status", "5"), ("grpc-message", "no")], end_stream=True))
    assert client.call.result == unary_call.RpcError(codes.NOT_FOUND, "no")


def test_the_first_frame_must_be_settings_in_go_words():
    client = wire.Connection(request())
    with pytest.raises(wire.ConnectionFailed) as failed:
        client.receive(raw(frames.PingFrame(0, opaque_data=b"12345678")), SECOND)
    assert failed.value.error.message == "initial http2 frame from server is not a settings frame: *http2.PingFrame"
    assert not client.ready


def test_pings_and_settings_are_acknowledged():
    client, _ = ready_client()
    ping = frames.PingFrame(0, opaque_data=b"abcdefgh")
    client.receive(raw(ping, settings_frame({4: 70000})), SECOND)
    acks = frames_of(client.data_to_send())
    assert [(type(f).__name__, sorted(f.flags)) for f in acks] == [("PingFrame", ["ACK"]), ("SettingsFrame", ["ACK"])]
    assert acks[0].opaque_data == b"abcdefgh"


def test_informational_headers_are_skipped():
    client, server = ready_client()
    client.receive(raw(headers_frame([(":status", "100")]),
                       headers_frame([(":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "0")],
                                     end_stream=True)), SECOND)
    assert client.call.result == unary_call.BARE_EOF


def test_header_blocks_of_other_streams_are_still_decoded():
    # They share the hpack table: skipping one would garble the next block on our stream.
    client, _ = ready_client()
    encoder = hpack.Encoder()
    fields = [(":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "0")]
    client.receive(raw(headers_frame(fields, stream_id=3, encoder=encoder),
                       headers_frame(fields, stream_id=1, end_stream=True, encoder=encoder)), SECOND)
    assert client.call.result == unary_call.BARE_EOF


def test_frames_for_other_streams_are_ignored():
    client, _ = ready_client()
    client.receive(raw(frames.RstStreamFrame(3, error_code=8), frames.DataFrame(5, data=b"x")), SECOND)
    assert client.call.result is None


@pytest.mark.parametrize(("remaining_ns", "code"), [(SECOND, codes.CANCELED), (0, codes.DEADLINE_EXCEEDED)])
def test_rst_stream_is_the_call_error(remaining_ns, code):
    client, _ = ready_client()
    client.receive(raw(frames.RstStreamFrame(1, error_code=8)), remaining_ns)
    assert client.call.result.code == code


def test_goaway_ends_the_call_as_draining():
    client, _ = ready_client()
    client.receive(raw(frames.GoAwayFrame(0, last_stream_id=0)), SECOND)
    assert client.call.result == unary_call.connection_error("the connection is draining")


@pytest.mark.parametrize(("data", "message"), [
    (raw(headers_frame([(":status", "200"), ("x-filler", "a" * (rules.MAX_HEADER_LIST_BYTES + 1))])),
     "peer header list size exceeded limit"),
    (raw(frames.HeadersFrame(1, data=b"\xff\xff\xff\xff", flags=["END_HEADERS"])),
     "error reading from server: connection error: COMPRESSION_ERROR"),
    (raw(frames.PushPromiseFrame(1, promised_stream_id=2, data=hpack.Encoder().encode([(":method", "GET")]),
                                 flags=["END_HEADERS"])),
     "error reading from server: connection error: PROTOCOL_ERROR"),
    (raw(frames.WindowUpdateFrame(0, window_increment=2**31 - 1)),
     "error reading from server: connection error: FLOW_CONTROL_ERROR"),
    (raw(settings_frame({h2.settings.SettingCodes.MAX_FRAME_SIZE: 1})),
     "error reading from server: connection error: PROTOCOL_ERROR"),
    (b"\x00\x00\x00\x00\x00\x00\x00\x00\x00", "error reading from server: connection error: PROTOCOL_ERROR"),
])
def test_broken_bytes_are_connection_errors(data, message):
    client, _ = ready_client()
    with pytest.raises(wire.ConnectionFailed) as failed:
        client.receive(data, SECOND)
    assert failed.value.error.message == message


def test_an_oversized_frame_is_refused_from_its_header_alone():
    # A hostile server announces a 16 MiB frame: refused as soon as its 9-byte header is in, before any payload
    # (h2's own FrameBuffer would wait to buffer all of it; this pins where h2 4.x keeps its unparsed bytes).
    client, _ = ready_client()
    with pytest.raises(wire.ConnectionFailed) as failed:
        client.receive(b"\xff\xff\xff\x00\x00\x00\x00\x00\x01", SECOND)
    assert failed.value.error.message == "error reading from server: connection error: FRAME_SIZE_ERROR"
