"""Pod IP discovery: the rtnetlink dump parser and the address filter, on bytes built here
(the kernel's answer in a real netns is covered by tests/system/test_worker_process.py and test_pod_ips_in_pod.py)."""

from __future__ import annotations

import ipaddress
import socket
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from probe_worker.pod_ips import (
    IFA_ADDRESS, IFA_LOCAL, NLMSG_DONE, NLMSG_ERROR, RT_SCOPE_UNIVERSE, RTM_GETADDR, RTM_NEWADDR, NetlinkError,
    dump_request, is_global, parse_dump, pod_ips_from,
)

RT_SCOPE_LINK, RT_SCOPE_HOST = 253, 254


def _attr(kind: int, value: bytes) -> bytes:
    length = 4 + len(value)
    return struct.pack("=HH", length, kind) + value + b"\0" * (-length % 4)


def _message(kind: int, body: bytes, seq: int = 1) -> bytes:
    length = 16 + len(body)
    return struct.pack("=IHHII", length, kind, 2, seq, 0) + body + b"\0" * (-length % 4)


def _address(family: int, scope: int, *attrs: tuple[int, str], seq: int = 1) -> bytes:
    body = struct.pack("=BBBBI", family, 24, 0, scope, 7)
    body += b"".join(_attr(kind, socket.inet_pton(family, text)) for kind, text in attrs)
    return _message(RTM_NEWADDR, body, seq)


def _done(seq: int = 1) -> bytes:
    return _message(NLMSG_DONE, struct.pack("=i", 0), seq)


def test_dump_request_asks_every_family_for_addresses():
    length, kind, flags, seq, pid = struct.unpack_from("=IHHII", dump_request())
    assert (length, kind, flags & 0x301, seq, pid) == (len(dump_request()), RTM_GETADDR, 0x301, 1, 0)
    assert dump_request()[16] == socket.AF_UNSPEC


def test_a_dump_in_two_datagrams():
    first = (_address(socket.AF_INET, RT_SCOPE_HOST, (IFA_ADDRESS, "127.0.0.1"), (IFA_LOCAL, "127.0.0.1"))
             + _address(socket.AF_INET, RT_SCOPE_UNIVERSE, (IFA_ADDRESS, "10.244.1.7"), (IFA_LOCAL, "10.244.1.7")))
    found, done = parse_dump(first)
    assert not done and [(f, s, socket.inet_ntop(f, raw)) for f, s, raw in found] == [
        (socket.AF_INET, RT_SCOPE_HOST, "127.0.0.1"), (socket.AF_INET, RT_SCOPE_UNIVERSE, "10.244.1.7")]
    found, done = parse_dump(_address(socket.AF_INET6, RT_SCOPE_UNIVERSE, (IFA_ADDRESS, "fd00::7")) + _done())
    assert done and [socket.inet_ntop(f, raw) for f, _, raw in found] == ["fd00::7"]


def test_the_local_address_wins_over_the_peer_of_a_point_to_point_link():
    found, _ = parse_dump(_address(socket.AF_INET, RT_SCOPE_UNIVERSE, (IFA_ADDRESS, "10.0.0.1"), (IFA_LOCAL, "10.0.0.2")))
    assert pod_ips_from(found) == ["10.0.0.2"]


def test_answers_to_another_request_are_ignored():
    found, done = parse_dump(_address(socket.AF_INET, RT_SCOPE_UNIVERSE, (IFA_LOCAL, "10.0.0.2"), seq=9) + _done(seq=9))
    assert (found, done) == ([], False)


def test_an_error_answer_raises_with_the_errno():
    with pytest.raises(NetlinkError) as caught:
        parse_dump(_message(NLMSG_ERROR, struct.pack("=i", -1) + b"\0" * 16))
    assert caught.value.errno == 1


@pytest.mark.parametrize("data", [
    struct.pack("=IHHII", 8, RTM_NEWADDR, 0, 1, 0),        # shorter than its own header
    struct.pack("=IHHII", 400, RTM_NEWADDR, 0, 1, 0),      # longer than the datagram
    _message(RTM_NEWADDR, struct.pack("=BBBBI", socket.AF_INET, 24, 0, 0, 7) + struct.pack("=HH", 64, IFA_LOCAL)),
])
def test_malformed_dumps_raise(data):
    with pytest.raises(NetlinkError):
        parse_dump(data)


def test_pod_ips_are_global_universe_addresses_ipv4_first_each_once():
    found, _ = parse_dump(b"".join([
        _address(socket.AF_INET6, RT_SCOPE_UNIVERSE, (IFA_ADDRESS, "fd00::7")),
        _address(socket.AF_INET6, RT_SCOPE_LINK, (IFA_ADDRESS, "fe80::1")),
        _address(socket.AF_INET6, RT_SCOPE_HOST, (IFA_ADDRESS, "::1")),
        _address(socket.AF_INET, RT_SCOPE_HOST, (IFA_LOCAL, "127.0.0.1")),
        _address(socket.AF_INET, RT_SCOPE_UNIVERSE, (IFA_LOCAL, "169.254.3.3")),
        _address(socket.AF_INET, RT_SCOPE_UNIVERSE, (IFA_LOCAL, "10.244.1.7")),
        _address(socket.AF_INET, RT_SCOPE_UNIVERSE, (IFA_LOCAL, "10.244.1.7")),
        _address(socket.AF_INET, RT_SCOPE_UNIVERSE, (IFA_LOCAL, "198.18.0.2")),
    ]))
    assert pod_ips_from(found) == ["10.244.1.7", "198.18.0.2", "fd00::7"]


@given(st.one_of(st.binary(min_size=4, max_size=4), st.binary(min_size=16, max_size=16)))
def test_is_global_agrees_with_ipaddress(raw):
    address = ipaddress.ip_address(raw)
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    expected = not (address.is_loopback or address.is_link_local or address.is_multicast or address.is_unspecified)
    assert is_global(family, raw) == expected


@pytest.mark.parametrize("text", ["127.0.0.1", "127.9.9.9", "169.254.0.1", "224.0.0.1", "239.255.255.255", "0.0.0.0",
                                  "::1", "fe80::1", "febf::1", "ff02::1", "::"])
def test_special_addresses_are_not_pod_ips(text):
    address = ipaddress.ip_address(text)
    assert not is_global(socket.AF_INET if address.version == 4 else socket.AF_INET6, address.packed)
