"""The HTTP probe executor against real servers: in-process on loopback, then through a real worker in a netns."""

from __future__ import annotations

import asyncio
import socket
import sys
import time

import pytest

from cri_proto import probe_spec_pb2 as spec_pb
from probe_worker.attempt import FAILURE, SUCCESS, UNKNOWN, WARNING, AttemptContext, Endpoint, Outcome
from probe_worker.probes.http import executor as http
from tests.servers.http_server import HTTPTestServer, server_tls_context

UA = "kube-probe/1.32"


def http_spec(path: str, port: int = 0, headers=(), scheme=spec_pb.HTTP, **spec_fields) -> spec_pb.ProbeSpec:
    return spec_pb.ProbeSpec(
        http_get=spec_pb.HTTPGetAction(
            path=path,
            port=spec_pb.PortRef(number=port),
            scheme=scheme,
            http_headers=[spec_pb.HTTPHeader(name=n, value=v) for n, v in headers],
        ),
        **spec_fields,
    )


async def run_probe(path, port, *, host="127.0.0.1", addresses=None, timeout=2.0, headers=(), scheme=spec_pb.HTTP):
    """One attempt; returns (outcome, ctx, seconds taken)."""
    loop = asyncio.get_running_loop()
    ctx = AttemptContext(deadline=loop.time() + timeout, timeout_ns=int(timeout * 1e9), user_agent=UA)
    endpoint = Endpoint(host=host, addresses=(host,) if addresses is None else addresses, port=port)
    started = loop.time()
    outcome = await http.probe(http_spec(path, headers=headers, scheme=scheme), endpoint, ctx)
    return outcome, ctx, loop.time() - started


def probe_once(path, server_factory=HTTPTestServer, **kw) -> tuple[Outcome, AttemptContext, float, HTTPTestServer]:
    async def go():
        async with server_factory() as server:
            outcome, ctx, took = await run_probe(path, server.port, **kw)
        return outcome, ctx, took, server

    return asyncio.run(go())


def phase_names(phases) -> list[str]:
    return [p.name for p in phases]


def default_head(target: str, host: str) -> str:
    return (
        f"GET {target} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {UA}\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    )


# --- results ---------------------------------------------------------------------------------


def test_success_returns_the_body_and_records_the_phases():
    outcome, ctx, _, server = probe_once("/ok?body=healthy")
    assert (outcome.result, outcome.output, outcome.http_status_code) == (SUCCESS, "healthy", 200)
    assert outcome.address == f"127.0.0.1:{server.port}"
    assert phase_names(ctx.trace.phases) == ["connect", "request", "processing", "transfer"]
    assert ctx.trace.phases[1].detail == "GET /ok?body=healthy HTTP/1.1"
    assert ctx.trace.phases[3].detail == "200"


def test_request_head_on_the_wire_is_the_kubelet_one():
    outcome, _, _, server = probe_once("/echo?x=1")
    assert outcome.output == default_head("/echo?x=1", f"127.0.0.1:{server.port}")
    assert server.requests == [outcome.output.encode()]


def test_user_headers_host_user_agent_and_accept_overrides():
    headers = [
        ("x-b", "2"), ("Host", "app.example"), ("User-Agent", "custom/1"), ("accept", "text/plain"), ("X-A", "1"),
    ]
    outcome, *_ = probe_once("/echo", headers=headers)
    assert outcome.output == (
        "GET /echo HTTP/1.1\r\nHost: app.example\r\nUser-Agent: custom/1\r\nAccept: text/plain\r\n"
        "X-A: 1\r\nX-B: 2\r\nConnection: close\r\n\r\n"
    )


def test_empty_user_agent_and_accept_remove_them():
    outcome, _, _, server = probe_once("/echo", headers=[("User-Agent", ""), ("Accept", "")])
    assert outcome.output == f"GET /echo HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nConnection: close\r\n\r\n"


@pytest.mark.parametrize("status", [400, 404, 500, 503])
def test_error_status_fails_without_the_body(status):
    outcome, *_ = probe_once(f"/status/{status}")
    assert (outcome.result, outcome.output, outcome.http_status_code) == (
        FAILURE, f"HTTP probe failed with statuscode: {status}", status
    )


def test_body_is_truncated_at_10240_bytes():
    for path in ("/body?size=50000", "/body?size=50000&chunked=1"):
        outcome, *_ = probe_once(path)
        assert outcome.result == SUCCESS and outcome.output == "x" * 10240


def _echo_over_ipv6_loopback(**probe_args):
    """A probe of /echo on a server listening on ::1 only (skipped without an IPv6 loopback): (outcome, port)."""

    async def go():
        server = HTTPTestServer()
        await server.start("::1")
        try:
            return await run_probe("/echo", server.port, **probe_args), server.port
        finally:
            await server.stop()

    try:
        (outcome, _, _), port = asyncio.run(go())
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback: {exc}")
    return outcome, port


def test_ipv6_url_and_host_header_are_bracketed():
    outcome, port = _echo_over_ipv6_loopback(host="::1")
    assert outcome.result == SUCCESS
    assert outcome.output == default_head("/echo", f"[::1]:{port}")
    assert outcome.address == f"[::1]:{port}"


def test_url_and_host_name_the_family_that_answered():
    """ip_family ANY: the IPv4 candidate refuses, IPv6 answers, and the request says so."""
    outcome, port = _echo_over_ipv6_loopback(host="127.0.0.1", addresses=("127.0.0.1", "::1"))
    assert outcome.result == SUCCESS and outcome.address == f"[::1]:{port}"
    assert outcome.output == default_head("/echo", f"[::1]:{port}")


def test_a_reused_request_names_whichever_family_answers_each_attempt():
    """The first request of a spec is built once; each attempt still names the IP that answered it."""

    async def go():
        v4 = HTTPTestServer()
        port = await v4.start("127.0.0.1")
        v6 = HTTPTestServer()
        await v6.start("::1", port)
        try:
            kw = dict(host="127.0.0.1", addresses=("127.0.0.1", "::1"))
            first, _, _ = await run_probe("/echo", port, **kw)
            await v4.stop()                      # now only IPv6 answers
            second, _, _ = await run_probe("/echo", port, **kw)
            await v4.start("127.0.0.1", port)    # and IPv4 again
            third, _, _ = await run_probe("/echo", port, **kw)
            return [first, second, third], port
        finally:
            await v4.stop()
            await v6.stop()

    try:
        outcomes, port = asyncio.run(go())
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback or port {exc}")
    assert [o.output for o in outcomes] == [
        default_head("/echo", f"127.0.0.1:{port}"), default_head("/echo", f"[::1]:{port}"),
        default_head("/echo", f"127.0.0.1:{port}")]
    assert [o.address for o in outcomes] == [f"127.0.0.1:{port}", f"[::1]:{port}", f"127.0.0.1:{port}"]


# --- redirects -------------------------------------------------------------------------------


def test_relative_redirect_is_followed_with_referer_and_user_host_kept():
    outcome, ctx, _, server = probe_once("/redirect?to=/echo", headers=[("Host", "app.example")])
    assert outcome.result == SUCCESS and outcome.http_status_code == 200
    assert outcome.output == (
        f"GET /echo HTTP/1.1\r\nHost: app.example\r\nUser-Agent: {UA}\r\nAccept: */*\r\n"
        f"Referer: http://127.0.0.1:{server.port}/redirect?to=/echo\r\nConnection: close\r\n\r\n"
    )
    redirect = ctx.trace.phases[-1]
    assert redirect.name == "redirect" and redirect.detail == f"http://127.0.0.1:{server.port}/echo"
    assert phase_names(redirect.children) == ["connect", "request", "processing", "transfer"]


def test_absolute_redirect_to_same_host_other_port_is_followed_with_the_new_host():
    async def go():
        async with HTTPTestServer() as first, HTTPTestServer() as second:
            target = f"http://127.0.0.1:{second.port}/echo"
            path = f"/redirect?code=307&to={target}"
            outcome, _, _ = await run_probe(path, first.port, headers=[("Host", "app.example")])
            return outcome, first.port, second.port

    outcome, first_port, second_port = asyncio.run(go())
    assert outcome.result == SUCCESS and outcome.address == f"127.0.0.1:{second_port}"
    assert f"Host: 127.0.0.1:{second_port}\r\n" in outcome.output
    referer = f"http://127.0.0.1:{first_port}/redirect?code=307&to=http://127.0.0.1:{second_port}/echo"
    assert f"Referer: {referer}\r\n" in outcome.output


def test_redirect_to_another_hostname_is_a_warning_with_the_body():
    outcome, ctx, _, _ = probe_once("/redirect?to=http://localhost:1/elsewhere")
    assert (outcome.result, outcome.output, outcome.http_status_code) == (
        WARNING, "Probe terminated redirects, Response body: redirect body 302", 302
    )
    assert "redirect" not in phase_names(ctx.trace.phases)


def test_redirect_without_location_is_a_warning():
    outcome, *_ = probe_once("/redirect?code=301")
    assert (outcome.result, outcome.output) == (WARNING, "Probe terminated redirects, Response body: redirect body 301")


def test_redirect_loop_stops_after_ten_requests():
    outcome, ctx, _, server = probe_once("/loop")
    assert (outcome.result, outcome.output, outcome.http_status_code) == (
        FAILURE, 'Get "/loop": stopped after 10 redirects', 302
    )
    assert len(server.requests) == 10
    assert phase_names(ctx.trace.phases) == ["connect", "request", "processing", "transfer"] + ["redirect"] * 9


# --- failures ---------------------------------------------------------------------------------


def test_connection_refused():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    outcome, *_ = asyncio.run(run_probe("/healthz", port))
    assert outcome.result == FAILURE
    assert outcome.output == (
        f'Get "http://127.0.0.1:{port}/healthz": dial tcp 127.0.0.1:{port}: connect: connection refused'
    )


def test_a_server_that_never_answers_is_bounded_by_the_timeout():
    outcome, ctx, took, server = probe_once("/hang", timeout=0.5)
    assert outcome.result == FAILURE
    assert outcome.output == (
        f'Get "http://127.0.0.1:{server.port}/hang": '
        "context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
    )
    assert took < 0.5 + 1.0
    assert ctx.trace.phases[-1].name == "processing" and ctx.trace.phases[-1].error


def test_timeout_while_reading_the_body_is_unknown():
    outcome, _, took, _ = probe_once("/slow-body", timeout=0.5)
    assert outcome.result == UNKNOWN and outcome.http_status_code == 200
    # Go's cancelTimerBody.Read: err.Error() + " (Client.Timeout or context cancellation while reading body)",
    # returned bare by DoHTTPProbe (pkg/probe/http/http.go: `return probe.Failure, "", err`).
    assert outcome.output == "context deadline exceeded (Client.Timeout or context cancellation while reading body)"
    assert took < 0.5 + 1.0


def test_peer_closing_without_answer_is_eof():
    outcome, _, _, server = probe_once("/close")
    assert (outcome.result, outcome.output) == (FAILURE, f'Get "http://127.0.0.1:{server.port}/close": EOF')


def test_peer_reset_names_both_ends_like_go():
    outcome, _, _, server = probe_once("/reset")
    assert outcome.result == FAILURE
    prefix = f'Get "http://127.0.0.1:{server.port}/reset": read tcp 127.0.0.1:'
    assert outcome.output.startswith(prefix)
    assert outcome.output.endswith(f"->127.0.0.1:{server.port}: read: connection reset by peer")


def test_non_http_answer_is_a_malformed_response():
    outcome, _, _, server = probe_once("/garbage")
    assert outcome.output == (
        f'Get "http://127.0.0.1:{server.port}/garbage": net/http: HTTP/1.x transport connection broken: '
        'malformed HTTP response "\\x00\\x00\\x12\\x04\\x00\\x00\\x00\\x00\\x00garbage"'
    )


@pytest.mark.parametrize("line, status", [("HTTP/1.1 101 Switching Protocols", 101), ("HTTP/1.1 099 Odd", 99)])
def test_final_statuses_h11_refuses_still_fail_with_their_code(line, status):
    outcome, *_ = probe_once(f"/status-line?line={line.replace(' ', '%20')}")
    assert (outcome.result, outcome.output, outcome.http_status_code) == (
        FAILURE, f"HTTP probe failed with statuscode: {status}", status
    )


def test_informational_responses_are_skipped_up_to_five():
    outcome, *_ = probe_once("/info?n=5")
    assert (outcome.result, outcome.output) == (SUCCESS, "after info")
    outcome, *_ = probe_once("/info?n=6")
    assert outcome.output.endswith("net/http: too many 1xx informational responses")


def test_oversized_response_head_is_refused():
    outcome, *_ = probe_once("/big-head")
    assert outcome.result == FAILURE
    assert outcome.output.endswith("net/http: server response headers exceeded 65536 bytes; aborted")


def test_invalid_header_fails_before_connecting():
    outcome, ctx, _, server = probe_once("/ok", headers=[("X-Bad", "a\r\nInjected: yes")])
    assert outcome.output == (
        f'Get "http://127.0.0.1:{server.port}/ok": net/http: invalid header field value for "X-Bad"'
    )
    assert ctx.trace.phases == [] and server.requests == []


@pytest.mark.parametrize("path", ["/echo?q=é", "/echo?a b", "/echo?%zz=ü&x"])
def test_a_raw_query_goes_out_as_go_writes_it(path):
    """net/url keeps RawQuery verbatim: RequestURI() is EscapedPath() + "?" + RawQuery, and the kubelet's
    url.Parse of the probe path puts everything after "?" there. So the non-ASCII bytes (UTF-8) and the space go
    out as they are, and a server that answers gets probed like any other (h11 would refuse such a target)."""
    outcome, _, _, server = probe_once(path)
    assert (outcome.result, outcome.http_status_code) == (SUCCESS, 200)
    assert outcome.output == default_head(path, f"127.0.0.1:{server.port}")
    assert server.requests == [default_head(path, f"127.0.0.1:{server.port}").encode()]


def test_a_non_ascii_path_is_escaped_as_go_escapes_it():
    """The path, unlike the query, is EscapedPath(): every byte >= 0x80 percent-encoded."""
    outcome, _, _, server = probe_once("/echo/é?q=é")
    assert outcome.output == default_head("/echo/%C3%A9?q=é", f"127.0.0.1:{server.port}")


def test_a_body_cut_short_is_the_bare_go_error():
    """pkg/probe/http DoHTTPProbe returns ReadAtMost's error as it is (`return probe.Failure, "", err`): the kubelet
    throws the result away as a prober error, whose text is Go's body reader's: io.ErrUnexpectedEOF."""
    outcome, *_ = probe_once("/cut-body")
    assert (outcome.result, outcome.output, outcome.http_status_code) == (UNKNOWN, "unexpected EOF", 200)


# --- HTTPS -------------------------------------------------------------------------------------


def tls_server() -> HTTPTestServer:
    ctx = server_tls_context()
    if ctx is None:
        pytest.skip("neither the cryptography package nor the openssl CLI can make a test certificate")
    return HTTPTestServer(ctx)


def test_https_without_verification_and_without_sni_for_an_ip():
    outcome, ctx, _, server = probe_once("/echo", server_factory=tls_server, scheme=spec_pb.HTTPS)
    assert outcome.result == SUCCESS
    assert outcome.output == default_head("/echo", f"127.0.0.1:{server.port}")
    assert phase_names(ctx.trace.phases) == ["connect", "tls", "request", "processing", "transfer"]
    assert ctx.trace.phases[1].detail.startswith("TLSv1.")
    assert server.server_names == [None]


def test_https_sends_sni_for_a_hostname():
    outcome, _, _, server = probe_once(
        "/ok", server_factory=tls_server, scheme=spec_pb.HTTPS, host="localhost", addresses=("127.0.0.1",)
    )
    assert outcome.result == SUCCESS and server.server_names == ["localhost"]


def test_https_to_a_plain_http_server_is_a_scheme_mismatch():
    outcome, _, _, server = probe_once("/ok", scheme=spec_pb.HTTPS)
    assert outcome.output == (
        f'Get "https://127.0.0.1:{server.port}/ok": http: server gave HTTP response to HTTPS client'
    )


def test_https_hang_is_bounded():
    outcome, _, took, server = probe_once("/hang", server_factory=tls_server, scheme=spec_pb.HTTPS, timeout=0.5)
    assert outcome.output == (
        f'Get "https://127.0.0.1:{server.port}/hang": '
        "context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
    )
    assert took < 0.5 + 1.0


def test_tls_handshake_against_a_silent_server_is_bounded():
    async def go():
        silent = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = silent.sockets[0].getsockname()[1]
        try:
            return await run_probe("/", port, scheme=spec_pb.HTTPS, timeout=0.5), port
        finally:
            silent.close()

    (outcome, ctx, took), port = asyncio.run(go())
    assert outcome.output == (
        f'Get "https://127.0.0.1:{port}/": context deadline exceeded (Client.Timeout exceeded while awaiting headers)'
    )
    assert ctx.trace.phases[-1].name == "tls" and ctx.trace.phases[-1].error
    assert took < 0.5 + 1.0


@pytest.mark.parametrize(
    "reply, error",
    [
        (b"", "EOF"),
        (b"\x15\x03\x03\x00\x02\x02\x28", "remote error: tls: handshake failure"),
        (b"\x15\x03\x03\x00\x02\x02\x46", "remote error: tls: protocol version not supported"),
        (b"SSH-2.0-OpenSSH_9.2\r\n", "tls: first record does not look like a TLS handshake"),
    ],
)
def test_tls_handshake_failures_read_like_go(reply, error):
    async def go():
        async def answer(reader, writer):
            await reader.read(1)  # the ClientHello has started
            writer.write(reply)
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            return await run_probe("/", port, scheme=spec_pb.HTTPS), port
        finally:
            server.close()

    (outcome, ctx, _), port = asyncio.run(go())
    assert (outcome.result, outcome.output) == (FAILURE, f'Get "https://127.0.0.1:{port}/": {error}')
    assert ctx.trace.phases[-1].name == "tls" and ctx.trace.phases[-1].error == error


# --- through a real worker in a pod network namespace --------------------------------------------


def spawn_http(pod_netns, *args):
    return pod_netns.spawn([sys.executable, "tests/servers/http_server.py", *args])


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
