"""What the kubelet HTTP prober makes of a response and its redirects (probe_worker.probes.http.response)."""

import pytest

from probe_worker import go_errors
from probe_worker.attempt import FAILURE, SUCCESS, UNKNOWN, WARNING
from probe_worker.probes.http import request as request_rules
from probe_worker.probes.http import response as response_rules
from probe_worker.probes.http.request import ProbeRequest
from probe_worker.probes.http.url import parse

UA = "kube-probe/1.37"


def request(path="/healthz", headers=(), host="10.0.0.1", port=8080, scheme="http"):
    return request_rules.new_probe_request(scheme, host, port, path, list(headers), UA)


# --- redirects ------------------------------------------------------------------------


def follow(location, status=302, current=None, first=None, made=1):
    first = first or request()
    return response_rules.follow_redirect(current or first, first, made, status, location)


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_redirect_statuses_are_followed(status):
    decision = follow("/next", status)
    assert decision.follow is not None and decision.follow.url.string() == "http://10.0.0.1:8080/next"
    assert decision.drain and decision.error is None


@pytest.mark.parametrize("status", [200, 300, 304, 305, 306, 399, 404])
def test_other_statuses_are_returned(status):
    assert follow("/next", status) == response_rules.RedirectDecision()


def test_redirect_without_location_is_returned():
    assert follow(None) == response_rules.RedirectDecision()
    assert follow("") == response_rules.RedirectDecision()


def test_same_hostname_other_port_is_followed():
    decision = follow("http://10.0.0.1:9090/x")
    assert decision.follow.url.string() == "http://10.0.0.1:9090/x"


def test_https_to_same_host_is_followed():
    assert follow("https://10.0.0.1:8443/x").follow.url.scheme == "https"


@pytest.mark.parametrize("location", ["http://10.0.0.2:8080/x", "http://localhost:8080/", "//other/x", "mailto:x"])
def test_other_hostname_is_returned_not_followed(location):
    assert follow(location) == response_rules.RedirectDecision()


def test_relative_location_resolves_against_the_current_url():
    current = ProbeRequest(parse("http://10.0.0.1:8080/a/b/c"), "", request().header)
    assert follow("../d?x", current=current).follow.url.string() == "http://10.0.0.1:8080/a/d?x"


def test_tenth_request_stops_with_go_error_naming_the_location_as_written():
    assert follow("/loop", made=9).follow is not None
    decision = follow("/loop", made=10)
    assert decision.follow is None and decision.drain
    assert decision.error == 'Get "/loop": stopped after 10 redirects'
    assert decision.failure == ("/loop", "stopped after 10 redirects")  # the url.Error's URL and Err


def test_other_host_is_checked_before_the_limit():
    assert follow("http://elsewhere/", made=10) == response_rules.RedirectDecision()


def test_unparsable_location_fails_naming_the_current_url():
    decision = follow("http://[::1")
    assert decision.error == (
        'Get "http://10.0.0.1:8080/healthz": failed to parse Location header "http://[::1": '
        'parse "http://[::1": missing \']\' in host'
    )
    assert not decision.drain


def test_referer_is_the_previous_url():
    current = ProbeRequest(parse("http://10.0.0.1:8080/one?q=1"), "", request().header)
    assert follow("/two", current=current).follow.header.get("Referer") == "http://10.0.0.1:8080/one?q=1"


def test_no_referer_from_https_to_http():
    first = request(scheme="https")
    assert not follow("http://10.0.0.1:8080/plain", first=first).follow.header.has("Referer")


def test_an_explicit_referer_is_kept():
    first = request(headers=[("Referer", "http://mine/")])
    assert follow("/x", first=first).follow.header.values("Referer") == ["http://mine/"]


def test_hop_headers_come_from_the_first_request():
    first = request(headers=[("X-Token", "t")])
    hop = follow("/a", first=first).follow
    second = follow("/b", current=hop, first=first, made=2).follow
    assert second.header.get("X-Token") == "t"
    assert second.header.get("Referer") == "http://10.0.0.1:8080/a"


def test_user_host_survives_a_relative_redirect():
    first = request(headers=[("Host", "app.example")])
    hop = follow("/next", first=first).follow
    assert hop.host == "app.example"
    assert dict(request_rules.wire_request(hop).headers)["Host"] == "app.example"


def test_user_host_survives_a_scheme_relative_redirect_to_the_same_hostname():
    first = request(headers=[("Host", "app.example")])
    assert follow("//10.0.0.1:9090/x", first=first).follow.host == "app.example"


def test_absolute_redirect_uses_the_new_url_host():
    first = request(headers=[("Host", "app.example")])
    hop = follow("http://10.0.0.1:9090/x", first=first).follow
    assert hop.host == ""
    assert dict(request_rules.wire_request(hop).headers)["Host"] == "10.0.0.1:9090"
    # ... and the custom Host is not restored by a later relative hop.
    assert follow("/y", current=hop, first=first, made=2).follow.host == ""


def test_only_the_lifecycle_client_keeps_a_complete_exchange_alive():
    assert response_rules.keeps_alive(request_rules.LIFECYCLE_TRANSPORT, complete=True)
    assert not response_rules.keeps_alive(request_rules.LIFECYCLE_TRANSPORT, complete=False)
    assert not response_rules.keeps_alive(request_rules.PROBE_TRANSPORT, complete=True)


@pytest.mark.parametrize("length, budget", [(None, 2048), (0, 2048), (2048, 2048), (2049, 0)])
def test_drain_budget(length, budget):
    assert response_rules.drain_budget(length) == budget


# --- results ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "status, result, output",
    [
        (200, SUCCESS, "body"),
        (204, SUCCESS, "body"),
        (299, SUCCESS, "body"),
        (300, WARNING, "Probe terminated redirects, Response body: body"),
        (302, WARNING, "Probe terminated redirects, Response body: body"),
        (399, WARNING, "Probe terminated redirects, Response body: body"),
        (400, FAILURE, "HTTP probe failed with statuscode: 400"),
        (503, FAILURE, "HTTP probe failed with statuscode: 503"),
        (101, FAILURE, "HTTP probe failed with statuscode: 101"),
        (99, FAILURE, "HTTP probe failed with statuscode: 99"),
    ],
)
def test_response_outcome(status, result, output):
    assert response_rules.response_outcome(status, b"body") == (result, output)


def test_body_is_cut_at_10240_bytes_and_decoded_leniently():
    result, output = response_rules.response_outcome(200, b"a" * 10239 + "é".encode())
    assert result == SUCCESS and output == "a" * 10239 + "\ufffd"
    assert response_rules.response_outcome(200, b"\xff")[1] == "\ufffd"


def test_the_transport_hides_the_length_of_a_gzip_body_it_asked_for():
    # transport.go: with requestedGzip and Content-Encoding gzip, resp.ContentLength = -1 (it gunzips itself).
    assert response_rules.response_length(50000, "gzip", added_gzip=True) is None
    assert response_rules.response_length(50000, "GZIP", added_gzip=True) is None
    assert response_rules.response_length(50000, "gzip", added_gzip=False) == 50000   # the user's own Accept-Encoding
    assert response_rules.response_length(50000, "br", added_gzip=True) == 50000
    assert response_rules.response_length(None, "", added_gzip=True) is None


def test_body_error_is_unknown():
    assert response_rules.body_error_outcome(go_errors.TIMEOUT_READING_BODY) == (
        UNKNOWN,
        "context deadline exceeded (Client.Timeout or context cancellation while reading body)",
    )
    assert response_rules.body_error_outcome("unexpected EOF") == (UNKNOWN, "unexpected EOF")


# --- the status line -----------------------------------------------------------------


@pytest.mark.parametrize(
    "line, parsed",
    [
        (b"HTTP/1.1 200 OK\r\n", 200),
        (b"HTTP/1.0 404\r\n", 404),
        (b"HTTP/1.1 099 Odd", 99),
        (b"HTTP/1.1  200 OK", 200),          # TrimLeft of the status
        (b"HTTP/2.0 200 OK", 200),
        (b"\x00\x00\x12\x04garbage", 'malformed HTTP response "\\x00\\x00\\x12\\x04garbage"'),
        (b"HTTP/1.1 20 OK", 'malformed HTTP status code "20"'),
        (b"HTTP/1.1 2x0 OK", 'malformed HTTP status code "2x0"'),
        (b"HTTP/1.1 -12 OK", 'malformed HTTP status code "-12"'),
        (b"HTTP/x 200 OK", 'malformed HTTP version "HTTP/x"'),
        (b"HTTP/10.1 200 OK", 'malformed HTTP version "HTTP/10.1"'),
    ],
)
def test_go_status_line(line, parsed):
    assert response_rules.go_status_line(line) == parsed


@pytest.mark.parametrize(
    "head, error",
    [
        (b"SSH-2.0-OpenSSH_9.2p1\r\n", 'malformed HTTP response "SSH-2.0-OpenSSH_9.2p1"'),
        (b"220 mail ESMTP ready\r\n", 'malformed HTTP status code "mail"'),
        (b"<html><body>up</body></html>\n<p>", 'malformed HTTP response "<html><body>up</body></html>"'),
    ],
)
def test_a_bad_status_line_fails_before_the_head_is_complete(head, error):
    assert response_rules.status_line_error(head) == "net/http: HTTP/1.x transport connection broken: " + error


@pytest.mark.parametrize("head", [b"", b"SSH-2.0-OpenSSH", b"HTTP/1.1 200 OK\r\n", b"HTTP/1.1 200 OK\r\nX-A: b"])
def test_an_incomplete_or_valid_status_line_waits_for_the_head(head):
    assert response_rules.status_line_error(head) is None
