"""HPACK decoding (RFC 7541) of the header blocks the shim answers with: static and dynamic table, integers and
strings; Huffman strings through hpack's own table, imported only if the peer Huffman-codes one (17 ms of a start),
which the shim's server never does. The table is bounded by what probectl advertises (SETTINGS_HEADER_TABLE_SIZE's
default); a block that breaks the rules raises ProtocolError, and the connection is of no further use.
"""

from __future__ import annotations

TABLE_BYTES = 4_096  # SETTINGS_HEADER_TABLE_SIZE's default: all probectl advertises


class ProtocolError(Exception):
    """The peer broke HTTP/2 or HPACK: the connection is of no further use."""


STATIC_TABLE = (  # RFC 7541 Appendix A, index 1 first
    (b":authority", b""), (b":method", b"GET"), (b":method", b"POST"), (b":path", b"/"), (b":path", b"/index.html"),
    (b":scheme", b"http"), (b":scheme", b"https"), (b":status", b"200"), (b":status", b"204"), (b":status", b"206"),
    (b":status", b"304"), (b":status", b"400"), (b":status", b"404"), (b":status", b"500"), (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"), (b"accept-language", b""), (b"accept-ranges", b""), (b"accept", b""),
    (b"access-control-allow-origin", b""), (b"age", b""), (b"allow", b""), (b"authorization", b""),
    (b"cache-control", b""), (b"content-disposition", b""), (b"content-encoding", b""), (b"content-language", b""),
    (b"content-length", b""), (b"content-location", b""), (b"content-range", b""), (b"content-type", b""),
    (b"cookie", b""), (b"date", b""), (b"etag", b""), (b"expect", b""), (b"expires", b""), (b"from", b""),
    (b"host", b""), (b"if-match", b""), (b"if-modified-since", b""), (b"if-none-match", b""), (b"if-range", b""),
    (b"if-unmodified-since", b""), (b"last-modified", b""), (b"link", b""), (b"location", b""),
    (b"max-forwards", b""), (b"proxy-authenticate", b""), (b"proxy-authorization", b""), (b"range", b""),
    (b"referer", b""), (b"refresh", b""), (b"retry-after", b""), (b"server", b""), (b"set-cookie", b""),
    (b"strict-transport-security", b""), (b"transfer-encoding", b""), (b"user-agent", b""), (b"vary", b""),
    (b"via", b""), (b"www-authenticate", b""),
)


class HeaderDecoder:
    """RFC 7541's decoder: the dynamic table lives as long as the connection."""

    def __init__(self) -> None:
        self._table: list[tuple[bytes, bytes]] = []  # newest first
        self._size = 0
        self._max = TABLE_BYTES

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        headers = []
        at, end = 0, len(block)
        while at < end:
            byte = block[at]
            if byte & 0x80:  # indexed
                index, at = self._int(block, at, 7)
                headers.append(self._entry(index))
            elif byte & 0x40:  # literal with incremental indexing
                name, value, at = self._literal(block, at, 6)
                headers.append((name, value))
                self._add(name, value)
            elif byte & 0x20:  # dynamic table size update
                size, at = self._int(block, at, 5)
                if size > TABLE_BYTES:
                    raise ProtocolError(f"HPACK table size {size} above the {TABLE_BYTES} advertised")
                self._max = size
                self._evict()
            else:  # without indexing, or never indexed
                name, value, at = self._literal(block, at, 4)
                headers.append((name, value))
        return headers

    def _int(self, block: bytes, at: int, prefix_bits: int) -> tuple[int, int]:
        limit = (1 << prefix_bits) - 1
        value = block[at] & limit
        at += 1
        if value < limit:
            return value, at
        shift = 0
        while True:
            if at >= len(block) or shift > 28:
                raise ProtocolError("HPACK integer truncated or too large")
            byte = block[at]
            at += 1
            value += (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value, at

    def _string(self, block: bytes, at: int) -> tuple[bytes, int]:
        huffman = block[at] & 0x80
        length, at = self._int(block, at, 7)
        if at + length > len(block):
            raise ProtocolError("HPACK string truncated")
        raw = block[at:at + length]
        if huffman:
            from hpack.exceptions import HPACKDecodingError
            from hpack.huffman_table import decode_huffman  # 17 ms: only for a peer that Huffman-codes

            try:
                raw = decode_huffman(raw)
            except HPACKDecodingError as exc:
                raise ProtocolError(f"HPACK Huffman string: {exc}") from exc
        return raw, at + length

    def _literal(self, block: bytes, at: int, prefix_bits: int) -> tuple[bytes, bytes, int]:
        index, at = self._int(block, at, prefix_bits)
        if index:
            name = self._entry(index)[0]
        else:
            name, at = self._string(block, at)
        value, at = self._string(block, at)
        return name, value, at

    def _entry(self, index: int) -> tuple[bytes, bytes]:
        if 1 <= index <= len(STATIC_TABLE):
            return STATIC_TABLE[index - 1]
        if 0 <= index - len(STATIC_TABLE) - 1 < len(self._table):
            return self._table[index - len(STATIC_TABLE) - 1]
        raise ProtocolError(f"HPACK index {index} out of the table")

    def _add(self, name: bytes, value: bytes) -> None:
        self._table.insert(0, (name, value))
        self._size += len(name) + len(value) + 32
        self._evict()

    def _evict(self) -> None:
        while self._size > self._max:
            name, value = self._table.pop()
            self._size -= len(name) + len(value) + 32
