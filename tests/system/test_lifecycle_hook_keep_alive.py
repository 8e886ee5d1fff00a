"""A lifecycle hook's keep-alive (the kubelet's lifecycle client keeps Go's transport defaults), through a real
worker process in a real pod netns: which connections a redirect chain and the fallback reuse."""

from __future__ import annotations

import pytest

from cri_proto import probe_spec_pb2 as spec_pb
from tests.support.hook_recorder import FAILURE, MISMATCH, SUCCESS, Recorder, hook, http_spec, needs_tls, run_once

pytestmark = pytest.mark.netns


@pytest.fixture
def recorder(pod_netns):
    return Recorder(pod_netns)


# --- keep-alive (the lifecycle client's transport) ------------------------------------------------------
# A redirect's body read to its end puts the connection in Go's idle pool, and the next request to the
# same scheme and address takes it: one connection for the whole chain. Not when the server asked to
# close, nor when the body was not drained (Go reads at most 2 KiB of it), nor for another port.


def conns(events: list[dict]) -> list[int]:
    return [e["conn"] for e in events if e["event"] == "request"]


@pytest.mark.parametrize("body, reused", [(0, True), (2048, True), (2049, False)])
def test_a_redirect_body_up_to_2_kib_is_drained_and_frees_the_connection(pod_netns, worker, recorder, body, reused):
    # Client.do reads a redirect's body when Content-Length <= 2048 (maxBodySlurpSize), else closes it.
    attempt = hook(worker, http_spec(f"/redirect?to=/status/200&body={body}", recorder.port))
    assert (attempt.result, attempt.http_status_code) == (SUCCESS, 200)
    first, second = conns(recorder.seen(worker))
    assert (first == second) is reused


def test_a_redirect_hop_reuses_the_kept_alive_connection(pod_netns, worker, recorder):
    attempt = hook(worker, http_spec("/redirect?to=/redirect%3Fto%3D/status/200", recorder.port))
    assert (attempt.result, attempt.http_status_code) == (SUCCESS, 200)
    first, second, third = conns(recorder.seen(worker))
    assert first == second == third
    hops = [p for p in attempt.phases if p.name == "redirect"]
    assert [[c.name for c in hop.children] for hop in hops] == [["request", "processing", "transfer"]] * 2


@pytest.mark.parametrize("option", ["close=1", "body=4096"])
def test_no_reuse_when_the_server_asks_to_close_or_the_body_is_not_drained(pod_netns, worker, recorder, option):
    attempt = hook(worker, http_spec(f"/redirect?to=/status/200&{option}", recorder.port))
    assert (attempt.result, attempt.http_status_code) == (SUCCESS, 200)
    first, second = conns(recorder.seen(worker))
    assert first != second


def test_a_kept_alive_connection_the_server_closed_is_replaced_by_a_new_one(pod_netns, worker, recorder):
    attempt = hook(worker, http_spec("/redirect?to=/status/200&drop=1", recorder.port))
    assert (attempt.result, attempt.output, attempt.http_status_code) == (SUCCESS, "", 200)
    first, second = conns(recorder.seen(worker))
    assert first != second
    # The hop tried the idle connection first (it got EOF or a reset, no response), then dialed.
    (hop,) = [p for p in attempt.phases if p.name == "redirect"]
    names = [c.name for c in hop.children]
    assert names[0] == "request" and names[-4:] == ["connect", "request", "processing", "transfer"]
    assert any(c.error for c in hop.children[:-4])


def test_an_https_redirect_hop_reuses_the_tls_connection(pod_netns, worker):
    needs_tls()
    tls = Recorder(pod_netns, "--tls")
    attempt = hook(worker, http_spec("/redirect?to=/status/200", tls.port, scheme=spec_pb.HTTPS))
    assert (attempt.result, attempt.http_status_code) == (SUCCESS, 200)
    events = tls.seen(worker)[:-1]  # the marker's own handshake last
    assert [(e["event"], e["conn"]) for e in events] == [("tls", 1), ("request", 1), ("request", 1)]


def test_a_probe_never_reuses_a_connection(pod_netns, worker, recorder):
    attempt = run_once(worker, http_spec("/redirect?to=/status/200", recorder.port), hook=False)
    assert (attempt.result, attempt.output) == (SUCCESS, "status 200")
    first, second = conns(recorder.seen(worker))
    assert first != second


def test_the_fallback_takes_the_connection_an_http_hop_left_idle(pod_netns, worker, recorder):
    # http -> 302 to https on a port that answers plain HTTP: the kubelet retries its first request over
    # http (isHTTPResponseError reads only the cause), through the same client and so the same idle pool.
    plain = Recorder(pod_netns)
    ip = pod_netns.ipv4
    to = f"https://{ip}:{plain.port}/stop"
    attempt = hook(worker, http_spec(f"/redirect?to={to}", recorder.port))
    assert (attempt.result, attempt.output) == (FAILURE, f'Get "{to}": {MISMATCH}')
    events = recorder.seen(worker)
    assert [e["event"] for e in events] == ["request", "request"]
    assert events[0]["conn"] == events[1]["conn"] and events[0]["head"] == events[1]["head"]
    assert [e["event"] for e in plain.seen(worker)] == ["non-http", "non-http"]
    assert [p.name for p in attempt.phases][-2:] == ["redirect", "fallback"]
