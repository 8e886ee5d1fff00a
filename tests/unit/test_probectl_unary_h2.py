"""probectl's HTTP/2 for unary gRPC calls (probectl/unary_h2.py), without sockets: h2's server as the reference peer,
hpack's encoder and decoder as the reference for the header blocks."""

from __future__ import annotations

import base64
import struct

import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack
import pytest
from hpack.table import HeaderTable

from probe_api.grpc_wire_rules import frame_message
from probectl import hpack_decoder, unary_h2

PATH = "/runtime.probe.v1alpha1.ProbeService/ShimVersion"
OK_HEADERS = [(":status", "200"), ("content-type", "application/grpc")]


class Peer:
    """h2's server side, answering what a test tells it to."""

    def __init__(self, **settings) -> None:
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        self.h2.initiate_connection()
        if settings:
            self.h2.update_settings(settings)
        self.requests: dict[int, dict] = {}

    def pump(self, client: unary_h2.Connection) -> None:
        """Bytes both ways until neither side has more to say."""
        while True:
            sent = client.data_to_send()
            for event in self.h2.receive_data(sent) if sent else ():
                if isinstance(event, h2.events.RequestReceived):
                    self.requests[event.stream_id] = {"headers": event.headers, "body": b"", "ended": False}
                elif isinstance(event, h2.events.DataReceived):
                    self.requests[event.stream_id]["body"] += event.data
                    self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    self.requests[event.stream_id]["ended"] = True
            answer = self.h2.data_to_send()
            if answer:
                client.receive(answer)
            if not sent and not answer:
                return

    def answer(self, stream_id: int, message: bytes, code: int = 0, *, trailers=()) -> None:
        self.h2.send_headers(stream_id, OK_HEADERS)
        body = frame_message(message)
        while body:
            size = min(len(body), self.h2.local_flow_control_window(stream_id), self.h2.max_outbound_frame_size)
            self.h2.send_data(stream_id, body[:size])
            body = body[size:]
        self.h2.send_headers(stream_id, [("grpc-status", str(code)), *trailers], end_stream=True)


def started(peer: Peer, request: bytes = b"\x08\x01", **kwargs) -> unary_h2.Connection:
    client = unary_h2.Connection()
    client.call(PATH, request, **kwargs)
    peer.pump(client)
    return client


def test_the_static_table_is_rfc_7541s():
    assert hpack_decoder.STATIC_TABLE == tuple(HeaderTable.STATIC_TABLE)


@pytest.mark.parametrize("huffman", [False, True])
def test_the_decoder_reads_what_hpacks_encoder_writes_block_after_block(huffman):
    encoder, decoder = hpack.Encoder(), hpack_decoder.HeaderDecoder()
    blocks = [[(b":status", b"200"), (b"content-type", b"application/grpc"), (b"x-long", b"v" * 300)],
              [(b"grpc-status", b"0"), (b"x-long", b"v" * 300), (b"x-secret", b"s", True)],  # the table, never indexed
              [(b"content-type", b"application/grpc"), (b"x-\xff", b"\x00\xff")]]
    for headers in blocks:
        block = encoder.encode(headers, huffman=huffman)
        assert decoder.decode(block) == [(name, value) for name, value, *_ in headers]


def test_the_decoder_follows_table_size_updates_and_evicts():
    encoder, decoder = hpack.Encoder(), hpack_decoder.HeaderDecoder()
    encoder.header_table_size = 100
    for index in range(5):
        headers = [(b"x-header", b"%d" % index * 20), (b"x-header", b"%d" % index * 20)]
        assert decoder.decode(encoder.encode(headers)) == headers


def test_the_decoder_refuses_an_index_out_of_the_table_and_a_truncated_string():
    with pytest.raises(unary_h2.ProtocolError):
        hpack_decoder.HeaderDecoder().decode(b"\xbf")  # index 63: the dynamic table is empty
    with pytest.raises(unary_h2.ProtocolError):
        hpack_decoder.HeaderDecoder().decode(b"\x00\x05ab")


def test_request_headers_read_back_with_hpacks_decoder():
    headers = [(b":path", b"/a/B"), (b"x-long", b"y" * 1000), (b"traceparent", b"00-" + b"a" * 32)]
    assert hpack.Decoder().decode(unary_h2.encode_headers(headers), raw=True) == headers


def test_a_call_is_what_grpc_asks_for_and_its_answer_is_the_message():
    peer = Peer()
    client = started(peer, b"\x08\x01", timeout_s=2.5, metadata=[("traceparent", "00-ab")])
    request = peer.requests[1]
    headers = dict(request["headers"])
    assert (headers[b":method"], headers[b":path"], headers[b"content-type"], headers[b"te"]) == \
        (b"POST", PATH.encode(), b"application/grpc", b"trailers")
    assert headers[b"grpc-timeout"] == b"2500000u" and headers[b"traceparent"] == b"00-ab"
    assert request["body"] == frame_message(b"\x08\x01") and request["ended"]
    assert client.answer is None
    peer.answer(1, b"answer", trailers=[("x-meta", "1")])
    peer.pump(client)
    assert client.answer == unary_h2.Answer(unary_h2.OK, "", b"answer", (("x-meta", "1"),))


def test_a_large_request_waits_for_the_peers_window_and_a_large_answer_needs_none():
    peer = Peer()
    request, answer = b"q" * 200_000, b"a" * 3_000_000
    client = started(peer, request)
    assert peer.requests[1]["body"] == frame_message(request) and peer.requests[1]["ended"]
    peer.answer(1, answer)
    peer.pump(client)
    assert client.answer.code == unary_h2.OK and client.answer.message == answer


def test_calls_follow_one_another_on_one_connection():
    peer = Peer()
    client = started(peer)
    peer.answer(1, b"first")
    peer.pump(client)
    client.call(PATH, b"")
    peer.pump(client)
    assert set(peer.requests) == {1, 3}
    peer.answer(3, b"second")
    peer.pump(client)
    assert client.answer.message == b"second" and not client.closed


def test_an_error_is_the_peers_status_details_and_binary_metadata():
    peer = Peer()
    client = started(peer)
    peer.h2.send_headers(1, [*OK_HEADERS, ("grpc-status", "3"), ("grpc-message", "bad %E2%9C%93 port"),
                             ("x-violations-bin", base64.b64encode(b"\x00\x01").decode().rstrip("="))],
                         end_stream=True)  # Trailers-Only
    peer.pump(client)
    assert client.answer == unary_h2.Answer(3, "bad \u2713 port", None, (("x-violations-bin", b"\x00\x01"),))


@pytest.mark.parametrize(("code", "status"), [(0x7, unary_h2.UNAVAILABLE), (0x8, unary_h2.CANCELLED),
                                              (0x2, unary_h2.INTERNAL)])
def test_a_reset_stream_reads_as_grpc_core_reads_it(code, status):
    peer = Peer()
    client = started(peer)
    peer.h2.reset_stream(1, code)
    peer.pump(client)
    assert client.answer == unary_h2.Answer(status, f"Received RST_STREAM with error code {code}",
                                            unprocessed=code == 0x7)  # REFUSED_STREAM: grpc tries it again


def test_goaway_before_the_call_was_taken_and_a_closed_socket_are_unavailable():
    peer = Peer()
    client = started(peer)
    peer.h2.close_connection(last_stream_id=0)
    peer.pump(client)
    assert client.answer.code == unary_h2.UNAVAILABLE and client.answer.unprocessed and client.closed
    other = started(Peer())
    assert other.ended() == unary_h2.Answer(unary_h2.UNAVAILABLE, "Socket closed") and other.closed


def test_an_answer_above_the_limit_is_resource_exhausted_and_the_stream_reset():
    peer = Peer()
    client = unary_h2.Connection(max_message=1000)
    client.call(PATH, b"")
    peer.pump(client)
    peer.answer(1, b"x" * 1001)
    client.receive(peer.h2.data_to_send())
    assert client.answer == unary_h2.Answer(unary_h2.RESOURCE_EXHAUSTED,
                                            "Received message larger than max (1001 vs. 1000)")
    sent = client.data_to_send()
    assert struct.unpack(">IBI", sent[:9]) == (4 << 8 | unary_h2.RST_STREAM, 0, 1)


def test_an_http_answer_is_mapped_as_grpcs_clients_map_it():
    peer = Peer()
    client = started(peer)
    peer.h2.send_headers(1, [(":status", "404")], end_stream=True)
    peer.pump(client)
    assert client.answer.code == unary_h2.UNIMPLEMENTED


def test_no_status_and_no_message_are_errors():
    peer = Peer()
    client = started(peer)
    peer.h2.send_headers(1, OK_HEADERS)
    peer.h2.send_headers(1, [("x", "y")], end_stream=True)
    peer.pump(client)
    assert client.answer.code == unary_h2.UNKNOWN
    peer = Peer()
    client = started(peer)
    peer.h2.send_headers(1, OK_HEADERS)
    peer.h2.send_headers(1, [("grpc-status", "0")], end_stream=True)
    peer.pump(client)
    assert client.answer.code == unary_h2.INTERNAL


def test_pings_and_settings_are_acknowledged():
    peer = Peer()
    client = started(peer)
    peer.h2.ping(b"12345678")
    peer.h2.update_settings({h2.settings.SettingCodes.MAX_FRAME_SIZE: 20000})
    client.receive(peer.h2.data_to_send())
    events = peer.h2.receive_data(client.data_to_send())
    assert any(isinstance(e, h2.events.PingAckReceived) and e.ping_data == b"12345678" for e in events)
    assert any(isinstance(e, h2.events.SettingsAcknowledged) for e in events)


def test_a_deadline_resets_the_stream_and_the_connection_serves_the_next_call():
    peer = Peer()
    client = started(peer)
    client.cancel()
    assert client.answer == unary_h2.Answer(unary_h2.DEADLINE_EXCEEDED, "Deadline Exceeded")
    events = peer.h2.receive_data(client.data_to_send())
    assert any(isinstance(e, h2.events.StreamReset) for e in events)
    client.call(PATH, b"")
    peer.pump(client)
    peer.answer(3, b"ok")
    peer.pump(client)
    assert client.answer.message == b"ok"


def test_a_frame_above_the_advertised_size_ends_the_connection():
    client = unary_h2.Connection()
    client.call(PATH, b"")
    client.data_to_send()
    client.receive(struct.pack(">IBI", 20000 << 8 | unary_h2.DATA, 0, 1) + b"x" * 20000)
    assert client.closed and client.answer.code == unary_h2.INTERNAL
    assert client.data_to_send()[3] == unary_h2.GOAWAY
