"""Go's http.Header and the textproto/httpguts rules (probe_worker.probes.http.headers), without sockets."""

import pytest

from probe_worker.probes.http import headers as header_rules
from probe_worker.probes.http.headers import Header


@pytest.mark.parametrize(
    "name, canonical",
    [
        ("x-foo", "X-Foo"),
        ("X-FOO-bar", "X-Foo-Bar"),
        ("user-agent", "User-Agent"),
        ("HOST", "Host"),
        ("content-md5", "Content-Md5"),
        ("-a", "-A"),
        ("x_y", "X_y"),
        ("foo bar", "foo bar"),     # not a token: left alone (and later rejected)
        ("x:y", "x:y"),
        ("é-x", "é-x"),
        ("", ""),
    ],
)
def test_canonical_header_key(name, canonical):
    assert header_rules.canonical_header_key(name) == canonical


def test_header_keeps_values_in_order_under_the_canonical_key():
    h = Header()
    h.add("x-a", "1")
    h.add("X-A", "2")
    assert h.values("X-a") == ["1", "2"] and h.get("x-A") == "1" and h.keys() == ["X-A"]
    h.set("x-a", "3")
    assert h.values("X-A") == ["3"]
    h.delete("x-a")
    assert not h.has("X-A") and h.get("X-A") == ""


@pytest.mark.parametrize(
    "value, token, found",
    [
        ("close", "close", True),
        ("Close", "close", True),
        ("keep-alive, close", "close", True),
        ("close,keep-alive", "close", True),
        ("closed", "close", False),
        ("enclose", "close", False),
        ("", "close", False),
    ],
)
def test_has_token(value, token, found):
    assert header_rules.has_token(value, token) is found
