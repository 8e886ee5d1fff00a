"""probectl against the shim beside a real containerd, on a real pod: pods, ps, exec and workers.
Fixtures: tests/e2e/conftest.py; helpers: tests/support/shim_calls.py.
"""

from __future__ import annotations

import pytest

from cri_proto import probe_spec_pb2 as spec_pb
from tests.support.containerd_session import HTTP_PORT
from tests.support.shim_calls import Watch, http_spec, is_state, probe_status, probectl, run_probe

pytestmark = pytest.mark.e2e


# --- 5. probectl ---------------------------------------------------------------------------------

def test_probectl_pods_ps_exec_and_workers_on_a_real_pod(containerd, shim, kubelet):
    pod = kubelet.run_pod("probectl-pod")
    kubelet.start_container(pod, "http", containerd.images.http)
    with Watch(shim, pod_sandbox_id=pod.id) as watch:
        readiness = run_probe(shim, pod, "http", spec_pb.READINESS, http_spec(target=spec_pb.LOOPBACK), shim.cri)
        watch.until(is_state(readiness, spec_pb.STATE_SUCCESS), "readiness success")
    worker = probe_status(shim, readiness).status.worker

    pods = probectl(shim, "pods")
    assert pods.returncode == 0, pods.stderr
    (row,) = [line for line in pods.stdout.splitlines() if line.startswith(pod.id[:13])]
    assert all(text in row for text in ("probectl-pod", "e2e", "Ready", pod.netns_path, str(worker.pid)))

    ps = probectl(shim, "ps", "--pod", pod.id)
    assert ps.returncode == 0, ps.stderr
    (row,) = [line for line in ps.stdout.splitlines() if "readiness" in line]
    assert all(text in row for text in ("http", "http-get", "success"))

    execd = probectl(shim, "exec", "--pod", pod.id, "--http-get", f":{HTTP_PORT}/healthz", "--target", "loopback")
    assert execd.returncode == 0, execd.stdout + execd.stderr
    out = execd.stdout
    assert "success" in out and f"127.0.0.1:{HTTP_PORT}" in out and f"ok {containerd.images.token}" in out
    waterfall = out[out.index("PHASE"):].splitlines()
    assert {"connect", "request", "transfer"} <= {line.split()[0] for line in waterfall[1:] if line.strip()}
    assert all("|" in line for line in waterfall[1:] if line.strip())

    # The same server on the pod IP: refused, since it listens on the pod's loopback only. Exit 4: failure.
    refused = probectl(shim, "exec", "--pod", pod.id, "--http-get", f":{HTTP_PORT}/healthz")
    assert refused.returncode == 4, refused.stdout + refused.stderr
    assert f"{pod.ip}:{HTTP_PORT}: connect: connection refused" in refused.stdout

    workers = probectl(shim, "workers")
    assert workers.returncode == 0, workers.stderr
    (row,) = [line for line in workers.stdout.splitlines() if line.startswith(str(worker.pid))]
    # One row per worker: its group is named after the pod's Kubernetes namespace (CRI metadata).
    assert row.split()[1:4] == [f"{pod.config.metadata.namespace}#1", "1", pod.id[:13]]
