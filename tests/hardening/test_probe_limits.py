"""The probe limits against a real daemon: max_probes_per_sandbox and max_probes_total answer RESOURCE_EXHAUSTED,
replacing a registered probe is not a new one, a one-shot ExecProbe is not limited, and concurrent registrations
cannot overshoot the total. Helpers: tests/support/api_requests.py.
"""

from __future__ import annotations

import threading

import grpc
import pytest

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from tests.support.api_requests import RPC_TIMEOUT_S, call, run_request
from tests.support.daemon_env import DaemonProcess, status, tcp_spec
from tests.support.netns_env import PodNetns

pytestmark = pytest.mark.netns


# --- limits ------------------------------------------------------------------------------------------

def limited_daemon(tmp_path, per_sandbox: int, total: int) -> DaemonProcess:
    config = tmp_path / "shim.toml"
    config.write_text(f"max_probes_per_sandbox = {per_sandbox}\nmax_probes_total = {total}\n")
    return DaemonProcess(tmp_path, ["--config", str(config)]).start()


def test_limits_per_sandbox_and_in_total_are_resource_exhausted(tmp_path, pod_netns):
    other = PodNetns.create(with_addresses=False)
    d = limited_daemon(tmp_path, per_sandbox=3, total=5)
    try:
        def register(ns, container, **kw):
            return call(d.stub.RunProbe, run_request(ns, tcp_spec(1, period_ms=60_000, **kw), container_name=container))

        for name in ("a", "b", "c"):
            assert register(pod_netns, name)[0] == grpc.StatusCode.OK
        code, details, _ = register(pod_netns, "d")
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert details == f"sandbox {pod_netns.name} already has 3 probes (max_probes_per_sandbox)"
        # Replacing a registered probe (same sandbox, container, type) is not a new probe.
        assert register(pod_netns, "a", timeout_ms=700)[0] == grpc.StatusCode.OK
        a = [p for p in status(d, pod_sandbox_id=pod_netns.name).probes if p.container_name == "a"]
        assert len(a) == 1 and a[0].spec.timeout_ms == 700

        assert [register(other, name)[0] for name in ("x", "y")] == [grpc.StatusCode.OK] * 2
        code, details, _ = register(other, "z")
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert details == "the daemon already runs 5 probes (max_probes_total)"
        assert register(other, "x", timeout_ms=800)[0] == grpc.StatusCode.OK  # replacing, when full
        assert len(status(d).probes) == 5
        # A one-shot ExecProbe registers nothing and is not limited.
        code, _, answer = call(d.stub.ExecProbe, service_pb.ExecProbeRequest(pod_sandbox_id=pod_netns.name,
                                                                              spec=tcp_spec(1)))
        assert code == grpc.StatusCode.OK and answer.attempt.result == spec_pb.RESULT_FAILURE

        # Room again after a StopProbe; and concurrent registrations cannot overshoot the total.
        d.stub.StopProbe(service_pb.StopProbeRequest(pod_sandbox_id=pod_netns.name), timeout=10)
        codes = []
        threads = [threading.Thread(target=lambda n=n: codes.append(register(pod_netns, f"r{n}")[0]))
                   for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(RPC_TIMEOUT_S)
        assert sorted(codes, key=str) == sorted([grpc.StatusCode.OK] * 3 + [grpc.StatusCode.RESOURCE_EXHAUSTED] * 5,
                                                key=str)
        assert len(status(d).probes) == 5
    finally:
        d.stop()
        other.destroy()
