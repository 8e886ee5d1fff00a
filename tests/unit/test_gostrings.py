"""Go's formatting of values (probe_api.gostrings)."""

import pytest

from probe_api.gostrings import go_duration, go_quote, is_ip_literal, join_host_port


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (0, "0s"),
        (1_000_000_000, "1s"),
        (1_500_000_000, "1.5s"),
        (500_000_000, "500ms"),
        (1_250_000, "1.25ms"),
        (1_500, "1.5µs"),
        (7, "7ns"),
        (60_000_000_000, "1m0s"),
        (120_000_000_000, "2m0s"),
        (90_500_000_000, "1m30.5s"),
        (3_600_000_000_000, "1h0m0s"),
        (-2_000_000_000, "-2s"),
    ],
)
def test_go_duration_matches_time_duration_string(ns, text):
    assert go_duration(ns) == text


def test_join_host_port_brackets_ipv6_only():
    assert join_host_port("10.0.0.1", 80) == "10.0.0.1:80"
    assert join_host_port("fd00::1", 80) == "[fd00::1]:80"
    assert join_host_port("pod.example", 8080) == "pod.example:8080"


def test_is_ip_literal():
    assert is_ip_literal("10.1.2.3") and is_ip_literal("::1")
    assert not is_ip_literal("localhost") and not is_ip_literal("10.1.2")


@pytest.mark.parametrize(
    ("data", "quoted"),
    [
        (b"NOT_SERVING", '"NOT_SERVING"'),
        (b'a"b\\c', r'"a\"b\\c"'),
        (b"tab\there\n", r'"tab\there\n"'),
        (b"\x01\x7f", r'"\x01\x7f"'),
        (b"\xff", r'"\xff"'),
        ("caf\u00e9".encode(), '"caf\u00e9"'),
        ("\u200b".encode(), r'"\u200b"'),
    ],
)
def test_go_quote_matches_strconv_quote(data, quoted):
    assert go_quote(data) == quoted
