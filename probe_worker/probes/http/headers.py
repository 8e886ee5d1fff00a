"""Go's request headers: http.Header and the textproto/httpguts rules on names, values and Host. Pure, no I/O.

The kubelet's probe request is a Go http.Request whose Header map canonicalizes keys
(textproto.CanonicalMIMEHeaderKey) and keeps each key's values in the order added; Go's
transport judges names and values (httpguts) before it dials and writes the Host header
punycoded, without an IPv6 zone. probes/http/request.py builds requests with these;
probes/http/h2_rules.py encodes the same headers for HTTP/2.
"""

from __future__ import annotations

import encodings.punycode  # noqa: F401  loaded now: the worker cannot import after dropping privileges
import re
from collections.abc import Iterable

_TOKEN_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_VALID_HOST_CHARS = frozenset(
    "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!$%&()*+,-.:;=[]'_~"
)


def canonical_header_key(name: str) -> str:
    """textproto.CanonicalMIMEHeaderKey: "x-foo-bar" -> "X-Foo-Bar"; invalid names stay as given."""
    if not name or any(c not in _TOKEN_CHARS for c in name):
        return name
    out = []
    upper = True
    for c in name:
        if upper and "a" <= c <= "z":
            c = c.upper()
        elif not upper and "A" <= c <= "Z":
            c = c.lower()
        out.append(c)
        upper = c == "-"
    return "".join(out)


def valid_header_name(name: str) -> bool:
    return bool(name) and all(c in _TOKEN_CHARS for c in name)


def valid_header_value(value: str) -> bool:
    """httpguts.ValidHeaderFieldValue: no control bytes except horizontal tab."""
    return not any((ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F for c in value)


def clean_value(value: str) -> str:
    """headerNewlineToSpace + textproto.TrimString: a value as Request.write emits it."""
    return value.replace("\n", " ").replace("\r", " ").strip(" \t\r\n")


class Header:
    """Go's http.Header: canonical keys, each with its values in the order added."""

    def __init__(self, items: dict[str, list[str]] | None = None) -> None:
        self._items: dict[str, list[str]] = {k: list(v) for k, v in (items or {}).items()}

    def add(self, name: str, value: str) -> None:
        self._items.setdefault(canonical_header_key(name), []).append(value)

    def set(self, name: str, value: str) -> None:
        self._items[canonical_header_key(name)] = [value]

    def get(self, name: str) -> str:
        values = self._items.get(canonical_header_key(name))
        return values[0] if values else ""

    def has(self, name: str) -> bool:
        return canonical_header_key(name) in self._items

    def values(self, name: str) -> list[str]:
        return list(self._items.get(canonical_header_key(name), ()))

    def delete(self, name: str) -> None:
        self._items.pop(canonical_header_key(name), None)

    def keys(self) -> list[str]:
        return list(self._items)

    def copy(self) -> "Header":
        return Header(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Header) and self._items == other._items

    def __repr__(self) -> str:
        return f"Header({self._items!r})"


def has_token(value: str, token: str) -> bool:
    """net/http hasToken: `token` appears in a comma/space separated header value (ASCII case-insensitive)."""
    if not token or len(token) > len(value):
        return False
    boundary = " ,\t"
    lowered = token.lower()
    for start in range(len(value) - len(token) + 1):
        end = start + len(token)
        if start > 0 and value[start - 1] not in boundary:
            continue
        if end != len(value) and value[end] not in boundary:
            continue
        if value[start:end].lower() == lowered:
            return True
    return False


def values_contain_token(values: Iterable[str], token: str) -> bool:
    """httpguts.HeaderValuesContainsToken."""
    return any(
        part.strip(" \t").lower() == token.lower() for value in values for part in value.split(",")
    )


def valid_host_header(host: str) -> bool:
    """httpguts.ValidHostHeader."""
    return all(c in _VALID_HOST_CHARS for c in host)


def punycode_host_port(value: str) -> str:
    """httpguts.PunycodeHostPort with idna's Punycode profile (labels converted as is)."""
    if value.isascii():
        return value
    host, port = value, ""
    match = re.fullmatch(r"(\[.*\]|[^:]*):(\d*)", value)
    if match:
        host, port = match.group(1), match.group(2)
    labels = [
        label if label.isascii() else "xn--" + label.encode("punycode").decode("ascii")
        for label in host.split(".")
    ]
    host = ".".join(labels)
    return f"{host}:{port}" if match else host


def remove_zone(host: str) -> str:
    """removeZone: a bracketed IPv6 host without its %zone, as the Host header carries it."""
    if not host.startswith("["):
        return host
    close = host.rfind("]")
    if close < 0:
        return host
    zone = host[:close].rfind("%")
    if zone < 0:
        return host
    return host[:zone] + host[close:]
