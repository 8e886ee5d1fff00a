"""A kubelet-like CRI client for the end-to-end tests: the runtime.v1 calls the kubelet makes, on any channel.

Owns: the gRPC channel options (a private subchannel pool, containerd's message size), `CriClient` (unary calls by
method name, raw or decoded), where a pod's network namespace is (PodSandboxStatus verbose, as the kubelet's tools
read it), and `Kubelet`: running a pod and its containers with the labels and annotations the kubelet gives them,
and ExecSync with the kubelet's deadline. It works through the shim (the proxy) or directly at containerd alike.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from tests.support.containerd_session import MAX_MESSAGE_BYTES

if TYPE_CHECKING:
    from tests.support.containerd_env import ContainerdEnv

CRI_TIMEOUT_S = 60.0         # one CRI call; RunPodSandbox took 0.66 s on a busy machine
KUBELET_CRI_TIMEOUT_S = 120  # the kubelet's --runtime-request-timeout default (2m)


def cri_channel(endpoint: str) -> grpc.Channel:
    # A private subchannel pool: a channel to a process a test stops must not lend its dead connection.
    return grpc.insecure_channel(endpoint, options=[
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ])


class CriClient:
    """runtime.v1 unary calls on any channel: containerd's own socket, or the shim's (the proxy)."""

    def __init__(self, channel: grpc.Channel, timeout_s: float = CRI_TIMEOUT_S) -> None:
        self.channel = channel
        self.timeout_s = timeout_s

    @staticmethod
    def _path(method: str) -> str:
        service = "ImageService" if method in ("ImageStatus", "ListImages", "PullImage", "RemoveImage",
                                                "ImageFsInfo") else "RuntimeService"
        return f"/runtime.v1.{service}/{method}"

    def raw(self, method: str, request, timeout_s: float | None = None) -> bytes:
        """The response's bytes as they came over the wire, undecoded."""
        call = self.channel.unary_unary(self._path(method), request_serializer=type(request).SerializeToString,
                                        response_deserializer=lambda data: data)
        return call(request, timeout=timeout_s or self.timeout_s, wait_for_ready=True)

    def call(self, method: str, request, timeout_s: float | None = None):
        response_type = getattr(cri_pb, f"{method}Response")
        return response_type.FromString(self.raw(method, request, timeout_s))

    # The calls the tests and the teardown make often.
    def list_sandboxes(self) -> list[cri_pb.PodSandbox]:
        return list(self.call("ListPodSandbox", cri_pb.ListPodSandboxRequest()).items)

    def sandbox_status(self, sandbox_id: str, verbose: bool = True) -> cri_pb.PodSandboxStatusResponse:
        return self.call("PodSandboxStatus", cri_pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=verbose))

    def container_status(self, container_id: str) -> cri_pb.ContainerStatus:
        return self.call("ContainerStatus", cri_pb.ContainerStatusRequest(container_id=container_id)).status

    def stop_and_remove_sandbox(self, sandbox_id: str) -> None:
        for method, request_type in (("StopPodSandbox", cri_pb.StopPodSandboxRequest),
                                     ("RemovePodSandbox", cri_pb.RemovePodSandboxRequest)):
            try:
                self.call(method, request_type(pod_sandbox_id=sandbox_id))
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:
                    raise


@dataclass(frozen=True)
class SandboxNetwork:
    """Where a pod's network namespace is, read from PodSandboxStatus(verbose) like the kubelet's tools do."""
    ip: str
    netns_path: str
    pid: int


def sandbox_network(response: cri_pb.PodSandboxStatusResponse) -> SandboxNetwork:
    info = json.loads(response.info["info"])
    path = next((ns.get("path", "") for ns in info.get("runtimeSpec", {}).get("linux", {}).get("namespaces", [])
                 if ns.get("type") == "network"), "")
    return SandboxNetwork(ip=response.status.network.ip, netns_path=path, pid=int(info.get("pid") or 0))


# --- a kubelet-like client ---------------------------------------------------------------------

@dataclass
class Pod:
    id: str
    config: cri_pb.PodSandboxConfig
    ip: str
    netns_path: str
    pid: int
    containers: dict[str, str] = field(default_factory=dict)   # name -> id of its current container


class Kubelet:
    """The CRI calls the kubelet makes to run a pod, on any CriClient (through the shim, or direct)."""

    def __init__(self, cri: CriClient, env: "ContainerdEnv") -> None:
        self.cri = cri
        self.env = env

    def run_pod(self, name: str, host_network: bool = False) -> Pod:
        config = self.env.sandbox_config(name, host_network=host_network)
        sandbox_id = self.cri.call("RunPodSandbox", cri_pb.RunPodSandboxRequest(config=config)).pod_sandbox_id
        self.env.note_sandbox(sandbox_id)
        network = sandbox_network(self.cri.sandbox_status(sandbox_id))
        return Pod(sandbox_id, config, network.ip, network.netns_path, network.pid)

    def start_container(self, pod: Pod, name: str, image: str, attempt: int = 0, ports: Sequence[dict] = ()) -> str:
        config = self.env.container_config(name, image, attempt, pod_config=pod.config, ports=ports)
        container_id = self.cri.call("CreateContainer", cri_pb.CreateContainerRequest(
            pod_sandbox_id=pod.id, config=config, sandbox_config=pod.config)).container_id
        self.cri.call("StartContainer", cri_pb.StartContainerRequest(container_id=container_id))
        pod.containers[name] = container_id
        return container_id

    def stop_container(self, container_id: str, timeout_s: int = 0) -> None:
        self.cri.call("StopContainer", cri_pb.StopContainerRequest(container_id=container_id, timeout=timeout_s))

    def remove_container(self, container_id: str) -> None:
        self.cri.call("RemoveContainer", cri_pb.RemoveContainerRequest(container_id=container_id))

    def exec_sync(self, container_id: str, cmd: Sequence[str], timeout_s: int) -> cri_pb.ExecSyncResponse:
        """ExecSync as the kubelet sends it for an exec probe (timeout = the probe's timeoutSeconds) or an exec
        hook (timeout 0): cri-client remote_runtime.go ExecSync sets the call's deadline to its 2-minute default
        plus the timeout, and none at all for a timeout of 0. Raises grpc.RpcError for an error status."""
        return cri_pb.ExecSyncResponse.FromString(self.exec_sync_raw(container_id, cmd, timeout_s))

    def exec_sync_raw(self, container_id: str, cmd: Sequence[str], timeout_s: int) -> bytes:
        request = cri_pb.ExecSyncRequest(container_id=container_id, cmd=list(cmd), timeout=timeout_s)
        deadline_s = KUBELET_CRI_TIMEOUT_S + timeout_s if timeout_s else None
        return self.cri.raw("ExecSync", request, timeout_s=deadline_s)

    def stop_pod(self, pod: Pod) -> None:
        self.cri.call("StopPodSandbox", cri_pb.StopPodSandboxRequest(pod_sandbox_id=pod.id))

    def remove_pod(self, pod: Pod) -> None:
        self.cri.call("RemovePodSandbox", cri_pb.RemovePodSandboxRequest(pod_sandbox_id=pod.id))
