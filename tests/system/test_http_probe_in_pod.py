"""The HTTP probe through a real worker in a pod network namespace."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

from cri_proto import probe_spec_pb2 as spec_pb
from probe_worker.attempt import FAILURE
from tests.support.http_probe_harness import default_head, http_spec, run_probe
from tests.support.servers.http_server import server_tls_context

# --- through a real worker in a pod network namespace --------------------------------------------


def spawn_http(pod_netns, *args):
    return pod_netns.spawn([sys.executable, "tests/support/servers/http_server.py", *args])


def run_in_worker(worker, path, port, **kw) -> spec_pb.Attempt:
    kw.setdefault("timeout_ms", 2000)
    return worker.run_once(http_spec(path, port, **kw))


@pytest.mark.netns
def test_pod_ip_probe_in_the_netns(pod_netns, worker):
    server = spawn_http(pod_netns, "--host", "::")
    attempt = run_in_worker(worker, "/echo", server.port)
    assert attempt.result == spec_pb.RESULT_SUCCESS and attempt.http_status_code == 200
    assert attempt.output == default_head("/echo", f"{pod_netns.ipv4}:{server.port}")
    assert attempt.address == f"{pod_netns.ipv4}:{server.port}"
    assert [p.name for p in attempt.phases][-4:] == ["connect", "request", "processing", "transfer"]


@pytest.mark.netns
def test_loopback_server_is_reachable_only_from_inside_the_netns(pod_netns, worker):
    server = spawn_http(pod_netns, "--host", "127.0.0.1")
    attempt = run_in_worker(worker, "/ok", server.port, target=spec_pb.LOOPBACK)
    assert (attempt.result, attempt.output) == (spec_pb.RESULT_SUCCESS, "ok")
    assert attempt.address == f"127.0.0.1:{server.port}"
    # The same probe from the host netns (this test process) finds nothing there.
    outcome, *_ = asyncio.run(run_probe("/ok", server.port))
    assert outcome.result == FAILURE and outcome.output.endswith("connect: connection refused")
    # And the pod IP target does not reach a loopback-only server.
    attempt = run_in_worker(worker, "/ok", server.port)
    assert attempt.result == spec_pb.RESULT_FAILURE and attempt.output.endswith("connect: connection refused")


@pytest.mark.netns
def test_redirects_in_the_netns(pod_netns, worker):
    first = spawn_http(pod_netns, "--host", "::")
    second = spawn_http(pod_netns, "--host", "::")
    ip = pod_netns.ipv4

    same_host = run_in_worker(worker, f"/redirect?to=http://{ip}:{second.port}/ok%3Fbody%3Dsecond", first.port)
    assert (same_host.result, same_host.output) == (spec_pb.RESULT_SUCCESS, "second")
    assert same_host.address == f"{ip}:{second.port}"
    hop = [p for p in same_host.phases if p.name == "redirect"]
    assert hop and hop[0].detail == f"http://{ip}:{second.port}/ok?body=second"

    other_host = run_in_worker(worker, f"/redirect?to=http://127.0.0.1:{second.port}/ok", first.port)
    assert (other_host.result, other_host.output) == (
        spec_pb.RESULT_WARNING, "Probe terminated redirects, Response body: redirect body 302"
    )

    loop = run_in_worker(worker, "/loop", first.port)
    assert (loop.result, loop.output) == (spec_pb.RESULT_FAILURE, 'Get "/loop": stopped after 10 redirects')


@pytest.mark.netns
def test_truncation_in_the_netns(pod_netns, worker):
    server = spawn_http(pod_netns)
    attempt = run_in_worker(worker, "/body?size=30000", server.port)
    assert attempt.result == spec_pb.RESULT_SUCCESS and attempt.output == "x" * 10240


@pytest.mark.netns
def test_never_answering_server_in_the_netns_is_bounded(pod_netns, worker):
    server = spawn_http(pod_netns)
    started = time.monotonic()
    attempt = run_in_worker(worker, "/hang", server.port, timeout_ms=500)
    assert time.monotonic() - started < 0.5 + 1.0
    assert attempt.result == spec_pb.RESULT_FAILURE
    assert attempt.output == (
        f'Get "http://{pod_netns.ipv4}:{server.port}/hang": '
        "context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
    )


@pytest.mark.netns
def test_headers_in_the_netns(pod_netns, worker):
    server = spawn_http(pod_netns)
    headers = [("Host", "app.example"), ("User-Agent", "custom/1"), ("Accept", "application/json")]
    attempt = run_in_worker(worker, "/echo", server.port, headers=headers)
    assert attempt.output == (
        "GET /echo HTTP/1.1\r\nHost: app.example\r\nUser-Agent: custom/1\r\nAccept: application/json\r\n"
        "Connection: close\r\n\r\n"
    )
    attempt = run_in_worker(worker, "/echo", server.port, headers=[("User-Agent", ""), ("Accept", "")])
    assert attempt.output == f"GET /echo HTTP/1.1\r\nHost: {pod_netns.ipv4}:{server.port}\r\nConnection: close\r\n\r\n"


@pytest.mark.netns
def test_ipv6_only_server_with_ip_family_any(pod_netns, worker):
    server = spawn_http(pod_netns, "--host", pod_netns.ipv6)
    attempt = run_in_worker(worker, "/echo", server.port, ip_family=spec_pb.ANY)
    assert attempt.result == spec_pb.RESULT_SUCCESS
    assert attempt.address == f"[{pod_netns.ipv6}]:{server.port}"
    assert attempt.output == default_head("/echo", f"[{pod_netns.ipv6}]:{server.port}")


@pytest.mark.netns
def test_https_in_the_netns(pod_netns, worker):
    if server_tls_context() is None:
        pytest.skip("neither the cryptography package nor the openssl CLI can make a test certificate")
    server = spawn_http(pod_netns, "--tls")
    attempt = run_in_worker(worker, "/ok", server.port, scheme=spec_pb.HTTPS)
    assert (attempt.result, attempt.output) == (spec_pb.RESULT_SUCCESS, "ok")
    assert "tls" in [p.name for p in attempt.phases]


@pytest.mark.netns
def test_dial_timeout_in_the_netns_names_the_dial(pod_netns, worker):
    """Nobody owns 198.18.0.77 on the pod's link: the SYN goes nowhere until the deadline."""
    spec = http_spec("/healthz", 8080, timeout_ms=500)
    spec.http_get.host = "198.18.0.77"
    started = time.monotonic()
    attempt = worker.run_once(spec)
    assert time.monotonic() - started < 0.5 + 1.0
    assert (attempt.result, attempt.output) == (
        spec_pb.RESULT_FAILURE,
        'Get "http://198.18.0.77:8080/healthz": dial tcp 198.18.0.77:8080: i/o timeout '
        "(Client.Timeout exceeded while awaiting headers)",
    )


@pytest.mark.netns
def test_a_body_read_error_is_unknown_and_tried_three_times_like_the_kubelet(pod_netns, worker):
    server = spawn_http(pod_netns, "--host", "::")
    port = spec_pb.PortRef(number=server.port)
    slow = spec_pb.ProbeSpec(http_get=spec_pb.HTTPGetAction(path="/slow-body", port=port), timeout_ms=300)
    attempt = worker.run_once(slow)
    assert attempt.result == spec_pb.RESULT_UNKNOWN
    assert "reading body" in attempt.output
    assert [p.name for p in attempt.phases].count("connect") == 3
    count = worker.run_once(spec_pb.ProbeSpec(http_get=spec_pb.HTTPGetAction(path="/count", port=port)))
    assert count.output == "4"  # three tries of /slow-body, then this request
