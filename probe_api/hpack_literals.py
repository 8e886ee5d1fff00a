"""HPACK as the project's HTTP/2 peers write it (RFC 7541): integers, and header fields as literals. Pure.

Both ends that write header blocks by hand, the daemon's gRPC server (shim/rpc/grpc_wire.py: its answers) and
probectl's unary client (probectl/unary_h2.py: its requests), write every field as a Literal Header Field without
Indexing, new name, no Huffman coding (6.2.2): no dynamic table on the writing side, so there is no encoder state
and a block can be built from constants.
"""

from __future__ import annotations


def integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An integer with an N-bit prefix (5.1); `first` holds the bits of the first byte above the prefix."""
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


def literal(name: bytes, value: bytes) -> bytes:
    """Literal Header Field without Indexing, new name, no Huffman (6.2.2)."""
    return b"\x00" + integer(len(name), 7) + name + integer(len(value), 7) + value
