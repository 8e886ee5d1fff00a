import errno

import pytest

from probe_api.gostrings import dial_error, errno_text, go_duration, is_ip_literal, join_host_port


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


def test_errno_text_is_go_syscall_spelling():
    assert errno_text(errno.ECONNREFUSED) == "connection refused"
    assert errno_text(errno.EHOSTUNREACH) == "no route to host"
    assert errno_text(errno.ENETUNREACH) == "network is unreachable"
    assert errno_text(errno.ETIMEDOUT) == "connection timed out"


def test_dial_error_texts():
    refused = ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
    assert dial_error("10.0.0.1:8080", refused) == "dial tcp 10.0.0.1:8080: connect: connection refused"
    assert dial_error("[fd00::1]:80", None, timed_out=True) == "dial tcp [fd00::1]:80: i/o timeout"


def test_is_ip_literal():
    assert is_ip_literal("10.1.2.3") and is_ip_literal("::1")
    assert not is_ip_literal("localhost") and not is_ip_literal("10.1.2")
