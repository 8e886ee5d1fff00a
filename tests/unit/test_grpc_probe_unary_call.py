"""grpc-go's client side of one unary call (probe_worker.probes.grpc.unary_call), without sockets."""

import struct

import pytest

from cri_proto import grpc_health_pb2 as health_pb
from probe_api import grpc_codes as codes
from probe_api.grpc_wire_rules import frame_message
from probe_worker import go_errors
from probe_worker.probes.grpc import unary_call

GRPC_OK_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]


def _response(status: int) -> bytes:
    return frame_message(health_pb.HealthCheckResponse(status=status).SerializeToString())


def _trailers(code: int, message: bytes = b"") -> list[tuple[bytes, bytes]]:
    fields = [(b"grpc-status", str(code).encode())]
    return fields + ([(b"grpc-message", message)] if message else [])


def _call(*steps) -> unary_call.UnaryCall:
    call = unary_call.UnaryCall()
    for kind, *args in steps:
        getattr(call, f"on_{kind}")(*args)
    return call



# ---------------------------------------------------------------- statuses and their texts


@pytest.mark.parametrize(("code", "name"), [(0, "OK"), (4, "DeadlineExceeded"), (12, "Unimplemented"), (16, "Unauthenticated"), (17, "Code(17)")])
def test_code_names_are_go_spelling(code, name):
    assert codes.code_name(code) == name


def test_status_error_text_is_go_status_error():
    assert unary_call.RpcError(5, "unknown service").text() == "rpc error: code = NotFound desc = unknown service"
    assert unary_call.BARE_EOF.text() == "EOF"


def test_grpc_message_is_decoded_as_utf8_with_replacement():
    """Go keeps the bytes; a probe's output travels in a proto string, which must be UTF-8."""
    call = _call(("headers", GRPC_OK_HEADERS + _trailers(2, b"%E2%9C%93 %ff %zz"), True))
    assert call.result == unary_call.RpcError(codes.UNKNOWN, "\u2713 \ufffd %zz")


# ---------------------------------------------------------------- one unary call


def test_serving_response_with_ok_trailers():
    call = _call(("headers", GRPC_OK_HEADERS, False), ("data", _response(1), False), ("headers", _trailers(0), True))
    assert call.result == _response(1)[5:]


def test_response_split_across_data_frames():
    body = _response(2)
    call = _call(("headers", GRPC_OK_HEADERS, False), ("data", body[:3], False), ("data", body[3:], False), ("headers", _trailers(0), True))
    assert health_pb.HealthCheckResponse.FromString(call.result).status == 2


def test_trailers_only_error_is_decoded():
    call = _call(("headers", GRPC_OK_HEADERS + _trailers(5, b"unknown%20service"), True))
    assert call.result == unary_call.RpcError(codes.NOT_FOUND, "unknown service")


def test_error_status_wins_over_a_received_message():
    call = _call(("headers", GRPC_OK_HEADERS, False), ("data", _response(1), False), ("headers", _trailers(13, b"boom"), True))
    assert call.result == unary_call.RpcError(codes.INTERNAL, "boom")


def test_ok_status_without_a_message_is_a_bare_eof_in_grpc_go_1_65():
    call = _call(("headers", GRPC_OK_HEADERS + _trailers(0), True))
    assert call.result == unary_call.BARE_EOF


def test_http_404_html_maps_to_unimplemented():
    call = _call(("headers", [(b":status", b"404"), (b"content-type", b"text/html")], False))
    assert call.result == unary_call.RpcError(
        codes.UNIMPLEMENTED,
        'unexpected HTTP status code received from server: 404 (Not Found); '
        'transport: received unexpected content-type "text/html"',
    )


@pytest.mark.parametrize(("status", "code"), [(400, codes.INTERNAL), (401, codes.UNAUTHENTICATED), (403, codes.PERMISSION_DENIED), (429, codes.UNAVAILABLE), (502, codes.UNAVAILABLE), (503, codes.UNAVAILABLE), (504, codes.UNAVAILABLE), (500, codes.UNKNOWN), (418, codes.UNKNOWN)])
def test_http_status_mapping(status, code):
    call = _call(("headers", [(b":status", str(status).encode()), (b"content-type", b"application/grpc")], True))
    assert call.result.code == code
    assert call.result.message == f"unexpected HTTP status code received from server: {status} ({go_errors.GO_STATUS_TEXT[status]})"


def test_200_with_wrong_content_type_is_unknown():
    call = _call(("headers", [(b":status", b"200"), (b"content-type", b"application/json")], False))
    assert call.result == unary_call.RpcError(codes.UNKNOWN, 'transport: received unexpected content-type "application/json"')


def test_missing_content_type_and_status():
    call = _call(("headers", [(b"grpc-status", b"0")], True))
    assert call.result == unary_call.RpcError(
        codes.INTERNAL, "malformed header: missing HTTP status; malformed header: missing HTTP content-type"
    )


@pytest.mark.parametrize("value", [b"application/grpc+proto", b"application/grpc;charset=utf-8"])
def test_content_type_subtypes_are_grpc(value):
    call = _call(("headers", [(b":status", b"200"), (b"content-type", value)] + _trailers(5), True))
    assert call.result.code == codes.NOT_FOUND


def test_malformed_grpc_status():
    call = _call(("headers", GRPC_OK_HEADERS + [(b"grpc-status", b"abc")], True))
    assert call.result == unary_call.RpcError(codes.INTERNAL, 'transport: malformed grpc-status: strconv.ParseInt: parsing "abc": invalid syntax')


def test_out_of_table_grpc_status_prints_as_code_n():
    call = _call(("headers", GRPC_OK_HEADERS + _trailers(42, b"x"), True))
    assert call.result.text() == "rpc error: code = Code(42) desc = x"


def test_oversized_message_fails_as_soon_as_its_length_arrives():
    call = _call(("headers", GRPC_OK_HEADERS, False), ("data", struct.pack(">BI", 0, 1 << 20), False))
    assert call.result == unary_call.RpcError(codes.RESOURCE_EXHAUSTED, f"grpc: received message larger than max ({1 << 20} vs. {unary_call.MAX_MESSAGE_BYTES})")


def test_truncated_message_is_unexpected_eof_even_with_an_error_status():
    call = _call(("headers", GRPC_OK_HEADERS, False), ("data", _response(1)[:6], False), ("headers", _trailers(5), True))
    assert call.result == unary_call.RpcError(codes.INTERNAL, "unexpected EOF")


def test_second_message_is_a_protocol_violation():
    call = _call(("headers", GRPC_OK_HEADERS, False), ("data", _response(1) * 2, False), ("headers", _trailers(0), True))
    assert call.result == unary_call.RpcError(codes.UNKNOWN, "grpc: client streaming protocol violation: get <nil>, want <EOF>")


def test_compressed_flag_without_encoding():
    call = _call(("headers", GRPC_OK_HEADERS, False), ("data", b"\x01" + _response(1)[1:], False), ("headers", _trailers(0), True))
    assert call.result == unary_call.RpcError(codes.INTERNAL, "grpc: compressed flag set with identity or empty encoding")


def test_data_with_end_stream_and_no_trailers():
    call = _call(("headers", GRPC_OK_HEADERS, False), ("data", _response(1), True))
    assert call.result == unary_call.RpcError(codes.INTERNAL, "server closed the stream without sending trailers")


def test_headers_in_the_middle_of_a_stream():
    call = _call(("headers", GRPC_OK_HEADERS, False), ("headers", [(b"x", b"y")], False))
    assert call.result == unary_call.RpcError(codes.INTERNAL, "a HEADERS frame cannot appear in the middle of a stream")


@pytest.mark.parametrize(
    ("error_code", "deadline_passed", "code", "name"),
    [
        (8, False, codes.CANCELED, "CANCEL"),
        (8, True, codes.DEADLINE_EXCEEDED, "CANCEL"),
        (7, False, codes.UNAVAILABLE, "REFUSED_STREAM"),
        (11, False, codes.RESOURCE_EXHAUSTED, "ENHANCE_YOUR_CALM"),
        (2, False, codes.INTERNAL, "INTERNAL_ERROR"),
        (0x99, False, codes.UNKNOWN, "unknown error code 0x99"),
    ],
)
def test_rst_stream_mapping(error_code, deadline_passed, code, name):
    call = _call(("headers", GRPC_OK_HEADERS, False), ("reset", error_code, deadline_passed))
    assert call.result == unary_call.RpcError(code, f"stream terminated by RST_STREAM with error code: {name}")


def test_first_decision_wins():
    call = _call(("headers", GRPC_OK_HEADERS + _trailers(5), True), ("reset", 8, False), ("error", unary_call.DEADLINE))
    assert call.result.code == codes.NOT_FOUND
