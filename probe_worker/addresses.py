"""Which address a probe connects to inside the pod netns (KEP-4559 target and ip_family).

Pure: the pod IPs come from the daemon or from probe_worker.pod_ips at start-up.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence

from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.gostrings import is_ip_literal
from probe_api.pod_loopback import LOCALHOST, loopback_addresses
from probe_worker.attempt import Endpoint

LOOPBACK = {4: "127.0.0.1", 6: "::1"}
_FAMILY_NAME = {4: "IPv4", 6: "IPv6"}


class AddressError(Exception):
    """No address matches the probe's target and family; the attempt is UNKNOWN."""


def _version(ip: str) -> int:
    return ipaddress.ip_address(ip).version


def _family_order(ip_family: int, primary: int) -> list[int]:
    other = 6 if primary == 4 else 4
    return {
        spec_pb.PRIMARY: [primary],
        spec_pb.IPV4: [4],
        spec_pb.IPV6: [6],
        spec_pb.ANY: [primary, other],  # primary first, the other after the Happy Eyeballs delay
    }[ip_family]


def choose_endpoint(
    host: str, target: int, ip_family: int, port: int, pod_ips: Sequence[str]
) -> Endpoint:
    """The endpoint for one attempt.

    An explicit host (deprecated Kubernetes field) wins; otherwise the pod IP of the
    wanted family, or loopback when the target is LOOPBACK or the pod has no address.
    `localhost` is the pod's loopback, never the node's /etc/hosts (probe_api.pod_loopback).
    """
    if host == LOCALHOST:
        return Endpoint(host=host, addresses=loopback_addresses(host, ip_family), port=port)
    if host:
        if is_ip_literal(host):
            return Endpoint(host=host, addresses=(host,), port=port)
        families = {spec_pb.IPV4: socket.AF_INET, spec_pb.IPV6: socket.AF_INET6}
        return Endpoint(host=host, addresses=(), port=port, family_filter=families.get(ip_family, 0))

    primary = _version(pod_ips[0]) if pod_ips else 4
    order = _family_order(ip_family, primary)
    if target == spec_pb.LOOPBACK or not pod_ips:
        addresses = tuple(LOOPBACK[f] for f in order)
    else:
        by_family = {f: [ip for ip in pod_ips if _version(ip) == f] for f in (4, 6)}
        addresses = tuple(by_family[f][0] for f in order if by_family[f])
        if not addresses:
            raise AddressError(f"the pod has no {_FAMILY_NAME[order[0]]} address (pod IPs: {', '.join(pod_ips)})")
    return Endpoint(host=addresses[0], addresses=addresses, port=port)
