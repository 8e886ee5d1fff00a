"""One HTTP/1.1 request and its response over a Stream, framed by h11.

The exchange interface the executor drives (send_request, wait_first_byte, read_head, read_body, complete, settle),
as probes/http/h2_exchange.py has it for HTTP/2, so that an attempt (redirects, outcome, trace) does not care which
version carried it. h11 parses; where Go's reader differs from h11 (a status line Go refuses before the head is
complete, a status h11 cannot frame, a head past the limit, too many 1xx responses) the texts are Go's, decided by
probes/http/response.py and worded by probe_worker/go_errors.py. A request target h11 refuses to write (a raw query
with spaces or non-ASCII bytes, which Go writes as is) goes out as Go's own bytes (`H1Request`).

Bounded against a hostile server: a head of at most response.MAX_HEAD_BYTES, whatever the chunking on the wire,
and the body read only as far as the prober reads it; the deadline is the caller's.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import h11

from probe_api.gostrings import go_quote
from probe_worker import go_errors
from probe_worker.probes.http import response
from probe_worker.probes.http.h1_head import plain_head
from probe_worker.probes.http.request import WireRequest
from probe_worker.probes.http.response import ResponseHead
from probe_worker.tls_stream import RECV_SIZE, Stream, StreamError

if TYPE_CHECKING:
    from probe_worker.probes.http.executor import Prepared


class H1Request:
    """A request as h11 sends it, worked out once per request (h11 never changes its event, so it is reused)."""

    def __init__(self, wire: WireRequest) -> None:
        self.target = wire.target
        self.raw_head: bytes | None = None  # the head as Go writes it, where h11 would refuse to write it
        headers = [(k.encode(), v.encode("utf-8", "surrogateescape")) for k, v in wire.headers]
        self._event: h11.Request | h11.LocalProtocolError
        try:
            self._event = h11.Request(method="GET", target=wire.target.encode("utf-8", "surrogateescape"),
                                      headers=headers)
        except h11.LocalProtocolError as exc:
            self._event = exc
            # Go writes a raw query as it is, non-ASCII bytes and spaces included (url.URL.RequestURI keeps
            # RawQuery verbatim), and an ordinary server answers; h11 refuses such a target. Then h11 gets
            # the same request with a placeholder target, to keep its state (the response is still parsed
            # by h11), and the bytes sent are Go's own head.
            try:
                self._event = h11.Request(method="GET", target=b"/", headers=headers)
                self.raw_head = wire.head()
            except h11.LocalProtocolError:
                pass  # not the target: the headers themselves (request.preflight_error has Go's word for those)

    def event(self) -> h11.Request:
        """The request as an h11 event; raises StreamError when h11 cannot send it."""
        if isinstance(self._event, h11.LocalProtocolError):
            raise StreamError(self.unsendable(self._event))
        return self._event

    def unsendable(self, exc: h11.LocalProtocolError) -> str:
        return f"cannot send request-target {go_quote(self.target)}: {exc}"

    @functools.cached_property
    def sent(self) -> tuple[bytes, bool] | str:
        """The bytes that go out, and whether the connection closes after the response (`Connection: close`, so
        an exchange's `complete` can never be true); or why they cannot go out (StreamError's text).

        h11's output for an event does not depend on the connection: worked out once on a scratch one."""
        scratch = h11.Connection(h11.CLIENT)
        try:
            data = scratch.send(self.event()) + (scratch.send(h11.EndOfMessage()) or b"")
        except StreamError as exc:
            return str(exc)
        except h11.LocalProtocolError as exc:
            return self.unsendable(exc)
        return (self.raw_head if self.raw_head is not None else data), scratch.our_state is h11.MUST_CLOSE


class H1Exchange:
    """One HTTP/1.1 request/response over a Stream, framed by h11, or read as h1_head.plain_head reads it.

    h11 is made only when needed: a request that closes the connection (every probe's) whose response head is
    plain (h1_head.py) and arrived in the first read is read without it, the body by its Content-Length or to
    EOF, as h11 frames it. Anything else goes to h11, fed the very same bytes in the same reads.
    """

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self._h11: h11.Connection | None = None
        self._request: H1Request | None = None
        self._closes = False         # the request said Connection: close
        self._unfed: list[bytes] = []  # what was read before h11 was made, each read as it came
        self._plain: tuple[int | None, bytes] | None = None  # a plain head's Content-Length and the body read so far
        self.received = 0
        self.eof = False
        # The raw bytes of the response head being read: h11 drops a head it refuses,
        # and Go's error names the offending status line.
        self.head: bytes | None = b""

    @property
    def h11(self) -> h11.Connection:
        """The h11 connection, made (the request sent, what was read fed in) the first time it is needed."""
        if self._h11 is None:
            conn = self._h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=response.MAX_HEAD_BYTES)
            if self._request is not None:  # its bytes went out already; h11 takes its own state from the event
                conn.send(self._request.event())
                conn.send(h11.EndOfMessage())
            for data in self._unfed:
                conn.receive_data(data)
            self._unfed.clear()
        return self._h11

    async def send_request(self, prepared: "Prepared") -> None:
        """`prepared`: the executor's request, whose `h1` is its H1Request."""
        request: H1Request = prepared.h1
        sent = request.sent
        if isinstance(sent, str):
            raise StreamError(sent)
        data, self._closes = sent
        if self._h11 is not None:
            self._h11.send(request.event())
            self._h11.send(h11.EndOfMessage())
        else:
            self._request = request
        await self.stream.send(data)

    async def wait_first_byte(self) -> None:
        await self._receive()

    async def _receive(self, limit: int = RECV_SIZE) -> None:
        data = await self.stream.recv(limit)
        self.eof = not data
        self.received += len(data)
        if self.head is not None:
            self.head += data
        if self._h11 is None:
            self._unfed.append(data)
        else:
            self._h11.receive_data(data)

    async def read_head(self) -> ResponseHead:
        if self._h11 is None and self._closes and len(self._unfed) == 1:
            plain = plain_head(self._unfed[0])
            if plain is not None:
                head, body_start = plain
                self._plain = (head.content_length, self._unfed[0][body_start:])
                self._unfed.clear()
                self.head = None
                return head
        informational = 0
        while True:
            if self.eof and self.received == 0:
                raise StreamError("EOF")  # closed without answering: Go reports the bare EOF
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as exc:
                return self._unparsable_head(exc)
            if event is h11.NEED_DATA:
                bad_status_line = response.status_line_error(self.head or b"")
                if bad_status_line:
                    raise StreamError(bad_status_line)
                if self.eof:
                    raise StreamError(self._broken("unexpected EOF"))
                # Never buffer more than one byte past the limit: a head is either
                # within it or refused, whatever the chunking on the wire.
                buffered = len(self.h11.trailing_data[0])
                if buffered > response.MAX_HEAD_BYTES:
                    raise StreamError(go_errors.head_too_large(response.MAX_HEAD_BYTES))
                try:
                    await self._receive(min(RECV_SIZE, response.MAX_HEAD_BYTES + 1 - buffered))
                except StreamError as exc:
                    raise StreamError(self._broken(str(exc))) from None
                continue
            if isinstance(event, h11.InformationalResponse):
                informational += 1
                if informational > response.MAX_INFORMATIONAL:
                    raise StreamError(go_errors.too_many_informational())
                self.head = self.h11.trailing_data[0]
                continue
            if isinstance(event, h11.Response):
                self.head = None
                return head_of(event)
            raise StreamError(self._broken("unexpected EOF"))

    def _broken(self, error: str) -> str:
        return go_errors.transport_broken(error) if self.received else error

    def _unparsable_head(self, exc: h11.RemoteProtocolError) -> ResponseHead:
        """h11 refused the head: say what Go's reader would have, or take the status Go accepts."""
        if exc.error_status_hint == 431:
            raise StreamError(go_errors.head_too_large(response.MAX_HEAD_BYTES))
        line, newline, _ = (self.head or b"").partition(b"\n")
        if not newline:
            raise StreamError(go_errors.transport_broken("unexpected EOF" if self.eof else "malformed HTTP response"))
        status = response.go_status_line(line)
        if isinstance(status, str):
            raise StreamError(go_errors.transport_broken(status))
        if self.eof:  # the status line was fine, the headers never ended
            raise StreamError(go_errors.transport_broken("unexpected EOF"))
        if response.h11_cannot_frame(status):
            return ResponseHead(status=status, framed=False)
        raise StreamError(go_errors.transport_broken("malformed HTTP response"))

    @property
    def complete(self) -> bool:
        """Request sent and response read to its end, and neither side asked to close (h11's keep-alive)."""
        if self._plain is not None:
            return False  # Connection: close was sent: h11's own state is MUST_CLOSE, never DONE
        return self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE

    def settle(self) -> None:
        """Takes the end of the response if it is already here, without waiting for anything.

        A body read to exactly its Content-Length has not produced h11's EndOfMessage yet,
        while Go's body reader returns EOF with the last byte (and frees the connection).
        """
        if self._plain is None and self.h11.their_state is h11.SEND_BODY:
            try:
                self.h11.next_event()
            except h11.RemoteProtocolError:
                pass

    async def read_body(self, limit: int) -> bytes:
        """Up to `limit` bytes of the body; stops there without waiting for the rest."""
        if self._plain is not None:
            return await self._read_plain_body(limit)
        body = bytearray()
        while len(body) < limit:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as exc:
                raise StreamError("unexpected EOF" if "peer closed" in str(exc) else str(exc)) from None
            if event is h11.NEED_DATA:
                await self._receive()
            elif isinstance(event, h11.Data):
                body += event.data[:limit - len(body)]
            else:  # EndOfMessage or ConnectionClosed
                break
        return bytes(body)

    async def _read_plain_body(self, limit: int) -> bytes:
        """A plain head's body as h11 reads it: its Content-Length (EOF before it: "unexpected EOF"), else to EOF."""
        assert self._plain is not None
        length, body = self._plain
        want = limit if length is None else min(length, limit)
        while len(body) < want:
            data = await self.stream.recv(RECV_SIZE)
            self.eof = not data
            self.received += len(data)
            if not data:
                if length is not None:
                    raise StreamError("unexpected EOF")  # h11: peer closed without sending the complete body
                break
            body += data
        # What was read is handed over once, as h11's events are; a later call reads on from there.
        self._plain = (None if length is None else length - min(len(body), length), b"")
        return bytes(body[:want])


def head_of(response: h11.Response) -> ResponseHead:
    location = None
    content_length = None
    chunked = False
    encoding = None
    for name, value in response.headers:
        if name == b"location" and location is None:
            location = value.decode("utf-8", "surrogateescape")
        elif name == b"content-length":
            content_length = int(value)
        elif name == b"transfer-encoding":
            chunked = True
        elif name == b"content-encoding" and encoding is None:
            encoding = value.decode("latin-1")
    return ResponseHead(status=response.status_code, location=location, content_length=None if chunked else content_length,
                 content_encoding=encoding or "")
