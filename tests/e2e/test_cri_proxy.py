"""The shim's CRI proxy beside a real containerd, driven as the kubelet drives it: the kubelet's pod and container
calls through the shim answer exactly what containerd answers directly (field for field, unknown fields and errors
included). Fixtures: tests/e2e/conftest.py; helpers: tests/support/shim_calls.py.
"""

from __future__ import annotations

import grpc
import pytest

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from tests.support.shim_calls import canonical, same_answer, same_error

pytestmark = pytest.mark.e2e


# --- 1. the proxy is invisible ----------------------------------------------------------------

def test_kubelet_calls_through_the_shim_answer_what_containerd_answers(containerd, shim, kubelet):
    direct, proxied = containerd.cri, shim.cri
    same_answer(direct, proxied, "Version", cri_pb.VersionRequest(version="v1"))

    pod = kubelet.run_pod("same-answers")
    assert pod.id in [s.id for s in direct.list_sandboxes()]
    via_shim = proxied.call("ListPodSandbox", cri_pb.ListPodSandboxRequest())
    at_containerd = direct.call("ListPodSandbox", cri_pb.ListPodSandboxRequest())
    assert canonical(via_shim.items) == canonical(at_containerd.items)
    status = same_answer(direct, proxied, "PodSandboxStatus",
                         cri_pb.PodSandboxStatusRequest(pod_sandbox_id=pod.id, verbose=True))
    assert status.status.state == cri_pb.SANDBOX_READY and status.status.network.ip == pod.ip
    assert status.status.metadata.name == "same-answers" and "info" in status.info

    http = kubelet.start_container(pod, "http", containerd.images.http)
    container = same_answer(direct, proxied, "ContainerStatus", cri_pb.ContainerStatusRequest(container_id=http)).status
    assert container.state == cri_pb.CONTAINER_RUNNING and container.image.image == containerd.images.http
    listing = cri_pb.ListContainersRequest(filter=cri_pb.ContainerFilter(pod_sandbox_id=pod.id))
    containers = proxied.call("ListContainers", listing).containers
    assert canonical(containers) == canonical(direct.call("ListContainers", listing).containers)
    assert [c.id for c in containers] == [http]

    exec_ok = same_answer(direct, proxied, "ExecSync", cri_pb.ExecSyncRequest(
        container_id=http, cmd=["cat", "/www/healthz"], timeout=10))
    assert (exec_ok.exit_code, exec_ok.stdout) == (0, f"ok {containerd.images.token}\n".encode())
    exec_failed = same_answer(direct, proxied, "ExecSync", cri_pb.ExecSyncRequest(
        container_id=http, cmd=["sh", "-c", "echo oops >&2; exit 3"], timeout=10))
    assert (exec_failed.exit_code, exec_failed.stderr) == (3, b"oops\n")
    missing = same_error(direct, proxied, "PodSandboxStatus", cri_pb.PodSandboxStatusRequest(pod_sandbox_id="nope"))
    assert missing.code() == grpc.StatusCode.NOT_FOUND
    same_error(direct, proxied, "CreateContainer", cri_pb.CreateContainerRequest(
        pod_sandbox_id="nope", config=containerd.container_config("x", containerd.images.http), sandbox_config=pod.config))
    same_error(direct, proxied, "StartContainer", cri_pb.StartContainerRequest(container_id="nope"))

    kubelet.stop_container(http)
    stopped = same_answer(direct, proxied, "ContainerStatus", cri_pb.ContainerStatusRequest(container_id=http)).status
    assert stopped.state == cri_pb.CONTAINER_EXITED and stopped.finished_at >= stopped.started_at
    kubelet.remove_container(http)
    gone = same_error(direct, proxied, "ContainerStatus", cri_pb.ContainerStatusRequest(container_id=http))
    assert gone.code() == grpc.StatusCode.NOT_FOUND

    kubelet.stop_pod(pod)
    not_ready = same_answer(direct, proxied, "PodSandboxStatus", cri_pb.PodSandboxStatusRequest(pod_sandbox_id=pod.id))
    assert not_ready.status.state == cri_pb.SANDBOX_NOTREADY
    kubelet.remove_pod(pod)
    same_error(direct, proxied, "PodSandboxStatus", cri_pb.PodSandboxStatusRequest(pod_sandbox_id=pod.id))
    assert pod.id not in [s.id for s in proxied.list_sandboxes()] + [s.id for s in direct.list_sandboxes()]
