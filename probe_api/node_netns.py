"""The node's own network namespace, the one place no probe is ever made from: the rule the daemon (every sandbox
resolver) and the netns broker (the privileged part that makes the sockets) both apply.

Probing from the node's namespace is the hole this project closes: node-local services (the kubelet's ports, a
metadata endpoint, whatever listens on the node's 127.0.0.1) would become reachable from a probe spec. A pod with
`hostNetwork: true` lives in that namespace, so it is never probed; it keeps the kubelet's own probes.

A namespace is the node's when it is PID 1's (the node's init; the daemon under systemd sees the node's PID 1) or
the caller's own (the daemon, the broker: started in the node's namespace; if the daemon ever runs in a container
of its own, its PID 1 is that container's, and its own namespace is the one it must not hand out either).
Namespaces are compared by device and inode, as the kernel identifies them (nsfs, `ip netns identify`).
"""

from __future__ import annotations

import os

NODE_NAMESPACE_FILES = ("/proc/1/ns/net", "/proc/self/ns/net")

NetnsId = tuple[int, int]  # (st_dev, st_ino) of a namespace file


def netns_id(st: os.stat_result) -> NetnsId:
    return st.st_dev, st.st_ino


def node_netns_ids(extra_fds: tuple[int, ...] = ()) -> frozenset[NetnsId]:
    """The node's namespace as this process can see it: PID 1's and its own (and those of `extra_fds`, open
    namespace files such as the broker's home). A file it cannot stat is left out: the other still counts."""
    ids = set()
    for path in NODE_NAMESPACE_FILES:
        try:
            ids.add(netns_id(os.stat(path)))
        except OSError:
            pass
    for fd in extra_fds:
        ids.add(netns_id(os.fstat(fd)))
    return frozenset(ids)


def is_node_netns(st: os.stat_result, node_ids: frozenset[NetnsId] | None = None) -> bool:
    """Whether a stat of a namespace file is the node's namespace."""
    return netns_id(st) in (node_netns_ids() if node_ids is None else node_ids)


def host_network_refusal(sandbox_id: str) -> str:
    """What every refusal says, so that the API, the kubelet bridge and the logs read alike."""
    return (f"pod sandbox {sandbox_id} uses the node's network namespace (hostNetwork): cri-probe-shim never probes "
            f"from the node's network namespace; a hostNetwork pod keeps the kubelet's own probes (do not convert "
            f"it)")
