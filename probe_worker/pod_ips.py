"""Finding the pod's IPs on the interfaces of the netns the worker is in (one rtnetlink dump).

Used only when the daemon could not pass the sandbox's IPs (embedded mode: a bare
netns, no container runtime). One RTM_GETADDR dump on a NETLINK_ROUTE socket, parsed
with `struct`: pyroute2 did the same through 170 modules, which cost every
embedded-mode worker 5.8 MiB of PSS and the zygote 10 MiB. It also stays clear of
the ipaddress module and of dataclasses: every shared object a forked worker touches
copies a page of the zygote's memory into the worker.
The parsing and the filtering are pure (`parse_dump`, `pod_ips_from`); the socket is
only in `discover_pod_ips`.
"""

from __future__ import annotations

import _socket
import struct

# linux/netlink.h, linux/rtnetlink.h, linux/if_addr.h, linux/socket.h
NLMSG_ERROR, NLMSG_DONE = 2, 3
RTM_NEWADDR, RTM_GETADDR = 20, 22
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
IFA_ADDRESS, IFA_LOCAL = 1, 2
RT_SCOPE_UNIVERSE = 0
AF_UNSPEC, AF_INET, AF_INET6 = 0, _socket.AF_INET, _socket.AF_INET6

_NLMSGHDR = struct.Struct("=IHHII")  # length, type, flags, seq, pid
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index
_RTATTR = struct.Struct("=HH")  # length, type
_ERRNO = struct.Struct("=i")
_ADDRESS_SIZE = {AF_INET: 4, AF_INET6: 16}
_RECV_SIZE = 32 * 1024
_SEQ = 1

# (family, scope, packed address) of one interface address
InterfaceAddress = tuple[int, int, bytes]


class NetlinkError(OSError):
    """The kernel answered the dump with an error, or with bytes that do not parse."""


def _align(length: int) -> int:
    return (length + 3) & ~3


def dump_request(seq: int = _SEQ) -> bytes:
    """RTM_GETADDR, NLM_F_DUMP, every family."""
    body = _IFADDRMSG.pack(AF_UNSPEC, 0, 0, 0, 0)
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body


def _address(data: bytes, offset: int, end: int, size: int) -> bytes | None:
    """IFA_LOCAL (the interface's own address) if present, else IFA_ADDRESS (the peer on a
    point-to-point link, and the only one IPv6 sends), from the rtattrs in data[offset:end]."""
    found: dict[int, bytes] = {}
    while offset + _RTATTR.size <= end:
        length, kind = _RTATTR.unpack_from(data, offset)
        if length < _RTATTR.size or offset + length > end:
            raise NetlinkError(f"malformed rtattr of length {length}")
        if kind in (IFA_LOCAL, IFA_ADDRESS) and length - _RTATTR.size == size:
            found[kind] = data[offset + _RTATTR.size:offset + length]
        offset += _align(length)
    return found.get(IFA_LOCAL, found.get(IFA_ADDRESS))


def parse_dump(data: bytes, seq: int = _SEQ) -> tuple[list[InterfaceAddress], bool]:
    """The addresses in one datagram of the dump, and whether the dump is complete."""
    found: list[InterfaceAddress] = []
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        length, kind, _flags, msg_seq, _pid = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size or offset + length > len(data):
            raise NetlinkError(f"malformed netlink message of length {length}")
        body = offset + _NLMSGHDR.size
        if msg_seq != seq:
            pass  # not an answer to our request
        elif kind == NLMSG_DONE:
            return found, True
        elif kind == NLMSG_ERROR:
            (errno,) = _ERRNO.unpack_from(data, body)
            raise NetlinkError(-errno, f"RTM_GETADDR failed: errno {-errno}")
        elif kind == RTM_NEWADDR and length >= _NLMSGHDR.size + _IFADDRMSG.size:
            family, _prefix, _ifa_flags, scope, _index = _IFADDRMSG.unpack_from(data, body)
            size = _ADDRESS_SIZE.get(family)
            raw = size and _address(data, body + _IFADDRMSG.size, offset + length, size)
            if raw:
                found.append((family, scope, raw))
        offset += _align(length)
    return found, False


def is_global(family: int, raw: bytes) -> bool:
    """Not loopback, link-local, multicast or unspecified (ipaddress's definitions, on packed bytes)."""
    if family == AF_INET:
        return not (raw[0] == 127 or raw[:2] == b"\xa9\xfe" or 224 <= raw[0] < 240 or raw == bytes(4))
    loopback = raw == bytes(15) + b"\x01"
    link_local = raw[0] == 0xFE and raw[1] & 0xC0 == 0x80
    return not (loopback or link_local or raw[0] == 0xFF or raw == bytes(16))


def pod_ips_from(found: list[InterfaceAddress]) -> list[str]:
    """Global-scope, global addresses as text, IPv4 first (the Kubernetes default primary), each once."""
    chosen: list[str] = []
    for family in (AF_INET, AF_INET6):
        for entry_family, scope, raw in found:
            if entry_family == family and scope == RT_SCOPE_UNIVERSE and is_global(family, raw):
                text = _socket.inet_ntop(family, raw)
                if text not in chosen:
                    chosen.append(text)
    return chosen


def discover_pod_ips() -> list[str]:
    """Global addresses on this netns's interfaces: IPv4 first."""
    sock = _socket.socket(_socket.AF_NETLINK, _socket.SOCK_RAW | _socket.SOCK_CLOEXEC, _socket.NETLINK_ROUTE)
    try:
        sock.settimeout(5.0)  # the kernel answers at once; a bound, not a wait
        sock.bind((0, 0))
        sock.send(dump_request())
        found: list[InterfaceAddress] = []
        done = False
        while not done:
            part, done = parse_dump(sock.recv(_RECV_SIZE))
            found.extend(part)
    finally:
        sock.close()
    return pod_ips_from(found)
