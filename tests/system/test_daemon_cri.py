"""The daemon in front of a container runtime: sandboxes resolved over CRI, CRI calls proxied
and observed, metrics labelled with the pod. The runtime is a small fake (tests/support/servers/
fake_runtime.py) whose one sandbox is a real test netns; real containerd is the end-to-end issue's."""

from __future__ import annotations

import select
import socket
import subprocess
import sys
import urllib.request

import grpc
import pytest

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from tests.support.daemon_env import DaemonProcess, status, tcp_spec, wait_for
from tests.support.netns_env import REPO_ROOT, listen

pytestmark = pytest.mark.netns
SANDBOX = "0123456789abcdef0123456789abcdef"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def runtime(tmp_path, pod_netns):
    sock = tmp_path / "cri.sock"
    proc = subprocess.Popen(
        [sys.executable, str(REPO_ROOT / "tests/support/servers/fake_runtime.py"), "--socket", str(sock),
         "--sandbox-id", SANDBOX, "--netns", pod_netns.path, "--ip", pod_netns.ipv4, "--ip", pod_netns.ipv6],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True,
    )
    ready, _, _ = select.select([proc.stdout], [], [], 15)
    assert ready and proc.stdout.readline().startswith("READY")
    yield f"unix://{sock}"
    proc.terminate()
    proc.wait(timeout=10)
    proc.stdout.close()


@pytest.fixture
def shim(tmp_path, runtime):
    metrics_port = free_port()
    d = DaemonProcess(tmp_path, ["--runtime-endpoint", runtime, "--metrics-listen", f"127.0.0.1:{metrics_port}"])
    d.metrics_port = metrics_port
    d.start()
    yield d
    d.stop()


def cri_call(channel: grpc.Channel, method: str, request, response_type):
    call = channel.unary_unary(f"/runtime.v1.RuntimeService/{method}",
                               request_serializer=type(request).SerializeToString,
                               response_deserializer=response_type.FromString)
    return call(request, timeout=5)


def test_probes_resolve_sandboxes_over_cri_and_metrics_name_the_pod(shim, pod_netns):
    server = listen(pod_netns)
    probe_id = shim.stub.RunProbe(service_pb.RunProbeRequest(
        pod_sandbox_id=SANDBOX, container_name="app", type=spec_pb.READINESS, spec=tcp_spec(server.port)), timeout=10).probe_id
    ready = wait_for(shim, lambda p: p.status.state == spec_pb.STATE_SUCCESS, probe_id)
    assert ready.status.last_attempt.address == f"{pod_netns.ipv4}:{server.port}"  # the pod IP the runtime reported
    (sandbox,) = [s for s in shim.stub.ListProbeSandboxes(service_pb.ListProbeSandboxesRequest(), timeout=5).sandboxes]
    assert (sandbox.id, sandbox.name, sandbox.namespace, sandbox.netns_path) == (SANDBOX, "web-0", "shop", pod_netns.path)
    assert list(sandbox.pod_ips) == [pod_netns.ipv4, pod_netns.ipv6]

    text = urllib.request.urlopen(f"http://127.0.0.1:{shim.metrics_port}/metrics", timeout=5).read().decode()
    assert ('prober_probe_total{container="app",namespace="shop",pod="web-0",pod_uid="uid-1",'
            'probe_type="Readiness",result="successful"}') in text


def test_unknown_sandbox_is_not_found(shim):
    with pytest.raises(grpc.RpcError) as err:
        shim.stub.RunProbe(service_pb.RunProbeRequest(
            pod_sandbox_id="nope", container_name="app", type=spec_pb.READINESS, spec=tcp_spec(80)), timeout=10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_cri_calls_pass_through_and_remove_drops_probes(shim, pod_netns):
    version = cri_call(shim.channel, "Version", cri_pb.VersionRequest(version="v1"), cri_pb.VersionResponse)
    assert (version.runtime_name, version.runtime_version) == ("fake-runtime", "9.9")
    with pytest.raises(grpc.RpcError) as err:
        cri_call(shim.channel, "ListContainers", cri_pb.VersionRequest(), cri_pb.VersionResponse)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED and "ListContainers" in err.value.details()

    server = listen(pod_netns)
    probe_id = shim.stub.RunProbe(service_pb.RunProbeRequest(
        pod_sandbox_id=SANDBOX, container_name="app", type=spec_pb.LIVENESS, spec=tcp_spec(server.port)), timeout=10).probe_id
    wait_for(shim, lambda p: p.status.worker.state == service_pb.WORKER_RUNNING, probe_id)

    cri_call(shim.channel, "StopPodSandbox", cri_pb.StopPodSandboxRequest(pod_sandbox_id=SANDBOX), cri_pb.VersionRequest)
    stopped = wait_for(shim, lambda p: p.status.worker.state == service_pb.WORKER_NONE, probe_id)
    assert stopped.probe_id == probe_id  # stopped, still registered until removal

    cri_call(shim.channel, "RemovePodSandbox", cri_pb.RemovePodSandboxRequest(pod_sandbox_id=SANDBOX), cri_pb.VersionRequest)
    assert status(shim).probes == []
