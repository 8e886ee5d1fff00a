"""The engine against kubelet 1.37's own prober, side by side on the same real targets.

The reference is tests/reference/kubelet_prober: pkg/kubelet/prober's runProbeWithRetries and runProbe with the
probers the kubelet makes (pkg/probe/http New(false), tcp, grpc), built from k8s.io/kubernetes v1.37.2 with its
version stamped (User-Agent kube-probe/1.37) by hack/build-kubelet-prober.sh. Both run inside one pod netns, against
the same servers there (tests/support/servers/), and each case's (result, output) must be equal, byte for byte
(outputs that name an address name the same one), but for what Go itself leaves to chance: the order of HTTP/2
header fields, a local port, the wording of an HTTP/2 timeout (tests/support/kubelet_prober_reference.py). The
engine is a real worker with its default kubelet version, running every case at once; the Go program runs them 8 at
a time.

Without Go (and without KUBELET_PROBER_BIN) the tests skip and say why; a first run builds the program (about 10 s
after the kubelet's build, 45 s with empty Go caches).
"""

from __future__ import annotations

import dataclasses
import sys

import pytest

from cri_proto import probe_worker_pb2 as worker_pb
from probe_api.defaults import KUBELET_VERSION
from tests.support.certificates import write_certificate
from tests.support.kubelet_prober_reference import (
    Case, ReferenceUnavailable, comparable, engine_answer, kubelet_answers, reference_binary,
)
from tests.support.netns_env import POD_IPV4, PodNetns, netns_unavailable_reason
from tests.support.worker_harness import WorkerHarness

# The first test builds the program when its sources changed (a few minutes on a cold machine at worst).
pytestmark = [pytest.mark.netns, pytest.mark.timeout(900)]

T = 1  # timeoutSeconds of every case: the kubelet's unit is the second


def http(path: str, port: str, **action) -> dict:
    return {"httpGet": {"path": path, "port": port, **action}, "timeoutSeconds": T}


def https(path: str, port: str, **action) -> dict:
    return http(path, port, scheme="HTTPS", **action)


def h2c(path: str, port: str, **action) -> dict:
    return http(path, port, protocol="HTTP2", **action)


def headers(*pairs: tuple[str, str]) -> list[dict]:
    return [{"name": n, "value": v} for n, v in pairs]


def grpc(port: str, service: str | None = None, mode: str | None = None) -> dict:
    action: dict = {"port": port}
    if service is not None:
        action["service"] = service
    if mode is not None:
        action["mode"] = mode
    return {"grpc": action, "timeoutSeconds": T}


def tcp(port: str) -> dict:
    return {"tcpSocket": {"port": port}, "timeoutSeconds": T}


# Ports are written as "{server}" and filled in once the servers listen (see Pod.resolve); "{closed}" is a port
# nothing listens on in the pod netns. Locations that name a host use "{ip}", the pod IPv4.
CASES = [
    # HTTP/1.1: statuses and bodies
    Case("http 200", http("/ok", "{http}")),
    Case("http 200 body", http("/ok?body=hello%20world", "{http}")),
    Case("http 204", http("/status/204", "{http}")),
    Case("http 301 no location", http("/redirect?code=301", "{http}")),
    Case("http 304", http("/status/304", "{http}")),
    Case("http 404", http("/status/404", "{http}")),
    Case("http 500", http("/status/500", "{http}")),
    Case("http 503", http("/status/503", "{http}")),
    Case("http body over 10 KiB", http("/body?size=20000", "{http}")),
    Case("http body of 10 KiB exactly", http("/body?size=10240", "{http}")),
    Case("http chunked body over 10 KiB", http("/body?size=15000&chunked=1", "{http}")),
    Case("http request head", http("/echo", "{http}")),
    Case("http request head with a query", http("/echo?a=1&b=%20x&c", "{http}")),
    Case("http request head with escapes", http("/echo/a%2Fb/%7Euser?q=a+b#frag", "{http}")),
    Case("http named port", {**http("/ok", "web")}, ports=({"name": "web", "containerPort": "{http}"},)),
    Case("http named port missing", {**http("/ok", "nope")}, ports=({"name": "web", "containerPort": "{http}"},)),
    Case("http over ipv6", http("/echo", "{http}"), ipv6=True),
    # redirects
    Case("http redirect same host", http("/redirect?to=/ok", "{http}")),
    Case("http redirect same host 307", http("/redirect?code=307&to=/echo", "{http}")),
    Case("http redirect same host other port", http("/redirect?to=http://{ip}:{h2c_http1}/echo", "{http}")),
    Case("http redirect other host", http("/redirect?to=http://198.18.0.1:{http}/ok", "{http}")),
    Case("http redirect to localhost", http("/redirect?to=http://localhost:{http}/ok", "{http}")),
    Case("http redirect to a 404", http("/redirect?to=/status/404", "{http}")),
    Case("http redirect loop", http("/loop", "{http}")),
    Case("http redirect with host header", http("/redirect?to=/echo", "{http}",
                                                httpHeaders=headers(("Host", "app.example")))),
    Case("http redirect to https same host", http("/redirect?to=https://{ip}:{https}/echo", "{http}")),
    Case("http redirect bad location", http("/redirect?to=http://%zz/", "{http}")),
    # headers
    Case("http host override", http("/echo", "{http}", httpHeaders=headers(("Host", "app.example:8080")))),
    Case("http user-agent empty", http("/echo", "{http}", httpHeaders=headers(("User-Agent", "")))),
    Case("http user-agent overridden", http("/echo", "{http}", httpHeaders=headers(("User-Agent", "probe/9")))),
    Case("http accept overridden", http("/echo", "{http}", httpHeaders=headers(("Accept", "application/json")))),
    Case("http accept empty", http("/echo", "{http}", httpHeaders=headers(("Accept", "")))),
    Case("http custom headers", http("/echo", "{http}", httpHeaders=headers(
        ("x-b", "2"), ("X-A", "1"), ("x-a", "again"), ("Authorization", "Bearer t"), ("Connection", "keep-alive")))),
    # failures of the exchange
    Case("http never answers", http("/hang", "{http}")),
    Case("http body never ends", http("/slow-body", "{http}")),
    Case("http body cut short", http("/cut-body", "{http}")),
    Case("http closed without a response", http("/close", "{http}")),
    Case("http reset", http("/reset", "{http}")),
    Case("http garbage", http("/garbage", "{http}")),
    Case("http bad status line", http("/status-line?line=HTTP/1.1%20abc%20Nope", "{http}")),
    Case("http 1xx then 200", http("/info?n=2", "{http}")),
    Case("http connection refused", http("/ok", "{closed}")),
    Case("http connection refused over ipv6", http("/ok", "{closed}"), ipv6=True),
    Case("http to an https server", http("/ok", "{https}")),
    # HTTPS, self-signed
    Case("https http/1.1 200", https("/ok", "{https}")),
    Case("https http/1.1 request head", https("/echo", "{https}")),
    Case("https http/1.1 500", https("/status/500", "{https}")),
    Case("https h2 negotiated", https("/echo", "{dual}")),
    Case("https h2 with headers", https("/echo", "{dual}", httpHeaders=headers(
        ("Host", "app.example"), ("Accept", ""), ("X-Trace", "a"), ("User-Agent", "custom/1")))),
    Case("https h2 only", https("/ok", "{h2}")),
    Case("https h2 404", https("/status/404", "{h2}")),
    Case("https h2 302", https("/redirect?to=https://198.18.0.1/", "{h2}")),
    Case("https h2 redirect same host", https("/redirect?to=/echo", "{h2}")),
    Case("https h2 big body", https("/big-body", "{h2}")),
    Case("https h2 never answers", https("/hang", "{h2}"), timeout_race=True),
    Case("https h2 reset", https("/reset?code=2", "{h2}")),
    Case("https h2 goaway", https("/goaway?code=2", "{h2}")),
    Case("https h2 no status", https("/no-status", "{h2}")),
    Case("https h2 body cut short", https("/cut-body", "{h2}")),
    Case("https h2 connection header", https("/ok", "{h2}", httpHeaders=headers(("Connection", "upgrade")))),
    Case("https to a plain server", https("/ok", "{http}")),
    # h2c (httpGet.protocol HTTP2)
    Case("h2c 200", h2c("/ok", "{h2c}")),
    Case("h2c request", h2c("/echo", "{h2c}")),
    Case("h2c with headers", h2c("/echo", "{h2c}", httpHeaders=headers(("Host", "app.example"), ("X-A", "1")))),
    Case("h2c 500", h2c("/status/500", "{h2c}")),
    Case("h2c big body", h2c("/big-body", "{h2c}")),
    Case("h2c redirect same host", h2c("/redirect?to=/echo", "{h2c}")),
    Case("h2c redirect to http/1.1 same host", h2c("/redirect?to=http://{ip}:{http}/echo", "{h2c}")),
    Case("h2c redirect to https same host", h2c("/redirect?to=https://{ip}:{dual}/echo", "{h2c}")),
    Case("h2c redirect to https h2 only", h2c("/redirect?to=https://{ip}:{h2}/ok", "{h2c}")),
    # ...which verifies the server (1.37's h2c transport has Go's default tls.Config): certificates for the pod IP,
    # for other IPs, and a pod IP as the common name alone
    Case("h2c redirect to https for the pod ip", h2c("/redirect?to=https://{ip}:{https_pod_ip}/echo", "{h2c}")),
    Case("h2c redirect to https for other ips", h2c("/redirect?to=https://{ip}:{https_other_ips}/ok", "{h2c}")),
    Case("h2c redirect to https with a cn only", h2c("/redirect?to=https://{ip}:{https_cn_only}/ok", "{h2c}")),
    Case("h2c never answers", h2c("/hang", "{h2c}")),
    Case("h2c against an http/1.1 server", h2c("/ok", "{http}")),
    Case("h2c against a TLS server", h2c("/ok", "{dual}")),
    Case("h2c connection refused", h2c("/ok", "{closed}")),
    # gRPC
    Case("grpc serving", grpc("{grpc}")),
    Case("grpc not serving", grpc("{grpc}", service="db")),
    Case("grpc unknown service", grpc("{grpc}", service="nope")),
    Case("grpc no health service", grpc("{grpc_bare}")),
    Case("grpc health rpc timeout", grpc("{grpc_slow}")),
    Case("grpc connection refused", grpc("{closed}")),
    Case("grpc silent server", grpc("{silent}")),
    Case("grpc against http/1.1", grpc("{http}")),
    Case("grpc tls serving", grpc("{grpc_tls}", mode="TLS")),
    Case("grpc tls not serving", grpc("{grpc_tls}", service="db", mode="TLS")),
    Case("grpc plaintext against tls", grpc("{grpc_tls}")),
    Case("grpc tls against plaintext", grpc("{grpc}", mode="TLS")),
    Case("grpc plaintext mode named", grpc("{grpc}", mode="Plaintext")),
    # TCP
    Case("tcp open", tcp("{http}")),
    Case("tcp refused", tcp("{closed}")),
    Case("tcp refused over ipv6", tcp("{closed}"), ipv6=True),
    Case("tcp timeout", tcp("{backlog}")),
    Case("tcp named port", tcp("web"), ports=({"name": "web", "containerPort": "{grpc}"},)),
]


class Pod:
    """A pod netns with every target server inside, and a worker serving it."""

    def __init__(self, certs: dict[str, tuple[str, str]]) -> None:
        self.netns = PodNetns.create()
        try:
            self.ports = {
                "http": self.spawn("http_server.py"),
                "h2c_http1": self.spawn("http_server.py"),
                "https": self.spawn("http_server.py", "--tls"),
                "https_pod_ip": self.spawn("http_server.py", "--tls-files", *certs["pod_ip"]),
                "https_other_ips": self.spawn("http_server.py", "--tls-files", *certs["other_ips"]),
                "https_cn_only": self.spawn("http_server.py", "--tls-files", *certs["cn_only"]),
                "dual": self.spawn("h2_server.py", "--mode", "dual"),
                "h2": self.spawn("h2_server.py", "--mode", "h2"),
                "h2c": self.spawn("h2_server.py", "--mode", "h2c"),
                "grpc": self.spawn("grpc_health_server.py", "--status", "db=NOT_SERVING"),
                "grpc_bare": self.spawn("grpc_health_server.py", "--no-health"),
                "grpc_slow": self.spawn("grpc_health_server.py", "--slow-ms", "3000"),
                "grpc_tls": self.spawn("grpc_health_server.py", "--status", "db=NOT_SERVING", "--tls", *certs["grpc"]),
                "silent": self.spawn("tcp_server.py", "--mode", "silent"),
                "backlog": self.spawn("tcp_server.py", "--mode", "full-backlog", "--host", self.netns.ipv4),
                "closed": 1,
            }
            self.worker = WorkerHarness(worker_pb.WorkerConfig(), self.netns.path, self.netns.pod_ips)
        except BaseException:
            self.netns.destroy()
            raise

    def spawn(self, script: str, *args: str) -> int:
        return self.netns.spawn([sys.executable, f"tests/support/servers/{script}", *args]).port

    def resolve(self, case: Case) -> Case:
        """The case with its "{server}" ports and "{ip}" filled in (a port alone becomes a number, as in a Pod)."""
        names = {**self.ports, "ip": self.netns.ipv4}

        def fill(value):
            if isinstance(value, dict):
                return {k: fill(v) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return type(value)(fill(v) for v in value)
            if isinstance(value, str) and "{" in value:
                text = value.format(**names)
                return int(text) if value.startswith("{") and value.endswith("}") else text
            return value

        return dataclasses.replace(case, probe=fill(case.probe), ports=fill(case.ports))

    def close(self) -> None:
        self.worker.close()
        self.netns.destroy()


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """Every case run by the kubelet's prober, then by the engine: {name: (kubelet, engine)}."""
    reason = netns_unavailable_reason()
    if reason:
        pytest.skip(reason)
    try:
        binary = reference_binary()
    except ReferenceUnavailable as exc:
        pytest.skip(str(exc))
    certs_dir = tmp_path_factory.mktemp("certs")
    certs = {"grpc": write_certificate(certs_dir, "grpc"),
             "pod_ip": write_certificate(certs_dir, "pod-ip", ip_sans=(POD_IPV4,)),
             "other_ips": write_certificate(certs_dir, "other-ips", ip_sans=("10.0.0.1", "fd00::1")),
             "cn_only": write_certificate(certs_dir, "cn-only", common_name=POD_IPV4)}
    pod = Pod(certs)
    try:
        cases = [pod.resolve(case) for case in CASES]
        version, kubelet = kubelet_answers(binary, pod.netns.name, cases, pod.netns.ipv4, pod.netns.ipv6)
        # The reference is the kubelet whose behaviour the engine claims by default (its User-Agent's version).
        assert version.startswith(f"v{KUBELET_VERSION}."), version
        attempts = pod.worker.run_many([(case.engine_spec(), case.container_ports()) for case in cases])
        yield {case.name: (comparable(case, kubelet[case.name]), comparable(case, engine_answer(a)))
               for case, a in zip(cases, attempts)}
    finally:
        pod.close()


@pytest.mark.parametrize("name", [case.name for case in CASES])
def test_the_engine_answers_as_the_kubelet_1_37(compared, name):
    kubelet, engine = compared[name]
    assert engine == kubelet
