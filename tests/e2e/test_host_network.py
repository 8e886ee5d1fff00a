"""A hostNetwork pod is never probed from the node's network namespace, against a real containerd.

A `hostNetwork: true` pod shares the node's namespace: containerd reports no network namespace of its own for it
(its pause process's /proc/PID/ns/net is the node's). Every probe of the tests aims at a server on the node's own
127.0.0.1 (tests/conftest.py `node_loopback`), which records every connection: it must see none, in this file or
anywhere in the suite.

What each test proves:
- RunProbe and ExecProbe for the pod are refused FAILED_PRECONDITION, with why and what to do, for every target;
- a marker ExecSync (the kubelet bridge) for its container is answered FAILED_PRECONDITION: the kubelet discards
  the result (not ready, never restarted) and its event carries the reason; as a hook it fails;
- ListProbeSandboxes and `probectl pods` show it as "host network";
- a pod of the same node with its own network namespace is still probed.
"""

from __future__ import annotations

import grpc
import pytest

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.bridge_command import command_for
from tests.support.containerd_session import HTTP_PORT
from tests.support.kubelet_exec_model import hook_error, probe_verdict
from tests.support.shim_calls import http_spec, probectl, run_probe, tcp_spec

pytestmark = pytest.mark.e2e

REFUSAL = "uses the node's network namespace (hostNetwork): cri-probe-shim never probes from the node's network namespace"


@pytest.fixture
def host_pod(containerd, kubelet):
    pod = kubelet.run_pod("hostnet", host_network=True)
    kubelet.start_container(pod, "app", containerd.images.pause)  # listens nowhere: the node's ports stay its own
    return pod


def specs(port: int) -> list[spec_pb.ProbeSpec]:
    by_host = spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=port),
                                                                   host="127.0.0.1"), timeout_ms=1000)
    return [http_spec("/", port, target=spec_pb.LOOPBACK), http_spec("/", port), tcp_spec(port), by_host]


def test_runprobe_and_execprobe_refuse_a_host_network_pod_and_the_nodes_loopback_sees_nothing(
        shim, host_pod, node_loopback):
    assert host_pod.netns_path == ""  # containerd's own account: no network namespace of its own
    for spec in specs(node_loopback.port):
        with pytest.raises(grpc.RpcError) as refused:
            run_probe(shim, host_pod, "app", spec_pb.READINESS, spec)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert refused.value.details() == f"pod sandbox {host_pod.id} {REFUSAL}; a hostNetwork pod keeps the " \
                                          f"kubelet's own probes (do not convert it)"
        with pytest.raises(grpc.RpcError) as refused:
            shim.stub.ExecProbe(service_pb.ExecProbeRequest(pod_sandbox_id=host_pod.id, spec=spec), timeout=30)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION and REFUSAL in refused.value.details()
    cli = probectl(shim, "exec", "--pod", host_pod.id, "--http-get", f":{node_loopback.port}/", "--target",
                   "loopback")
    assert cli.returncode == 1 and REFUSAL in cli.stderr, cli
    assert shim.stub.ProbeStatus(service_pb.ProbeStatusRequest(), timeout=10).probes == []
    assert node_loopback.connections == []


def test_a_marker_execsync_fails_closed_without_a_restart_and_says_why(shim, kubelet, host_pod, node_loopback):
    for role in ("readiness", "liveness", "startup"):
        cmd = command_for(role, {"httpGet": {"path": "/", "port": node_loopback.port, "host": "127.0.0.1"}})
        with pytest.raises(grpc.RpcError) as refused:
            kubelet.exec_sync(host_pod.containers["app"], cmd, 1)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert refused.value.details().startswith(f"cri-probe-shim: pod sandbox {host_pod.id} {REFUSAL}")
        verdict = probe_verdict(cmd, 1, refused.value)
        assert verdict.discarded  # neither a success nor a counted failure: not ready, never restarted
        assert "code = FailedPrecondition" in verdict.error and REFUSAL in verdict.error
    hook = command_for("preStop", {"httpGet": {"path": "/", "port": node_loopback.port}})
    with pytest.raises(grpc.RpcError) as refused:
        kubelet.exec_sync(host_pod.containers["app"], hook, 0)
    assert REFUSAL in hook_error(hook, refused.value)
    assert node_loopback.connections == []


def test_a_host_network_pod_shows_as_host_network_and_a_pod_network_beside_it_is_probed(
        shim, kubelet, containerd, host_pod, node_loopback):
    with pytest.raises(grpc.RpcError):
        run_probe(shim, host_pod, "app", spec_pb.READINESS, tcp_spec(node_loopback.port))
    listed = {s.id: s for s in shim.stub.ListProbeSandboxes(service_pb.ListProbeSandboxesRequest(),
                                                            timeout=10).sandboxes}
    assert listed[host_pod.id].host_network and not listed[host_pod.id].netns_path
    table = probectl(shim, "pods", "--no-trunc")
    row = next(line for line in table.stdout.splitlines() if line.startswith(host_pod.id))
    assert "host network" in row, table.stdout
    pod = kubelet.run_pod("podnet")
    kubelet.start_container(pod, "http", containerd.images.http)
    attempt = shim.stub.ExecProbe(service_pb.ExecProbeRequest(
        pod_sandbox_id=pod.id, spec=http_spec("/healthz", HTTP_PORT, target=spec_pb.LOOPBACK)), timeout=30).attempt
    assert attempt.result == spec_pb.RESULT_SUCCESS, attempt
    assert node_loopback.connections == []
