"""gRPC's wire rules shared by the worker and the daemon (probe_api/grpc_wire_rules.py). Expected values are grpc-go
1.65's, most from its own tests (internal/grpcutil/encode_duration_test.go, internal/transport/http_util_test.go);
the function that decides is named by each test."""

from __future__ import annotations

import struct
from urllib.parse import unquote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from probe_api.grpc_wire_rules import (
    COMPRESSED, MAX_DURATION_NS, PREFIX_BYTES, UNCOMPRESSED, decode_grpc_message, decode_timeout, encode_grpc_message,
    encode_timeout, frame_message, read_prefix,
)

US, MS, S, M, H = 1_000, 1_000_000, 1_000_000_000, 60_000_000_000, 3_600_000_000_000


# --- messages: rpc_util.go msgHeader, parser.recvMsg --------------------------------------------------------------


def test_a_message_is_format_zero_and_a_big_endian_length():
    assert frame_message(b"abc") == b"\x00\x00\x00\x00\x03abc"
    assert frame_message(b"") == b"\x00\x00\x00\x00\x00"
    assert frame_message(b"q" * 70_000)[:PREFIX_BYTES] == b"\x00\x00\x01\x11\x70"


def test_the_prefix_is_read_at_an_offset_and_any_format_is_handed_back():
    data = b"xx" + bytes((COMPRESSED,)) + (2**32 - 1).to_bytes(4, "big") + bytes((7, 0, 0, 0, 1))
    assert read_prefix(data, 2) == (COMPRESSED, 2**32 - 1)
    assert read_prefix(data, 7) == (7, 1)  # the reader says it is not 0 or 1 (checkRecvPayload)
    with pytest.raises(struct.error):
        read_prefix(b"\x00\x00\x00\x00")


@given(st.binary(max_size=300), st.binary(max_size=20))
def test_a_framed_message_reads_back(payload, before):
    data = before + frame_message(payload) + b"next"
    flag, length = read_prefix(data, len(before))
    start = len(before) + PREFIX_BYTES
    assert (flag, data[start:start + length], data[start + length:]) == (UNCOMPRESSED, payload, b"next")


# --- grpc-timeout: grpcutil.EncodeDuration, transport decodeTimeout ---------------------------------------------------


@pytest.mark.parametrize(("ns", "text"), [
    # encode_duration_test.go TestEncodeDuration
    (12_345_678, "12345678n"), (123_456_789, "123457u"), (12_345_678 * US, "12345678u"),
    (123_456_789 * US, "123457m"), (12_345_678 * MS, "12345678m"), (123_456_789 * MS, "123457S"),
    (12_345_678 * S, "12345678S"), (123_456_789 * S, "2057614M"), (12_345_678 * M, "12345678M"),
    (123_456_789 * M, "2057614H"),
    # EncodeDuration's "t <= 0" branch, div's rounding up, each unit's 8-digit edge
    (0, "0n"), (-5, "0n"), (-(2**63), "0n"), (1, "1n"), (99_999_999, "99999999n"), (100_000_000, "100000u"),
    (999_876_001, "999877u"), (S, "1000000u"), (250 * MS, "250000u"), (99_999_999 * US + 1, "100000m"),
    (100 * S, "100000m"), (150 * S, "150000m"), (100_000 * S, "100000S"), (10_000_000 * M, "10000000M"),
    (100_000_000 * M, "1666667H"),
    # the longest Go Duration, and what a Duration cannot hold counts as it
    (MAX_DURATION_NS, "2562048H"), (10**21, "2562048H"),
])
def test_timeout_encoding_is_grpc_gos(ns, text):
    assert encode_timeout(ns) == text


@pytest.mark.parametrize(("text", "ns"), [
    (b"1234S", 1234 * S),  # http_util_test.go TestTimeoutDecode
    (b"0n", 0), (b"0S", 0), (b"1H", H), (b"2M", 2 * M), (b"3S", 3 * S), (b"250m", 250 * MS), (b"1500u", 1500 * US),
    (b"99999999n", 99_999_999), (b"00000001S", S), (b"99999999M", 99_999_999 * M),
    (b"2562047H", 2_562_047 * H), (b"2562048H", MAX_DURATION_NS), (b"99999999H", MAX_DURATION_NS),  # maxHours clamp
])
def test_timeout_decoding_is_grpc_gos(text, ns):
    assert decode_timeout(text) == ns


@pytest.mark.parametrize("text", [
    b"", b"1", b"S",  # "too short"
    b"123456789S",  # "too long": 8 digits at most
    b"1234x", b"10s", b"10",  # "unit is not recognized"
    b"1.5S", b"10 S", b" 1S", b"0x1S", b"1_0S", b"\xd9\xa1S",  # not strconv.ParseInt's digits
    b"-1S", b"+1S",  # ParseInt would take a sign; the spec and grpc core do not (see decode_timeout)
])
def test_malformed_timeouts_are_none(text):
    assert decode_timeout(text) is None


@given(st.integers(min_value=1, max_value=MAX_DURATION_NS))
def test_an_encoded_timeout_decodes_to_at_least_itself_and_less_than_one_unit_more(ns):
    text = encode_timeout(ns).encode()
    decoded = decode_timeout(text)
    unit = decode_timeout(b"1" + text[-1:])
    assert len(text) <= 9 and ns <= decoded < ns + unit


# --- grpc-message: transport encodeGrpcMessage, decodeGrpcMessage ----------------------------------------------------


@pytest.mark.parametrize(("text", "wire"), [
    # http_util_test.go TestEncodeGrpcMessage
    ("", b""), ("Hello", b"Hello"), ("\x00", b"%00"), ("%", b"%25"), ("\u7cfb\u7edf", b"%E7%B3%BB%E7%BB%9F"),
    ("plain text ~!", b"plain text ~!"), ("100%", b"100%25"), ("tab\there", b"tab%09here"), ("\x7f", b"%7F"),
    ("\u00e9", b"%C3%A9"), ("\U0001f600", b"%F0%9F%98%80"),
    # Go writes U+FFFD for what is not UTF-8 (there {0xff, 0xfe, 0xfd}; in a Python str, a lone surrogate)
    ("a\ud800b\udfff", b"a%EF%BF%BDb%EF%BF%BD"),
])
def test_grpc_message_encoding_is_grpc_gos(text, wire):
    assert encode_grpc_message(text) == wire


def test_printable_ascii_but_percent_is_sent_as_it_is_and_the_rest_escaped():
    for byte in range(0x80):
        expected = bytes((byte,)) if 0x20 <= byte <= 0x7E and byte != 0x25 else b"%%%02X" % byte
        assert encode_grpc_message(chr(byte)) == expected


@pytest.mark.parametrize(("wire", "raw"), [
    # http_util_test.go TestDecodeGrpcMessage and TestDecodeEncodeGrpcMessage
    (b"", b""), (b"Hello", b"Hello"), (b"H%61o", b"Hao"), (b"H%6", b"H%6"), (b"%G0", b"%G0"),
    (b"%E7%B3%BB%E7%BB%9F", "\u7cfb\u7edf".encode()), (b"%EF%BF%BD", "\ufffd".encode()),
    # bytes that are not UTF-8 stay bytes: the caller decides on text
    (b"%ff%FE", b"\xff\xfe"), (b"unknown%20service", b"unknown service"), (b"100%25", b"100%"),
    (b"bad %zz escape", b"bad %zz escape"), (b"cut %4", b"cut %4"), (b"%", b"%"), (b"%%41", b"%A"),
    (b"%+1", b"%+1"),  # strconv.ParseUint(s, 16, 8) takes no sign
])
def test_grpc_message_decoding_is_grpc_gos(wire, raw):
    assert decode_grpc_message(wire) == raw


@given(st.text())
def test_a_grpc_message_decodes_to_its_utf8(text):
    wire = encode_grpc_message(text)
    assert all(0x20 <= byte <= 0x7E for byte in wire)
    expected = "".join("\ufffd" if "\ud800" <= char <= "\udfff" else char for char in text)
    assert decode_grpc_message(wire) == expected.encode()
    assert unquote(wire.decode("ascii")) == expected  # any percent-decoder reads it


@given(st.binary())
def test_decoding_arbitrary_bytes_never_fails_and_keeps_what_is_no_escape(wire):
    decoded = decode_grpc_message(wire)
    assert len(decoded) <= len(wire)
    if b"%" not in wire:
        assert decoded == wire
