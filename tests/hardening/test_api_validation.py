"""Bad API input against a real daemon, rule by rule: every bad RunProbe and ExecProbe is INVALID_ARGUMENT naming the
field, the error text stays bounded however many fields are wrong, thresholds of zero mean the Kubernetes defaults,
and the host field is refused (also as probectl shows it).

The daemon is a real `probe-shim serve --runtime-endpoint none` (the `api_daemon` fixture, tests/hardening/
conftest.py); sandboxes are real network namespaces with a listener inside. Helpers: tests/support/api_requests.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

import grpc
import pytest

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from probe_api import request_rules as rules
from probe_api import validation
from tests.support.api_requests import MORE_ERRORS_RE, assert_answer_is, call, headers, http_get, run_request
from tests.support.daemon_env import run, status, tcp_spec
from tests.support.netns_env import REPO_ROOT

pytestmark = pytest.mark.netns


def answer_of_run_probe(req: service_pb.RunProbeRequest, allow_host: bool) -> list[str]:
    """The errors a RunProbe answer shows (bounded texts), from the rules alone."""
    return rules.bounded(validation.texts(rules.run_probe_errors(req, allow_host)))


# --- each rule through the daemon ---------------------------------------------------------------------

V = validation
HEADER_NAME_MSG = ("a valid HTTP header must consist of alphanumeric characters or '-' "
                   "(e.g. 'X-Header-Name', regex used for validation is '[-A-Za-z0-9]+')")
CRLF_VALUE = "Invalid value: must not contain CR, LF or NUL characters"
MAX_MS = V.MAX_DURATION_MS

BAD_RUN_PROBES = {
    # header injection
    "header name with CR LF": (dict(spec=http_get(http_headers=headers(("X-A\r\nX-Evil", "1")))),
                               f'spec.http_get.http_headers: Invalid value: "X-A\\r\\nX-Evil": {HEADER_NAME_MSG}'),
    "header name with NUL": (dict(spec=http_get(http_headers=headers(("X\0", "1")))),
                             f'spec.http_get.http_headers: Invalid value: "X\\x00": {HEADER_NAME_MSG}'),
    "header value with CR LF": (dict(spec=http_get(http_headers=headers(("X-Ok", "1"), ("X-A", "v\r\nHost: evil")))),
                                f"spec.http_get.http_headers[1].value: {CRLF_VALUE}"),
    "header value with LF": (dict(spec=http_get(http_headers=headers(("X-A", "v\nw")))),
                             f"spec.http_get.http_headers[0].value: {CRLF_VALUE}"),
    "header value with NUL": (dict(spec=http_get(http_headers=headers(("X-A", "v\0")))),
                              f"spec.http_get.http_headers[0].value: {CRLF_VALUE}"),
    # paths
    "relative path": (dict(spec=http_get(path="healthz")),
                      "spec.http_get.path: Invalid value: \"healthz\": must be an absolute path: start with '/'"),
    "path with CR LF": (dict(spec=http_get(path="/x HTTP/1.1\r\nHost: evil\r\n\r\n")),
                        'spec.http_get.path: Invalid value: "/x HTTP/1.1\\r\\nHost: evil\\r\\n\\r\\n": '
                        "must not contain control characters"),
    # ports
    "tcp port 0": (dict(spec=tcp_spec(0)),
                   "spec.tcp_socket.port: Invalid value: 0: must be between 1 and 65535, inclusive"),
    "tcp port 65536": (dict(spec=tcp_spec(65536)),
                       "spec.tcp_socket.port: Invalid value: 65536: must be between 1 and 65535, inclusive"),
    "http port -1": (dict(spec=http_get(port=spec_pb.PortRef(number=-1))),
                     "spec.http_get.port: Invalid value: -1: must be between 1 and 65535, inclusive"),
    "grpc port 70000": (dict(spec=spec_pb.ProbeSpec(grpc=spec_pb.GRPCAction(port=70000))),
                        "spec.grpc.port: Invalid value: 70000: must be between 1 and 65535, inclusive"),
    # durations
    "negative period": (dict(spec=tcp_spec(80, period_ms=-1)),
                        "spec.period_ms: Invalid value: -1: must be greater than or equal to 0"),
    "negative timeout": (dict(spec=tcp_spec(80, timeout_ms=-1000)),
                         "spec.timeout_ms: Invalid value: -1000: must be greater than or equal to 0"),
    "negative initial delay": (dict(spec=tcp_spec(80, initial_delay_ms=-5)),
                               "spec.initial_delay_ms: Invalid value: -5: must be greater than or equal to 0"),
    "absurd period": (dict(spec=tcp_spec(80, period_ms=2**62)),
                      f"spec.period_ms: Invalid value: {2**62}: must be no more than {MAX_MS}"),
    "absurd timeout": (dict(spec=tcp_spec(80, timeout_ms=MAX_MS + 1)),
                       f"spec.timeout_ms: Invalid value: {MAX_MS + 1}: must be no more than {MAX_MS}"),
    "absurd initial delay": (dict(spec=tcp_spec(80, initial_delay_ms=2**63 - 1)),
                             f"spec.initial_delay_ms: Invalid value: {2**63 - 1}: must be no more than"),
    "absurd grace period": (dict(type=spec_pb.LIVENESS, spec=tcp_spec(80, termination_grace_period_ms=2**62)),
                            f"spec.termination_grace_period_ms: Invalid value: {2**62}: must be no more than"),
    "period below 10ms": (dict(spec=tcp_spec(80, period_ms=5)),
                          "spec.period_ms: Invalid value: 5: must be at least 10ms"),
    # thresholds (0 is "unset", the Kubernetes default; see the test below)
    "negative success threshold": (dict(spec=tcp_spec(80, success_threshold=-1)),
                                   "spec.success_threshold: Invalid value: -1: must be greater than or equal to 0"),
    "negative failure threshold": (dict(spec=tcp_spec(80, failure_threshold=-3)),
                                   "spec.failure_threshold: Invalid value: -3: must be greater than or equal to 0"),
    "liveness success threshold 2": (dict(type=spec_pb.LIVENESS, spec=tcp_spec(80, success_threshold=2)),
                                     "spec.success_threshold: Invalid value: 2: must be 1"),
    # oversize strings and lists
    "65 headers": (dict(spec=http_get(http_headers=headers(*[("X-H", "v")] * 65))),
                   "spec.http_get.http_headers: Too many: 65: must have at most 64 items"),
    "long header name": (dict(spec=http_get(http_headers=headers(("X" * 257, "v")))),
                         "spec.http_get.http_headers[0].name: Too long: may not be more than 256 bytes"),
    "long header value": (dict(spec=http_get(http_headers=headers(("X-A", "v" * 4097)))),
                          "spec.http_get.http_headers[0].value: Too long: may not be more than 4096 bytes"),
    "headers over 16 KiB": (dict(spec=http_get(http_headers=headers(*[("X-A", "v" * 4000)] * 5))),
                            "spec.http_get.http_headers: Too long: may not be more than 16384 bytes"),
    "long path": (dict(spec=http_get(path="/" + "p" * 2048)),
                  "spec.http_get.path: Too long: may not be more than 2048 bytes"),
    "long host": (dict(spec=http_get(host="h" * 254)), "spec.http_get.host: Too long: may not be more than 253 bytes"),
    "long grpc service": (dict(spec=spec_pb.ProbeSpec(grpc=spec_pb.GRPCAction(port=1, service="s" * 1025))),
                          "spec.grpc.service: Too long: may not be more than 1024 bytes"),
    "long container name": (dict(container_name="c" * 64, spec=tcp_spec(80)),
                            "container_name: Too long: may not be more than 63 bytes"),
    "long container id": (dict(container_id="c" * 257, spec=tcp_spec(80)),
                          "container_id: Too long: may not be more than 256 bytes"),
    "long sandbox id": (dict(pod_sandbox_id="s" * 257, spec=tcp_spec(80)),
                        "pod_sandbox_id: Too long: may not be more than 256 bytes"),
    "65 labels": (dict(labels={f"k{i}": "v" for i in range(65)}, spec=tcp_spec(80)),
                  "labels: Too many: 65: must have at most 64 items"),
    "long label value": (dict(labels={"team": "v" * 64}, spec=tcp_spec(80)),
                         "labels[team]: Too long: may not be more than 63 bytes"),
    "long label key": (dict(labels={"k" * 318: "v"}, spec=tcp_spec(80)),
                       "labels: Invalid value: \"kkkk"),
    "257 container ports": (dict(container_ports=[spec_pb.ContainerPort(name="p", container_port=1)] * 257,
                                 spec=tcp_spec(80)),
                            "container_ports: Too many: 257: must have at most 256 items"),
    "long port name": (dict(spec=spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(
                            port=spec_pb.PortRef(name="p" * 300)))),
                       'spec.tcp_socket.port: Invalid value: "pppp'),
    # handlers and types
    "no handler": (dict(spec=spec_pb.ProbeSpec()), "spec: Required value: must specify a handler type"),
    "exec handler": (dict(spec=spec_pb.ProbeSpec(exec=spec_pb.ExecAction(command=["sh"]))),
                     'spec.exec: Unsupported value: "exec"'),
    "two handlers": (dict(spec=spec_pb.ProbeSpec(tcp_socket=tcp_spec(80).tcp_socket, grpc=spec_pb.GRPCAction(port=1))),
                     "spec.grpc: Forbidden: may not specify more than 1 handler type"),
    "no type": (dict(type=spec_pb.PROBE_TYPE_UNSPECIFIED, spec=tcp_spec(80)), "type: Required value"),
    "unknown type": (dict(type=42, spec=tcp_spec(80)), 'type: Unsupported value: 42: supported values: "LIVENESS"'),
    "unknown target": (dict(spec=tcp_spec(80, target=7)), 'spec.target: Unsupported value: 7'),
    "no sandbox": (dict(pod_sandbox_id="", spec=tcp_spec(80)), "pod_sandbox_id: Required value"),
    "no container": (dict(container_name="", spec=tcp_spec(80)), "container_name: Required value"),
}


@pytest.mark.parametrize("case", BAD_RUN_PROBES, ids=list(BAD_RUN_PROBES))
def test_bad_run_probe_is_invalid_argument_naming_the_field(api_daemon, netns, case):
    fields, expected = BAD_RUN_PROBES[case]
    request = run_request(netns, **fields)
    code, details, _ = call(api_daemon.stub.RunProbe, request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert expected in details
    assert_answer_is(details, answer_of_run_probe(request, allow_host=False))


@pytest.mark.parametrize("case", ["header value with CR LF", "relative path", "tcp port 0", "absurd timeout",
                                  "long header value", "long grpc service", "exec handler"])
def test_exec_probe_applies_the_same_rules(api_daemon, netns, case):
    fields, expected = BAD_RUN_PROBES[case]
    request = service_pb.ExecProbeRequest(pod_sandbox_id=netns.name, spec=fields["spec"])
    code, details, _ = call(api_daemon.stub.ExecProbe, request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and expected in details


def test_error_text_is_bounded_however_many_fields_are_wrong(api_daemon, netns):
    # 64 headers, each with a 256-byte invalid name: the full list would be ~25 KiB of errors, more
    # than a gRPC client accepts as status details (8 KiB of metadata).
    spec = http_get(path="x" * 2000, http_headers=headers(*[("\r" * 256, "\n")] * 64))
    request = run_request(netns, spec, labels={"k" * 300: "v"})
    code, details, _ = call(api_daemon.stub.RunProbe, request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert len(details.encode()) <= rules.MAX_ERRORS_BYTES + 64
    assert MORE_ERRORS_RE.match(details.split("; ")[-1]), details[-200:]
    assert_answer_is(details, answer_of_run_probe(request, allow_host=False))


def test_thresholds_of_zero_mean_the_kubernetes_defaults(api_daemon, netns):
    """proto3 cannot tell 0 from unset: 0 is the API server's default (success 1, failure 3), never "0 in a row"."""
    closed_port = 1  # nothing listens: every attempt fails
    probe_id = rules.probe_id_for(netns.name, "zero-thresholds", spec_pb.LIVENESS)
    stream = api_daemon.stub.WatchProbeStatus(service_pb.WatchProbeStatusRequest(
        filter=service_pb.ProbeFilter(probe_id=probe_id), every_attempt=True), timeout=15)
    attempts = []
    try:
        events = iter(stream)
        assert next(events).type == service_pb.SNAPSHOT_COMPLETE
        spec = tcp_spec(closed_port, period_ms=50, success_threshold=0, failure_threshold=0)
        assert run(api_daemon, netns, spec, probe_type=spec_pb.LIVENESS, container="zero-thresholds") == probe_id
        for event in events:
            if event.type == service_pb.ATTEMPT:
                attempts.append((event.probe.status.consecutive_failures, event.probe.status.on_hold))
                if event.probe.status.on_hold:  # liveness tripped: no more attempts until re-registered
                    break
    finally:
        stream.cancel()
        api_daemon.stub.StopProbe(service_pb.StopProbeRequest(probe_id=probe_id), timeout=10)
    # The third failure in a row trips it (and resets the run, as the kubelet does), not the first.
    assert attempts == [(1, False), (2, False), (0, True)]


# --- the host field ----------------------------------------------------------------------------------

def probectl(endpoint: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    env.pop("PROBE_SHIM_ENDPOINT", None)
    return subprocess.run([sys.executable, "-m", "probectl.cli", "-r", endpoint, *args],
                          capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=60)


@pytest.mark.parametrize("handler, path", [
    (["--tcp", "169.254.169.254:80"], "spec.tcp_socket.host"),
    (["--http-get", "http://10.0.0.1:8080/healthz"], "spec.http_get.host"),
])
def test_host_field_is_refused_and_probectl_says_why(api_daemon, netns, handler, path):
    endpoint = f"unix://{api_daemon.socket_path}"
    for command in (["run", "--pod", netns.name, "--container", "app", "--type", "readiness"],
                    ["exec", "--pod", netns.name]):
        done = probectl(endpoint, *command, *handler)
        assert done.returncode == 1, done
        assert done.stdout == ""
        lines = done.stderr.splitlines()
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith(f"probectl: INVALID_ARGUMENT: {path}: Forbidden: ")
        assert "blind SSRF" in lines[0] and "allow_host_field = true" in lines[0]
    assert [p for p in status(api_daemon, pod_sandbox_id=netns.name).probes if p.container_name == "app"] == []
