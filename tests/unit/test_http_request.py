"""The kubelet HTTP probe's request, from spec to bytes (probe_worker.probes.http.request), without sockets."""

import pytest

from probe_worker.probes.http import request as request_rules
from probe_worker.probes.http.headers import Header
from probe_worker.probes.http.request import ProbeRequest
from probe_worker.probes.http.url import URLError, parse

UA = "kube-probe/1.37"


def request(path="/healthz", headers=(), host="10.0.0.1", port=8080, scheme="http"):
    return request_rules.new_probe_request(scheme, host, port, path, list(headers), UA)


def wire(path="/healthz", headers=(), **kw):
    w = request_rules.wire_request(request(path, headers, **kw))
    return [w.request_line, *(f"{k}: {v}" for k, v in w.headers)]


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
    assert request_rules.wire_request(req).target == target


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
        "User-Agent: kube-probe/1.37",
        "Accept: */*",
        "Connection: close",
    ]


def test_ipv6_host_header_is_bracketed():
    assert wire(host="fd00:5a::2")[1] == "Host: [fd00:5a::2]:8080"


def test_user_headers_are_sorted_by_canonical_key_and_repeated_ones_kept_in_order():
    assert wire(headers=[("x-zeta", "z"), ("X-Alpha", "a1"), ("accept-language", "de"), ("x-alpha", "a2")]) == [
        "GET /healthz HTTP/1.1",
        "Host: 10.0.0.1:8080",
        "User-Agent: kube-probe/1.37",
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
    headers = dict(request_rules.wire_request(req).headers)
    assert headers["Authorization"] == "Basic dXNlcjpwYTpzcw=="  # user:pa:ss


# --- the lifecycle hook's request head ---------------------------------------------
# Same request (pkg/probe/http NewRequestForHTTPGetAction(..., "lifecycle")), sent by the kubelet's
# insecureContainerLifecycleHTTPClient: a plain http.Transport, so persistConn.roundTrip adds
# `Accept-Encoding: gzip` (DisableCompression false, no Accept-Encoding, no Range) and no
# `Connection: close` (DisableKeepAlives false); Request.write emits those extra headers last.

HOOK_UA = "kube-lifecycle/1.37"


def hook_wire(path="/stop", headers=(), **kw):
    req = request_rules.new_probe_request(kw.pop("scheme", "http"), "10.0.0.1", 8080, path, list(headers), HOOK_UA)
    w = request_rules.wire_request(req, request_rules.LIFECYCLE_TRANSPORT)
    return [w.request_line, *(f"{k}: {v}" for k, v in w.headers)]


def test_hook_head_is_exactly_what_the_kubelet_lifecycle_client_sends():
    assert hook_wire() == [
        "GET /stop HTTP/1.1",
        "Host: 10.0.0.1:8080",
        "User-Agent: kube-lifecycle/1.37",
        "Accept: */*",
        "Accept-Encoding: gzip",
    ]


def test_hook_gzip_comes_after_every_user_header():
    assert hook_wire(headers=[("x-zeta", "z"), ("Authorization", "Bearer t"), ("accept-language", "de")]) == [
        "GET /stop HTTP/1.1",
        "Host: 10.0.0.1:8080",
        "User-Agent: kube-lifecycle/1.37",
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
    assert request_rules.transport_headers(Header(), request_rules.PROBE_TRANSPORT) == [("Connection", "close")]
    assert request_rules.transport_headers(Header(), request_rules.LIFECYCLE_TRANSPORT) == [("Accept-Encoding", "gzip")]
    both = request_rules.Transport(disable_keep_alives=True, disable_compression=False)
    assert request_rules.transport_headers(Header(), both) == [("Accept-Encoding", "gzip"), ("Connection", "close")]


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
    assert request_rules.preflight_error(request(headers=headers)) == error


def test_preflight_scheme_and_host():
    req = request()
    assert request_rules.preflight_error(ProbeRequest(parse("ftp://10.0.0.1/"), "", req.header)) == (
        'unsupported protocol scheme "ftp"'
    )
    assert request_rules.preflight_error(ProbeRequest(parse("http:opaque"), "", req.header)) == "http: no Host in request URL"


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
    assert request_rules.dial_address(parse(url)) == address


def test_retarget_names_the_address_reached():
    req = request(host="198.18.0.2")
    assert request_rules.retarget(req, "fd00:5a::2").url.string() == "http://[fd00:5a::2]:8080/healthz"
    assert request_rules.retarget(req, "198.18.0.2") == req


def test_only_a_compressing_transport_without_the_users_accept_encoding_or_range_adds_gzip():
    assert request_rules.adds_gzip(Header(), request_rules.LIFECYCLE_TRANSPORT)
    assert not request_rules.adds_gzip(Header(), request_rules.PROBE_TRANSPORT)
    assert not request_rules.adds_gzip(Header({"Accept-Encoding": ["gzip"]}), request_rules.LIFECYCLE_TRANSPORT)
    assert not request_rules.adds_gzip(Header({"Range": ["bytes=0-1"]}), request_rules.LIFECYCLE_TRANSPORT)
    assert request_rules.adds_gzip(Header({"Accept-Encoding": [""]}), request_rules.LIFECYCLE_TRANSPORT)
