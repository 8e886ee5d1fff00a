"""HTTP/2 as both sides of the daemon's connections spell it (RFC 9113): frame types, flags, error codes, settings,
the frame layout, the events a connection reports, and what it keeps per stream.

What the daemon announces (windows, concurrency, header list size) is here too, so the server's and the client's
sides (h2_server.py, h2_client.py) announce the same.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x5, 0x6, 0x7, 0x8, 0x9
ENHANCE_YOUR_CALM = 0xB

HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = (
    range(1, 7))

DEFAULT_WINDOW = 65_535
DEFAULT_FRAME_SIZE = 16_384
MAX_WINDOW = 2**31 - 1

# The receive windows the client's side announces (the runtime's answers: a ListContainers of a few MiB arrives
# without waiting for window updates). They are given back as the data is consumed (h2_core.py), so they bound what
# the runtime can have sent ahead of the reader: 4 MiB a stream, 16 MiB a connection. The server's are limits.py's.
STREAM_WINDOW = 4 * 1024 * 1024
CONNECTION_WINDOW = 16 * 1024 * 1024

_FRAME_HEAD = struct.Struct(">HBBBL")  # 24-bit length as 16+8 bits, type, flags, R + stream id
_SETTING = struct.Struct(">HL")
_U32 = struct.Struct(">L")


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    size = len(payload)
    return _FRAME_HEAD.pack(size >> 8, size & 0xFF, kind, flags, stream_id) + payload


def settings_payload(settings: dict[int, int]) -> bytes:
    return b"".join(_SETTING.pack(key, value) for key, value in settings.items())


class ConnectionError_(Exception):
    """A rule of the connection was broken: GOAWAY with `code`."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


# --- events ----------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class StreamOpened:
    stream_id: int
    headers: list[tuple[bytes, bytes]]
    ended: bool  # the request has no body (END_STREAM on its HEADERS)
    header_list_size: int = 0  # decoded (RFC 9113 6.5.2); over HEADER_LIST_BYTES the call is refused alone


@dataclass(slots=True)
class DataReceived:
    stream_id: int
    data: bytes
    ended: bool


@dataclass(slots=True)
class StreamEnded:
    """The client closed its side with a trailing HEADERS block (gRPC clients end with DATA instead)."""
    stream_id: int


@dataclass(slots=True)
class StreamReset:
    stream_id: int
    code: int


@dataclass(slots=True)
class WindowOpened:
    """A WINDOW_UPDATE or SETTINGS let this stream's queued DATA or trailers move: its writer may go on."""
    stream_id: int


@dataclass(slots=True)
class ConnectionEnded:
    """GOAWAY was sent (error_code != NO_ERROR: a rule was broken) or received; no new stream will open."""
    error_code: int
    reason: str
    by_peer: bool
    last_stream_id: int = 0  # of a GOAWAY received: the peer's last stream served; later ones never were


Event = StreamOpened | DataReceived | StreamEnded | StreamReset | WindowOpened | ConnectionEnded


# --- per stream ------------------------------------------------------------------------------------------------


class Stream:
    """What a connection keeps of one stream, either side."""

    __slots__ = ("send_window", "pending", "trailers", "end_with_data", "remote_open", "local_open",
                 "receive_window", "consumed")

    def __init__(self, send_window: int, receive_window: int) -> None:
        self.send_window = send_window
        self.pending: deque[bytes] = deque()  # DATA payload waiting for a window
        self.trailers: bytes | None = None  # a closing header block to send once `pending` is out
        self.end_with_data = False  # or: an empty DATA frame with END_STREAM once `pending` is out (a client's)
        self.remote_open = True
        self.local_open = True
        self.receive_window = receive_window  # what the peer may still send on it
        self.consumed = 0  # bytes consumed and not yet given back to the peer's stream window


def unpadded(flags: int, payload: bytes) -> bytes:
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise ConnectionError_(PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1:len(payload) - payload[0]]
