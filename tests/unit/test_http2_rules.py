"""probe_worker.probes.http.h2_rules and the frame handling of probe_worker.probes.http.h2_exchange, without a server.

Expected values are Go's: golang.org/x/net/http2 (transport.go encodeRequestHeaders/handleResponse, frame.go
readMetaFrame/checkPseudos/ReadFrame, errors.go) and internal/httpcommon EncodeHeaders.
"""

from __future__ import annotations

import asyncio
import socket

import hpack
import hyperframe.frame as frames
import pytest

from probe_worker.probes.http import h2_rules as rules
from probe_worker.probes.http import request as http_request
from probe_worker.probes.http.h2_exchange import OPENING, H2Exchange, request_frames
from probe_worker.probes.http.headers import Header
from probe_worker.probes.http.url import parse
from probe_worker.tls_stream import Stream, StreamError

UA = "kube-probe/1.37"


def request(path="/healthz", headers=(), scheme="http", host="10.0.0.1", port=8080):
    return http_request.new_probe_request(scheme, host, port, path, headers, UA)


def fields(**kw):
    return rules.request_fields(request(**kw), http_request.PROBE_TRANSPORT)


# --- the request --------------------------------------------------------------------------------------------


def test_pseudo_headers_first_then_lower_case_names():
    assert fields() == [(":authority", "10.0.0.1:8080"), (":method", "GET"), (":path", "/healthz"),
                        (":scheme", "http"), ("accept", "*/*"), ("user-agent", UA)]


def test_host_is_the_authority_and_connection_specific_headers_are_not_sent():
    got = fields(headers=[("Host", "app.example:81"), ("Keep-Alive", "5"), ("Proxy-Connection", "x"),
                          ("Transfer-Encoding", "chunked"), ("Upgrade", ""), ("Connection", "Keep-Alive"),
                          ("X-A", " padded ")])
    assert got[0] == (":authority", "app.example:81")
    # Values go as they are (HTTP/1.1 trims them); the user's X-A sorts after User-Agent.
    assert got[4:] == [("accept", "*/*"), ("user-agent", UA), ("x-a", " padded ")]


def test_user_agent_first_value_only_and_none_when_emptied():
    assert ("user-agent", "a") in fields(headers=[("User-Agent", "a"), ("User-Agent", "b")])
    emptied = fields(headers=[("User-Agent", "")])
    assert not [f for f in emptied if f[0] == "user-agent"]  # key present, value empty: Go adds no default


def test_userinfo_becomes_basic_authorization():
    got = rules.request_fields(http_request.new_probe_request("http", "10.0.0.1", 80, "/", (), UA),
                               http_request.PROBE_TRANSPORT)
    assert got[0] == (":authority", "10.0.0.1:80")
    with_user = http_request.ProbeRequest(url=parse("http://u:p@10.0.0.1/"), host="",
                                        header=Header({"User-Agent": [UA]}))
    assert ("authorization", "Basic dTpw") in rules.request_fields(with_user, http_request.PROBE_TRANSPORT)


@pytest.mark.parametrize("name, values, error", [
    ("Connection", ["upgrade"], 'http2: invalid Connection request header: ["upgrade"]'),
    ("Connection", ["close", "close"], 'http2: invalid Connection request header: ["close" "close"]'),
    ("Transfer-Encoding", ["gzip"], 'http2: invalid Transfer-Encoding request header: ["gzip"]'),
    ("Upgrade", ["websocket"], 'http2: invalid Upgrade request header: ["websocket"]'),
])
def test_connection_headers_http2_cannot_carry(name, values, error):
    assert fields(headers=[(name, v) for v in values]) == error


def test_an_invalid_host_fails_where_http1_sends_an_empty_one():
    assert fields(headers=[("Host", "a b")]) == "http2: invalid Host header"


# --- the response -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block, error", [
    ([(b":status", b"200"), (b"x-a", b"1")], None),
    ([(b"x-a", b"1"), (b":status", b"200")], "pseudo header field after regular"),
    ([(b":status", b"200"), (b"X-A", b"1")], 'invalid header field name "X-A"'),
    ([(b":status", b"200"), (b"x-a", b"a\x01")], 'invalid header field value for "x-a"'),
    ([(b":status", b"200"), (b":foo", b"1")], 'invalid pseudo-header ":foo"'),
    ([(b":status", b"200"), (b":status", b"204")], 'duplicate pseudo-header ":status"'),
    ([(b":status", b"200"), (b":path", b"/")], "mix of request and response pseudo headers"),
])
def test_header_block_checks(block, error):
    assert rules.header_block_error(block) == error


@pytest.mark.parametrize("value, status", [
    (b"200", 200), (b"+200", 200), (b"0204", 204), (b"-1", -1), (b"99", 99),  # strconv.Atoi takes them all
    (b" 200", rules.NON_NUMERIC_STATUS), (b"2_00", rules.NON_NUMERIC_STATUS), (b"abc", rules.NON_NUMERIC_STATUS),
    (b"", rules.MISSING_STATUS),
])
def test_status_as_go_reads_it(value, status):
    assert rules.response_status([(b":status", value)] if value else []) == status


def test_content_length_counts_when_given_once_and_valid():
    def length(values, end_stream=False):
        return rules.response_head(200, [(b"content-length", v) for v in values], end_stream).content_length

    assert (length([b"12"]), length([b"+12"]), length([b"1", b"1"]), length([]), length([], True)) == (
        12, None, None, None, 0)


def test_go_error_texts():
    assert rules.stream_error(rules.REFUSED_STREAM, rules.FROM_PEER) == \
        "stream error: stream ID 1; REFUSED_STREAM; received from peer"
    assert rules.connection_error(rules.COMPRESSION_ERROR) == "connection error: COMPRESSION_ERROR"
    assert rules.goaway_error(3, 0xB, b"slow\x00down") == (
        'http2: server sent GOAWAY and closed the connection; LastStreamID=3, ErrCode=ENHANCE_YOUR_CALM, '
        'debug="slow\\x00down"')
    assert rules.frame_too_large(b"HTTP/1.0 ") == "http2: frame too large"
    assert rules.retried(reset_code=rules.REFUSED_STREAM) and not rules.retried(reset_code=rules.PROTOCOL_ERROR)
    assert rules.retried(goaway_code=rules.NO_ERROR) and not rules.retried(goaway_code=rules.PROTOCOL_ERROR)


# --- frames, over a socketpair ------------------------------------------------------------------------------


def _exchange_with(server_bytes: bytes, then_close: bool = False):
    """Runs read_head against a peer that sends `server_bytes`; returns (outcome, what the client wrote)."""

    async def go():
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        theirs.setblocking(False)
        exchange = H2Exchange(Stream(ours, "peer"))
        try:
            loop = asyncio.get_running_loop()
            await exchange.stream.send(OPENING + request_frames([(":method", "GET")]))
            await loop.sock_sendall(theirs, server_bytes)
            if then_close:
                theirs.shutdown(socket.SHUT_WR)
            try:
                outcome = await asyncio.wait_for(exchange.read_head(), 5)
            except StreamError as exc:
                outcome = str(exc)
            written = await loop.sock_recv(theirs, 65536)
            return outcome, written
        finally:
            ours.close()
            theirs.close()

    return asyncio.run(go())


SETTINGS = frames.SettingsFrame(0).serialize()


def test_an_oversized_frame_is_refused_from_its_header_alone():
    # A header claiming 1 MiB and no payload: Go's framer fails at once; nothing waits for (or buffers) the MiB.
    header = (1 << 20).to_bytes(3, "big") + bytes([0, 0, 0, 0, 0, 1])
    assert _exchange_with(SETTINGS + header) == ("http2: frame too large", OPENING + request_frames(
        [(":method", "GET")]) + frames.SettingsFrame(0, flags=["ACK"]).serialize())


def test_the_first_frame_must_be_settings():
    ping = frames.PingFrame(0, opaque_data=b"12345678").serialize()
    outcome, _ = _exchange_with(ping)
    assert outcome == "connection error: PROTOCOL_ERROR"


def test_a_ping_is_answered_and_eof_before_a_response_is_unexpected():
    ping = frames.PingFrame(0, opaque_data=b"12345678").serialize()
    outcome, written = _exchange_with(SETTINGS + ping, then_close=True)
    assert outcome == "unexpected EOF"
    assert frames.PingFrame(0, flags=["ACK"], opaque_data=b"12345678").serialize() in written


def test_a_header_block_in_continuation_frames():
    block = hpack.Encoder().encode([(b":status", b"204")])
    first = frames.HeadersFrame(1, data=block[:1], flags=["END_STREAM"]).serialize()
    rest = frames.ContinuationFrame(1, data=block[1:], flags=["END_HEADERS"]).serialize()
    outcome, _ = _exchange_with(SETTINGS + first + rest)
    assert (outcome.status, outcome.content_length) == (204, 0)
