"""gRPC's wire rules that every side of a call follows (doc/PROTOCOL-HTTP2.md of grpc/grpc), once, as grpc-go 1.65
(the kubelet's) has them: pure functions, no I/O, and no grpc import (the worker never loads grpcio).

- A message's 5-byte prefix: `frame_message` builds one (rpc_util.go msgHeader), `read_prefix` reads one
  (parser.recvMsg). Limits, and what a format other than 0 or 1 means, are the reader's to say.
- grpc-timeout in nanoseconds: `encode_timeout` (internal/grpcutil EncodeDuration), `decode_timeout`
  (internal/transport decodeTimeout, the server's).
- grpc-message: `encode_grpc_message` and `decode_grpc_message` (internal/transport encodeGrpcMessage,
  decodeGrpcMessage); decoding gives bytes, as Go's string holds them, and each caller decides how they become text.

Users: the worker's gRPC probe (probe_worker/probes/grpc/) and the daemon's gRPC server and client (shim/rpc/).
"""

from __future__ import annotations

import struct

# --- messages ------------------------------------------------------------------------------------------------------

PREFIX_BYTES = 5
UNCOMPRESSED, COMPRESSED = 0, 1  # grpc-go's payloadFormat: compressionNone, compressionMade
_PREFIX = struct.Struct(">BL")


def frame_message(payload: bytes) -> bytes:
    """An uncompressed message: format 0, the payload's length in 4 bytes big-endian, the payload."""
    return _PREFIX.pack(UNCOMPRESSED, len(payload)) + payload


# read_prefix(data, offset=0) -> (payload format, length) of the message whose prefix starts at `offset` (5 bytes
# must be there); the struct's own method, no Python call around it (every DATA frame the daemon reads goes here).
# grpc-go checks the length against its limit first, then reads the body, and only then the format
# (checkRecvPayload: a format other than 0 or 1 is Internal "received unexpected payload format").
read_prefix = _PREFIX.unpack_from


# --- grpc-timeout --------------------------------------------------------------------------------------------------

MAX_DURATION_NS = 2**63 - 1  # math.MaxInt64: the longest Go time.Duration
_MAX_TIMEOUT_VALUE = 99_999_999  # the spec's 8 digits
_HOUR_NS = 3_600_000_000_000
_ENCODE_UNITS = (("n", 1), ("u", 1_000), ("m", 1_000_000), ("S", 1_000_000_000), ("M", 60_000_000_000))
_UNIT_NS = {b"n": 1, b"u": 1_000, b"m": 1_000_000, b"S": 1_000_000_000, b"M": 60_000_000_000, b"H": _HOUR_NS}


def encode_timeout(ns: int) -> str:
    """EncodeDuration: "0n" for 0 or less, else the finest unit whose count, rounded up, has at most 8 digits.
    More than a Go Duration holds counts as the longest one, so hours never need more than 8 digits either."""
    if ns <= 0:
        return "0n"
    ns = min(ns, MAX_DURATION_NS)
    for unit, size in _ENCODE_UNITS:
        count = -(-ns // size)
        if count <= _MAX_TIMEOUT_VALUE:
            return f"{count}{unit}"
    return f"{-(-ns // _HOUR_NS)}H"


def decode_timeout(value: bytes) -> int | None:
    """decodeTimeout: 1 to 8 ASCII digits and a unit (H M S m u n) -> nanoseconds; None when malformed. "0n" is a
    valid zero timeout (an expired deadline); hours past a Go Duration are clamped to it, as grpc-go does.

    Unlike grpc-go, a sign is refused: Go's strconv.ParseInt takes "+1S" and "-1S" (and a negative hour count then
    overflows), but the spec's TimeoutValue is a positive integer and grpc core refuses a sign as well."""
    size = _UNIT_NS.get(value[-1:])
    digits = value[:-1]
    if size is None or not 0 < len(digits) <= 8 or not digits.isdigit():
        return None
    return min(int(digits) * size, MAX_DURATION_NS)  # only hours can pass it: 99999999M is 6e18 ns


# --- grpc-message --------------------------------------------------------------------------------------------------

_PLAIN = frozenset(range(0x20, 0x7F)) - {0x25}  # ' ' to '~' but '%': sent as they are
_HEX = frozenset(b"0123456789abcdefABCDEF")


def encode_grpc_message(text: str) -> bytes:
    """encodeGrpcMessage: the UTF-8 bytes, each outside 0x20-0x7E and each '%' as %XX (upper-case hex).

    What is not UTF-8 becomes U+FFFD first, as Go's range over a string's runes makes an invalid byte; in a Python
    str that is a lone surrogate."""
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:
        raw = "".join("\ufffd" if "\ud800" <= char <= "\udfff" else char for char in text).encode("utf-8")
    if _PLAIN.issuperset(raw):
        return raw
    return "".join(chr(byte) if byte in _PLAIN else f"%{byte:02X}" for byte in raw).encode("ascii")


def decode_grpc_message(raw: bytes) -> bytes:
    """decodeGrpcMessage: each '%' and two hex digits to that byte; a '%' without two hex digits after it is kept."""
    if b"%" not in raw:
        return raw
    out = bytearray()
    index, end = 0, len(raw)
    while index < end:
        byte = raw[index]
        if byte == 0x25 and index + 2 < end and raw[index + 1] in _HEX and raw[index + 2] in _HEX:
            out.append(int(raw[index + 1:index + 3], 16))
            index += 3
        else:
            out.append(byte)
            index += 1
    return bytes(out)
