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

import json
import os
import select
import sys
import time

import pytest

from cri_proto import probe_spec_pb2 as spec_pb
from cri_proto import probe_worker_pb2 as worker_pb
from tests.netns_env import listen
from tests.servers.http_server import server_tls_context
from tests.worker_harness import Rejected

pytestmark = pytest.mark.netns

SUCCESS, FAILURE, UNKNOWN = spec_pb.RESULT_SUCCESS, spec_pb.RESULT_FAILURE, spec_pb.RESULT_UNKNOWN
HOOK_UA = "kube-lifecycle/1.32"   # the worker's default user_agent_version
MISMATCH = "http: server gave HTTP response to HTTPS client"

# An HTTP/1.1 server that keeps connections alive and reports what it sees, one JSON line per event:
#   {"event": "tls", "conn": N, "alpn": ...}      a TLS handshake (--tls), with the ALPN protocol chosen
#   {"event": "non-http", "conn": N}              bytes that are not a request (a ClientHello): answered 400
#   {"event": "request", "conn": N, "head": ...}  a request head, printed before it is answered
# argv: HOST [--tls] [--one-shot]; --one-shot closes the listener when the first connection arrives.
# Routes: /status/N, /redirect?to=URL[&body=N][&close=1|&drop=1] (a body of N bytes; `close` says
# Connection: close, `drop` closes the connection after the response without saying so), /loop,
# /hang, /slow-body (promises 100 bytes, sends 10), /reset, /ssh (an SSH banner), /marker; else 404.
RECORDING_SERVER = r'''
import asyncio, itertools, json, socket, struct, sys, urllib.parse
from tests.servers.serving import announce_and_wait, listening_socket

host, flags = sys.argv[1], set(sys.argv[2:])
ids = itertools.count(1)
state = {}

def emit(**event):
    print(json.dumps(event), flush=True)

def response(status, body=b"", headers=()):
    head = [f"HTTP/1.1 {status} Status"] + [f"{k}: {v}" for k, v in headers] + [f"Content-Length: {len(body)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body

async def serve(reader, writer):
    conn = next(ids)
    if "--one-shot" in flags:
        state["server"].close()
    try:
        if "--tls" in flags:
            emit(event="tls", conn=conn, alpn=writer.get_extra_info("ssl_object").selected_alpn_protocol())
        while True:
            first = await reader.read(1)
            if not first:
                return
            if not first.isalpha():
                emit(event="non-http", conn=conn)
                writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                await writer.drain()
                return
            head = first + await reader.readuntil(b"\r\n\r\n")
            emit(event="request", conn=conn, head=head.decode("latin-1"))
            target = urllib.parse.urlsplit(head.split(b" ")[1].decode("latin-1"))
            query = dict(urllib.parse.parse_qsl(target.query))
            path = target.path
            if path.startswith("/status/"):
                writer.write(response(int(path[8:]), f"status {path[8:]}".encode()))
            elif path == "/redirect":
                headers = [("Location", query["to"])] + ([("Connection", "close")] if "close" in query else [])
                writer.write(response(302, b"m" * int(query.get("body", "5")), headers))
                if "close" in query or "drop" in query:
                    await writer.drain()
                    return
            elif path == "/loop":
                writer.write(response(302, b"loop", [("Location", "/loop")]))
            elif path in ("/hang", "/slow-body"):
                if path == "/slow-body":
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
                    await writer.drain()
                await reader.read()  # until the client goes away
                return
            elif path == "/reset":
                writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
                return
            elif path == "/ssh":
                writer.write(b"SSH-2.0-OpenSSH_9.2\r\n")
            elif path == "/marker":
                writer.write(response(200, b"marker"))
            else:
                writer.write(response(404, b"no such route"))
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError, OSError):
        pass
    finally:
        writer.transport.abort()

async def main():
    tls = None
    if "--tls" in flags:
        from tests.servers.http_server import server_tls_context
        tls = server_tls_context()
    sock = listening_socket(host, 0)
    state["server"] = await asyncio.start_server(serve, sock=sock, ssl=tls)
    await announce_and_wait(sock.getsockname()[1])

asyncio.run(main())
'''


class Recorder:
    """A recording server in the pod netns, and the events it printed."""

    def __init__(self, pod_netns, *flags: str) -> None:
        self.server = pod_netns.spawn([sys.executable, "-c", RECORDING_SERVER, "::", *flags])
        self.port = self.server.port
        self.scheme = spec_pb.HTTPS if "--tls" in flags else spec_pb.HTTP
        self._fd = self.server.proc.stdout.fileno()
        self._buffer = b""

    def _line(self, timeout: float = 10.0) -> str:
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([self._fd], [], [], timeout)
            if not ready:
                raise TimeoutError("the recording server printed nothing")
            data = os.read(self._fd, 65536)
            if not data:
                raise EOFError("the recording server exited")
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def seen(self, worker) -> list[dict]:
        """Every event since the last call: a probe of /marker through the worker closes the list."""
        marker = run_once(worker, http_spec("/marker", self.port, scheme=self.scheme), hook=False, max_tries=1)
        assert marker.result == SUCCESS, marker.output
        events = []
        while True:
            event = json.loads(self._line())
            if event["event"] == "request" and event["head"].startswith("GET /marker "):
                return events
            events.append(event)

    def heads(self, worker) -> list[str]:
        return [e["head"] for e in self.seen(worker) if e["event"] == "request"]


def http_spec(path: str, port: int, headers=(), scheme=spec_pb.HTTP, timeout_ms: int = 2000) -> spec_pb.ProbeSpec:
    return spec_pb.ProbeSpec(
        http_get=spec_pb.HTTPGetAction(
            path=path, port=spec_pb.PortRef(number=port), scheme=scheme,
            http_headers=[spec_pb.HTTPHeader(name=n, value=v) for n, v in headers],
        ),
        timeout_ms=timeout_ms,
    )


def run_once(worker, spec: spec_pb.ProbeSpec, *, hook: bool, max_tries: int = 0, timeout: float = 10.0):
    reg = worker_pb.ProbeRegistration(type=spec_pb.READINESS, spec=spec, container=worker_pb.ContainerRef(),
                                      sandbox_id=worker.sandbox_id)
    run = worker_pb.RunOnce(probe=reg, max_tries=max_tries, lifecycle_hook=hook)
    return worker.request(timeout, run_once=run).attempt.attempt


def hook(worker, spec, **kw):
    return run_once(worker, spec, hook=True, **kw)


@pytest.fixture
def recorder(pod_netns):
    return Recorder(pod_netns)


def hook_head(target: str, host: str, *extra: str) -> str:
    lines = [f"GET {target} HTTP/1.1", f"Host: {host}", f"User-Agent: {HOOK_UA}", "Accept: */*", *extra,
             "Accept-Encoding: gzip"]
    return "\r\n".join(lines) + "\r\n\r\n"


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
        (f"GET /status/200 HTTP/1.1\r\nHost: {pod_netns.ipv4}:{recorder.port}\r\nUser-Agent: kube-probe/1.32\r\n"
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


def needs_tls():
    if server_tls_context() is None:
        pytest.skip("neither the cryptography package nor the openssl CLI can make a test certificate")


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
