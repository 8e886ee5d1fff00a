"""Which network namespace, IPs and identity a pod sandbox has.

Two sources behind one interface:
- the container runtime: CRI PodSandboxStatus(verbose=true), whose `info["info"]`
  JSON holds the runtime spec (network namespace path) and the sandbox pid;
- the embedded mode (`--runtime-endpoint none`): a sandbox id is the name of a
  network namespace under /var/run/netns, or /proc/PID/ns/net.
One rule for both (probe_api/node_netns.py): a sandbox in the node's own network namespace is never probed,
whether the runtime says so (a hostNetwork pod: NamespaceOption network NODE, no network namespace of its own) or
its namespace file is the node's; it is refused as not ready (FAILED_PRECONDITION) with a message saying why.
The parsing of the runtime's answer is pure (`sandbox_from_status`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import grpc

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from probe_api.node_netns import host_network_refusal, is_node_netns
from shim.rpc.client import CallError, Channel
from shim.workers.grouping import embedded_tenancy

NETNS_DIR = "/var/run/netns"
NETNS_DIRS = (NETNS_DIR, "/run/netns")
_PROC_NETNS = re.compile(r"/proc/[1-9][0-9]*/ns/net")
RUNTIME_SERVICE = "/runtime.v1.RuntimeService"


class SandboxNotFound(Exception):
    """The runtime does not know the sandbox (NOT_FOUND to the caller)."""


class SandboxNotReady(Exception):
    """The sandbox exists but cannot be probed now (FAILED_PRECONDITION to the caller)."""


class HostNetworkSandbox(SandboxNotReady):
    """The sandbox lives in the node's network namespace: never probed (FAILED_PRECONDITION, as not ready)."""

    def __init__(self, sandbox_id: str) -> None:
        super().__init__(host_network_refusal(sandbox_id))


class RuntimeUnavailable(Exception):
    """The container runtime did not answer; the answer is unknown, not negative."""


@dataclass(frozen=True)
class SandboxInfo:
    id: str
    netns_path: str
    pod_ips: tuple[str, ...] = ()
    ready: bool = True
    name: str = ""
    namespace: str = ""
    uid: str = ""
    created_at: int = 0
    pid: int = 0
    host_network: bool = False  # the runtime says it shares the node's network namespace


class SandboxSource(Protocol):
    async def resolve(self, sandbox_id: str) -> SandboxInfo: ...

    async def gone(self, sandboxes: Mapping[str, int]) -> dict[str, str]:
        """Of these sandbox ids (each with the inode of the netns its worker runs in, 0 if none), those that no
        longer exist, are not ready, or whose netns was replaced, each with why. RuntimeUnavailable when the
        runtime does not answer: an unreachable runtime says nothing about its sandboxes."""
        ...

    async def list(self) -> list[SandboxInfo]:
        """The sandboxes to show even without probes (ListProbeSandboxes): every netns in the embedded mode;
        none with a runtime, whose own list probectl asks for and merges."""
        ...


def _network_path(info: Mapping) -> str:
    spec_namespaces = info.get("runtimeSpec", {}).get("linux", {}).get("namespaces", [])
    for ns in spec_namespaces:
        if ns.get("type") == "network" and ns.get("path"):
            return ns["path"]
    return info.get("sandboxMetadata", {}).get("Metadata", {}).get("NetNSPath", "")


def sandbox_from_status(response: cri_pb.PodSandboxStatusResponse) -> SandboxInfo:
    """Builds a SandboxInfo from a verbose PodSandboxStatus answer (containerd's layout)."""
    status = response.status
    raw = response.info.get("info", "")
    try:
        info = json.loads(raw) if raw else {}
    except ValueError:
        info = {}
    pid = int(info.get("pid") or 0)
    path = _network_path(info)
    host_network = status.linux.namespaces.options.network == cri_pb.NODE
    if not path and pid and not host_network:
        # A runtime that names no path for a pod network: the pause process's namespace (checked before use).
        path = f"/proc/{pid}/ns/net"
    ips = [status.network.ip] if status.network.ip else []
    ips += [p.ip for p in status.network.additional_ips if p.ip]
    meta = status.metadata
    return SandboxInfo(
        id=status.id,
        netns_path=path,
        pod_ips=tuple(ips),
        ready=status.state == cri_pb.SANDBOX_READY,
        name=meta.name,
        namespace=meta.namespace,
        uid=meta.uid,
        created_at=status.created_at,
        pid=pid,
        host_network=host_network,
    )


def sandbox_gone_reason(listed: cri_pb.PodSandbox | None) -> str:
    if listed is None:
        return "the runtime no longer lists the pod sandbox"
    return f"the runtime lists the pod sandbox as {cri_pb.PodSandboxState.Name(listed.state)}"


def _on_the_node(netns_path: str) -> bool:
    """Whether the runtime's namespace path is the node's own (a runtime that reports a hostNetwork pod without
    saying so: its pause process's /proc/PID/ns/net). A path the daemon cannot stat is left to the broker, which
    checks again before it makes any socket."""
    try:
        return bool(netns_path) and is_node_netns(os.stat(netns_path))
    except OSError:
        return False


def netns_path_for(sandbox_id: str) -> str:
    """The embedded mode's mapping; refuses names that would escape NETNS_DIR.

    An absolute id must name a netns file the way runtimes do (a bind mount under
    /var/run/netns or /run/netns, or /proc/PID/ns/net): an arbitrary path would let a
    caller point a worker at any file the daemon can open.
    """
    if os.path.isabs(sandbox_id):
        path = os.path.normpath(sandbox_id)
        if _PROC_NETNS.fullmatch(path) or os.path.dirname(path) in NETNS_DIRS:
            return path
        raise SandboxNotFound(
            f"invalid network namespace path {sandbox_id!r}: must be a name, a file directly under "
            f"{' or '.join(NETNS_DIRS)}, or /proc/PID/ns/net")
    if not sandbox_id or "/" in sandbox_id or sandbox_id in (".", ".."):
        raise SandboxNotFound(f"invalid network namespace name {sandbox_id!r}")
    return os.path.join(NETNS_DIR, sandbox_id)


class NetnsSandboxes:
    """--runtime-endpoint none: every network namespace file is a sandbox; its namespace is the part of its
    name before `namespace_separator`, if one is set and present (worker_groups.embedded_tenancy)."""

    def __init__(self, namespace_separator: str = "") -> None:
        self._separator = namespace_separator

    async def resolve(self, sandbox_id: str) -> SandboxInfo:
        path = netns_path_for(sandbox_id)
        try:
            st = os.stat(path)
        except OSError:
            raise SandboxNotFound(f"no network namespace at {path}") from None
        if is_node_netns(st):
            raise HostNetworkSandbox(sandbox_id)
        name = os.path.basename(path)
        return SandboxInfo(id=sandbox_id, netns_path=path, name=name, created_at=int(st.st_mtime * 1e9),
                           namespace=embedded_tenancy(name, self._separator))

    async def gone(self, sandboxes: Mapping[str, int]) -> dict[str, str]:
        result = {}
        for sid, inode in sandboxes.items():
            try:
                path = netns_path_for(sid)
                st = os.stat(path)
            except SandboxNotFound as exc:
                result[sid] = str(exc)
            except OSError:
                result[sid] = f"no network namespace at {path} any more"
            else:
                # Deleted and added again under the same name: the worker still holds the old namespace.
                if inode and st.st_ino != inode:
                    result[sid] = f"the network namespace at {path} was replaced (inode {inode}, now {st.st_ino})"
        return result

    async def list(self) -> list[SandboxInfo]:
        try:
            names = sorted(os.listdir(NETNS_DIR))
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            try:
                out.append(await self.resolve(name))
            except HostNetworkSandbox:  # the node's own netns (`ip netns attach host 1`): listed, never probed
                out.append(SandboxInfo(id=name, netns_path=netns_path_for(name), name=name, ready=False,
                                       host_network=True))
            except SandboxNotFound:
                pass  # deleted since listdir
        return out


class CriSandboxes:
    """Asks the container runtime over CRI (the same upstream the proxy forwards to)."""

    def __init__(self, channel: Channel, timeout_s: float = 5.0) -> None:
        self._timeout = timeout_s
        self._status = channel.unary_unary(
            f"{RUNTIME_SERVICE}/PodSandboxStatus",
            request_serializer=cri_pb.PodSandboxStatusRequest.SerializeToString,
            response_deserializer=cri_pb.PodSandboxStatusResponse.FromString,
        )
        self._list = channel.unary_unary(
            f"{RUNTIME_SERVICE}/ListPodSandbox",
            request_serializer=cri_pb.ListPodSandboxRequest.SerializeToString,
            response_deserializer=cri_pb.ListPodSandboxResponse.FromString,
        )

    async def resolve(self, sandbox_id: str) -> SandboxInfo:
        try:
            response = await self._status(
                cri_pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=True), timeout=self._timeout
            )
        except CallError as exc:
            if exc.code == grpc.StatusCode.NOT_FOUND:
                raise SandboxNotFound(f"pod sandbox {sandbox_id} not found: {exc.details}") from None
            raise RuntimeUnavailable(f"PodSandboxStatus({sandbox_id}): {exc}") from None
        sandbox = sandbox_from_status(response)
        if sandbox.host_network or _on_the_node(sandbox.netns_path):
            raise HostNetworkSandbox(sandbox_id)
        if not sandbox.ready:
            raise SandboxNotReady(f"pod sandbox {sandbox_id} is not ready")
        if not sandbox.netns_path:
            raise SandboxNotReady(f"pod sandbox {sandbox_id} has no network namespace in the runtime's status")
        return sandbox

    async def gone(self, sandboxes: Mapping[str, int]) -> dict[str, str]:
        # Inodes are not compared: a CRI sandbox's netns is its own for its whole life.
        items = {item.id: item for item in await self.list_pod_sandboxes()}
        return {sid: sandbox_gone_reason(items.get(sid)) for sid in sandboxes
                if sid not in items or items[sid].state != cri_pb.SANDBOX_READY}

    async def list(self) -> list[SandboxInfo]:
        return []  # the runtime's own ListPodSandbox is the list: probectl pods merges it with the shim's

    async def list_pod_sandboxes(self) -> list[cri_pb.PodSandbox]:
        try:
            response = await self._list(cri_pb.ListPodSandboxRequest(), timeout=self._timeout)
        except CallError as exc:
            raise RuntimeUnavailable(f"ListPodSandbox: {exc}") from None
        return list(response.items)

