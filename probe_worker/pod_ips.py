"""Finding the pod's IPs on the interfaces of the netns the worker is in (pyroute2).

Used only when the daemon could not pass the sandbox's IPs (e.g. a bare netns with
no container runtime). pyroute2 costs ~10 MiB and 170 modules, so the worker
imports this module only then, and always before it drops privileges.
"""

from __future__ import annotations

import ipaddress
import socket

from pyroute2 import IPRoute

RT_SCOPE_UNIVERSE = 0


def _is_global(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    return not (addr.is_loopback or addr.is_link_local or addr.is_multicast or addr.is_unspecified)


def discover_pod_ips() -> list[str]:
    """Global addresses on this netns's interfaces: IPv4 first (the Kubernetes default primary)."""
    with IPRoute() as ipr:
        found = [(msg["family"], msg.get_attr("IFA_ADDRESS")) for msg in ipr.get_addr() if msg["scope"] == RT_SCOPE_UNIVERSE]
    v4 = [ip for family, ip in found if family == socket.AF_INET and ip and _is_global(ip)]
    v6 = [ip for family, ip in found if family == socket.AF_INET6 and ip and _is_global(ip)]
    return v4 + v6
