"""The pod's own loopback: what a probe's `host` means when the probe runs inside the pod's network namespace.

The kubelet probes from the node's netns, so there `host: 127.0.0.1` is the node: a pod's admin port on its own
loopback cannot be probed, and any other `host` lets a pod make the node connect anywhere it can reach (blind
SSRF, kubernetes#99425), which is why the daemon gates the field. The shim probes from the pod's netns, where
127.0.0.1 and ::1 are the pod itself, the one place a `host` can never lead out of the pod (KEP-4559: "a pod's
localhost means the pod"). So these three spellings are the LOOPBACK target, allowed without
`allow_host_field`; every other value keeps the gate.

- `127.0.0.1` is the pod's IPv4 loopback, `::1` its IPv6 loopback;
- `localhost` is both, IPv4 first, as the kubelet's (Go's) resolver orders them from /etc/hosts (127.0.0.1, then
  ::1) and its dialer races them (the second as soon as the first fails): an IPv6-only server on ::1 answers.
  The node's /etc/hosts is not read: whatever it says, localhost must not lead out of the pod.

The `host` itself stays in the probe, so the URL, the Host header and every message read as the kubelet's would
(`Get "http://localhost:8080/healthz": ...`), and `convert --reverse` gives the original back. Only these exact
spellings: another 127.0.0.0/8 address, `[::1]` or `LOCALHOST` keep the gate, so the rule is one a reader can
check by eye. Pure: probectl, the daemon and the worker share it.
"""

from __future__ import annotations

from cri_proto import probe_spec_pb2 as spec_pb

IPV4_LOOPBACK = "127.0.0.1"
IPV6_LOOPBACK = "::1"
LOCALHOST = "localhost"
POD_LOOPBACK_HOSTS = (IPV4_LOOPBACK, IPV6_LOOPBACK, LOCALHOST)

# Which of localhost's addresses an ip_family keeps; PRIMARY and ANY keep the resolver's order.
_LOCALHOST_BY_FAMILY = {
    spec_pb.IPV4: (IPV4_LOOPBACK,),
    spec_pb.IPV6: (IPV6_LOOPBACK,),
}


def is_pod_loopback(host: str) -> bool:
    """True for the three spellings that mean the pod's own loopback inside its netns."""
    return host in POD_LOOPBACK_HOSTS


def loopback_addresses(host: str, ip_family: int) -> tuple[str, ...]:
    """The addresses to race for a pod-loopback host, preferred first; () for any other host."""
    if host == LOCALHOST:
        return _LOCALHOST_BY_FAMILY.get(ip_family, (IPV4_LOOPBACK, IPV6_LOOPBACK))
    if host in (IPV4_LOOPBACK, IPV6_LOOPBACK):
        return (host,)  # a literal is the address it names, whatever ip_family says (as for any literal host)
    return ()
