"""HTTP probes over HTTP/2, through a real worker, against real HTTP/2 servers inside a pod netns.

The kubelet's probe transport offers ALPN h2 and http/1.1 (utilnet.SetTransportDefaults configures HTTP/2) and
speaks HTTP/2 when a TLS server picks it; `httpGet.protocol: HTTP2` (1.37, KEP-5999) speaks it in cleartext with
prior knowledge. Expected outputs are Go's: golang.org/x/net/http2 (transport.go, frame.go, errors.go,
internal/httpcommon) as net/http bundles it, wrapped by http.Client in a url.Error (`Get "URL": ...`), and
pkg/probe/http's outcome (DoHTTPProbe: a Do error is a failure with its text; a body read error is the bare
error, which the worker reports as UNKNOWN and tries again, as the kubelet's prober does).

Servers: tests/support/servers/h2_server.py (h2's server side) in three modes: h2 (TLS, ALPN h2 only), dual (ALPN h2 and
http/1.1, recording which one it spoke), h2c (cleartext, prior knowledge only); tests/support/servers/http_server.py is
the HTTP/1.1-only server.
"""

from __future__ import annotations

import json
import sys

import pytest

from cri_proto import probe_spec_pb2 as spec_pb
from cri_proto import probe_worker_pb2 as worker_pb
from probe_api.defaults import KUBELET_VERSION
from tests.support.netns_env import PodNetns, netns_unavailable_reason
from tests.support.servers.http_server import server_tls_context
from tests.support.worker_harness import WorkerHarness

UA = f"kube-probe/{KUBELET_VERSION}"  # the worker harness's kubelet version
FAILURE, SUCCESS, UNKNOWN = spec_pb.RESULT_FAILURE, spec_pb.RESULT_SUCCESS, spec_pb.RESULT_UNKNOWN

pytestmark = pytest.mark.netns


class Pod:
    def __init__(self) -> None:
        self.netns = PodNetns.create()
        self.worker = WorkerHarness(worker_pb.WorkerConfig(), self.netns.path, self.netns.pod_ips, "test-sandbox")
        self.ports = {mode: self._spawn("h2_server.py", "--mode", mode) for mode in ("h2", "dual", "h2c")}
        self.ports["http1"] = self._spawn("http_server.py")

    def _spawn(self, script: str, *args: str) -> int:
        return self.netns.spawn([sys.executable, f"tests/support/servers/{script}", *args]).port

    def close(self) -> None:
        self.worker.close()
        self.netns.destroy()

    def probe(self, server: str, path: str, headers=(), timeout_ms: int = 2000, **action) -> spec_pb.Attempt:
        if server == "h2c":
            action.setdefault("protocol", spec_pb.HTTP2)
        elif server != "http1":
            action.setdefault("scheme", spec_pb.HTTPS)
        spec = spec_pb.ProbeSpec(
            http_get=spec_pb.HTTPGetAction(path=path, port=spec_pb.PortRef(number=self.ports[server]),
                                           http_headers=[spec_pb.HTTPHeader(name=n, value=v) for n, v in headers],
                                           **action),
            timeout_ms=timeout_ms)
        return self.worker.run_once(spec)

    def url(self, server: str, path: str) -> str:
        scheme = "http" if server in ("h2c", "http1") else "https"
        return f"{scheme}://{self.netns.ipv4}:{self.ports[server]}{path}"


@pytest.fixture(scope="module")
def pod():
    reason = netns_unavailable_reason()
    if reason:
        pytest.skip(reason)
    if server_tls_context() is None:
        pytest.skip("neither the cryptography package nor the openssl CLI can make a test certificate")
    pod = Pod()
    try:
        yield pod
    finally:
        pod.close()


def echoed(attempt: spec_pb.Attempt) -> tuple[str, list[list[str]]]:
    assert attempt.result == SUCCESS, attempt.output
    body = json.loads(attempt.output)
    return body["protocol"], body["headers"]


def request_phase(attempt: spec_pb.Attempt) -> str:
    return next(p.detail for p in attempt.phases if p.name == "request")


# --- negotiation and the request ----------------------------------------------------------------------------


def test_an_h2_only_tls_server_is_probed_over_http2(pod):
    # Before: the engine offered http/1.1 only and this server refused the handshake; the kubelet succeeds.
    attempt = pod.probe("h2", "/ok")
    assert (attempt.result, attempt.output, attempt.http_status_code) == (SUCCESS, "ok", 200)
    assert request_phase(attempt) == "GET /ok HTTP/2.0"


def test_a_dual_protocol_server_picks_h2_and_sees_the_kubelet_request(pod):
    # encodeRequestHeaders: :authority (the URL's host:port), :method, :path, :scheme, then the request's headers
    # under lower-case names (Accept and User-Agent, as newProbeRequest sets them); no accept-encoding
    # (DisableCompression), no connection header (HTTP/2 has none), nothing else.
    protocol, fields = echoed(pod.probe("dual", "/echo?x=1"))
    assert protocol == "h2"
    assert fields == [[":authority", f"{pod.netns.ipv4}:{pod.ports['dual']}"], [":method", "GET"],
                      [":path", "/echo?x=1"], [":scheme", "https"], ["accept", "*/*"], ["user-agent", UA]]


def test_user_headers_over_http2(pod):
    # Host becomes :authority; Accept "" removes Accept (kubelet); a cookie goes as one field per pair; Connection
    # "close" is allowed and not sent (checkConnHeaders, and the connection-specific headers are skipped).
    headers = [("Host", "app.example"), ("Accept", ""), ("X-Trace", "a"), ("Cookie", "a=1; b=2"),
               ("User-Agent", "custom/1"), ("Connection", "close")]
    _, fields = echoed(pod.probe("dual", "/echo", headers=headers))
    assert fields == [[":authority", "app.example"], [":method", "GET"], [":path", "/echo"], [":scheme", "https"],
                      ["cookie", "a=1"], ["cookie", "b=2"], ["user-agent", "custom/1"], ["x-trace", "a"]]


def test_a_connection_header_http2_cannot_carry_fails_the_request(pod):
    # checkConnHeaders: HTTP/1.1 would send `Connection: upgrade`; HTTP/2 refuses the request before sending it.
    attempt = pod.probe("dual", "/echo", headers=[("Connection", "upgrade")])
    assert (attempt.result, attempt.output) == (
        FAILURE, f'Get "{pod.url("dual", "/echo")}": http2: invalid Connection request header: ["upgrade"]')


def test_h2c_with_prior_knowledge(pod):
    protocol, fields = echoed(pod.probe("h2c", "/echo"))
    assert protocol == "h2"
    assert fields == [[":authority", f"{pod.netns.ipv4}:{pod.ports['h2c']}"], [":method", "GET"],
                      [":path", "/echo"], [":scheme", "http"], ["accept", "*/*"], ["user-agent", UA]]
    assert [p.name for p in pod.probe("h2c", "/ok").phases] == ["connect", "request", "processing", "transfer"]


def test_h2c_against_an_http1_server_reads_its_answer_as_a_frame(pod):
    # The HTTP/1.1 server answers the preface with a status line; Framer.ReadFrame reads "HTTP/1.1 " as a frame
    # header far over the 16 KiB limit, and says what it looked like.
    attempt = pod.probe("http1", "/ok", protocol=spec_pb.HTTP2)
    assert (attempt.result, attempt.output) == (
        FAILURE, f'Get "{pod.url("http1", "/ok")}": http2: failed reading the frame payload: http2: frame too '
                 "large, note that the frame header looked like an HTTP/1.1 header")


# --- responses ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("server", ["h2", "h2c"])
def test_statuses_redirects_and_informational_responses(pod, server):
    failed = pod.probe(server, "/status/500")
    assert (failed.result, failed.output) == (FAILURE, "HTTP probe failed with statuscode: 500")
    assert (pod.probe(server, "/redirect?to=/ok").output, pod.probe(server, "/info").output) == ("ok", "ok")
    big = pod.probe(server, "/big-body")
    assert big.result == SUCCESS and big.output == "x" * 10240  # maxRespBodyLength, as over HTTP/1.1


def test_a_refused_stream_is_sent_again_on_a_new_connection(pod):
    # canRetryError(REFUSED_STREAM): net/http dials a new connection for the request.
    attempt = pod.probe("h2", "/refuse?n=1")
    assert (attempt.result, attempt.output) == (SUCCESS, "ok")
    assert [p.name for p in attempt.phases].count("connect") == 2


@pytest.mark.parametrize("path, error", [
    ("/reset?code=2", "stream error: stream ID 1; INTERNAL_ERROR; received from peer"),
    ("/reset?code=99", "stream error: stream ID 1; unknown error code 0x63; received from peer"),
    ("/goaway?last=0&code=1", "http2: Transport received GOAWAY from server ErrCode:PROTOCOL_ERROR"),
    ("/goaway-late", 'http2: server sent GOAWAY and closed the connection; LastStreamID=1, ErrCode=NO_ERROR, '
                     'debug=""'),
    ("/no-status", "stream error: stream ID 1; PROTOCOL_ERROR; malformed response from server: missing status "
                   "pseudo header"),
    ("/bad-status", "stream error: stream ID 1; PROTOCOL_ERROR; malformed response from server: malformed "
                    "non-numeric status pseudo header"),
    ("/upper", 'stream error: stream ID 1; PROTOCOL_ERROR; invalid header field name "X-Upper"'),
])
def test_http2_errors_read_like_go(pod, path, error):
    attempt = pod.probe("h2", path)
    assert (attempt.result, attempt.output) == (FAILURE, f'Get "{pod.url("h2", path)}": {error}')


@pytest.mark.parametrize("path, error", [
    ("/cut-body", "unexpected EOF"),
    ("/reset-body", "stream error: stream ID 1; INTERNAL_ERROR; received from peer"),
    ("/long-body", "net/http: server replied with more than declared Content-Length; truncated"),
])
def test_body_errors_are_the_bare_go_error(pod, path, error):
    attempt = pod.probe("h2", path)
    assert (attempt.result, attempt.output) == (UNKNOWN, error)


def test_a_body_past_the_timeout_is_the_client_timeout_text(pod):
    # The head came; the body never ends: Client.Timeout cancels the body read (cancelTimerBody's wording).
    attempt = pod.probe("h2", "/trickle", timeout_ms=300)
    assert (attempt.result, attempt.output) == (
        UNKNOWN, "context deadline exceeded (Client.Timeout or context cancellation while reading body)")


def test_a_server_that_never_answers_or_always_refuses_ends_at_the_timeout(pod):
    timeout = "context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
    for path in ("/hang", "/goaway?last=0&code=0"):  # a graceful GOAWAY is retried on new connections
        attempt = pod.probe("h2", path, timeout_ms=300)
        assert (attempt.result, attempt.output) == (FAILURE, f'Get "{pod.url("h2", path)}": {timeout}')
