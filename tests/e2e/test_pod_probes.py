"""Probes of the shim beside a real containerd, inside real pods:
- probes run inside the pod: an HTTP readiness probe reaches a server bound to the pod's 127.0.0.1 that the
  node cannot reach at all, a TCP liveness probe and a gRPC startup probe reach the pod IP from the pod;
- liveness semantics with a real container: stopping it fails liveness after failureThreshold periods, a
  kubelet-like restart (new container id, new registration) brings it back.
Fixtures: tests/e2e/conftest.py; helpers: tests/support/shim_calls.py.
"""

from __future__ import annotations

import os
import sys

import pytest

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from tests.support.containerd_session import HTTP_PORT, TCP_PORT
from tests.support.netns_env import REPO_ROOT
from tests.support.shim_calls import (
    Watch, cannot_connect, grpc_spec, host_http_body, http_spec, is_state, probe_status, run_probe, tcp_spec,
    wait_listening,
)

pytestmark = pytest.mark.e2e


# --- 2. probes inside the pod ------------------------------------------------------------------

def test_probes_run_in_the_pod_and_reach_what_the_node_cannot(containerd, shim, kubelet, in_pod):
    pod = kubelet.run_pod("probed")
    kubelet.start_container(pod, "http", containerd.images.http)
    kubelet.start_container(pod, "tcp", containerd.images.tcp)
    grpc_port = in_pod(pod, [sys.executable, str(REPO_ROOT / "tests/support/servers/grpc_health_server.py"),
                             "--host", "0.0.0.0", "--port", "0"])
    wait_listening(pod.ip, TCP_PORT)

    with Watch(shim, pod_sandbox_id=pod.id) as watch:
        # The startup probe gates the same container's readiness, as in the kubelet.
        startup = run_probe(shim, pod, "http", spec_pb.STARTUP, grpc_spec(grpc_port), shim.cri)
        readiness = run_probe(shim, pod, "http", spec_pb.READINESS, http_spec(target=spec_pb.LOOPBACK), shim.cri)
        liveness = run_probe(shim, pod, "tcp", spec_pb.LIVENESS, tcp_spec(), shim.cri)
        seen: dict[str, service_pb.Probe] = {}

        def all_good(event) -> bool:
            if event.type != service_pb.REMOVED:
                seen[event.probe.probe_id] = event.probe
            return (all(p in seen and seen[p].status.state == spec_pb.STATE_SUCCESS for p in (startup, readiness))
                    and liveness in seen and seen[liveness].status.last_attempt.result == spec_pb.RESULT_SUCCESS)

        watch.until(all_good, "startup and readiness success, a successful liveness attempt")
        readiness_states = [e.probe.status.state for e in watch.events
                            if e.probe.probe_id == readiness and e.type in (service_pb.SNAPSHOT, service_pb.UPDATED)]
        first_success = {p: next(i for i, e in enumerate(watch.events)
                                 if e.probe.probe_id == p and e.probe.status.state == spec_pb.STATE_SUCCESS)
                         for p in (startup, readiness)}

    assert readiness_states[0] != spec_pb.STATE_SUCCESS and readiness_states[-1] == spec_pb.STATE_SUCCESS
    assert first_success[startup] < first_success[readiness], "readiness must wait for the startup probe"

    ready = seen[readiness].status.last_attempt
    assert (ready.address, ready.http_status_code) == (f"127.0.0.1:{HTTP_PORT}", 200)
    assert ready.output == f"ok {containerd.images.token}\n"  # the body, from this session's workload
    assert seen[liveness].status.last_attempt.address == f"{pod.ip}:{TCP_PORT}"
    started = seen[startup].status.last_attempt
    assert (started.address, started.output) == (f"{pod.ip}:{grpc_port}", "service healthy")

    worker = probe_status(shim, readiness).status.worker
    assert worker.state == service_pb.WORKER_RUNNING and worker.netns_path == pod.netns_path
    assert worker.netns_inode == os.stat(pod.netns_path).st_ino == os.stat(f"/proc/{pod.pid}/ns/net").st_ino
    # The worker itself sits in an empty netns of its own: the pod's sockets come from the netns broker.
    assert os.stat(f"/proc/{worker.pid}/ns/net").st_ino not in (worker.netns_inode, os.stat("/proc/self/ns/net").st_ino)

    # The node: the pod is routable (the TCP workload listens on every address), but the HTTP workload,
    # bound to the pod's loopback, is not reachable from the node's network namespace.
    assert not cannot_connect(pod.ip, TCP_PORT), "the pod IP should be reachable from the node"
    assert cannot_connect(pod.ip, HTTP_PORT), "the pod's 127.0.0.1-only server answered on the pod IP"
    node_loopback = host_http_body(f"http://127.0.0.1:{HTTP_PORT}/healthz")
    assert node_loopback is None or containerd.images.token not in node_loopback


# --- 3. liveness and a kubelet-like restart ------------------------------------------------------

def test_liveness_fails_when_the_container_stops_and_recovers_after_a_restart(containerd, shim, kubelet):
    pod = kubelet.run_pod("restarts")
    first = kubelet.start_container(pod, "tcp", containerd.images.tcp)
    wait_listening(pod.ip, TCP_PORT)
    failure_threshold = 3
    spec = tcp_spec(failure_threshold=failure_threshold, timeout_ms=500)

    with Watch(shim, pod_sandbox_id=pod.id) as watch:
        liveness = run_probe(shim, pod, "tcp", spec_pb.LIVENESS, spec, shim.cri)
        watch.until(lambda e: e.probe.probe_id == liveness and e.type == service_pb.ATTEMPT
                    and e.probe.status.last_attempt.result == spec_pb.RESULT_SUCCESS, "a successful liveness attempt")
        kubelet.stop_container(first)
        failed = watch.until(is_state(liveness, spec_pb.STATE_FAILURE), "liveness turning failure").probe
    # Attempts read after the stop may still include successes from before it: what counts is the run of
    # failures since the last success, which must be exactly failureThreshold long.
    results = [e.probe.status.last_attempt.result for e in watch.events
               if e.type == service_pb.ATTEMPT and e.probe.probe_id == liveness]
    last_success = max(i for i, r in enumerate(results) if r == spec_pb.RESULT_SUCCESS)
    assert results[last_success + 1:] == [spec_pb.RESULT_FAILURE] * failure_threshold
    assert "connect: connection refused" in failed.status.last_attempt.output
    assert probe_status(shim, liveness).status.on_hold  # no more attempts for a dead container

    # The kubelet: kill, restart (attempt 1, a new container id), and a new probe worker for it.
    kubelet.remove_container(first)
    second = kubelet.start_container(pod, "tcp", containerd.images.tcp, attempt=1)
    assert second != first
    wait_listening(pod.ip, TCP_PORT)
    shim.stub.StopProbe(service_pb.StopProbeRequest(probe_id=liveness), timeout=10)
    with Watch(shim, pod_sandbox_id=pod.id) as watch:
        renewed = run_probe(shim, pod, "tcp", spec_pb.LIVENESS, spec, shim.cri)
        recovered = watch.until(lambda e: e.probe.probe_id == renewed and e.type == service_pb.ATTEMPT
                                and e.probe.status.last_attempt.result == spec_pb.RESULT_SUCCESS, "liveness success").probe
    assert renewed != liveness and probe_status(shim, liveness) is None
    assert (recovered.container_id, recovered.status.state, recovered.status.on_hold) == (second, spec_pb.STATE_SUCCESS, False)
    assert recovered.status.consecutive_failures == 0
