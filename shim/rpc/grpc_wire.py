"""gRPC over HTTP/2, the server's half (doc/PROTOCOL-HTTP2.md of grpc/grpc): pure rules, no I/O.

- A request's header block -> `CallHead` (path, metadata as grpc.aio hands it to a handler, deadline, encoding),
  or `BadRequest` with the status grpc core answers for it.
- Length-prefixed messages in, split by `MessageReader` (bounded by the server's receive limit, compressed
  messages inflated for gzip and deflate as grpc core does); one message out by `message`.
- Response header blocks: the initial headers and the trailers (or both in one, "Trailers-Only"), HPACK-encoded
  as literals without indexing (RFC 7541 6.2.2): no dynamic table on either side, so there is no encoder state
  and a block can be built from constants. Status messages percent-encoded, binary metadata in base64.
"""

from __future__ import annotations

import base64
import binascii
import struct
import zlib
from dataclasses import dataclass

import grpc

GRPC_CONTENT_TYPE = b"application/grpc"
TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}

# Headers that belong to HTTP/2 or to gRPC's transport, not to the call's metadata. grpc core hands a handler
# `user-agent` and nothing else of these; the same here.
TRANSPORT_HEADERS = frozenset({
    b"content-type", b"te", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding", b"content-length",
    b"grpc-message-type", b"host", b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding",
    b"upgrade", b"grpc-status", b"grpc-message", b"grpc-internal-encoding-request", b"grpc-previous-rpc-attempts",
})
INFLATERS = {b"gzip": 16 + zlib.MAX_WBITS, b"deflate": zlib.MAX_WBITS}

_LENGTH = struct.Struct(">BL")
Metadata = tuple[tuple[str, str | bytes], ...]


@dataclass(frozen=True, slots=True)
class CallHead:
    path: str
    metadata: Metadata
    timeout_s: float | None
    encoding: bytes  # the request messages' compression, b"identity" when none


@dataclass(frozen=True, slots=True)
class BadRequest:
    """A request that is not a gRPC call this server can serve; answered with Trailers-Only of `code`."""
    code: grpc.StatusCode
    details: str
    http_status: bytes = b"200"


def call_head(headers: list[tuple[bytes, bytes]]) -> CallHead | BadRequest:
    path = method = content_type = None
    timeout_s: float | None = None
    encoding = b"identity"
    metadata: list[tuple[str, str | bytes]] = []
    for name, value in headers:
        if name[:1] == b":":
            if name == b":path":
                path = value
            elif name == b":method":
                method = value
            continue
        if name == b"content-type":
            content_type = value
        elif name == b"grpc-timeout":
            timeout_s = parse_timeout(value)
            if timeout_s is None:
                return BadRequest(grpc.StatusCode.INTERNAL, f"Invalid grpc-timeout: {value!r}")
        elif name == b"grpc-encoding":
            encoding = value
        elif name == b"user-agent" or name not in TRANSPORT_HEADERS:
            key = name.decode("ascii", "replace")
            if key.endswith("-bin"):
                try:  # strictly, as grpc core: it answers INTERNAL where a lenient decoder would drop bytes
                    metadata.append((key, base64.b64decode(value + b"=" * (-len(value) % 4), validate=True)))
                except (binascii.Error, ValueError):
                    return BadRequest(grpc.StatusCode.INTERNAL, f"Invalid base64 in metadata {key}")
            else:
                metadata.append((key, value.decode("latin-1")))
    if method != b"POST":
        return BadRequest(grpc.StatusCode.UNIMPLEMENTED, "gRPC requires POST", http_status=b"405")
    if content_type is None or not content_type.startswith(GRPC_CONTENT_TYPE):
        return BadRequest(grpc.StatusCode.UNKNOWN, "not a gRPC request (content-type)", http_status=b"415")
    if not path:
        return BadRequest(grpc.StatusCode.UNIMPLEMENTED, "no :path")
    if encoding != b"identity" and encoding not in INFLATERS:
        return BadRequest(grpc.StatusCode.UNIMPLEMENTED,
                          f"Compression algorithm '{encoding.decode('latin-1')}' is not supported")
    return CallHead(path.decode("latin-1"), tuple(metadata), timeout_s, encoding)


def parse_timeout(value: bytes) -> float | None:
    """grpc-timeout: at most 8 digits and a unit (H M S m u n); None when malformed."""
    digits, unit = value[:-1], value[-1:]
    if not 0 < len(digits) <= 8 or not digits.isdigit() or unit not in TIMEOUT_UNITS:
        return None
    return int(digits) * TIMEOUT_UNITS[unit]


class MessageTooLarge(Exception):
    pass


class BadMessage(Exception):
    pass


class InvalidMetadata(ValueError):
    """Metadata a handler gave that gRPC cannot carry: grpc core fails the call with INTERNAL "Invalid metadata"."""


class MessageReader:
    """Length-prefixed messages out of a stream's DATA, in order."""

    __slots__ = ("_buffer", "_limit", "_inflate_bits")

    def __init__(self, limit: int, encoding: bytes = b"identity") -> None:
        self._buffer = bytearray()
        self._limit = limit
        self._inflate_bits = INFLATERS.get(encoding)

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self._buffer
        if not buffer and len(data) >= 5:  # the common case: one whole message in one DATA frame
            compressed, length = _LENGTH.unpack_from(data)
            if len(data) == 5 + length and length <= self._limit:
                return [self._payload(compressed, data[5:])]
        buffer += data
        messages = []
        while len(buffer) >= 5:
            compressed, length = _LENGTH.unpack_from(buffer)
            if length > self._limit:
                raise MessageTooLarge(f"Received message larger than max ({length} vs. {self._limit})")
            if len(buffer) < 5 + length:
                break
            messages.append(self._payload(compressed, bytes(buffer[5:5 + length])))
            del buffer[:5 + length]
        return messages

    @property
    def partial(self) -> bool:
        """Bytes of an unfinished message are left (a request that ends here is malformed)."""
        return bool(self._buffer)

    def _payload(self, compressed: int, payload: bytes) -> bytes:
        if not compressed:
            return payload
        if self._inflate_bits is None:
            raise BadMessage("a compressed message without grpc-encoding")
        inflater = zlib.decompressobj(self._inflate_bits)
        try:
            data = inflater.decompress(payload, self._limit + 1)  # bounded: a small message may inflate to GiBs
        except zlib.error as error:
            raise BadMessage(f"cannot decompress the message: {error}") from None
        if len(data) > self._limit:
            raise MessageTooLarge(f"Received message larger than max (over {self._limit} when decompressed)")
        if not inflater.eof:  # all input consumed under the bound, and still no end: a truncated stream
            raise BadMessage("cannot decompress the message: truncated")
        return data


def message(payload: bytes) -> bytes:
    return _LENGTH.pack(0, len(payload)) + payload


# --- header blocks ------------------------------------------------------------------------------------------------


def _integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name: bytes, value: bytes) -> bytes:
    """Literal Header Field without Indexing, new name, no Huffman (RFC 7541 6.2.2)."""
    return b"\x00" + _integer(len(name), 7) + name + _integer(len(value), 7) + value


# ":status: 200" is entry 8 of the static table; content-type (31) as an indexed name with a literal value.
RESPONSE_START = b"\x88" + b"\x0f\x10" + _integer(len(GRPC_CONTENT_TYPE), 7) + GRPC_CONTENT_TYPE
_STATUS_OK = _literal(b"grpc-status", b"0")


# grpc core's rules (src/core/lib/surface/validate_metadata.cc): keys of lower-case letters, digits, "-_."; text
# values of printable ASCII. Upper-case keys are lower-cased (grpcio refuses them; HTTP/2 requires lower case).
_KEY_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789-_.")
_TEXT_BYTES = frozenset(range(0x20, 0x7F))


def metadata_block(metadata) -> bytes:
    """Raises InvalidMetadata for a key or text value grpc core refuses."""
    parts = []
    for key, value in metadata or ():
        name = _ascii(key).lower()
        if not name or not _KEY_BYTES.issuperset(name):
            raise InvalidMetadata(f"metadata key {key!r}")
        if name.endswith(b"-bin"):
            raw = value if isinstance(value, bytes | bytearray) else value.encode()
            value_bytes = base64.b64encode(raw).rstrip(b"=")
        else:  # bytes go as they are (grpcio sends them unencoded), text as ASCII
            value_bytes = _ascii(value)
            if not _TEXT_BYTES.issuperset(value_bytes):
                raise InvalidMetadata(f"metadata value of {key!r}")
        parts.append(_literal(name, value_bytes))
    return b"".join(parts)


def _ascii(text: str | bytes) -> bytes:
    if isinstance(text, bytes | bytearray):
        return bytes(text)
    try:
        return text.encode("ascii")
    except UnicodeEncodeError:
        raise InvalidMetadata(f"not ASCII: {text!r}") from None


def response_headers(initial_metadata=()) -> bytes:
    """Raises InvalidMetadata as metadata_block does."""
    return RESPONSE_START + metadata_block(initial_metadata) if initial_metadata else RESPONSE_START


def trailers(code: grpc.StatusCode, details: str = "", trailing_metadata=(), *, trailers_only: bool = False,
             http_status: bytes = b"200") -> bytes:
    """The closing header block; with `trailers_only` it also starts the response (no headers were sent).
    Trailing metadata that cannot be sent turns the status into INTERNAL "Invalid metadata", as in grpc core."""
    try:
        metadata = metadata_block(trailing_metadata)
    except InvalidMetadata:  # grpc core's answer when a handler's trailing metadata cannot be sent
        code, details, metadata = grpc.StatusCode.INTERNAL, "Invalid metadata", b""
    if code is grpc.StatusCode.OK and not details:
        block = _STATUS_OK
    else:
        block = _literal(b"grpc-status", str(code.value[0]).encode())
        if details:
            block += _literal(b"grpc-message", percent_encoded(details))
    block += metadata
    if not trailers_only:
        return block
    if http_status != b"200":
        return _literal(b":status", http_status) + b"\x0f\x10" + _integer(
            len(GRPC_CONTENT_TYPE), 7) + GRPC_CONTENT_TYPE + block
    return RESPONSE_START + block


def percent_encoded(text: str) -> bytes:
    """grpc-message: UTF-8, with bytes outside 0x20-0x7E and '%' itself as %XX."""
    raw = text.encode("utf-8", "replace")
    if all(0x20 <= byte <= 0x7E and byte != 0x25 for byte in raw):
        return raw
    return b"".join(bytes((byte,)) if 0x20 <= byte <= 0x7E and byte != 0x25 else b"%%%02X" % byte for byte in raw)


# --- the client's half (client.py): what a response's header blocks carry -------------------------------------------

literal = _literal


def response_metadata(headers: list[tuple[bytes, bytes]]) -> tuple[tuple[str, str | bytes], ...]:
    """A response's metadata as grpc's clients hand it over: no pseudo-headers or transport headers, -bin decoded.
    Raises InvalidMetadata for binary metadata that is not base64 (grpc core then fails the call INTERNAL)."""
    metadata: list[tuple[str, str | bytes]] = []
    for name, value in headers:
        if name[:1] == b":" or name in TRANSPORT_HEADERS:
            continue
        key = name.decode("latin-1")
        if key.endswith("-bin"):
            try:
                metadata.append((key, base64.b64decode(value + b"=" * (-len(value) % 4), validate=True)))
            except (binascii.Error, ValueError):
                raise InvalidMetadata(f"Error parsing '{key}' metadata: illegal base64 encoding") from None
        else:
            metadata.append((key, value.decode("latin-1")))
    return tuple(metadata)


def percent_decoded(raw: bytes) -> str:
    """grpc-message back to text: %XX sequences to bytes (invalid sequences kept, as grpc does), then UTF-8, or
    Latin-1 when that fails, as grpcio hands details over (grpc/_common.py decode)."""
    if b"%" not in raw:
        return _text(raw)
    out = bytearray()
    index = 0
    while index < len(raw):
        byte = raw[index]
        if byte == 0x25 and _is_hex(raw[index + 1:index + 3]):
            out.append(int(raw[index + 1:index + 3], 16))
            index += 3
        else:
            out.append(byte)
            index += 1
    return _text(bytes(out))


def _text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def _is_hex(pair: bytes) -> bool:
    return len(pair) == 2 and all(c in b"0123456789abcdefABCDEF" for c in pair)
