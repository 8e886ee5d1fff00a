"""Go's error texts as the kubelet prints them (probe_worker.go_errors)."""

import errno

import pytest

from probe_worker import go_errors

# ---------------------------------------------------------------- net


def test_errno_text_is_go_syscall_spelling():
    assert go_errors.errno_text(errno.ECONNREFUSED) == "connection refused"
    assert go_errors.errno_text(errno.EHOSTUNREACH) == "no route to host"
    assert go_errors.errno_text(errno.ENETUNREACH) == "network is unreachable"
    assert go_errors.errno_text(errno.ETIMEDOUT) == "connection timed out"


def test_dial_error_texts():
    refused = ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
    assert go_errors.dial_error("10.0.0.1:8080", refused) == "dial tcp 10.0.0.1:8080: connect: connection refused"
    assert go_errors.dial_error("[fd00::1]:80", None, timed_out=True) == "dial tcp [fd00::1]:80: i/o timeout"


# ---------------------------------------------------------------- net/http, crypto/tls


def test_url_error_and_timeout_texts():
    refused = "dial tcp 198.18.0.2:8080: connect: connection refused"
    assert go_errors.url_error("http://198.18.0.2:8080/healthz", refused) == f'Get "http://198.18.0.2:8080/healthz": {refused}'
    assert go_errors.awaiting_headers("dial tcp 10.0.0.1:80: i/o timeout") == (
        "dial tcp 10.0.0.1:80: i/o timeout (Client.Timeout exceeded while awaiting headers)"
    )
    assert go_errors.TIMEOUT_AWAITING_HEADERS == (
        "context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
    )


def test_net_op_error():
    exc = ConnectionResetError(104, "Connection reset by peer")
    assert go_errors.net_op_error("read", "10.0.0.9:5000", "10.0.0.1:80", exc) == (
        "read tcp 10.0.0.9:5000->10.0.0.1:80: read: connection reset by peer"
    )


def test_transport_texts():
    assert go_errors.transport_broken("malformed HTTP response") == (
        "net/http: HTTP/1.x transport connection broken: malformed HTTP response"
    )
    assert go_errors.head_too_large(64 * 1024).endswith("net/http: server response headers exceeded 65536 bytes; aborted")
    assert go_errors.too_many_informational().endswith("net/http: too many 1xx informational responses")


@pytest.mark.parametrize(
    "reason, text",
    [
        ("SSLV3_ALERT_HANDSHAKE_FAILURE", "remote error: tls: handshake failure"),
        ("TLSV1_ALERT_PROTOCOL_VERSION", "remote error: tls: protocol version not supported"),
        ("TLSV1_ALERT_INTERNAL_ERROR", "remote error: tls: internal error"),
        ("TLSV13_ALERT_CERTIFICATE_REQUIRED", "remote error: tls: certificate required"),
        ("TLSV1_UNRECOGNIZED_NAME", "remote error: tls: unrecognized name"),
        ("TLSV1_ALERT_NO_APPLICATION_PROTOCOL", "remote error: tls: no application protocol"),
        ("UNEXPECTED_EOF_WHILE_READING", "EOF"),
        ("WRONG_VERSION_NUMBER", "tls: wrong version number"),
        ("", "tls: handshake failure"),
    ],
)
def test_tls_error_text(reason, text):
    assert go_errors.tls_error_text(reason) == text


@pytest.mark.parametrize(
    "header, eof, error",
    [
        (b"\x16\x03\x03\x00\x7a", False, None),                      # handshake record
        (b"\x15\x03\x03\x00\x02", False, None),                      # alert record
        (b"\x16\x03", False, None),                                  # not enough yet
        (b"", True, "EOF"),
        (b"\x16\x03", True, "unexpected EOF"),
        (b"HTTP/1.1 400", False, "http: server gave HTTP response to HTTPS client"),
        (b"SSH-2", False, "tls: first record does not look like a TLS handshake"),
        (b"\x16\x10\x00\x00\x01", False, "tls: first record does not look like a TLS handshake"),
    ],
)
def test_first_record_error(header, eof, error):
    assert go_errors.first_record_error(header[:5], eof) == error


# ---------------------------------------------------------------- strconv, x/net/http2


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
    assert go_errors.go_parse_int32(text) == (value, error)


def test_http2_error_names_are_x_net_http2s():
    assert go_errors.http2_error_name(0x7) == "REFUSED_STREAM"
    assert go_errors.http2_error_name(0xD) == "HTTP_1_1_REQUIRED"
    assert go_errors.http2_error_name(0xE) == "unknown error code 0xe"


def test_strconv_num_error_text():
    assert go_errors.strconv_error("Atoi", "99999999999999999999", "value out of range") == (
        'strconv.Atoi: parsing "99999999999999999999": value out of range'
    )


def test_every_deadline_text_is_contexts():
    assert go_errors.CONTEXT_DEADLINE == "context deadline exceeded"
    assert go_errors.TIMEOUT_READING_BODY == (
        "context deadline exceeded (Client.Timeout or context cancellation while reading body)"
    )
