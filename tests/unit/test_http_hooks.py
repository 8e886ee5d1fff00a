"""What an HTTP lifecycle hook decides beyond a probe's request (probe_worker.probes.http.hooks)."""

import pytest

from probe_worker import go_errors
from probe_worker.attempt import FAILURE, SUCCESS, UNKNOWN
from probe_worker.probes.http import hooks as hook_rules
from probe_worker.probes.http import request as request_rules
from probe_worker.probes.http.headers import Header
from probe_worker.probes.http.request import ProbeRequest
from probe_worker.probes.http.url import parse

HOOK_UA = "kube-lifecycle/1.37"


@pytest.mark.parametrize("status", [200, 204, 301, 302, 400, 404, 500, 503, 101, 99])
def test_any_response_is_a_successful_hook_with_no_output(status):
    # handlers.go runHTTPHandler returns Do's error only; the status and body are never looked at.
    assert hook_rules.hook_response_outcome(status) == (SUCCESS, "")


@pytest.mark.parametrize("length, budget", [(None, 10240), (0, 10240), (10240, 10240), (10241, 0)])
def test_hook_discard_budget(length, budget):
    # discardHTTPRespBody: `if resp.ContentLength <= maxRespBodyLength` (10 KiB; -1 when unknown).
    assert hook_rules.hook_discard_budget(length) == budget


def test_https_hook_answered_in_plain_http_is_sent_again_over_http_without_authorization():
    sent = request_rules.new_probe_request(
        "https", "10.0.0.1", 8443, "/stop?x=1", [("Authorization", "Bearer t"), ("X-Token", "k"), ("Host", "app")],
        HOOK_UA,
    )
    retry = hook_rules.lifecycle_fallback(sent, go_errors.SCHEME_MISMATCH)
    assert retry.url.string() == "http://10.0.0.1:8443/stop?x=1"
    assert retry.host == "app"
    assert not retry.header.has("Authorization") and retry.header.get("X-Token") == "k"
    assert sent.header.get("Authorization") == "Bearer t"  # req.Clone: the first request is untouched
    assert [f"{k}: {v}" for k, v in request_rules.wire_request(retry, request_rules.LIFECYCLE_TRANSPORT).headers] == [
        "Host: app", "User-Agent: kube-lifecycle/1.37", "Accept: */*", "X-Token: k", "Accept-Encoding: gzip",
    ]


def test_url_credentials_still_become_basic_auth_in_the_fallback():
    sent = ProbeRequest(url=parse("https://user:pw@10.0.0.1:8443/"), host="", header=Header({"Authorization": ["x"]}))
    retry = hook_rules.lifecycle_fallback(sent, go_errors.SCHEME_MISMATCH)
    assert dict(request_rules.wire_request(retry, request_rules.LIFECYCLE_TRANSPORT).headers)["Authorization"] == "Basic dXNlcjpwdw=="


@pytest.mark.parametrize(
    "cause",
    [None, "EOF", "tls: first record does not look like a TLS handshake", "stopped after 10 redirects",
     "dial tcp 10.0.0.1:8443: connect: connection refused"],
)
def test_no_fallback_for_other_errors(cause):
    assert hook_rules.lifecycle_fallback(request_rules.new_probe_request("https", "10.0.0.1", 8443, "/", [], HOOK_UA), cause) is None


def test_fallback_looks_at_the_cause_whatever_the_scheme_sent():
    # isHTTPResponseError only reads the url.Error's Err: an https redirect hop answered in plain HTTP
    # makes the kubelet retry its first (http) request as well.
    sent = request_rules.new_probe_request("http", "10.0.0.1", 8080, "/stop", [], HOOK_UA)
    assert hook_rules.lifecycle_fallback(sent, go_errors.SCHEME_MISMATCH).url.string() == "http://10.0.0.1:8080/stop"


def test_only_a_retry_that_got_a_response_replaces_the_first_error():
    assert hook_rules.fallback_wins(SUCCESS)
    assert not hook_rules.fallback_wins(FAILURE) and not hook_rules.fallback_wins(UNKNOWN)
