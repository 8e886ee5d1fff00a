"""probes/http/h1_head.py against h11 itself: whatever plain_head reads, h11 reads the same (head and body)."""

from __future__ import annotations

import asyncio

import h11
from hypothesis import given, settings
from hypothesis import strategies as st

from probe_worker.probes.http.h1_exchange import H1Exchange, H1Request, head_of
from probe_worker.probes.http.h1_head import plain_head
from probe_worker.probes.http.request import WireRequest
from probe_worker.probes.http.response import ResponseHead
from probe_worker.tls_stream import StreamError

REQUEST = h11.Request(method="GET", target=b"/healthz", headers=[(b"Host", b"10.0.0.1:8080"), (b"Connection", b"close")])


def h11_reads(data: bytes) -> tuple[ResponseHead, bytes, bool] | None:
    """What h11 reads from `data` then EOF, as the executor drives it: the head, the body, and whether the body
    ended well (not cut short of its Content-Length); None when h11 refuses the head."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(REQUEST)
    conn.send(h11.EndOfMessage())
    conn.receive_data(data)
    conn.receive_data(b"")
    try:
        response = conn.next_event()
    except h11.RemoteProtocolError:
        return None
    if not isinstance(response, h11.Response):
        return None
    body = b""
    try:
        while isinstance(event := conn.next_event(), h11.Data):
            body += event.data
    except h11.RemoteProtocolError:
        return head_of(response), body, False
    return head_of(response), body, True


def plain_reads(data: bytes) -> tuple[ResponseHead, bytes, bool] | None:
    plain = plain_head(data)
    if plain is None:
        return None
    head, start = plain
    body = data[start:]
    if head.content_length is None:
        return head, body, True
    return head, body[:head.content_length], len(body) >= head.content_length


def test_a_usual_probe_response_is_plain_and_read_as_h11_reads_it():
    data = (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 2\r\n"
            b"Date: Fri, 27 Nov 2026 02:00:00 GMT\r\nConnection: close\r\n\r\nok")
    assert plain_reads(data) == h11_reads(data) == (ResponseHead(status=200, content_length=2), b"ok", True)
    cut_short = data.replace(b"Content-Length: 2", b"Content-Length: 5")
    assert plain_reads(cut_short) == h11_reads(cut_short) == (ResponseHead(status=200, content_length=5), b"ok", False)
    until_close = b"HTTP/1.1 404 Not Found\r\nContent-Encoding: identity\r\n\r\n<html>gone</html>"
    assert plain_reads(until_close) == h11_reads(until_close) == (
        ResponseHead(status=404, content_encoding="identity"), b"<html>gone</html>", True)


def test_what_is_not_plain_is_left_to_h11():
    for data in (
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n",                           # head not complete
        b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok",                            # bare LF
        b"HTTP/1.0 200 OK\r\n\r\nok",                                           # HTTP/1.0
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\r\n",                # 1xx
        b"HTTP/1.1 204 No Content\r\n\r\n", b"HTTP/1.1 304 Not Modified\r\n\r\n",
        b"HTTP/1.1 302 Found\r\nLocation: /x\r\n\r\n",                         # redirects
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok",  # h11 dedupes
        b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nX: a\r\n folded\r\n\r\n",                          # obs-fold
        b"HTTP/1.1 200 OK\r\nX: caf\xc3\xa9\r\n\r\n",                           # obs-text
        b"HTTP/1.1 200 OK\r\nX : a\r\n\r\n", b"HTTP/1.1 099 Low\r\n\r\n", b"\r\nHTTP/1.1 200 OK\r\n\r\n",
    ):
        assert plain_head(data) is None, data


def _mostly(usual: list[bytes], odd: list[bytes]) -> st.SearchStrategy[bytes]:
    """One of `usual` four times in five, else one of `odd`: most drawn responses are plain, many nearly so."""
    return st.integers(0, 9).flatmap(lambda n: st.sampled_from(odd if n == 9 else usual))


_CHARS = _mostly([b"a", b"Z", b"0", b"9", b" ", b"-", b"/", b";", b"=", b'"', b","],
                 [b"\t", b"\r", b"\n", b"\x00", b"\x7f", b"\x80", b"\xe9", b":", b"\x0b", b"\x0c"])
_TEXT = st.lists(_CHARS, max_size=12).map(b"".join)
_NAMES = _mostly([b"Content-Length", b"content-length", b"Location", b"Content-Encoding", b"content-encoding",
                  b"Content-Type", b"Connection", b"X-A", b"Date"],
                 [b"Transfer-Encoding", b"X A", b" X", b"", b"\tX", b"X\x80"])
_LENGTHS = _mostly([b"0", b"2", b"5", b"10", b"02"], [b" 2 ", b"2,2", b"2, 2", b"-1", b"+2", b"0x2", b"9" * 21])


@st.composite
def responses(draw) -> bytes:
    version = draw(_mostly([b"HTTP/1.1"], [b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.1 ", b"http/1.1", b"HTTP/1.10"]))
    status = draw(_mostly([b"200", b"201", b"404", b"500", b"503"],
                          [b"204", b"301", b"302", b"304", b"100", b"999", b"099", b"1000", b"20", b"2x0"]))
    reason = draw(_mostly([b"", b" OK", b" Not Found", b" ", b"  two  spaces"], [b" caf\xe9", b" a\x00", b" \t",
                                                                                   b"\tOK", b" a\rb"]))
    eol = draw(_mostly([b"\r\n"], [b"\n", b"\r"]))
    headers = b""
    for _ in range(draw(st.integers(0, 4))):
        name = draw(_NAMES)
        value = draw(_LENGTHS) if name.lower() == b"content-length" and draw(st.booleans()) else draw(_TEXT)
        sep = draw(_mostly([b": ", b":"], [b":\t", b" : ", b": \t ", b"::"]))
        headers += name + sep + value + draw(_mostly([b""], [b" ", b"\t", b" \t"])) + eol
    body = draw(st.sampled_from([b"", b"ok", b"hello", b"x" * 10]))
    return version + b" " + status + reason + eol + headers + draw(_mostly([b"\r\n"], [b"\n", b""])) + body


@settings(max_examples=3000, deadline=None)
@given(responses())
def test_plain_head_never_reads_a_response_otherwise_than_h11(data):
    plain = plain_reads(data)
    if plain is not None:
        assert h11_reads(data) == plain


# --- the exchange: a plain response never makes an h11 connection, anything else is h11's from the first byte ----

class _Prepared:
    def __init__(self, connection: str) -> None:
        self.h1 = H1Request(WireRequest(target="/healthz", headers=(("Host", "10.0.0.1:8080"),
                                                                       ("Connection", connection))))


class _Stream:
    """Hands out the given reads one by one, then EOF; keeps what was sent."""

    def __init__(self, *reads: bytes) -> None:
        self.reads = list(reads)
        self.sent = b""

    async def send(self, data: bytes) -> None:
        self.sent += data

    async def recv(self, limit: int = 65536) -> bytes:
        return self.reads.pop(0) if self.reads else b""


def _exchange(connection: str, *reads: bytes, limit: int = 1000) -> tuple[H1Exchange, ResponseHead, bytes | str]:
    async def run():
        exchange = H1Exchange(_Stream(*reads))
        await exchange.send_request(_Prepared(connection))
        await exchange.wait_first_byte()
        head = await exchange.read_head()
        try:
            body: bytes | str = await exchange.read_body(limit)
        except StreamError as exc:
            body = str(exc)
        return exchange, head, body

    return asyncio.run(run())


def test_a_plain_response_to_a_closing_request_is_read_without_h11_over_any_number_of_reads():
    exchange, head, body = _exchange("close", b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", b"defg", b"hij",
                                     b"ignored")
    assert (head.status, body, exchange.complete) == (200, b"abcdefghij", False)
    assert exchange._h11 is None and exchange.stream.reads == [b"ignored"]  # read no further than the body
    exchange, _, body = _exchange("close", b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", b"de")
    assert body == "unexpected EOF" and exchange._h11 is None
    exchange, _, body = _exchange("close", b"HTTP/1.1 503 Unavailable\r\n\r\nab", b"cd", limit=3)
    assert body == b"abc" and exchange._h11 is None


def test_h11_reads_what_is_not_plain_and_a_keep_alive_request_fed_the_same_reads():
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc", b"\r\n0\r\n\r\n")
    exchange, head, body = _exchange("close", *chunked)
    assert (head.status, body) == (200, b"abc") and exchange._h11 is not None
    exchange, head, body = _exchange("keep-alive", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    assert (head.status, body, exchange.complete) == (200, b"ok", True) and exchange._h11 is not None
    exchange, head, body = _exchange("close", b"HTTP/1.1 200 OK\r\nContent-", b"Length: 2\r\n\r\nok")
    assert (head.status, body) == (200, b"ok") and exchange._h11 is not None  # the head took two reads
