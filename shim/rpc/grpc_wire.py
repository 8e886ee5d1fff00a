"""gRPC over HTTP/2, the server's half (doc/PROTOCOL-HTTP2.md of grpc/grpc): pure rules, no I/O.

- A request's header block -> `CallHead` (path, metadata as grpc.aio hands it to a handler, deadline, encoding),
  or `BadRequest` with the status grpc core answers for it.
- Length-prefixed messages in, split by `MessageReader` (bounded by the server's receive limit, compressed
  messages inflated for gzip and deflate as grpc core does).
- Response header blocks: the initial headers and the trailers (or both in one, "Trailers-Only"), HPACK-encoded
  as literals without indexing (RFC 7541 6.2.2): no dynamic table on either side, so there is no encoder state
  and a block can be built from constants. Status messages percent-encoded, binary metadata in base64.

gRPC's own encodings (the message prefix, grpc-timeout, grpc-message) are probe_api/grpc_wire_rules.py's, shared with
the worker; the daemon's readings of them are here.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from dataclasses import dataclass

import grpc

from probe_api import hpack_literals
from probe_api.grpc_wire_rules import (
    COMPRESSED, PREFIX_BYTES, UNCOMPRESSED, decode_grpc_message, decode_timeout, encode_grpc_message, frame_message,
    read_prefix,
)

GRPC_CONTENT_TYPE = b"application/grpc"

# Headers that belong to HTTP/2 or to gRPC's transport, not to the call's metadata. grpc core hands a handler
# `user-agent` and nothing else of these; the same here.
TRANSPORT_HEADERS = frozenset({
    b"content-type", b"te", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding", b"content-length",
    b"grpc-message-type", b"host", b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding",
    b"upgrade", b"grpc-status", b"grpc-message", b"grpc-internal-encoding-request", b"grpc-previous-rpc-attempts",
})
INFLATERS = {b"gzip": 16 + zlib.MAX_WBITS, b"deflate": zlib.MAX_WBITS}

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
            timeout_ns = decode_timeout(value)
            if timeout_ns is None:
                return BadRequest(grpc.StatusCode.INTERNAL, f"Invalid grpc-timeout: {value!r}")
            timeout_s = timeout_ns / 1e9
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
    """grpc-timeout in seconds, None when malformed (decode_timeout's rule). Kept for callers outside this module
    that import it by this name."""
    ns = decode_timeout(value)
    return None if ns is None else ns / 1e9


class MessageTooLarge(Exception):
    pass


class BadMessage(Exception):
    pass


class InvalidMetadata(ValueError):
    """Metadata a handler gave that gRPC cannot carry: grpc core fails the call with INTERNAL "Invalid metadata"."""


class MessageReader:
    """Length-prefixed messages out of a stream's DATA, in order (the prefix read by grpc_wire_rules.read_prefix)."""

    __slots__ = ("_buffer", "_limit", "_inflate_bits")

    def __init__(self, limit: int, encoding: bytes = b"identity") -> None:
        self._buffer = bytearray()
        self._limit = limit
        self._inflate_bits = INFLATERS.get(encoding)

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self._buffer
        if not buffer and len(data) >= PREFIX_BYTES:  # the common case: one whole message in one DATA frame
            flag, length = read_prefix(data)
            if len(data) == PREFIX_BYTES + length and length <= self._limit:
                return [self._payload(flag, data[PREFIX_BYTES:])]
        buffer += data
        messages = []
        while len(buffer) >= PREFIX_BYTES:
            flag, length = read_prefix(buffer)
            if length > self._limit:
                raise MessageTooLarge(f"Received message larger than max ({length} vs. {self._limit})")
            end = PREFIX_BYTES + length
            if len(buffer) < end:
                break
            messages.append(self._payload(flag, bytes(buffer[PREFIX_BYTES:end])))
            del buffer[:end]
        return messages

    @property
    def partial(self) -> bool:
        """Bytes of an unfinished message are left (a request that ends here is malformed)."""
        return bool(self._buffer)

    @property
    def buffered(self) -> int:
        """How many bytes of an unfinished message it holds (its prefix included)."""
        return len(self._buffer)

    def _payload(self, flag: int, payload: bytes) -> bytes:
        if flag == UNCOMPRESSED:
            return payload
        if flag != COMPRESSED:  # grpc-go's checkRecvPayload; grpc core: "Bad GRPC frame type"
            raise BadMessage(f"received unexpected payload format {flag}")
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


# The shared rules under this module's old names, kept for the callers that import them so (shim/rpc/client.py and
# call.py send `message`).
message = frame_message
percent_encoded = encode_grpc_message


# --- header blocks ------------------------------------------------------------------------------------------------


_integer, _literal = hpack_literals.integer, hpack_literals.literal  # probe_api/hpack_literals.py: shared with probectl

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
            block += _literal(b"grpc-message", encode_grpc_message(details))
    block += metadata
    if not trailers_only:
        return block
    if http_status != b"200":
        return _literal(b":status", http_status) + b"\x0f\x10" + _integer(
            len(GRPC_CONTENT_TYPE), 7) + GRPC_CONTENT_TYPE + block
    return RESPONSE_START + block


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
    """grpc-message as the client's details: decode_grpc_message's bytes as UTF-8, or Latin-1 when they are not, as
    grpcio hands details over (grpc/_common.py decode). Kept by this name for shim/rpc/client.py."""
    if not raw:  # the usual OK status: no message
        return ""
    decoded = decode_grpc_message(raw)
    try:
        return decoded.decode("utf-8")
    except UnicodeDecodeError:
        return decoded.decode("latin-1")
