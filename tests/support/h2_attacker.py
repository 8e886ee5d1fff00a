"""A hostile HTTP/2 client of the daemon's unix socket: the frames an attacker writes, built by hand, and what the
server answers, read back.

A well-kept client library (h2, grpcio) refuses to break the rules these tests break (a stream reset as soon as it
is opened, SETTINGS by the million, DATA after END_STREAM, half a frame), so the frames are built here with struct
and the header blocks with hpack. What the server answers is split into frames here too, not by hyperframe: the
tests read millions of frames back (a SETTINGS ACK per SETTINGS), and a frame object each costs ten times the
splitting. Only what a test asserts on is decoded: SETTINGS, GOAWAY (code, last stream, debug data), RST_STREAM,
HEADERS (hpack, in order, so the table follows the server's) for grpc-status, WINDOW_UPDATE for flow control.

- `HeaderBlocks`: a connection's HPACK encoder. A call's first header block is literals with indexing, the next ones
  with the same headers are indexed from the dynamic table: six bytes, so a HEADERS frame is fifteen.
- `ServerView`: what the server said so far (sans-IO: frames in, state out).
- `Attacker`: the socket (non-blocking, polled). Two modes: `reads=True` reads and parses everything the server
  sends whenever it waits to write (it never lets the server's writes back up); `reads=False` never reads, so the
  socket's receive buffer fills and what the server writes stays in the server. Writes of any size in chunks
  (`send`), stopping cleanly on EPIPE/ECONNRESET, on a GOAWAY (reading mode), or when the server stopped reading
  (no progress for `stall_s`). Every wait has a timeout: a server that wedges ends the test, never hangs it.
"""

from __future__ import annotations

import resource
import select
import socket
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import IntEnum

import hpack
from h2.errors import ErrorCodes

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class Kind(IntEnum):
    DATA = 0
    HEADERS = 1
    PRIORITY = 2
    RST_STREAM = 3
    SETTINGS = 4
    PUSH_PROMISE = 5
    PING = 6
    GOAWAY = 7
    WINDOW_UPDATE = 8
    CONTINUATION = 9


END_STREAM = ACK = 0x1
END_HEADERS = 0x4

HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = (
    range(1, 7))
DEFAULT_WINDOW = 65_535
MAX_WINDOW = 2**31 - 1
FRAME_SIZE = 16_384  # SETTINGS_MAX_FRAME_SIZE's default: the daemon never announces more

HEALTH_CHECK = "/grpc.health.v1.Health/Check"
SHIM_VERSION = "/runtime.probe.v1alpha1.ProbeService/ShimVersion"
WATCH_PROBE_STATUS = "/runtime.probe.v1alpha1.ProbeService/WatchProbeStatus"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"

_HEAD = struct.Struct(">HBBBL")  # 24-bit length as 16 + 8 bits, type, flags, R + stream id
_U32 = struct.Struct(">L")
_SETTING = struct.Struct(">HL")


# --- frames ----------------------------------------------------------------------------------------------------

def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    size = len(payload)
    return _HEAD.pack(size >> 8, size & 0xFF, kind, flags, stream_id) + payload


def settings_frame(settings: dict[int, int] | None = None, *, ack: bool = False) -> bytes:
    payload = b"".join(_SETTING.pack(key, value) for key, value in (settings or {}).items())
    return frame(Kind.SETTINGS, ACK if ack else 0, 0, payload)


def ping_frame(opaque: bytes = bytes(8), *, ack: bool = False) -> bytes:
    return frame(Kind.PING, ACK if ack else 0, 0, opaque)


def rst_stream_frame(stream_id: int, code: int = ErrorCodes.CANCEL) -> bytes:
    return frame(Kind.RST_STREAM, 0, stream_id, _U32.pack(code))


def window_update_frame(stream_id: int, increment: int) -> bytes:
    return frame(Kind.WINDOW_UPDATE, 0, stream_id, _U32.pack(increment))


def data_frame(stream_id: int, data: bytes = b"", *, end_stream: bool = False) -> bytes:
    return frame(Kind.DATA, END_STREAM if end_stream else 0, stream_id, data)


def headers_frame(stream_id: int, block: bytes, *, end_stream: bool = False, end_headers: bool = True) -> bytes:
    return frame(Kind.HEADERS, (END_STREAM if end_stream else 0) | (END_HEADERS if end_headers else 0), stream_id,
                 block)


def continuation_frame(stream_id: int, block: bytes = b"", *, end_headers: bool = False) -> bytes:
    return frame(Kind.CONTINUATION, END_HEADERS if end_headers else 0, stream_id, block)


def goaway_frame(last_stream_id: int, code: int = ErrorCodes.NO_ERROR, debug: bytes = b"") -> bytes:
    return frame(Kind.GOAWAY, 0, 0, _U32.pack(last_stream_id) + _U32.pack(code) + debug)


def grpc_message(payload: bytes = b"") -> bytes:
    """A length-prefixed gRPC message (uncompressed). The empty payload is an empty protobuf message, the request
    of Health/Check, ShimVersion and an unfiltered WatchProbeStatus."""
    return b"\x00" + _U32.pack(len(payload)) + payload


def message_prefix(length: int) -> bytes:
    """The 5-byte prefix announcing a message of `length` bytes (whose bytes may never all come)."""
    return b"\x00" + _U32.pack(length)


def request_headers(path: str, *, timeout: str | None = None,
                    metadata: Iterable[tuple[str, str]] = ()) -> list[tuple[bytes, bytes]]:
    """A gRPC request's headers as grpc clients send them; `timeout` is grpc-timeout's text ("1n", "0n", "5S")."""
    headers = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", path.encode()),
               (b":authority", b"localhost"), (b"content-type", b"application/grpc"), (b"te", b"trailers")]
    if timeout is not None:
        headers.append((b"grpc-timeout", timeout.encode()))
    headers.extend((name.encode(), value.encode()) for name, value in metadata)
    return headers


def never_indexed(headers: Iterable[tuple[str, str]]) -> list[hpack.NeverIndexedHeaderTuple]:
    """Metadata sent as literals never indexed: it leaves the dynamic table (and the cheap blocks) as they are."""
    return [hpack.NeverIndexedHeaderTuple(name.encode(), value.encode()) for name, value in headers]


class HeaderBlocks:
    """A connection's HPACK encoder, with the indexed blocks remembered.

    A block must be sent in the order it was encoded (the server's decoder follows the encoder's table). A block
    that adds nothing to the table (every field indexed) stays valid as long as the table does not change, so it is
    kept and reused: 120k requests cost one encoding. An encoding that changes the table forgets them all (a new
    entry shifts every dynamic index by one)."""

    def __init__(self) -> None:
        self._encoder = hpack.Encoder()
        self._indexed: dict[tuple, bytes] = {}

    def block(self, headers: list) -> bytes:
        key = tuple(headers)
        cached = self._indexed.get(key)
        if cached is not None:
            return cached
        table = self._encoder.header_table.dynamic_entries
        before = list(table)
        block = self._encoder.encode(headers)
        if list(table) == before:
            self._indexed[key] = block
        else:
            self._indexed.clear()
        return block


def code_name(code: int) -> str:
    try:
        return ErrorCodes(code).name
    except ValueError:
        return hex(code)


# --- what the server said --------------------------------------------------------------------------------------

@dataclass
class GoAway:
    last_stream_id: int
    error_code: int
    debug: bytes
    at: float  # time.monotonic() when read
    settings_acks: int = 0  # what the server had answered before it: where in a flood it stopped
    ping_acks: int = 0

    @property
    def code_name(self) -> str:
        return code_name(self.error_code)


@dataclass
class StreamView:
    headers: list[list[tuple[bytes, bytes]]] = field(default_factory=list)
    data_bytes: int = 0
    ended: bool = False  # the server's END_STREAM
    reset: int | None = None  # the server's RST_STREAM code

    @property
    def grpc_status(self) -> int | None:
        """grpc-status of the closing header block (trailers, or Trailers-Only)."""
        if not self.ended or not self.headers:
            return None
        for name, value in self.headers[-1]:
            if name == b"grpc-status":
                return int(value)
        return None

    @property
    def grpc_message(self) -> str:
        for name, value in self.headers[-1] if self.headers else ():
            if name == b"grpc-message":
                return value.decode("utf-8", "replace")
        return ""

    @property
    def answered(self) -> bool:
        return self.ended or self.reset is not None


class ServerView:
    """The frames the server sent, applied (sans-IO). Counts what a flood makes it send; decodes what is asserted on."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = 1 << 24  # what the server sends is not what is under test
        self._continuing: tuple[int, int, bytearray] | None = None
        self.frames = dict.fromkeys(Kind, 0)
        self.bytes_read = 0
        self.settings: dict[int, int] = {}
        self.settings_seen = False
        self.settings_acks = 0
        self.ping_acks = 0
        self.pings: list[bytes] = []  # the server's own PINGs (not ACKs)
        self.goaway: GoAway | None = None
        self.goaways: list[GoAway] = []
        self.streams: dict[int, StreamView] = {}
        self.send_window = DEFAULT_WINDOW  # the connection's, for what this client sends
        self.stream_windows: dict[int, int] = {}  # changes to a stream's window since it opened
        self.to_ack: list[bytes] = []  # SETTINGS and PING acknowledgements this client owes

    def stream(self, stream_id: int) -> StreamView:
        view = self.streams.get(stream_id)
        if view is None:
            view = self.streams[stream_id] = StreamView()
        return view

    def feed(self, data: bytes) -> None:
        self.bytes_read += len(data)
        buffer = self._buffer
        buffer += data
        offset, size = 0, len(buffer)
        frames = self.frames
        while size - offset >= 9:
            high, low, kind, flags, stream_id = _HEAD.unpack_from(buffer, offset)
            end = offset + 9 + (high << 8 | low)
            if end > size:
                break
            if kind == Kind.SETTINGS and flags & ACK:  # the answer to a SETTINGS flood: only counted
                frames[Kind.SETTINGS] += 1
                self.settings_acks += 1
            elif kind == Kind.PING and flags & ACK:
                frames[Kind.PING] += 1
                self.ping_acks += 1
            else:
                self._frame(kind, flags, stream_id & 0x7FFFFFFF, bytes(buffer[offset + 9:end]))
            offset = end
        del buffer[:offset]

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if kind in self.frames:
            self.frames[Kind(kind)] += 1
        if kind == Kind.SETTINGS:
            for offset in range(0, len(payload) - len(payload) % 6, 6):
                key, value = _SETTING.unpack_from(payload, offset)
                if key == INITIAL_WINDOW_SIZE:
                    old = self.settings.get(INITIAL_WINDOW_SIZE, DEFAULT_WINDOW)
                    for sid in self.stream_windows:
                        self.stream_windows[sid] += value - old
                self.settings[key] = value
            self.settings_seen = True
            self.to_ack.append(settings_frame(ack=True))
        elif kind == Kind.PING:
            self.pings.append(payload)
            self.to_ack.append(ping_frame(payload, ack=True))
        elif kind == Kind.GOAWAY:
            goaway = GoAway(_U32.unpack_from(payload)[0] & 0x7FFFFFFF, _U32.unpack_from(payload, 4)[0],
                            payload[8:], time.monotonic(), self.settings_acks, self.ping_acks)
            self.goaways.append(goaway)
            if self.goaway is None or goaway.error_code:
                self.goaway = goaway
        elif kind == Kind.RST_STREAM:
            self.stream(stream_id).reset = _U32.unpack(payload)[0]
        elif kind == Kind.WINDOW_UPDATE:
            increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
            if stream_id == 0:
                self.send_window += increment
            else:
                self.stream_windows[stream_id] = self.stream_windows.get(stream_id, 0) + increment
        elif kind == Kind.DATA:
            view = self.stream(stream_id)
            view.data_bytes += len(payload)
            if flags & END_STREAM:
                view.ended = True
        elif kind == Kind.HEADERS:
            block = payload
            if flags & 0x8:  # PADDED
                block = block[1:len(block) - block[0]]
            if flags & 0x20:  # PRIORITY
                block = block[5:]
            if flags & END_HEADERS:
                self._headers(stream_id, flags, block)
            else:
                self._continuing = (stream_id, flags, bytearray(block))
        elif kind == Kind.CONTINUATION and self._continuing is not None:
            first = self._continuing
            first[2].extend(payload)
            if flags & END_HEADERS:
                self._continuing = None
                self._headers(first[0], first[1], bytes(first[2]))

    def _headers(self, stream_id: int, flags: int, block: bytes) -> None:
        view = self.stream(stream_id)
        view.headers.append(self._decoder.decode(block, raw=True))
        if flags & END_STREAM:
            view.ended = True

    def stream_send_window(self, stream_id: int) -> int:
        return self.settings.get(INITIAL_WINDOW_SIZE, DEFAULT_WINDOW) + self.stream_windows.get(stream_id, 0)

    def statuses(self, stream_ids: Iterable[int]) -> dict[int | str | None, int]:
        """How the streams ended: {grpc-status: count}, "RST <code name>" for a reset, None for no answer yet."""
        tally: dict[int | str | None, int] = {}
        for stream_id in stream_ids:
            view = self.streams.get(stream_id)
            if view is None or not view.answered:
                key: int | str | None = None
            elif view.ended:
                key = view.grpc_status
            else:
                key = f"RST {code_name(view.reset)}"
            tally[key] = tally.get(key, 0) + 1
        return tally


# --- the socket ------------------------------------------------------------------------------------------------

@dataclass
class Sent:
    """How a write ended: "done", "goaway" (read one, reading mode), "closed" (EPIPE/ECONNRESET/EOF) or "stalled"
    (nothing could be written for `stall_s`: the server stopped reading)."""
    stopped: str
    bytes: int
    chunks: int
    seconds: float


class Attacker:
    """One raw connection to the daemon's socket. See the module docstring for the two modes."""

    def __init__(self, path: str, *, reads: bool = True, sndbuf: int | None = None, rcvbuf: int | None = None,
                 connect_timeout: float = 10.0) -> None:
        self.path = path
        self.reads = reads
        self.view = ServerView()
        self.blocks = HeaderBlocks()
        self.closed = False  # the server closed (EOF, EPIPE, ECONNRESET)
        self.closed_at: float | None = None
        self.sent_bytes = 0
        self._next_stream = 1
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if sndbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        # A blocking connect waits while the listener's backlog is full (a non-blocking one fails with EAGAIN, which
        # socket.settimeout() does not retry); SO_SNDTIMEO bounds that wait for a unix socket.
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(connect_timeout))
        try:
            self.sock.connect(path)
        except BaseException:
            self.sock.close()
            raise
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(0))
        self.sock.setblocking(False)
        self.started = False  # sent the preface: until then nothing is written, not even an acknowledgement
        self._poll = select.poll()
        self._poll.register(self.sock, select.POLLIN)

    # --- the start of a connection -----------------------------------------------------------------------------

    def start(self, settings: dict[int, int] | None = None, *, open_windows: bool = True,
              handshake: bool = True, timeout: float = 10.0) -> Attacker:
        """The preface and SETTINGS. open_windows: a large stream and connection window, as grpc's clients announce
        (the server's answers never wait for this client's WINDOW_UPDATEs). handshake (reading mode): waits for
        the server's SETTINGS and acknowledges them."""
        ours = dict(settings or {})
        self.started = True
        preamble = PREFACE
        if open_windows:
            ours.setdefault(INITIAL_WINDOW_SIZE, MAX_WINDOW)
        preamble += settings_frame(ours)
        if open_windows:
            preamble += window_update_frame(0, MAX_WINDOW - DEFAULT_WINDOW)
        self.send(preamble, stall_s=timeout)
        if handshake and self.reads:
            if not self.read_until(lambda view: view.settings_seen, timeout):
                raise AssertionError(f"no SETTINGS from the server within {timeout} s (closed: {self.closed})")
            self.send(b"", stall_s=timeout)  # the ACK it is owed
        return self

    # --- streams -----------------------------------------------------------------------------------------------

    def new_stream(self) -> int:
        stream_id, self._next_stream = self._next_stream, self._next_stream + 2
        return stream_id

    def skip_streams(self, count: int) -> int:
        """Reserves `count` stream ids (for frames built by hand); returns the first."""
        first = self._next_stream
        self._next_stream += 2 * count
        return first

    def call_frames(self, path: str, message: bytes | None = b"", *, timeout: str | None = None,
                    metadata: Iterable[tuple[str, str]] = (), big_metadata: Iterable[tuple[str, str]] = (),
                    end_stream: bool = True) -> tuple[int, bytes]:
        """A new stream's frames: HEADERS, then (message not None) one DATA with the gRPC message, ending the
        request when end_stream. big_metadata is sent never-indexed, across CONTINUATION frames if it must be."""
        stream_id = self.new_stream()
        headers = request_headers(path, timeout=timeout, metadata=metadata)
        extra = never_indexed(big_metadata)
        block = self.blocks.block(headers + extra if extra else headers)
        headers_end = end_stream and message is None
        if len(block) <= FRAME_SIZE:
            out = headers_frame(stream_id, block, end_stream=headers_end)
        else:
            out = headers_frame(stream_id, block[:FRAME_SIZE], end_stream=headers_end, end_headers=False)
            rest = block[FRAME_SIZE:]
            while rest:
                out += continuation_frame(stream_id, rest[:FRAME_SIZE], end_headers=len(rest) <= FRAME_SIZE)
                rest = rest[FRAME_SIZE:]
        if message is not None:
            out += data_frame(stream_id, grpc_message(message), end_stream=end_stream)
        return stream_id, out

    def call(self, path: str, message: bytes | None = b"", **kw) -> int:
        """Opens a call now (call_frames, written); returns its stream id."""
        stream_id, out = self.call_frames(path, message, **kw)
        self.send(out)
        return stream_id

    def repeated_calls(self, count: int, path: str, *, message: bytes | None = b"", timeout: str | None = None,
                       reset: bool = False, per_chunk: int = 4096, end_stream: bool = True,
                       extra: Callable[[int], bytes] | None = None) -> tuple[list[int], Iterator[bytes]]:
        """`count` calls of the same headers as chunks of `per_chunk` calls: the first call's block literal, the rest
        indexed. reset: each HEADERS followed at once by RST_STREAM CANCEL (rapid reset). extra(stream_id): more
        frames after each call's own. Returns the stream ids and the chunks (build them lazily, send in order)."""
        headers = request_headers(path, timeout=timeout)
        first = self.skip_streams(count)
        stream_ids = list(range(first, first + 2 * count, 2))
        body = None if message is None else data_frame(0, grpc_message(message), end_stream=end_stream)

        def chunks() -> Iterator[bytes]:
            block = self.blocks.block(headers)
            parts: list[bytes] = []
            headers_end = end_stream and message is None
            for index, stream_id in enumerate(stream_ids):
                if index == 1:
                    block = self.blocks.block(headers)  # indexed from here on
                parts.append(headers_frame(stream_id, block, end_stream=headers_end))
                if body is not None:
                    parts.append(body[:5] + _U32.pack(stream_id) + body[9:])
                if reset:
                    parts.append(rst_stream_frame(stream_id))
                if extra is not None:
                    parts.append(extra(stream_id))
                if len(parts) >= per_chunk:
                    yield b"".join(parts)
                    parts.clear()
            if parts:
                yield b"".join(parts)

        return stream_ids, chunks()

    # --- writing -----------------------------------------------------------------------------------------------

    def send(self, data: bytes | Iterable[bytes], *, stall_s: float = 10.0, stop_on_goaway: bool = True) -> Sent:
        """Writes `data` (bytes, or an iterable of chunks, written in order). In reading mode everything readable
        is read meanwhile, and acknowledgements the server is owed go out between chunks. Stops early on EPIPE or
        ECONNRESET ("closed"), a GOAWAY ("goaway", reading mode, when stop_on_goaway), or `stall_s` without a
        byte written ("stalled")."""
        chunks: Iterable[bytes] = (data,) if isinstance(data, bytes | bytearray | memoryview) else data
        start, written, count = time.monotonic(), 0, 0
        for chunk in chunks:
            view = memoryview(self._owed() + bytes(chunk))
            while view:
                if self.closed:
                    return Sent("closed", written, count, time.monotonic() - start)
                if stop_on_goaway and self.view.goaway is not None:
                    return Sent("goaway", written, count, time.monotonic() - start)
                try:
                    n = self.sock.send(view)
                except BlockingIOError:
                    if not self._wait_writable(stall_s):
                        return Sent("stalled", written, count, time.monotonic() - start)
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    self._closed()  # what the server wrote before it closed is still there to read
                    return Sent("closed", written, count, time.monotonic() - start)
                view = view[n:]
                written += n
                self.sent_bytes += n
            count += 1
            if self.reads:
                self.pump()  # a server that keeps up never fills the socket: its answers are read here
        if self.reads:
            self.pump()
        stopped = "goaway" if stop_on_goaway and self.view.goaway is not None else "done"
        return Sent("closed" if self.closed else stopped, written, count, time.monotonic() - start)

    def send_data(self, stream_id: int, data: bytes, *, end_stream: bool = False, timeout: float = 10.0) -> int:
        """DATA within the server's windows (reading mode): waits for its WINDOW_UPDATEs. Stops when the stream is
        answered (its END_STREAM or RST_STREAM), the connection ends, or no window opens within `timeout`. Returns
        the bytes sent."""
        sent = 0
        while sent < len(data) or (end_stream and sent == len(data) == 0):
            stream = self.view.streams.get(stream_id)
            if self.closed or (stream is not None and stream.answered) or self.view.goaway is not None:
                return sent
            room = min(FRAME_SIZE, self.view.send_window, self.view.stream_send_window(stream_id), len(data) - sent)
            if room <= 0 and len(data) > sent:
                if not self.read_until(lambda view: min(view.send_window, view.stream_send_window(stream_id)) > 0
                                       or view.streams.get(stream_id, StreamView()).answered, timeout):
                    return sent
                continue
            chunk = data[sent:sent + room]
            last = end_stream and sent + room == len(data)
            self.view.send_window -= len(chunk)
            self.view.stream_windows[stream_id] = self.view.stream_windows.get(stream_id, 0) - len(chunk)
            if self.send(data_frame(stream_id, chunk, end_stream=last)).stopped not in ("done",):
                return sent
            sent += len(chunk)
            if last or not data:
                break
        return sent

    def _owed(self) -> bytes:
        if not self.view.to_ack or not self.started:
            return b""
        owed = b"".join(self.view.to_ack)
        self.view.to_ack.clear()
        return owed

    def _wait_writable(self, stall_s: float) -> bool:
        """Until the socket takes bytes again, reading meanwhile (reading mode). False after stall_s."""
        deadline = time.monotonic() + stall_s
        self._poll.modify(self.sock, select.POLLOUT | (select.POLLIN if self.reads else 0))
        try:
            while not self.closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                for _, events in self._poll.poll(left * 1000):
                    if events & (select.POLLIN | select.POLLHUP | select.POLLERR) and self.reads:
                        self.pump()
                    if events & select.POLLOUT:
                        return True
                    if events & (select.POLLHUP | select.POLLERR) and not self.reads:
                        return True  # the write says how it ended (EPIPE)
            return True
        finally:
            self._poll.modify(self.sock, select.POLLIN)

    # --- reading -----------------------------------------------------------------------------------------------

    def pump(self) -> bool:
        """Reads what is there now, without waiting. False once the server closed."""
        while not self.closed:
            try:
                data = self.sock.recv(1 << 20)
            except BlockingIOError:
                return True
            except ConnectionResetError:
                self._closed()
                return False
            if not data:
                self._closed()
                return False
            self.view.feed(data)
        return False

    def read_until(self, done: Callable[[ServerView], bool], timeout: float) -> bool:
        """Reads until done(view), the server closes, or timeout; says whether done(view) holds. Acknowledgements
        the server is owed are written as they come (a polite client, so the server has no reason to stop)."""
        assert self.reads, "a never-reading attacker cannot wait for an answer"
        deadline = time.monotonic() + timeout
        while not done(self.view):
            if self.view.to_ack and self.started and not self.closed:
                self._write_owed()
            if self.closed or not self.pump():
                return done(self.view)
            if done(self.view):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._poll.poll(min(left, 1.0) * 1000)
        return True

    def read_until_closed(self, timeout: float) -> bool:
        """Reads (reading mode) or waits (never-reading mode: only for EOF's POLLHUP) until the server closes."""
        if self.reads:
            self.read_until(lambda view: False, timeout)
            return self.closed
        deadline = time.monotonic() + timeout
        self._poll.modify(self.sock, 0)  # POLLHUP is reported whatever is asked for; unread data is not asked for
        try:
            while not self.closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                for _, events in self._poll.poll(min(left, 1.0) * 1000):
                    if events & (select.POLLHUP | select.POLLERR):
                        self._closed()
            return True
        finally:
            if not self.closed:
                self._poll.modify(self.sock, select.POLLIN)

    def _write_owed(self) -> None:
        owed = self._owed()
        try:
            self.sock.send(owed)  # a few frames; a full buffer drops them (the flood's own writes come first)
        except BlockingIOError:
            pass
        except (BrokenPipeError, ConnectionResetError):
            self._closed()

    def _closed(self) -> None:
        """The server closed: in reading mode, what it wrote before is read first (its GOAWAY, say)."""
        if self.closed:
            return
        self.closed, self.closed_at = True, time.monotonic()
        if self.reads:
            while True:
                try:
                    data = self.sock.recv(1 << 20)
                except OSError:  # BlockingIOError: all read; ECONNRESET: the rest is gone
                    return
                if not data:
                    return
                self.view.feed(data)

    def close(self) -> None:
        self._closed()
        self.sock.close()

    def __enter__(self) -> Attacker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _timeval(seconds: float) -> bytes:
    return struct.pack("ll", int(seconds), int(seconds % 1 * 1e6))


def repeated(frame_bytes: bytes, count: int, per_chunk: int = 8192) -> Iterator[bytes]:
    """`count` copies of one frame, as chunks of `per_chunk` frames (one bytes object reused)."""
    full, rest = divmod(count, per_chunk)
    chunk = frame_bytes * per_chunk
    for _ in range(full):
        yield chunk
    if rest:
        yield frame_bytes * rest


def pump_all(attackers: list[Attacker], done: Callable[[Attacker], bool], timeout: float) -> bool:
    """Reads every connection (all in reading mode) until done(attacker) holds for each, or timeout. A connection
    the server closed counts as done once done() has been asked for it. Says whether all were done."""
    poll = select.poll()
    by_fd: dict[int, Attacker] = {}
    for attacker in attackers:
        if not done(attacker) and not attacker.closed:
            poll.register(attacker.sock, select.POLLIN)
            by_fd[attacker.sock.fileno()] = attacker
    deadline = time.monotonic() + timeout
    while by_fd:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        for fd, _ in poll.poll(min(left, 1.0) * 1000):
            attacker = by_fd[fd]
            attacker.pump()
            if attacker.view.to_ack and attacker.started and not attacker.closed:
                attacker._write_owed()
            if done(attacker) or attacker.closed:
                poll.unregister(fd)
                del by_fd[fd]
    return all(done(attacker) for attacker in attackers)


def raise_fd_limit(needed: int) -> None:
    """RLIMIT_NOFILE's soft limit up to `needed` (root may raise the hard limit too)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            hard = needed
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
