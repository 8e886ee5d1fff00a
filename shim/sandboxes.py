"""Which network namespace, IPs and identity a pod sandbox has.

Two sources behind one interface:
- the container runtime: CRI PodSandboxStatus(verbose=true), whose `info["info"]`
  JSON holds the runtime spec (network namespace path) and the sandbox pid;
- the embedded mode (`--runtime-endpoint none`): a sandbox id is the name of a
  network namespace under /var/run/netns, or the absolute path of a netns file.
The parsing of the runtime's answer is pure (`sandbox_from_status`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import grpc

from cri_proto import cri_runtime_v1_pb2 as cri_pb

NETNS_DIR = "/var/run/netns"
RUNTIME_SERVICE = "/runtime.v1.RuntimeService"


class SandboxNotFound(Exception):
    """The runtime does not know the sandbox (NOT_FOUND to the caller)."""


class SandboxNotReady(Exception):
    """The sandbox exists but cannot be probed now (FAILED_PRECONDITION to the caller)."""


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


class SandboxSource(Protocol):
    async def resolve(self, sandbox_id: str) -> SandboxInfo: ...

    async def present(self, sandbox_ids: set[str]) -> dict[str, bool]:
        """For each id: True if it still exists and is ready, False if it is gone or not ready."""
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
    if not path and pid:
        # hostNetwork pods have no netns path; the pause process's namespace is the node's.
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
    )


def netns_path_for(sandbox_id: str) -> str:
    """The embedded mode's mapping; refuses names that would escape NETNS_DIR."""
    if os.path.isabs(sandbox_id):
        return os.path.normpath(sandbox_id)
    if not sandbox_id or "/" in sandbox_id or sandbox_id in (".", ".."):
        raise SandboxNotFound(f"invalid network namespace name {sandbox_id!r}")
    return os.path.join(NETNS_DIR, sandbox_id)


class NetnsSandboxes:
    """--runtime-endpoint none: every network namespace file is a sandbox."""

    async def resolve(self, sandbox_id: str) -> SandboxInfo:
        path = netns_path_for(sandbox_id)
        try:
            st = os.stat(path)
        except OSError:
            raise SandboxNotFound(f"no network namespace at {path}") from None
        return SandboxInfo(id=sandbox_id, netns_path=path, name=os.path.basename(path), created_at=int(st.st_mtime * 1e9))

    async def present(self, sandbox_ids: set[str]) -> dict[str, bool]:
        result = {}
        for sid in sandbox_ids:
            try:
                result[sid] = os.path.exists(netns_path_for(sid))
            except SandboxNotFound:
                result[sid] = False
        return result

    async def list(self) -> list[SandboxInfo]:
        try:
            names = sorted(os.listdir(NETNS_DIR))
        except FileNotFoundError:
            return []
        return [await self.resolve(name) for name in names]


class CriSandboxes:
    """Asks the container runtime over CRI (the same upstream the proxy forwards to)."""

    def __init__(self, channel: grpc.aio.Channel, timeout_s: float = 5.0) -> None:
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
        self._version = channel.unary_unary(
            f"{RUNTIME_SERVICE}/Version",
            request_serializer=cri_pb.VersionRequest.SerializeToString,
            response_deserializer=cri_pb.VersionResponse.FromString,
        )

    async def resolve(self, sandbox_id: str) -> SandboxInfo:
        try:
            response = await self._status(
                cri_pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=True), timeout=self._timeout
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                raise SandboxNotFound(f"pod sandbox {sandbox_id} not found: {exc.details()}") from None
            raise RuntimeUnavailable(f"PodSandboxStatus({sandbox_id}): {exc.code().name}: {exc.details()}") from None
        sandbox = sandbox_from_status(response)
        if not sandbox.ready:
            raise SandboxNotReady(f"pod sandbox {sandbox_id} is not ready")
        if not sandbox.netns_path:
            raise SandboxNotReady(f"pod sandbox {sandbox_id} has no network namespace in the runtime's status")
        return sandbox

    async def present(self, sandbox_ids: set[str]) -> dict[str, bool]:
        items = await self.list_pod_sandboxes()
        ready = {item.id for item in items if item.state == cri_pb.SANDBOX_READY}
        return {sid: sid in ready for sid in sandbox_ids}

    async def list_pod_sandboxes(self) -> list[cri_pb.PodSandbox]:
        try:
            response = await self._list(cri_pb.ListPodSandboxRequest(), timeout=self._timeout)
        except grpc.aio.AioRpcError as exc:
            raise RuntimeUnavailable(f"ListPodSandbox: {exc.code().name}: {exc.details()}") from None
        return list(response.items)

    async def version(self) -> cri_pb.VersionResponse:
        return await self._version(cri_pb.VersionRequest(version="v1"), timeout=self._timeout)
