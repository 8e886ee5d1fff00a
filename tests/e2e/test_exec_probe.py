"""ExecProbe against a real containerd: the daemon resolves a pod sandbox once (shim/sandboxes/cache.py) and reuses
that only while the pod lives, so a stopped or removed pod is never probed from memory.

What each test proves:
- repeated ExecProbes of a running pod each run their attempt inside that pod;
- after StopPodSandbox through the shim, the next ExecProbe answers FAILED_PRECONDITION (containerd's NOTREADY),
  and after RemovePodSandbox NOT_FOUND: not an attempt made on a remembered resolution;
- after the pod is stopped and removed straight at containerd (behind the shim's back, so the proxy saw nothing),
  the next ExecProbe answers NOT_FOUND: the pod's own process ending is enough.
"""

from __future__ import annotations

import grpc
import pytest

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from tests.support.containerd_session import TCP_PORT

pytestmark = pytest.mark.e2e

CALL_TIMEOUT_S = 30


def exec_probe(shim, sandbox_id: str) -> service_pb.ExecProbeResponse:
    # Nothing listens on the TCP port in a bare sandbox: the pod's own kernel refuses, naming the pod's IP.
    spec = spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=TCP_PORT)))
    return shim.stub.ExecProbe(service_pb.ExecProbeRequest(pod_sandbox_id=sandbox_id, spec=spec),
                               timeout=CALL_TIMEOUT_S)


def refused_in(pod, answer: service_pb.ExecProbeResponse) -> bool:
    return answer.attempt.output.endswith(f"dial tcp {pod.ip}:{TCP_PORT}: connect: connection refused")


def exec_probe_error(shim, sandbox_id: str) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as caught:
        exec_probe(shim, sandbox_id)
    return caught.value.code()


def test_a_running_pod_is_probed_every_time(containerd, shim, kubelet):
    pod = kubelet.run_pod("exec-warm")
    for _ in range(5):
        assert refused_in(pod, exec_probe(shim, pod.id))


def test_a_pod_stopped_through_the_shim_is_not_probed_from_memory(containerd, shim, kubelet):
    pod = kubelet.run_pod("exec-stop")
    assert refused_in(pod, exec_probe(shim, pod.id))
    kubelet.stop_pod(pod)
    assert exec_probe_error(shim, pod.id) == grpc.StatusCode.FAILED_PRECONDITION
    kubelet.remove_pod(pod)
    assert exec_probe_error(shim, pod.id) == grpc.StatusCode.NOT_FOUND


def test_a_pod_removed_behind_the_shims_back_is_not_probed_from_memory(containerd, shim, kubelet):
    pod = kubelet.run_pod("exec-gone")
    assert refused_in(pod, exec_probe(shim, pod.id))
    containerd.cri.stop_and_remove_sandbox(pod.id)  # straight at containerd: the shim's proxy sees nothing
    assert exec_probe_error(shim, pod.id) == grpc.StatusCode.NOT_FOUND
