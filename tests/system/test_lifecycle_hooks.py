"""Lifecycle hooks and RunOnce's max_tries, through a real worker process in a real pod netns.

A hook is RunOnce with lifecycle_hook set: the kubelet's runHTTPHandler semantics
(pkg/kubelet/lifecycle/handlers.go, with kubelet.go's insecureContainerLifecycleHTTPClient)
instead of the prober's. Expected texts and heads come from the kubelet's and Go's source:
  - the request: pkg/probe/http/request.go newProbeRequest with userAgent("lifecycle"), written
    by net/http Request.write (Host, User-Agent, the sorted header map, then the transport's
    extra headers); a plain http.Transport adds `Accept-Encoding: gzip` and, keep-alives being
    on, no `Connection: close` (transport.go persistConn.roundTrip);
  - the result: Do's error alone decides; any response is success, its body discarded;
  - HTTPS answered in plain HTTP: one retry over http without Authorization, the first error kept
    unless the retry gets a response.
The servers run in the pod netns and print one JSON line per event they see; the test reads
those lines from the pipe (select, never a sleep), up to a marker request sent after the attempt.
"""

from __future__ import annotations

import time

import pytest

from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.defaults import KUBELET_VERSION
from tests.support.hook_recorder import (
    FAILURE, HOOK_UA, MISMATCH, SUCCESS, UNKNOWN, Recorder, hook, hook_head, http_spec, needs_tls, run_once,
)
from tests.support.netns_env import listen
from tests.support.worker_harness import Rejected

pytestmark = pytest.mark.netns


@pytest.fixture
def recorder(pod_netns):
    return Recorder(pod_netns)


# --- the request ---------------------------------------------------------------------------------


def test_hook_request_is_the_lifecycle_clients_byte_for_byte(pod_netns, worker, recorder):
    attempt = hook(worker, http_spec("/status/200", recorder.port))
    assert (attempt.result, attempt.output, attempt.http_status_code) == (SUCCESS, "", 200)
    assert attempt.address == f"{pod_netns.ipv4}:{recorder.port}"
    assert recorder.heads(worker) == [hook_head("/status/200", f"{pod_netns.ipv4}:{recorder.port}")]


def test_hook_user_headers_sort_before_the_transports_gzip(pod_netns, worker, recorder):
    headers = [("x-zeta", "z"), ("Authorization", "Bearer t"), ("Host", "app.example")]
    hook(worker, http_spec("/status/200", recorder.port, headers=headers))
    assert recorder.heads(worker) == [
        hook_head("/status/200", "app.example", "Authorization: Bearer t", "X-Zeta: z")
    ]


def test_hook_empty_user_agent_removes_it_and_an_own_accept_encoding_replaces_gzip(pod_netns, worker, recorder):
    hook(worker, http_spec("/status/200", recorder.port, headers=[("User-Agent", "")]))
    hook(worker, http_spec("/status/200", recorder.port, headers=[("Accept-Encoding", "identity")]))
    host = f"{pod_netns.ipv4}:{recorder.port}"
    assert recorder.heads(worker) == [
        f"GET /status/200 HTTP/1.1\r\nHost: {host}\r\nAccept: */*\r\nAccept-Encoding: gzip\r\n\r\n",
        (f"GET /status/200 HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {HOOK_UA}\r\nAccept: */*\r\n"
         "Accept-Encoding: identity\r\n\r\n"),
    ]


def test_a_probe_of_the_same_spec_is_unchanged(pod_netns, worker, recorder):
    attempt = run_once(worker, http_spec("/status/200", recorder.port), hook=False)
    assert (attempt.result, attempt.output) == (SUCCESS, "status 200")
    assert recorder.heads(worker) == [
        (f"GET /status/200 HTTP/1.1\r\nHost: {pod_netns.ipv4}:{recorder.port}\r\nUser-Agent: kube-probe/{KUBELET_VERSION}\r\n"
         "Accept: */*\r\nConnection: close\r\n\r\n"),
    ]


# --- the result --------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [204, 404, 500, 503])
def test_any_status_is_a_successful_hook_with_no_output(pod_netns, worker, recorder, status):
    attempt = hook(worker, http_spec(f"/status/{status}", recorder.port))
    assert (attempt.result, attempt.output, attempt.http_status_code) == (SUCCESS, "", status)


def test_a_body_that_never_ends_does_not_fail_the_hook(pod_netns, worker, recorder):
    started = time.monotonic()
    attempt = hook(worker, http_spec("/slow-body", recorder.port, timeout_ms=300))
    assert (attempt.result, attempt.output, attempt.http_status_code) == (SUCCESS, "", 200)
    assert time.monotonic() - started < 0.3 + 1.0


def test_connection_refused_is_a_failure_in_gos_words(pod_netns, worker):
    attempt = hook(worker, http_spec("/stop", 1))
    ip = pod_netns.ipv4
    assert (attempt.result, attempt.output) == (
        FAILURE, f'Get "http://{ip}:1/stop": dial tcp {ip}:1: connect: connection refused'
    )


def test_a_server_that_never_answers_fails_at_the_timeout(pod_netns, worker, recorder):
    started = time.monotonic()
    attempt = hook(worker, http_spec("/hang", recorder.port, timeout_ms=500))
    assert time.monotonic() - started < 0.5 + 1.0
    assert (attempt.result, attempt.output) == (
        FAILURE,
        (f'Get "http://{pod_netns.ipv4}:{recorder.port}/hang": '
         "context deadline exceeded (Client.Timeout exceeded while awaiting headers)"),
    )


def test_a_reset_before_the_response_is_a_failure(pod_netns, worker, recorder):
    attempt = hook(worker, http_spec("/reset", recorder.port))
    ip, port = pod_netns.ipv4, recorder.port
    assert attempt.result == FAILURE
    assert attempt.output.startswith(f'Get "http://{ip}:{port}/reset": read tcp {ip}:')
    assert attempt.output.endswith(f"->{ip}:{port}: read: connection reset by peer")


def test_a_response_that_is_not_http_is_a_failure(pod_netns, worker, recorder):
    attempt = hook(worker, http_spec("/ssh", recorder.port))
    assert (attempt.result, attempt.output) == (
        FAILURE,
        (f'Get "http://{pod_netns.ipv4}:{recorder.port}/ssh": net/http: HTTP/1.x transport connection broken: '
         'malformed HTTP response "SSH-2.0-OpenSSH_9.2"'),
    )


# --- redirects (RedirectChecker(false), as for probes) -------------------------------------------------


def test_same_host_redirect_is_followed(pod_netns, worker, recorder):
    attempt = hook(worker, http_spec("/redirect?to=/status/503", recorder.port))
    assert (attempt.result, attempt.output, attempt.http_status_code) == (SUCCESS, "", 503)
    host = f"{pod_netns.ipv4}:{recorder.port}"
    assert recorder.heads(worker) == [
        hook_head("/redirect?to=/status/503", host),
        hook_head("/status/503", host, f"Referer: http://{host}/redirect?to=/status/503"),
    ]
    assert [p.name for p in attempt.phases][-1] == "redirect"


def test_redirect_to_another_host_is_not_followed_and_the_3xx_succeeds(pod_netns, worker, recorder):
    attempt = hook(worker, http_spec("/redirect?to=http://127.0.0.1:1/x", recorder.port))
    assert (attempt.result, attempt.output, attempt.http_status_code) == (SUCCESS, "", 302)
    assert len(recorder.heads(worker)) == 1


def test_a_redirect_loop_stops_after_ten_requests(pod_netns, worker, recorder):
    attempt = hook(worker, http_spec("/loop", recorder.port))
    assert (attempt.result, attempt.output) == (FAILURE, 'Get "/loop": stopped after 10 redirects')
    assert len(recorder.heads(worker)) == 10


# --- HTTPS, and the fallback to HTTP --------------------------------------------------------------------


def test_https_hook_offers_no_alpn_unlike_the_probe(pod_netns, worker):
    needs_tls()
    tls = Recorder(pod_netns, "--tls")
    attempt = hook(worker, http_spec("/status/200", tls.port, scheme=spec_pb.HTTPS))
    assert (attempt.result, attempt.output) == (SUCCESS, "")
    assert "tls" in [p.name for p in attempt.phases]
    probe = run_once(worker, http_spec("/status/200", tls.port, scheme=spec_pb.HTTPS), hook=False)
    assert probe.result == SUCCESS
    events = tls.seen(worker)
    # A plain http.Transport given a TLSClientConfig never attempts HTTP/2: no ALPN extension at all.
    assert [e["alpn"] for e in events if e["event"] == "tls"][:2] == [None, "http/1.1"]


def test_https_hook_answered_in_plain_http_is_sent_again_over_http(pod_netns, worker, recorder):
    headers = [("Authorization", "Bearer secret"), ("X-Token", "t")]
    attempt = hook(worker, http_spec("/stop", recorder.port, headers=headers, scheme=spec_pb.HTTPS))
    assert (attempt.result, attempt.output, attempt.http_status_code) == (SUCCESS, "", 404)
    host = f"{pod_netns.ipv4}:{recorder.port}"
    events = recorder.seen(worker)
    assert [e["event"] for e in events] == ["non-http", "request"]
    assert events[1]["head"] == hook_head("/stop", host, "X-Token: t")  # no Authorization
    assert events[1]["conn"] != events[0]["conn"]

    names = [p.name for p in attempt.phases]
    assert names == ["connect", "tls", "fallback"]
    assert attempt.phases[1].error == MISMATCH
    fallback = attempt.phases[2]
    assert fallback.detail == f"http://{host}/stop"
    assert [p.name for p in fallback.children] == ["connect", "request", "processing", "transfer"]


def test_a_failed_fallback_keeps_the_first_error(pod_netns, worker):
    # The server stops listening once the HTTPS attempt has connected: the retry is refused.
    once = Recorder(pod_netns, "--one-shot")
    attempt = hook(worker, http_spec("/stop", once.port, scheme=spec_pb.HTTPS))
    assert (attempt.result, attempt.output) == (FAILURE, f'Get "https://{pod_netns.ipv4}:{once.port}/stop": {MISMATCH}')
    fallback = attempt.phases[-1]
    assert fallback.name == "fallback" and fallback.children[0].name == "connect"
    assert fallback.children[0].error.endswith("connect: connection refused")


def test_a_probe_never_falls_back(pod_netns, worker, recorder):
    attempt = run_once(worker, http_spec("/stop", recorder.port, scheme=spec_pb.HTTPS), hook=False, max_tries=1)
    assert (attempt.result, attempt.output) == (
        FAILURE, f'Get "https://{pod_netns.ipv4}:{recorder.port}/stop": {MISMATCH}'
    )
    assert [e["event"] for e in recorder.seen(worker)] == ["non-http"]


# --- TCP and gRPC hooks -------------------------------------------------------------------------------


def tcp_spec(port: int) -> spec_pb.ProbeSpec:
    return spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=port)), timeout_ms=1000)


def test_tcp_hook_succeeds_iff_it_connects(pod_netns, worker):
    server = listen(pod_netns)
    attempt = hook(worker, tcp_spec(server.port))
    assert (attempt.result, attempt.output, attempt.address) == (SUCCESS, "", f"{pod_netns.ipv4}:{server.port}")
    refused = hook(worker, tcp_spec(1))
    assert (refused.result, refused.output) == (FAILURE, f"dial tcp {pod_netns.ipv4}:1: connect: connection refused")


def test_a_grpc_hook_is_refused(pod_netns, worker):
    grpc = spec_pb.ProbeSpec(grpc=spec_pb.GRPCAction(port=9090))
    with pytest.raises(Rejected) as refused:
        hook(worker, grpc)
    assert refused.value.errors == ["probe.spec.grpc: Forbidden: a lifecycle hook handler is http_get or tcp_socket"]


# --- max_tries --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tries", [1, 2])
def test_max_tries_bounds_the_tries_of_an_attempt_that_ends_unknown(pod_netns, worker, recorder, tries):
    # A body read error is a prober error: UNKNOWN, tried again (runProbeWithRetries) up to max_tries.
    attempt = run_once(worker, http_spec("/slow-body", recorder.port, timeout_ms=300), hook=False, max_tries=tries)
    assert attempt.result == UNKNOWN and "reading body" in attempt.output
    assert len(recorder.heads(worker)) == tries


def test_the_same_attempt_as_a_hook_is_one_request_and_a_success(pod_netns, worker, recorder):
    attempt = hook(worker, http_spec("/slow-body", recorder.port, timeout_ms=300), max_tries=3)
    assert (attempt.result, attempt.output) == (SUCCESS, "")
    assert len(recorder.heads(worker)) == 1


@pytest.mark.parametrize("tries", [-1, 4])
def test_max_tries_out_of_range_is_refused(pod_netns, worker, tries):
    with pytest.raises(Rejected) as refused:
        run_once(worker, tcp_spec(1), hook=False, max_tries=tries)
    assert refused.value.errors == [f"max_tries: Invalid value: {tries}: must be between 0 and 3, inclusive"]
