"""grpc-go / kubelet decisions of the gRPC probe, without sockets."""

import struct

import pytest

from cri_proto import grpc_health_pb2 as health_pb
from probe_api import grpc_codes as codes
from probe_worker.probes.grpc import rules
from probe_api.gostrings import go_quote
from probe_worker.attempt import FAILURE, SUCCESS

SECOND = 1_000_000_000
GRPC_OK_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]


def _response(status: int) -> bytes:
    return rules.frame_message(health_pb.HealthCheckResponse(status=status).SerializeToString())


def _trailers(code: int, message: bytes = b"") -> list[tuple[bytes, bytes]]:
    fields = [(b"grpc-status", str(code).encode())]
    return fields + ([(b"grpc-message", message)] if message else [])


def _call(*steps) -> rules.UnaryCall:
    call = rules.UnaryCall()
    for kind, *args in steps:
        getattr(call, f"on_{kind}")(*args)
    return call


# ---------------------------------------------------------------- texts and encodings


@pytest.mark.parametrize(("code", "name"), [(0, "OK"), (4, "DeadlineExceeded"), (12, "Unimplemented"), (16, "Unauthenticated"), (17, "Code(17)")])
def test_code_names_are_go_spelling(code, name):
    assert codes.code_name(code) == name


def test_status_error_text_is_go_status_error():
    assert rules.RpcError(5, "unknown service").text() == "rpc error: code = NotFound desc = unknown service"
    assert rules.BARE_EOF.text() == "EOF"


@pytest.mark.parametrize(
    ("ns", "wire"),
    [
        (0, "0n"), (-5, "0n"), (1, "1n"), (99_999_999, "99999999n"),
        (999_876_000, "999876u"), (999_876_001, "999877u"),  # rounded up, like grpc-go's div
        (SECOND, "1000000u"), (100 * SECOND, "100000m"), (100_000 * SECOND, "100000S"),
        (10_000_000 * 60 * SECOND, "10000000M"), (100_000_000 * 60 * SECOND, "1666667H"),
    ],
)
def test_grpc_timeout_encoding_matches_grpc_go(ns, wire):
    assert rules.encode_timeout(ns) == wire


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        (b"plain", "plain"),
        (b"unknown%20service", "unknown service"),
        (b"100%25", "100%"),
        (b"%E2%9C%93 ok", "\u2713 ok"),
        (b"bad %zz escape", "bad %zz escape"),
        (b"cut %4", "cut %4"),  # needs two characters after the percent sign
        (b"%41", "A"),
    ],
)
def test_grpc_message_percent_decoding(raw, text):
    assert rules.decode_grpc_message(raw) == text


@pytest.mark.parametrize(
    ("data", "quoted"),
    [
        (b"NOT_SERVING", '"NOT_SERVING"'),
        (b'a"b\\c', r'"a\"b\\c"'),
        (b"tab\there\n", r'"tab\there\n"'),
        (b"\x01\x7f", r'"\x01\x7f"'),
        (b"\xff", r'"\xff"'),
        ("caf\u00e9".encode(), '"caf\u00e9"'),
        ("\u200b".encode(), r'"\u200b"'),
    ],
)
def test_go_quote_matches_strconv_quote(data, quoted):
    assert go_quote(data) == quoted


@pytest.mark.parametrize(
    ("text", "value", "error"),
    [
        ("5", 5, ""), ("+7", 7, ""), ("-1", -1, ""),
        ("x", None, 'strconv.ParseInt: parsing "x": invalid syntax'),
        ("", None, 'strconv.ParseInt: parsing "": invalid syntax'),
        (" 5", None, 'strconv.ParseInt: parsing " 5": invalid syntax'),
        ("1_0", None, 'strconv.ParseInt: parsing "1_0": invalid syntax'),
        ("2147483648", None, 'strconv.ParseInt: parsing "2147483648": value out of range'),
    ],
)
def test_go_parse_int32(text, value, error):
    assert rules.go_parse_int32(text) == (value, error)


def test_request_headers_are_grpc_go_order_and_values():
    assert rules.request_headers("198.18.0.2:9000", "kube-probe/1.32", 999_876_000) == [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/grpc.health.v1.Health/Check"),
        (":authority", "198.18.0.2:9000"),
        ("content-type", "application/grpc"),
        ("user-agent", "kube-probe/1.32 grpc-go/1.65.0"),
        ("te", "trailers"),
        ("grpc-timeout", "999876u"),
    ]


def test_check_request_is_length_prefixed_health_request():
    framed = rules.check_request("db")
    assert framed[:5] == struct.pack(">BI", 0, len(framed) - 5)
    assert health_pb.HealthCheckRequest.FromString(framed[5:]).service == "db"


# ---------------------------------------------------------------- backoff


def test_first_retry_waits_exactly_the_base_delay():
    assert rules.backoff_delay(0, lambda: 0.0) == 1.0
    assert rules.backoff_delay(0, lambda: 0.999) == 1.0


def test_backoff_grows_by_1_6_with_20_percent_jitter():
    assert rules.backoff_delay(1, lambda: 0.5) == pytest.approx(1.6)
    assert rules.backoff_delay(1, lambda: 0.0) == pytest.approx(1.6 * 0.8)
    assert rules.backoff_delay(2, lambda: 1.0) == pytest.approx(1.6 * 1.6 * 1.2)


def test_backoff_is_capped_at_120s_before_jitter():
    assert rules.backoff_delay(50, lambda: 0.5) == pytest.approx(120.0)
    assert rules.backoff_delay(50, lambda: 1.0) == pytest.approx(144.0)


def test_connect_window_is_at_least_min_connect_timeout():
    assert rules.connect_window(1.0) == 20.0
    assert rules.connect_window(75.0) == 75.0


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
    assert call.result == rules.RpcError(codes.NOT_FOUND, "unknown service")


def test_error_status_wins_over_a_received_message():
    call = _call(("headers", GRPC_OK_HEADERS, False), ("data", _response(1), False), ("headers", _trailers(13, b"boom"), True))
    assert call.result == rules.RpcError(codes.INTERNAL, "boom")


def test_ok_status_without_a_message_is_a_bare_eof_in_grpc_go_1_65():
    call = _call(("headers", GRPC_OK_HEADERS + _trailers(0), True))
    assert call.result == rules.BARE_EOF


def test_http_404_html_maps_to_unimplemented():
    call = _call(("headers", [(b":status", b"404"), (b"content-type", b"text/html")], False))
    assert call.result == rules.RpcError(
        codes.UNIMPLEMENTED,
        'unexpected HTTP status code received from server: 404 (Not Found); '
        'transport: received unexpected content-type "text/html"',
    )


@pytest.mark.parametrize(("status", "code"), [(400, codes.INTERNAL), (401, codes.UNAUTHENTICATED), (403, codes.PERMISSION_DENIED), (429, codes.UNAVAILABLE), (502, codes.UNAVAILABLE), (503, codes.UNAVAILABLE), (504, codes.UNAVAILABLE), (500, codes.UNKNOWN), (418, codes.UNKNOWN)])
def test_http_status_mapping(status, code):
    call = _call(("headers", [(b":status", str(status).encode()), (b"content-type", b"application/grpc")], True))
    assert call.result.code == code
    assert call.result.message == f"unexpected HTTP status code received from server: {status} ({rules.GO_STATUS_TEXT[status]})"


def test_200_with_wrong_content_type_is_unknown():
    call = _call(("headers", [(b":status", b"200"), (b"content-type", b"application/json")], False))
    assert call.result == rules.RpcError(codes.UNKNOWN, 'transport: received unexpected content-type "application/json"')


def test_missing_content_type_and_status():
    call = _call(("headers", [(b"grpc-status", b"0")], True))
    assert call.result == rules.RpcError(
        codes.INTERNAL, "malformed header: missing HTTP status; malformed header: missing HTTP content-type"
    )


@pytest.mark.parametrize("value", [b"application/grpc+proto", b"application/grpc;charset=utf-8"])
def test_content_type_subtypes_are_grpc(value):
    call = _call(("headers", [(b":status", b"200"), (b"content-type", value)] + _trailers(5), True))
    assert call.result.code == codes.NOT_FOUND


def test_malformed_grpc_status():
    call = _call(("headers", GRPC_OK_HEADERS + [(b"grpc-status", b"abc")], True))
    assert call.result == rules.RpcError(codes.INTERNAL, 'transport: malformed grpc-status: strconv.ParseInt: parsing "abc": invalid syntax')


def test_out_of_table_grpc_status_prints_as_code_n():
    call = _call(("headers", GRPC_OK_HEADERS + _trailers(42, b"x"), True))
    assert call.result.text() == "rpc error: code = Code(42) desc = x"


def test_oversized_message_fails_as_soon_as_its_length_arrives():
    call = _call(("headers", GRPC_OK_HEADERS, False), ("data", struct.pack(">BI", 0, 1 << 20), False))
    assert call.result == rules.RpcError(codes.RESOURCE_EXHAUSTED, f"grpc: received message larger than max ({1 << 20} vs. {rules.MAX_MESSAGE_BYTES})")


def test_truncated_message_is_unexpected_eof_even_with_an_error_status():
    call = _call(("headers", GRPC_OK_HEADERS, False), ("data", _response(1)[:6], False), ("headers", _trailers(5), True))
    assert call.result == rules.RpcError(codes.INTERNAL, "unexpected EOF")


def test_second_message_is_a_protocol_violation():
    call = _call(("headers", GRPC_OK_HEADERS, False), ("data", _response(1) * 2, False), ("headers", _trailers(0), True))
    assert call.result == rules.RpcError(codes.UNKNOWN, "grpc: client streaming protocol violation: get <nil>, want <EOF>")


def test_compressed_flag_without_encoding():
    call = _call(("headers", GRPC_OK_HEADERS, False), ("data", b"\x01" + _response(1)[1:], False), ("headers", _trailers(0), True))
    assert call.result == rules.RpcError(codes.INTERNAL, "grpc: compressed flag set with identity or empty encoding")


def test_data_with_end_stream_and_no_trailers():
    call = _call(("headers", GRPC_OK_HEADERS, False), ("data", _response(1), True))
    assert call.result == rules.RpcError(codes.INTERNAL, "server closed the stream without sending trailers")


def test_headers_in_the_middle_of_a_stream():
    call = _call(("headers", GRPC_OK_HEADERS, False), ("headers", [(b"x", b"y")], False))
    assert call.result == rules.RpcError(codes.INTERNAL, "a HEADERS frame cannot appear in the middle of a stream")


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
    assert call.result == rules.RpcError(code, f"stream terminated by RST_STREAM with error code: {name}")


def test_first_decision_wins():
    call = _call(("headers", GRPC_OK_HEADERS + _trailers(5), True), ("reset", 8, False), ("error", rules.DEADLINE))
    assert call.result.code == codes.NOT_FOUND


# ---------------------------------------------------------------- kubelet outputs


def test_serving_is_success():
    outcome = rules.check_outcome(_response(1)[5:], SECOND)
    assert (outcome.result, outcome.output, outcome.grpc_status) == (SUCCESS, "service healthy", "SERVING")


@pytest.mark.parametrize(("status", "name"), [(0, "UNKNOWN"), (2, "NOT_SERVING"), (3, "SERVICE_UNKNOWN"), (9, "9")])
def test_other_statuses_are_unhealthy(status, name):
    outcome = rules.check_outcome(_response(status)[5:], SECOND)
    assert (outcome.result, outcome.output, outcome.grpc_status) == (FAILURE, f'service unhealthy (responded with "{name}")', name)


def test_unimplemented_output():
    outcome = rules.check_outcome(rules.RpcError(codes.UNIMPLEMENTED, "Method not found!"), SECOND)
    assert outcome.output == "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): Method not found!"
    assert outcome.grpc_status == "Unimplemented"


def test_deadline_output_uses_the_probe_timeout():
    outcome = rules.check_outcome(rules.DEADLINE, 1_500_000_000)
    assert (outcome.result, outcome.output, outcome.grpc_status) == (FAILURE, "timeout: health rpc did not complete within 1.5s", "DeadlineExceeded")


def test_other_errors_output():
    outcome = rules.check_outcome(rules.RpcError(codes.NOT_FOUND, "unknown service"), SECOND)
    assert outcome.output == "error: health rpc probe failed: rpc error: code = NotFound desc = unknown service"
    assert rules.check_outcome(rules.BARE_EOF, SECOND).output == "error: health rpc probe failed: EOF"


def test_undecodable_response():
    outcome = rules.check_outcome(b"\xff\xff", SECOND)
    assert outcome.output == (
        "error: health rpc probe failed: rpc error: code = Internal desc = "
        "grpc: failed to unmarshal the received message: proto: cannot parse invalid wire-format data"
    )


def test_dial_timeout_output():
    assert rules.dial_timeout_output("[fd00:5a::2]:9000", SECOND) == (
        'timeout: failed to connect service "[fd00:5a::2]:9000" within 1s: context deadline exceeded'
    )
