"""net/url's percent-encoding, by its escaping modes (url.shouldEscape, escape, unescape). Pure, no I/O.

Go escapes each part of a URL with its own set (path, path segment, host, zone, userinfo,
query component, fragment) and refuses broken escapes with texts of its own (EscapeError,
InvalidHostError); Python's urllib.parse.quote has one set and no such errors. Bytes that are
not valid UTF-8 are carried in str as surrogate escapes and come back out intact.
probes/http/url.py parses and prints URLs with these.
"""

from __future__ import annotations

from probe_api.gostrings import go_quote

# Escaping modes of net/url (its `encoding` type).
PATH, PATH_SEGMENT, HOST, ZONE, USER_PASSWORD, QUERY_COMPONENT, FRAGMENT = range(7)

_UPPER_HEX = "0123456789ABCDEF"


class URLError(Exception):
    """A url.Parse error; str() is Go's text, e.g. `parse "http://[::1": missing ']' in host`."""


def _bytes(s: str) -> bytes:
    return s.encode("utf-8", "surrogateescape")


def _text(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape")


def should_escape(c: int, mode: int) -> bool:
    """url.shouldEscape for one byte."""
    if 0x61 <= c <= 0x7A or 0x41 <= c <= 0x5A or 0x30 <= c <= 0x39:
        return False
    ch = chr(c)
    if mode in (HOST, ZONE) and ch in "!$&'()*+,;=:[]<>\"":
        return False
    if ch in "-_.~":
        return False
    if ch in "$&+,/:;=?@":
        if mode == PATH:
            return ch == "?"
        if mode == PATH_SEGMENT:
            return ch in "/;,?"
        if mode == USER_PASSWORD:
            return ch in "@/?:"
        if mode == QUERY_COMPONENT:
            return True
        if mode == FRAGMENT:
            return False
    if mode == FRAGMENT and ch in "!()*":
        return False
    return True


def escape(s: str, mode: int) -> str:
    out = []
    for c in _bytes(s):
        if c == 0x20 and mode == QUERY_COMPONENT:
            out.append("+")
        elif should_escape(c, mode):
            out.append("%" + _UPPER_HEX[c >> 4] + _UPPER_HEX[c & 15])
        else:
            out.append(chr(c))
    return "".join(out)


def _is_hex(c: int) -> bool:
    return 0x30 <= c <= 0x39 or 0x61 <= c <= 0x66 or 0x41 <= c <= 0x46


def unescape(s: str, mode: int) -> str:
    """url.unescape; raises URLError with Go's EscapeError / InvalidHostError text."""
    raw = _bytes(s)
    i = 0
    while i < len(raw):
        c = raw[i]
        if c == 0x25:  # '%'
            if i + 2 >= len(raw) or not _is_hex(raw[i + 1]) or not _is_hex(raw[i + 2]):
                bad = raw[i:i + 3]
                raise URLError("invalid URL escape " + go_quote(_text(bad)))
            seq = raw[i:i + 3]
            value = int(seq[1:], 16)
            # Hosts may %-encode only non-ASCII bytes, except %25 for IPv6 zones (RFC 6874).
            if mode == HOST and value < 0x80 and seq != b"%25":
                raise URLError("invalid URL escape " + go_quote(_text(seq)))
            if mode == ZONE and seq != b"%25" and value != 0x20 and should_escape(value, HOST):
                raise URLError("invalid URL escape " + go_quote(_text(seq)))
            i += 3
        else:
            if mode in (HOST, ZONE) and c < 0x80 and should_escape(c, mode):
                raise URLError("invalid character " + go_quote(chr(c)) + " in host name")
            i += 1
    out = bytearray()
    i = 0
    while i < len(raw):
        c = raw[i]
        if c == 0x25:
            out.append(int(raw[i + 1:i + 3], 16))
            i += 3
        elif c == 0x2B and mode == QUERY_COMPONENT:
            out.append(0x20)
            i += 1
        else:
            out.append(c)
            i += 1
    return _text(bytes(out))


def valid_encoded(s: str, mode: int) -> bool:
    for c in _bytes(s):
        if chr(c) in "!$&'()*+,;=:@[]%":
            continue
        if should_escape(c, mode):
            return False
    return True
