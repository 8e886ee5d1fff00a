"""gRPC over HTTP/2, the server's half (shim/rpc/grpc_wire.py): pure rules, checked against grpc's
PROTOCOL-HTTP2.md and what grpcio's own server does (the metadata a handler sees, the statuses of bad requests),
with header blocks read back by hpack's Decoder (the reference HPACK implementation)."""

from __future__ import annotations

import base64
import gzip
import zlib

import grpc
import hpack
import pytest

from shim.rpc import grpc_wire
from shim.rpc.grpc_wire import BadMessage, BadRequest, CallHead, InvalidMetadata, MessageReader, \
    MessageTooLarge

GRPCIO_REQUEST = [  # what grpcio's client sends, as hpack decodes it (raw)
    (b":scheme", b"http"), (b":method", b"POST"), (b":authority", b"localhost"), (b":path", b"/pkg.Svc/Call"),
    (b"te", b"trailers"), (b"content-type", b"application/grpc"),
    (b"user-agent", b"grpc-python-asyncio/1.85.3 grpc-c/58.0.0 (linux; chttp2)"),
    (b"grpc-accept-encoding", b"identity, deflate, gzip"), (b"grpc-timeout", b"4999m"),
]


def decoded(block: bytes) -> list[tuple[str, str]]:
    return [(name, value) for name, value in hpack.Decoder().decode(block)]


# --- the request's head --------------------------------------------------------------------------------------------


def test_call_head_of_a_grpcio_request_keeps_user_agent_and_drops_transport_headers():
    head = grpc_wire.call_head(GRPCIO_REQUEST + [(b"x-a", b"1"), (b"authorization", b"t"), (b"x-a", b"2")])
    assert head == CallHead(
        path="/pkg.Svc/Call",
        metadata=(("user-agent", "grpc-python-asyncio/1.85.3 grpc-c/58.0.0 (linux; chttp2)"), ("x-a", "1"),
                  ("authorization", "t"), ("x-a", "2")),
        timeout_s=pytest.approx(4.999), encoding=b"identity")


@pytest.mark.parametrize("sent", [base64.b64encode(b"\x00\x01\x02\xff"), base64.b64encode(b"\x00\x01\x02\xff")
                                  .rstrip(b"=")], ids=["padded", "unpadded"])
def test_binary_metadata_is_decoded_to_bytes_with_and_without_padding(sent):
    head = grpc_wire.call_head(GRPCIO_REQUEST + [(b"x-trace-bin", sent)])
    assert head.metadata[-1] == ("x-trace-bin", b"\x00\x01\x02\xff")


@pytest.mark.parametrize("sent", [b"!!!", b"AQ=B", b"A", b"AQ==="])
def test_binary_metadata_that_is_not_base64_is_internal(sent):
    head = grpc_wire.call_head(GRPCIO_REQUEST + [(b"x-trace-bin", sent)])
    assert head == BadRequest(grpc.StatusCode.INTERNAL, "Invalid base64 in metadata x-trace-bin")


def test_every_transport_header_is_left_out_of_the_metadata():
    checked_elsewhere = {b"content-type", b"grpc-timeout", b"grpc-encoding"}
    transport = [(name, b"v") for name in sorted(grpc_wire.TRANSPORT_HEADERS - checked_elsewhere)]
    head = grpc_wire.call_head(GRPCIO_REQUEST + transport)
    assert [key for key, _ in head.metadata] == ["user-agent"]


@pytest.mark.parametrize("value,seconds", [(b"1500u", 0.0015), (b"0n", 0.0), (b"2562048H", (2**63 - 1) / 1e9)])
def test_grpc_timeout_is_the_call_heads_seconds(value, seconds):
    head = grpc_wire.call_head(GRPCIO_REQUEST + [(b"grpc-timeout", value)])
    assert head.timeout_s == pytest.approx(seconds)


@pytest.mark.parametrize("value", [b"", b"123456789S", b"10s", b"-1S"])  # the rule is grpc_wire_rules.decode_timeout
def test_malformed_grpc_timeout_is_internal(value):
    head = grpc_wire.call_head(GRPCIO_REQUEST + [(b"grpc-timeout", value)])
    assert head == BadRequest(grpc.StatusCode.INTERNAL, f"Invalid grpc-timeout: {value!r}")


def test_no_grpc_timeout_is_no_deadline():
    head = grpc_wire.call_head([h for h in GRPCIO_REQUEST if h[0] != b"grpc-timeout"])
    assert head.timeout_s is None


def test_a_request_not_a_post_is_unimplemented_405():
    head = grpc_wire.call_head([(b":method", b"GET") if h[0] == b":method" else h for h in GRPCIO_REQUEST])
    assert head == BadRequest(grpc.StatusCode.UNIMPLEMENTED, "gRPC requires POST", http_status=b"405")


@pytest.mark.parametrize("content_type", [None, b"application/json", b"text/plain"])
def test_a_request_without_grpc_content_type_is_415(content_type):
    headers = [h for h in GRPCIO_REQUEST if h[0] != b"content-type"]
    if content_type is not None:
        headers.append((b"content-type", content_type))
    head = grpc_wire.call_head(headers)
    assert isinstance(head, BadRequest) and head.http_status == b"415"


def test_content_type_with_a_subtype_is_grpc():
    head = grpc_wire.call_head([(b"content-type", b"application/grpc+proto") if h[0] == b"content-type" else h
                                for h in GRPCIO_REQUEST])
    assert isinstance(head, CallHead)


@pytest.mark.parametrize("encoding", [b"gzip", b"deflate", b"identity"])
def test_supported_encodings(encoding):
    assert grpc_wire.call_head(GRPCIO_REQUEST + [(b"grpc-encoding", encoding)]).encoding == encoding


def test_unsupported_encoding_is_unimplemented():
    head = grpc_wire.call_head(GRPCIO_REQUEST + [(b"grpc-encoding", b"snappy")])
    assert head == BadRequest(grpc.StatusCode.UNIMPLEMENTED, "Compression algorithm 'snappy' is not supported")


# --- messages in ---------------------------------------------------------------------------------------------------


def framed(payload: bytes, compressed: bool = False) -> bytes:
    return bytes((int(compressed),)) + len(payload).to_bytes(4, "big") + payload


def test_message_split_across_frames_byte_by_byte():
    reader = MessageReader(1024)
    wire = framed(b"hello")
    for held, byte in enumerate(wire[:-1], 1):
        assert reader.feed(bytes((byte,))) == []
        assert reader.partial and reader.buffered == held
    assert reader.feed(wire[-1:]) == [b"hello"]
    assert not reader.partial and reader.buffered == 0


def test_several_messages_in_one_frame_and_one_across_the_next():
    reader = MessageReader(1024)
    wire = framed(b"one") + framed(b"") + framed(b"three") + framed(b"four")
    assert reader.feed(wire[:-2]) == [b"one", b"", b"three"]
    assert reader.buffered == len(framed(b"four")) - 2
    assert reader.feed(wire[-2:]) == [b"four"]
    assert reader.buffered == 0


def test_one_whole_message_per_frame():
    reader = MessageReader(1024)
    assert [reader.feed(framed(bytes([n]) * n)) for n in (1, 2, 3)] == [[b"\x01"], [b"\x02\x02"], [b"\x03" * 3]]


def test_message_over_the_limit_is_refused_from_its_prefix_before_its_body_arrives():
    reader = MessageReader(1000)
    with pytest.raises(MessageTooLarge, match="1001 vs. 1000"):
        reader.feed(framed(b"x" * 1001)[:5])
    assert MessageReader(1000).feed(framed(b"x" * 1000)) == [b"x" * 1000]
    with pytest.raises(MessageTooLarge):
        MessageReader(1000).feed(framed(b"x" * 1001))  # whole in one frame


@pytest.mark.parametrize("encoding,compress", [(b"gzip", gzip.compress), (b"deflate", zlib.compress)])
def test_compressed_messages_are_inflated(encoding, compress):
    reader = MessageReader(1 << 20, encoding)
    body = b"probe " * 10_000
    wire = framed(compress(body), compressed=True) + framed(b"plain")
    assert reader.feed(wire[:100]) == []
    assert reader.feed(wire[100:]) == [body, b"plain"]


def test_compressed_message_without_grpc_encoding_is_bad():
    with pytest.raises(BadMessage, match="without grpc-encoding"):
        MessageReader(1024).feed(framed(gzip.compress(b"x"), compressed=True))


@pytest.mark.parametrize("flag", [2, 0x80, 0xFF])
def test_a_payload_format_other_than_0_or_1_is_bad_once_the_message_is_whole(flag):
    """grpc-go's checkRecvPayload and grpc core ("Bad GRPC frame type") refuse it; the limit is checked before."""
    wire = bytes((flag,)) + framed(b"abc")[1:]
    reader = MessageReader(1024, b"gzip")
    assert reader.feed(wire[:-1]) == []
    with pytest.raises(BadMessage, match=f"unexpected payload format {flag}"):
        reader.feed(wire[-1:])
    with pytest.raises(MessageTooLarge):
        MessageReader(2, b"gzip").feed(wire)


@pytest.mark.parametrize("payload", [b"not gzip at all", gzip.compress(b"x" * 1000)[:-20]], ids=["garbage", "cut"])
def test_undecompressable_message_is_bad(payload):
    with pytest.raises(BadMessage):
        MessageReader(1 << 20, b"gzip").feed(framed(payload, compressed=True))


def test_decompression_bomb_is_bounded_by_the_limit():
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = bytes(1 << 20)
    bomb = b"".join(compressor.compress(block) for _ in range(64)) + compressor.flush()  # 64 MiB in ~64 KiB
    reader = MessageReader(1 << 20, b"gzip")
    with pytest.raises(MessageTooLarge, match="when decompressed"):
        reader.feed(framed(bomb, compressed=True))


def test_compressed_message_of_exactly_the_limit_passes():
    body = b"z" * 4096
    assert MessageReader(4096, b"deflate").feed(framed(zlib.compress(body), compressed=True)) == [body]
    with pytest.raises(MessageTooLarge):
        MessageReader(4095, b"deflate").feed(framed(zlib.compress(body), compressed=True))


def test_a_message_of_many_frames_in_one_feed():
    assert MessageReader(1 << 20).feed(framed(b"q" * 70_000)) == [b"q" * 70_000]


# --- header blocks out ---------------------------------------------------------------------------------------------


def test_response_headers_decode_to_status_content_type_and_metadata():
    block = grpc_wire.response_headers((("x-initial", "v1"), ("x-raw-bin", b"\x00\xff\x10")))
    assert decoded(block) == [(":status", "200"), ("content-type", "application/grpc"), ("x-initial", "v1"),
                              ("x-raw-bin", base64.b64encode(b"\x00\xff\x10").decode().rstrip("="))]
    assert decoded(grpc_wire.response_headers()) == [(":status", "200"), ("content-type", "application/grpc")]


def test_trailers_of_ok():
    assert decoded(grpc_wire.trailers(grpc.StatusCode.OK)) == [("grpc-status", "0")]


def test_trailers_with_status_details_and_metadata():
    block = grpc_wire.trailers(grpc.StatusCode.FAILED_PRECONDITION, "nö 100%",
                               (("x-text", "t"), ("x-blob-bin", b"\x01\x02")))
    assert decoded(block) == [("grpc-status", "9"), ("grpc-message", "n%C3%B6 100%25"), ("x-text", "t"),
                              ("x-blob-bin", "AQI")]


def test_trailers_only_start_the_response():
    block = grpc_wire.trailers(grpc.StatusCode.NOT_FOUND, "gone", trailers_only=True)
    assert decoded(block) == [(":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "5"),
                              ("grpc-message", "gone")]


def test_trailers_only_with_an_http_status():
    block = grpc_wire.trailers(grpc.StatusCode.UNKNOWN, "no", trailers_only=True, http_status=b"415")
    assert decoded(block) == [(":status", "415"), ("content-type", "application/grpc"), ("grpc-status", "2"),
                              ("grpc-message", "no")]


def test_bytes_under_a_text_key_go_unencoded_as_grpcio_sends_them():
    assert decoded(grpc_wire.metadata_block((("x-t", b"abc"),))) == [("x-t", "abc")]


def test_text_under_a_binary_key_is_sent_as_its_utf8_in_base64():
    assert decoded(grpc_wire.metadata_block((("x-t-bin", "é"),))) == [("x-t-bin", "w6k")]


def test_upper_case_keys_are_lower_cased():
    assert decoded(grpc_wire.metadata_block((("X-Upper", "v"),))) == [("x-upper", "v")]


@pytest.mark.parametrize("metadata", [(("x-t", "vé"),), (("x-t", "a\x01"),), (("x-t", "a\r\nb"),), (("x y", "v"),),
                                      (("", "v"),), (("x-é", "v"),), (("x-t", b"\xff"),)])
def test_metadata_grpc_core_refuses_is_invalid(metadata):
    with pytest.raises(InvalidMetadata):
        grpc_wire.metadata_block(metadata)
    with pytest.raises(InvalidMetadata):
        grpc_wire.response_headers(metadata)


def test_trailers_with_invalid_metadata_are_internal_invalid_metadata_as_in_grpc_core():
    block = grpc_wire.trailers(grpc.StatusCode.OK, "", (("x-ok", "fine"), ("x-t", "vé€")))
    assert decoded(block) == [("grpc-status", "13"), ("grpc-message", "Invalid metadata")]


@pytest.mark.parametrize("size", [126, 127, 128, 255, 16_383, 16_384, 100_000, 2_000_000])
def test_hpack_integers_of_127_and_more_use_the_prefix_encoding(size):
    name, value = b"n" * min(size, 300), b"v" * size
    assert hpack.Decoder(max_header_list_size=4 << 20).decode(grpc_wire._literal(name, value), raw=True) == [
        (name, value)]
