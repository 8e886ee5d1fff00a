"""The HTTP probe executor against real servers on loopback, in-process: results, redirects, failures.

HTTPS is tests/unit/test_http_probe_tls.py's; the same probes through a real worker in a pod netns are
tests/system/test_http_probe_in_pod.py's.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from probe_worker.attempt import FAILURE, SUCCESS, UNKNOWN, WARNING
from tests.support.http_probe_harness import UA, default_head, phase_names, probe_once, run_probe
from tests.support.servers.http_server import HTTPTestServer

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
