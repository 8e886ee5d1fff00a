"""The TCP socket probe executor through a real worker in a pod netns (in-process on loopback:
tests/unit/test_tcp_probe.py)."""

from __future__ import annotations

import pytest

from cri_proto import probe_spec_pb2 as spec_pb
from probe_worker.attempt import FAILURE, SUCCESS
from tests.support.tcp_probe_specs import tcp_spec


@pytest.mark.netns
def test_worker_tcp_open_and_refused_on_the_pod_ip(pod_netns, worker):
    server = pod_netns.spawn_python("tcp_server.py", "--mode", "silent")
    attempt = worker.run_once(tcp_spec(server.port))
    assert (attempt.result, attempt.output, attempt.address) == (SUCCESS, "", f"{pod_netns.ipv4}:{server.port}")

    server.stop()
    attempt = worker.run_once(tcp_spec(server.port))
    assert (attempt.result, attempt.output) == (FAILURE, f"dial tcp {pod_netns.ipv4}:{server.port}: connect: connection refused")


@pytest.mark.netns
def test_worker_tcp_any_family_falls_back_to_ipv6(pod_netns, worker):
    server = pod_netns.spawn_python("tcp_server.py", "--mode", "silent", "--host", pod_netns.ipv6)
    spec = tcp_spec(server.port)
    spec.ip_family = spec_pb.ANY
    attempt = worker.run_once(spec)
    assert (attempt.result, attempt.address) == (SUCCESS, f"[{pod_netns.ipv6}]:{server.port}")


@pytest.mark.netns
def test_worker_tcp_connect_timeout(pod_netns, worker):
    server = pod_netns.spawn_python("tcp_server.py", "--mode", "full-backlog", "--host", pod_netns.ipv4)
    attempt = worker.run_once(tcp_spec(server.port, timeout_ms=300))
    assert (attempt.result, attempt.output) == (FAILURE, f"dial tcp {pod_netns.ipv4}:{server.port}: i/o timeout")
    assert attempt.duration_ns < 1_300_000_000
