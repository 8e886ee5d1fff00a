"""The kubelet HTTP probe's decisions (probe_worker.probes.http.rules), without sockets."""

import pytest

from probe_worker.probes.http import rules
from probe_worker.attempt import FAILURE, SUCCESS, UNKNOWN, WARNING
from probe_worker.probes.http.rules import Header, ProbeRequest
from probe_worker.probes.http.url import URLError, parse

UA = "kube-probe/1.32"


def request(path="/healthz", headers=(), host="10.0.0.1", port=8080, scheme="http"):
    return rules.new_probe_request(scheme, host, port, path, list(headers), UA)


def wire(path="/healthz", headers=(), **kw):
    w = rules.wire_request(request(path, headers, **kw))
    return [w.request_line, *(f"{k}: {v}" for k, v in w.headers)]


# --- header keys -------------------------------------------------------------


@pytest.mark.parametrize(
    "name, canonical",
    [
        ("x-foo", "X-Foo"),
        ("X-FOO-bar", "X-Foo-Bar"),
        ("user-agent", "User-Agent"),
        ("HOST", "Host"),
        ("content-md5", "Content-Md5"),
        ("-a", "-A"),
        ("x_y", "X_y"),
        ("foo bar", "foo bar"),     # not a token: left alone (and later rejected)
        ("x:y", "x:y"),
        ("é-x", "é-x"),
        ("", ""),
    ],
)
def test_canonical_header_key(name, canonical):
    assert rules.canonical_header_key(name) == canonical


def test_header_keeps_values_in_order_under_the_canonical_key():
    h = Header()
    h.add("x-a", "1")
    h.add("X-A", "2")
    assert h.values("X-a") == ["1", "2"] and h.get("x-A") == "1" and h.keys() == ["X-A"]
    h.set("x-a", "3")
    assert h.values("X-A") == ["3"]
    h.delete("x-a")
    assert not h.has("X-A") and h.get("X-A") == ""


@pytest.mark.parametrize(
    "value, token, found",
    [
        ("close", "close", True),
        ("Close", "close", True),
        ("keep-alive, close", "close", True),
        ("close,keep-alive", "close", True),
        ("closed", "close", False),
        ("enclose", "close", False),
        ("", "close", False),
    ],
)
def test_has_token(value, token, found):
    assert rules.has_token(value, token) is found


# --- the request URL -----------------------------------------------------------


@pytest.mark.parametrize(
    "host, path, url, target",
    [
        ("10.0.0.1", "/healthz", "http://10.0.0.1:8080/healthz", "/healthz"),
        ("10.0.0.1", "", "http://10.0.0.1:8080/", "/"),
        ("10.0.0.1", "/p?x=1&y=%2F", "http://10.0.0.1:8080/p?x=1&y=%2F", "/p?x=1&y=%2F"),
        ("10.0.0.1", "healthz", "http://10.0.0.1:8080/healthz", "/healthz"),  # NewRequest re-parses String()
        ("10.0.0.1", "/a b", "http://10.0.0.1:8080/a%20b", "/a%20b"),
        ("10.0.0.1", "/%zz", "http://10.0.0.1:8080/%25zz", "/%25zz"),      # formatURL's "busted path"
        ("10.0.0.1", "/é", "http://10.0.0.1:8080/%C3%A9", "/%C3%A9"),
        ("10.0.0.1", "/p#frag", "http://10.0.0.1:8080/p#frag", "/p"),
        ("10.0.0.1", "//evil/x", "http://10.0.0.1:8080/x", "/x"),              # host from the path is replaced
        ("10.0.0.1", "/p?", "http://10.0.0.1:8080/p?", "/p?"),
        ("fd00:5a::2", "/healthz", "http://[fd00:5a::2]:8080/healthz", "/healthz"),
        ("svc.example", "/", "http://svc.example:8080/", "/"),
    ],
)
def test_probe_url_and_request_target(host, path, url, target):
    req = request(path, host=host)
    assert req.url.string() == url
    assert rules.wire_request(req).target == target


def test_https_scheme():
    assert request(scheme="https").url.string() == "https://10.0.0.1:8080/healthz"


def test_a_host_go_cannot_reparse_is_an_error():
    with pytest.raises(URLError, match="invalid URL escape"):
        request(host="bad host")


# --- the request head -----------------------------------------------------------


def test_default_head_is_exactly_what_the_kubelet_sends():
    assert wire() == [
        "GET /healthz HTTP/1.1",
        "Host: 10.0.0.1:8080",
        "User-Agent: kube-probe/1.32",
        "Accept: */*",
        "Connection: close",
    ]


def test_ipv6_host_header_is_bracketed():
    assert wire(host="fd00:5a::2")[1] == "Host: [fd00:5a::2]:8080"


def test_user_headers_are_sorted_by_canonical_key_and_repeated_ones_kept_in_order():
    assert wire(headers=[("x-zeta", "z"), ("X-Alpha", "a1"), ("accept-language", "de"), ("x-alpha", "a2")]) == [
        "GET /healthz HTTP/1.1",
        "Host: 10.0.0.1:8080",
        "User-Agent: kube-probe/1.32",
        "Accept: */*",
        "Accept-Language: de",
        "X-Alpha: a1",
        "X-Alpha: a2",
        "X-Zeta: z",
        "Connection: close",
    ]


def test_user_host_header_replaces_the_url_host():
    lines = wire(headers=[("host", "app.example.com")])
    assert lines[1] == "Host: app.example.com"
    assert not any(line.startswith("host:") for line in lines)


def test_empty_host_header_means_the_url_host():
    assert wire(headers=[("Host", "")])[1] == "Host: 10.0.0.1:8080"


def test_first_host_value_wins():
    assert wire(headers=[("Host", "a.example"), ("Host", "b.example")])[1] == "Host: a.example"


def test_invalid_host_header_is_sent_empty_like_go():
    assert wire(headers=[("Host", "a b/c")])[1] == "Host: "


def test_zone_is_removed_from_host_and_non_ascii_host_is_punycoded():
    assert wire(headers=[("Host", "[fe80::1%eth0]:80")])[1] == "Host: [fe80::1]:80"
    assert wire(headers=[("Host", "bücher.example:8080")])[1] == "Host: xn--bcher-kva.example:8080"


def test_user_agent_override_first_value_and_empty_removal():
    assert wire(headers=[("user-agent", "my-agent/2"), ("User-Agent", "second")])[2] == "User-Agent: my-agent/2"
    assert not any(line.startswith("User-Agent") for line in wire(headers=[("User-Agent", "")]))


def test_accept_override_and_empty_removal():
    assert "Accept: application/json" in wire(headers=[("accept", "application/json")])
    assert not any(line.startswith("Accept") for line in wire(headers=[("Accept", "")]))
    # headers.Get("Accept") is the first value: an empty first value removes them all.
    assert not any(line.startswith("Accept") for line in wire(headers=[("Accept", ""), ("Accept", "text/plain")]))


def test_no_accept_encoding_unless_asked():
    assert not any(line.startswith("Accept-Encoding") for line in wire())
    assert "Accept-Encoding: gzip" in wire(headers=[("Accept-Encoding", "gzip")])


def test_connection_close_only_when_the_user_did_not_ask_for_it():
    assert wire(headers=[("Connection", "close")]).count("Connection: close") == 1
    keep = wire(headers=[("Connection", "keep-alive")])
    assert keep[-2:] == ["Connection: keep-alive", "Connection: close"]


def test_no_connection_close_when_switching_protocols():
    lines = wire(headers=[("Connection", "Upgrade"), ("Upgrade", "websocket")])
    assert "Connection: close" not in lines and "Connection: Upgrade" in lines


def test_framing_headers_from_the_user_are_dropped():
    lines = wire(headers=[("Content-Length", "5"), ("Transfer-Encoding", "chunked"), ("Trailer", "X")])
    assert not any(line.split(":")[0] in ("Content-Length", "Transfer-Encoding", "Trailer") for line in lines)


def test_values_are_trimmed():
    assert "X-A: v" in wire(headers=[("X-A", "  v\t")])


def test_empty_user_header_value_is_sent_empty():
    assert "X-Empty: " in wire(headers=[("X-Empty", "")])


def test_credentials_in_the_url_become_basic_auth():
    req = request()
    req = ProbeRequest(url=parse("http://user:pa%3Ass@10.0.0.1:8080/"), host="", header=req.header)
    headers = dict(rules.wire_request(req).headers)
    assert headers["Authorization"] == "Basic dXNlcjpwYTpzcw=="  # user:pa:ss


# --- the lifecycle hook's request head ---------------------------------------------
# Same request (pkg/probe/http NewRequestForHTTPGetAction(..., "lifecycle")), sent by the kubelet's
# insecureContainerLifecycleHTTPClient: a plain http.Transport, so persistConn.roundTrip adds
# `Accept-Encoding: gzip` (DisableCompression false, no Accept-Encoding, no Range) and no
# `Connection: close` (DisableKeepAlives false); Request.write emits those extra headers last.

HOOK_UA = "kube-lifecycle/1.32"


def hook_wire(path="/stop", headers=(), **kw):
    req = rules.new_probe_request(kw.pop("scheme", "http"), "10.0.0.1", 8080, path, list(headers), HOOK_UA)
    w = rules.wire_request(req, rules.LIFECYCLE_TRANSPORT)
    return [w.request_line, *(f"{k}: {v}" for k, v in w.headers)]


def test_hook_head_is_exactly_what_the_kubelet_lifecycle_client_sends():
    assert hook_wire() == [
        "GET /stop HTTP/1.1",
        "Host: 10.0.0.1:8080",
        "User-Agent: kube-lifecycle/1.32",
        "Accept: */*",
        "Accept-Encoding: gzip",
    ]


def test_hook_gzip_comes_after_every_user_header():
    assert hook_wire(headers=[("x-zeta", "z"), ("Authorization", "Bearer t"), ("accept-language", "de")]) == [
        "GET /stop HTTP/1.1",
        "Host: 10.0.0.1:8080",
        "User-Agent: kube-lifecycle/1.32",
        "Accept: */*",
        "Accept-Language: de",
        "Authorization: Bearer t",
        "X-Zeta: z",
        "Accept-Encoding: gzip",
    ]


def test_hook_user_agent_and_accept_overrides_work_as_for_probes():
    lines = hook_wire(headers=[("User-Agent", ""), ("Accept", "")])
    assert lines == ["GET /stop HTTP/1.1", "Host: 10.0.0.1:8080", "Accept-Encoding: gzip"]
    assert hook_wire(headers=[("user-agent", "mine/1")])[2] == "User-Agent: mine/1"


def test_hook_asks_for_gzip_only_without_accept_encoding_or_range():
    own = hook_wire(headers=[("accept-encoding", "br")])
    assert own[-1] == "Accept-Encoding: br" and "Accept-Encoding: gzip" not in own
    ranged = hook_wire(headers=[("Range", "bytes=0-9")])
    assert ranged[-1] == "Range: bytes=0-9" and not any(line.startswith("Accept-Encoding") for line in ranged)
    # req.Header.Get("Accept-Encoding") == "": an empty one is sent as given, and gzip after it.
    assert hook_wire(headers=[("Accept-Encoding", "")])[-2:] == ["Accept-Encoding: ", "Accept-Encoding: gzip"]


def test_hook_never_adds_connection_close():
    assert not any(line.startswith("Connection") for line in hook_wire())
    assert hook_wire(headers=[("Connection", "keep-alive")])[-2:] == ["Connection: keep-alive", "Accept-Encoding: gzip"]


def test_transport_headers_of_each_client():
    assert rules.transport_headers(Header(), rules.PROBE_TRANSPORT) == [("Connection", "close")]
    assert rules.transport_headers(Header(), rules.LIFECYCLE_TRANSPORT) == [("Accept-Encoding", "gzip")]
    both = rules.Transport(disable_keep_alives=True, disable_compression=False)
    assert rules.transport_headers(Header(), both) == [("Accept-Encoding", "gzip"), ("Connection", "close")]


# --- before dialing ----------------------------------------------------------------


@pytest.mark.parametrize(
    "headers, error",
    [
        ([("X Bad", "1")], 'net/http: invalid header field name "X Bad"'),
        ([("", "1")], 'net/http: invalid header field name ""'),
        ([("X-Bad", "a\r\nInjected: 1")], 'net/http: invalid header field value for "X-Bad"'),
        ([("X-Bad", "a\x00")], 'net/http: invalid header field value for "X-Bad"'),
        ([("X-Tab", "a\tb")], None),
        ([("X-Utf8", "ünïcode")], None),
    ],
)
def test_preflight_header_validation(headers, error):
    assert rules.preflight_error(request(headers=headers)) == error


def test_preflight_scheme_and_host():
    req = request()
    assert rules.preflight_error(ProbeRequest(parse("ftp://10.0.0.1/"), "", req.header)) == (
        'unsupported protocol scheme "ftp"'
    )
    assert rules.preflight_error(ProbeRequest(parse("http:opaque"), "", req.header)) == "http: no Host in request URL"


@pytest.mark.parametrize(
    "url, address",
    [
        ("http://10.0.0.1:8080/", ("10.0.0.1", 8080)),
        ("http://10.0.0.1/", ("10.0.0.1", 80)),
        ("https://[fd00::2]/", ("fd00::2", 443)),
        ("http://10.0.0.1:08080/", ("10.0.0.1", 8080)),
        ("http://10.0.0.1:99999/", "dial tcp: address 10.0.0.1:99999: invalid port"),
    ],
)
def test_dial_address(url, address):
    assert rules.dial_address(parse(url)) == address


def test_retarget_names_the_address_reached():
    req = request(host="198.18.0.2")
    assert rules.retarget(req, "fd00:5a::2").url.string() == "http://[fd00:5a::2]:8080/healthz"
    assert rules.retarget(req, "198.18.0.2") == req


# --- redirects ------------------------------------------------------------------------


def follow(location, status=302, current=None, first=None, made=1):
    first = first or request()
    return rules.follow_redirect(current or first, first, made, status, location)


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_redirect_statuses_are_followed(status):
    decision = follow("/next", status)
    assert decision.follow is not None and decision.follow.url.string() == "http://10.0.0.1:8080/next"
    assert decision.drain and decision.error is None


@pytest.mark.parametrize("status", [200, 300, 304, 305, 306, 399, 404])
def test_other_statuses_are_returned(status):
    assert follow("/next", status) == rules.RedirectDecision()


def test_redirect_without_location_is_returned():
    assert follow(None) == rules.RedirectDecision()
    assert follow("") == rules.RedirectDecision()


def test_same_hostname_other_port_is_followed():
    decision = follow("http://10.0.0.1:9090/x")
    assert decision.follow.url.string() == "http://10.0.0.1:9090/x"


def test_https_to_same_host_is_followed():
    assert follow("https://10.0.0.1:8443/x").follow.url.scheme == "https"


@pytest.mark.parametrize("location", ["http://10.0.0.2:8080/x", "http://localhost:8080/", "//other/x", "mailto:x"])
def test_other_hostname_is_returned_not_followed(location):
    assert follow(location) == rules.RedirectDecision()


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
    assert follow("http://elsewhere/", made=10) == rules.RedirectDecision()


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
    assert dict(rules.wire_request(hop).headers)["Host"] == "app.example"


def test_user_host_survives_a_scheme_relative_redirect_to_the_same_hostname():
    first = request(headers=[("Host", "app.example")])
    assert follow("//10.0.0.1:9090/x", first=first).follow.host == "app.example"


def test_absolute_redirect_uses_the_new_url_host():
    first = request(headers=[("Host", "app.example")])
    hop = follow("http://10.0.0.1:9090/x", first=first).follow
    assert hop.host == ""
    assert dict(rules.wire_request(hop).headers)["Host"] == "10.0.0.1:9090"
    # ... and the custom Host is not restored by a later relative hop.
    assert follow("/y", current=hop, first=first, made=2).follow.host == ""


def test_only_the_lifecycle_client_keeps_a_complete_exchange_alive():
    assert rules.keeps_alive(rules.LIFECYCLE_TRANSPORT, complete=True)
    assert not rules.keeps_alive(rules.LIFECYCLE_TRANSPORT, complete=False)
    assert not rules.keeps_alive(rules.PROBE_TRANSPORT, complete=True)


@pytest.mark.parametrize("length, budget", [(None, 2048), (0, 2048), (2048, 2048), (2049, 0)])
def test_drain_budget(length, budget):
    assert rules.drain_budget(length) == budget


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
    assert rules.response_outcome(status, b"body") == (result, output)


def test_body_is_cut_at_10240_bytes_and_decoded_leniently():
    result, output = rules.response_outcome(200, b"a" * 10239 + "é".encode())
    assert result == SUCCESS and output == "a" * 10239 + "\ufffd"
    assert rules.response_outcome(200, b"\xff")[1] == "\ufffd"


@pytest.mark.parametrize("status", [200, 204, 301, 302, 400, 404, 500, 503, 101, 99])
def test_any_response_is_a_successful_hook_with_no_output(status):
    # handlers.go runHTTPHandler returns Do's error only; the status and body are never looked at.
    assert rules.hook_response_outcome(status) == (SUCCESS, "")


@pytest.mark.parametrize("length, budget", [(None, 10240), (0, 10240), (10240, 10240), (10241, 0)])
def test_hook_discard_budget(length, budget):
    # discardHTTPRespBody: `if resp.ContentLength <= maxRespBodyLength` (10 KiB; -1 when unknown).
    assert rules.hook_discard_budget(length) == budget


def test_the_transport_hides_the_length_of_a_gzip_body_it_asked_for():
    # transport.go: with requestedGzip and Content-Encoding gzip, resp.ContentLength = -1 (it gunzips itself).
    assert rules.response_length(50000, "gzip", added_gzip=True) is None
    assert rules.response_length(50000, "GZIP", added_gzip=True) is None
    assert rules.response_length(50000, "gzip", added_gzip=False) == 50000   # the user's own Accept-Encoding
    assert rules.response_length(50000, "br", added_gzip=True) == 50000
    assert rules.response_length(None, "", added_gzip=True) is None


def test_only_a_compressing_transport_without_the_users_accept_encoding_or_range_adds_gzip():
    assert rules.adds_gzip(Header(), rules.LIFECYCLE_TRANSPORT)
    assert not rules.adds_gzip(Header(), rules.PROBE_TRANSPORT)
    assert not rules.adds_gzip(Header({"Accept-Encoding": ["gzip"]}), rules.LIFECYCLE_TRANSPORT)
    assert not rules.adds_gzip(Header({"Range": ["bytes=0-1"]}), rules.LIFECYCLE_TRANSPORT)
    assert rules.adds_gzip(Header({"Accept-Encoding": [""]}), rules.LIFECYCLE_TRANSPORT)


def test_https_hook_answered_in_plain_http_is_sent_again_over_http_without_authorization():
    sent = rules.new_probe_request(
        "https", "10.0.0.1", 8443, "/stop?x=1", [("Authorization", "Bearer t"), ("X-Token", "k"), ("Host", "app")],
        HOOK_UA,
    )
    retry = rules.lifecycle_fallback(sent, rules.SCHEME_MISMATCH)
    assert retry.url.string() == "http://10.0.0.1:8443/stop?x=1"
    assert retry.host == "app"
    assert not retry.header.has("Authorization") and retry.header.get("X-Token") == "k"
    assert sent.header.get("Authorization") == "Bearer t"  # req.Clone: the first request is untouched
    assert [f"{k}: {v}" for k, v in rules.wire_request(retry, rules.LIFECYCLE_TRANSPORT).headers] == [
        "Host: app", "User-Agent: kube-lifecycle/1.32", "Accept: */*", "X-Token: k", "Accept-Encoding: gzip",
    ]


def test_url_credentials_still_become_basic_auth_in_the_fallback():
    sent = ProbeRequest(url=parse("https://user:pw@10.0.0.1:8443/"), host="", header=Header({"Authorization": ["x"]}))
    retry = rules.lifecycle_fallback(sent, rules.SCHEME_MISMATCH)
    assert dict(rules.wire_request(retry, rules.LIFECYCLE_TRANSPORT).headers)["Authorization"] == "Basic dXNlcjpwdw=="


@pytest.mark.parametrize(
    "cause",
    [None, "EOF", "tls: first record does not look like a TLS handshake", "stopped after 10 redirects",
     "dial tcp 10.0.0.1:8443: connect: connection refused"],
)
def test_no_fallback_for_other_errors(cause):
    assert rules.lifecycle_fallback(rules.new_probe_request("https", "10.0.0.1", 8443, "/", [], HOOK_UA), cause) is None


def test_fallback_looks_at_the_cause_whatever_the_scheme_sent():
    # isHTTPResponseError only reads the url.Error's Err: an https redirect hop answered in plain HTTP
    # makes the kubelet retry its first (http) request as well.
    sent = rules.new_probe_request("http", "10.0.0.1", 8080, "/stop", [], HOOK_UA)
    assert rules.lifecycle_fallback(sent, rules.SCHEME_MISMATCH).url.string() == "http://10.0.0.1:8080/stop"


def test_only_a_retry_that_got_a_response_replaces_the_first_error():
    assert rules.fallback_wins(SUCCESS)
    assert not rules.fallback_wins(FAILURE) and not rules.fallback_wins(UNKNOWN)


def test_body_error_is_unknown():
    assert rules.body_error_outcome(rules.TIMEOUT_READING_BODY) == (
        UNKNOWN,
        "context deadline exceeded (Client.Timeout or context cancellation while reading body)",
    )
    assert rules.body_error_outcome("unexpected EOF") == (UNKNOWN, "unexpected EOF")


# --- error texts -----------------------------------------------------------------------------


def test_url_error_and_timeout_texts():
    refused = "dial tcp 198.18.0.2:8080: connect: connection refused"
    assert rules.url_error("http://198.18.0.2:8080/healthz", refused) == f'Get "http://198.18.0.2:8080/healthz": {refused}'
    assert rules.awaiting_headers("dial tcp 10.0.0.1:80: i/o timeout") == (
        "dial tcp 10.0.0.1:80: i/o timeout (Client.Timeout exceeded while awaiting headers)"
    )
    assert rules.TIMEOUT_AWAITING_HEADERS == (
        "context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
    )


def test_net_op_error():
    exc = ConnectionResetError(104, "Connection reset by peer")
    assert rules.net_op_error("read", "10.0.0.9:5000", "10.0.0.1:80", exc) == (
        "read tcp 10.0.0.9:5000->10.0.0.1:80: read: connection reset by peer"
    )


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
    assert rules.go_status_line(line) == parsed


@pytest.mark.parametrize(
    "head, error",
    [
        (b"SSH-2.0-OpenSSH_9.2p1\r\n", 'malformed HTTP response "SSH-2.0-OpenSSH_9.2p1"'),
        (b"220 mail ESMTP ready\r\n", 'malformed HTTP status code "mail"'),
        (b"<html><body>up</body></html>\n<p>", 'malformed HTTP response "<html><body>up</body></html>"'),
    ],
)
def test_a_bad_status_line_fails_before_the_head_is_complete(head, error):
    assert rules.status_line_error(head) == "net/http: HTTP/1.x transport connection broken: " + error


@pytest.mark.parametrize("head", [b"", b"SSH-2.0-OpenSSH", b"HTTP/1.1 200 OK\r\n", b"HTTP/1.1 200 OK\r\nX-A: b"])
def test_an_incomplete_or_valid_status_line_waits_for_the_head(head):
    assert rules.status_line_error(head) is None


def test_transport_texts():
    assert rules.transport_broken("malformed HTTP response") == (
        "net/http: HTTP/1.x transport connection broken: malformed HTTP response"
    )
    assert rules.head_too_large().endswith("net/http: server response headers exceeded 65536 bytes; aborted")
    assert rules.too_many_informational().endswith("net/http: too many 1xx informational responses")


@pytest.mark.parametrize(
    "reason, text",
    [
        ("SSLV3_ALERT_HANDSHAKE_FAILURE", "remote error: tls: handshake failure"),
        ("TLSV1_ALERT_PROTOCOL_VERSION", "remote error: tls: protocol version not supported"),
        ("TLSV1_ALERT_INTERNAL_ERROR", "remote error: tls: internal error"),
        ("TLSV13_ALERT_CERTIFICATE_REQUIRED", "remote error: tls: certificate required"),
        ("TLSV1_UNRECOGNIZED_NAME", "remote error: tls: unrecognized name"),
        ("TLSV1_ALERT_NO_APPLICATION_PROTOCOL", "remote error: tls: no application protocol"),
        ("UNEXPECTED_EOF_WHILE_READING", "EOF"),
        ("WRONG_VERSION_NUMBER", "tls: wrong version number"),
        ("", "tls: handshake failure"),
    ],
)
def test_tls_error_text(reason, text):
    assert rules.tls_error_text(reason) == text


@pytest.mark.parametrize(
    "header, eof, error",
    [
        (b"\x16\x03\x03\x00\x7a", False, None),                      # handshake record
        (b"\x15\x03\x03\x00\x02", False, None),                      # alert record
        (b"\x16\x03", False, None),                                  # not enough yet
        (b"", True, "EOF"),
        (b"\x16\x03", True, "unexpected EOF"),
        (b"HTTP/1.1 400", False, "http: server gave HTTP response to HTTPS client"),
        (b"SSH-2", False, "tls: first record does not look like a TLS handshake"),
        (b"\x16\x10\x00\x00\x01", False, "tls: first record does not look like a TLS handshake"),
    ],
)
def test_first_record_error(header, eof, error):
    assert rules.first_record_error(header[:5], eof) == error
