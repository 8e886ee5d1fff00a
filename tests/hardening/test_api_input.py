"""Bad API input against a real daemon: every request is answered OK or INVALID_ARGUMENT naming a field,
nothing crashes or leaks, the host field is gated (also as probectl shows it), and the probe limits hold.

The daemon is a real `probe-shim serve --runtime-endpoint none`; sandboxes are real network namespaces
with a listener inside, so requests that pass validation really register probes and run attempts.
The expected answer for each request is computed by the pure validators (shim.api.request_rules), so the
property tests check that the daemon says exactly what validation says, and never anything else.
"""

from __future__ import annotations

import os
import re
import string
import subprocess
import sys
import threading

import grpc
import psutil
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import FieldDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from probe_api import validation
from shim.api import request_rules as rules
from tests.support.daemon_env import DaemonProcess, run, status, tcp_spec
from tests.support.netns_env import REPO_ROOT, PodNetns, listen

pytestmark = pytest.mark.netns

ANCHOR = "anchor"  # a container name no generated request uses: its probe keeps the worker up
# The first words of every INVALID_ARGUMENT error: a field path of the request.
FIELD_PATH_RE = re.compile(
    r"^(type|pod_sandbox_id|container_id|container_name|labels|container_ports|spec)"
    r"(\[.*?\]|\.[a-z_]+)*: ")
MORE_ERRORS_RE = re.compile(r"^and \d+ more errors$")
RPC_TIMEOUT_S = 30
SETTINGS = dict(derandomize=True, deadline=None, database=None, print_blob=True,
                suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def netns():
    ns = PodNetns.create()
    try:
        yield ns
    finally:
        ns.destroy()


@pytest.fixture(scope="module")
def target_port(netns):
    """A listener in the pod that accepts and closes: TCP probes succeed, HTTP and gRPC ones fail fast."""
    return listen(netns).port


@pytest.fixture(scope="module")
def api_daemon(tmp_path_factory):
    d = DaemonProcess(tmp_path_factory.mktemp("api-daemon")).start()
    yield d
    d.stop()


def run_request(ns, spec, **kw) -> service_pb.RunProbeRequest:
    kw.setdefault("pod_sandbox_id", ns.name)
    kw.setdefault("container_name", "app")
    kw.setdefault("type", spec_pb.READINESS)
    return service_pb.RunProbeRequest(spec=spec, **kw)


def http_get(**kw) -> spec_pb.ProbeSpec:
    kw.setdefault("port", spec_pb.PortRef(number=8080))
    return spec_pb.ProbeSpec(http_get=spec_pb.HTTPGetAction(**kw))


def headers(*pairs) -> list[spec_pb.HTTPHeader]:
    return [spec_pb.HTTPHeader(name=n, value=v) for n, v in pairs]


def call(method, request) -> tuple[grpc.StatusCode, str, object]:
    try:
        return grpc.StatusCode.OK, "", method(request, timeout=RPC_TIMEOUT_S)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or "", None


def assert_answer_is(details: str, errors: list[str]) -> None:
    """The daemon said exactly what validation says, and every error begins with a field path."""
    assert details == "; ".join(errors), (details[:300], errors[:3])
    assert errors and all(FIELD_PATH_RE.match(e) for e in errors[:-1]), errors
    assert FIELD_PATH_RE.match(errors[-1]) or MORE_ERRORS_RE.match(errors[-1]), errors[-1]


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
    assert_answer_is(details, rules.validate_run_probe(request, allow_host=False))


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
    assert_answer_is(details, rules.validate_run_probe(request, allow_host=False))


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


# --- limits ------------------------------------------------------------------------------------------

def limited_daemon(tmp_path, per_sandbox: int, total: int) -> DaemonProcess:
    config = tmp_path / "shim.toml"
    config.write_text(f"max_probes_per_sandbox = {per_sandbox}\nmax_probes_total = {total}\n")
    return DaemonProcess(tmp_path, ["--config", str(config)]).start()


def test_limits_per_sandbox_and_in_total_are_resource_exhausted(tmp_path, pod_netns):
    other = PodNetns.create(with_addresses=False)
    d = limited_daemon(tmp_path, per_sandbox=3, total=5)
    try:
        def register(ns, container, **kw):
            return call(d.stub.RunProbe, run_request(ns, tcp_spec(1, period_ms=60_000, **kw), container_name=container))

        for name in ("a", "b", "c"):
            assert register(pod_netns, name)[0] == grpc.StatusCode.OK
        code, details, _ = register(pod_netns, "d")
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert details == f"sandbox {pod_netns.name} already has 3 probes (max_probes_per_sandbox)"
        # Replacing a registered probe (same sandbox, container, type) is not a new probe.
        assert register(pod_netns, "a", timeout_ms=700)[0] == grpc.StatusCode.OK
        a = [p for p in status(d, pod_sandbox_id=pod_netns.name).probes if p.container_name == "a"]
        assert len(a) == 1 and a[0].spec.timeout_ms == 700

        assert [register(other, name)[0] for name in ("x", "y")] == [grpc.StatusCode.OK] * 2
        code, details, _ = register(other, "z")
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert details == "the daemon already runs 5 probes (max_probes_total)"
        assert register(other, "x", timeout_ms=800)[0] == grpc.StatusCode.OK  # replacing, when full
        assert len(status(d).probes) == 5
        # A one-shot ExecProbe registers nothing and is not limited.
        code, _, answer = call(d.stub.ExecProbe, service_pb.ExecProbeRequest(pod_sandbox_id=pod_netns.name,
                                                                              spec=tcp_spec(1)))
        assert code == grpc.StatusCode.OK and answer.attempt.result == spec_pb.RESULT_FAILURE

        # Room again after a StopProbe; and concurrent registrations cannot overshoot the total.
        d.stub.StopProbe(service_pb.StopProbeRequest(pod_sandbox_id=pod_netns.name), timeout=10)
        codes = []
        threads = [threading.Thread(target=lambda n=n: codes.append(register(pod_netns, f"r{n}")[0]))
                   for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(RPC_TIMEOUT_S)
        assert sorted(codes, key=str) == sorted([grpc.StatusCode.OK] * 3 + [grpc.StatusCode.RESOURCE_EXHAUSTED] * 5,
                                                key=str)
        assert len(status(d).probes) == 5
    finally:
        d.stop()
        other.destroy()


# --- property tests: anything goes in, OK or INVALID_ARGUMENT comes out ----------------------------------

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
# Characters that matter to validation and to the wire: separators, controls, non-ASCII.
TRICKY = st.text(alphabet=st.sampled_from(list("aZ09-_./:?#% \t\r\n\0\x7f\u00e9\u65e5\U0001f600")), max_size=24)
LONG = st.builds(lambda c, n: c * n, st.sampled_from(["a", "\n", "\u00e9"]), st.integers(0, 5000))
TEXT = st.one_of(st.text(max_size=24), TRICKY, LONG)
_INT_BOUNDS = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1), FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1), FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
}


def _scalars(field: FieldDescriptor) -> st.SearchStrategy:
    if field.type in _INT_BOUNDS:
        return st.integers(*_INT_BOUNDS[field.type])
    if field.type == FieldDescriptor.TYPE_ENUM:
        return st.one_of(st.sampled_from([v.number for v in field.enum_type.values]), INT32)
    if field.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if field.type == FieldDescriptor.TYPE_STRING:
        return TEXT
    raise AssertionError(f"no strategy for {field.full_name} (type {field.type})")


def arbitrary(descriptor, depth: int = 0) -> st.SearchStrategy:
    """Any message of this type: every field possibly set, to any value its type can hold."""
    cls = message_factory.GetMessageClass(descriptor)
    fields = {}
    for field in descriptor.fields:
        if field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry:
            key, value = (field.message_type.fields_by_name[n] for n in ("key", "value"))
            fields[field.name] = st.dictionaries(_scalars(key), _scalars(value), max_size=4)
            continue
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if depth >= 3:
                continue
            one = arbitrary(field.message_type, depth + 1)
        else:
            one = _scalars(field)
        fields[field.name] = st.lists(one, max_size=3) if field.is_repeated else one
    return st.fixed_dictionaries({}, optional=fields).map(lambda kw: cls(**kw))


def valid_specs(probe_type: int, port: int) -> st.SearchStrategy[spec_pb.ProbeSpec]:
    ports = st.sampled_from([spec_pb.PortRef(number=port), spec_pb.PortRef(number=1), spec_pb.PortRef(name="web")])
    header = st.builds(spec_pb.HTTPHeader, name=st.from_regex(r"[A-Za-z][-A-Za-z0-9]{0,15}", fullmatch=True),
                       value=st.text(alphabet=string.printable.replace("\r", "").replace("\n", ""), max_size=20))
    handlers = st.one_of(
        st.builds(lambda p: spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=p)), ports),
        st.builds(lambda p, path, scheme, hs: spec_pb.ProbeSpec(http_get=spec_pb.HTTPGetAction(
                      port=p, path=path, scheme=scheme, http_headers=hs)),
                  ports, st.sampled_from(["", "/", "/healthz", "/a/b?c=d&e"]),
                  st.sampled_from([spec_pb.HTTP, spec_pb.HTTPS]), st.lists(header, max_size=3)),
        st.builds(lambda p, service: spec_pb.ProbeSpec(grpc=spec_pb.GRPCAction(port=p, service=service)),
                  st.sampled_from([port, 1, 65535]), st.sampled_from(["", "svc"])),
    )
    one_success = probe_type in (spec_pb.LIVENESS, spec_pb.STARTUP)

    def timed(spec, period, timeout, delay, success, failure, target, family):
        spec.period_ms, spec.timeout_ms, spec.initial_delay_ms = period, timeout, delay
        spec.success_threshold = min(success, 1) if one_success else success
        spec.failure_threshold, spec.target, spec.ip_family = failure, target, family
        return spec

    return st.builds(timed, handlers, st.sampled_from([0, 1000, 60_000]), st.sampled_from([0, 1, 300]),
                     st.sampled_from([0, 100]), st.integers(0, 3), st.integers(0, 5),
                     st.sampled_from(list(spec_pb.Target.values())), st.sampled_from(list(spec_pb.IPFamily.values())))


def _set(path: str, values: st.SearchStrategy):
    """A mutation: one field (a dotted path from the request) set to a drawn value."""
    def mutate(request, draw):
        *parents, name = path.split(".")
        message = request
        for parent in parents:
            message = getattr(message, parent)
        value = draw(values)
        field = message.DESCRIPTOR.fields_by_name[name]
        if field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry:
            getattr(message, name).clear()
            getattr(message, name).update(value)
        elif field.is_repeated:
            del getattr(message, name)[:]
            getattr(message, name).extend(value)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            getattr(message, name).CopyFrom(value)
        else:
            setattr(message, name, value)
    mutate.__name__ = path
    return mutate


def _bad_headers():
    one = st.builds(spec_pb.HTTPHeader, name=st.one_of(TRICKY, st.just("X-A"), LONG), value=st.one_of(TRICKY, LONG))
    many = st.integers(60, 70).map(lambda n: [spec_pb.HTTPHeader(name="X", value="v")] * n)
    return st.one_of(st.lists(one, max_size=4), many)


SPEC_MUTATIONS = [
    _set("spec.http_get", arbitrary(spec_pb.HTTPGetAction.DESCRIPTOR)),
    _set("spec.http_get.path", TEXT), _set("spec.http_get.host", TEXT), _set("spec.http_get.scheme", INT32),
    _set("spec.http_get.http_headers", _bad_headers()), _set("spec.http_get.port.number", INT32),
    _set("spec.http_get.port.name", TEXT),
    _set("spec.tcp_socket.port.number", INT32), _set("spec.tcp_socket.host", TEXT),
    _set("spec.grpc.port", INT32), _set("spec.grpc.service", TEXT),
    _set("spec.exec.command", st.lists(TEXT, max_size=3)),
    _set("spec.initial_delay_ms", INT64), _set("spec.period_ms", INT64), _set("spec.timeout_ms", INT64),
    _set("spec.success_threshold", INT32), _set("spec.failure_threshold", INT32),
    _set("spec.termination_grace_period_ms", INT64),
    _set("spec.target", INT32), _set("spec.ip_family", INT32), _set("type", INT32),
    _set("container_ports", st.lists(arbitrary(spec_pb.ContainerPort.DESCRIPTOR), max_size=3)),
    _set("spec", arbitrary(spec_pb.ProbeSpec.DESCRIPTOR)),
]
# Near-valid requests (one field changed) are the most telling: weighted double.
KINDS = st.sampled_from(["valid", "one field", "one field", "arbitrary"])
RUN_MUTATIONS = SPEC_MUTATIONS + [
    _set("pod_sandbox_id", st.sampled_from(["", "s" * 257])), _set("container_name", TEXT),
    _set("container_id", TEXT), _set("labels", st.dictionaries(TEXT, TEXT, max_size=3)),
    _set("labels", st.integers(63, 66).map(lambda n: {f"k{i}": "v" for i in range(n)})),
    _set("container_started_at", INT64),
]
EXEC_MUTATIONS = SPEC_MUTATIONS + [_set("pod_sandbox_id", st.sampled_from(["", "s" * 257]))]


def varied(draw, request, mutations: list, ns_name: str):
    """request as it is, with one field changed (one of mutations), or an arbitrary message of its type (KINDS)."""
    kind = draw(KINDS)
    if kind == "one field":
        draw(st.sampled_from(mutations))(request, draw)
    elif kind == "arbitrary":
        request = draw(arbitrary(request.DESCRIPTOR))
        # A sandbox that does not exist is NOT_FOUND, a different answer: keep to ours, empty, or too long.
        request.pod_sandbox_id = draw(st.sampled_from([ns_name, "", "s" * 257]))
    return request


@st.composite
def run_requests(draw, ns_name: str, port: int):
    probe_type = draw(st.sampled_from([spec_pb.LIVENESS, spec_pb.READINESS, spec_pb.STARTUP]))
    request = service_pb.RunProbeRequest(
        pod_sandbox_id=ns_name, type=probe_type, spec=draw(valid_specs(probe_type, port)),
        container_name=draw(st.from_regex(r"c-[a-z0-9]{1,8}", fullmatch=True)),
        container_ports=[spec_pb.ContainerPort(name="web", container_port=port, protocol="TCP")],
        labels=draw(st.dictionaries(st.sampled_from(["team", "app.kubernetes.io/name"]), st.text(max_size=8))))
    request = varied(draw, request, RUN_MUTATIONS, ns_name)
    if request.container_name == ANCHOR:
        request.container_name = "c-anchor"
    return request


@st.composite
def exec_requests(draw, ns_name: str, port: int):
    probe_type = draw(st.sampled_from([spec_pb.PROBE_TYPE_UNSPECIFIED, spec_pb.LIVENESS, spec_pb.READINESS]))
    request = service_pb.ExecProbeRequest(
        pod_sandbox_id=ns_name, type=probe_type, spec=draw(valid_specs(probe_type or spec_pb.READINESS, port)),
        container_ports=[spec_pb.ContainerPort(name="web", container_port=port)])
    return varied(draw, request, EXEC_MUTATIONS, ns_name)


class Tally:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, key: str) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1


def accepted_answer(rpc, request, expected: list[str], tally: Tally, verb: str):
    """Calls rpc with request. If validation expects errors, asserts the daemon refused with exactly those and
    returns None; otherwise asserts it answered OK and returns the answer."""
    code, details, answer = call(rpc, request)
    tally.add(f"{verb} {code.name}")
    if expected:
        tally.add("field " + re.split(r"[.:\[]", expected[0])[0])
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
        assert_answer_is(details, expected)
        return None
    assert code == grpc.StatusCode.OK, (code, details, request)
    return answer


def answer_run_probe(daemon, request, tally: Tally) -> None:
    expected = rules.validate_run_probe(request, allow_host=False)
    answer = accepted_answer(daemon.stub.RunProbe, request, expected, tally, "run")
    if answer is None:
        return
    assert answer.probe_id == rules.probe_id_for(request.pod_sandbox_id, rules.container_key(request),
                                                     request.type)
    stopped = daemon.stub.StopProbe(service_pb.StopProbeRequest(probe_id=answer.probe_id), timeout=RPC_TIMEOUT_S)
    assert list(stopped.stopped_probe_ids) == [answer.probe_id]


def answer_exec_probe(daemon, request, tally: Tally) -> None:
    expected = rules.validate_exec_probe(request, allow_host=False)
    answer = accepted_answer(daemon.stub.ExecProbe, request, expected, tally, "exec")
    if answer is None:
        return
    assert answer.attempt.result in spec_pb.AttemptResult.values()
    assert len(answer.attempt.output) <= 16 * 1024
    tally.add(f"exec {spec_pb.AttemptResult.Name(answer.attempt.result)}")


def test_any_request_gets_ok_or_invalid_argument_and_the_daemon_neither_crashes_nor_leaks(
        api_daemon, netns, target_port):
    anchor = run(api_daemon, netns, tcp_spec(target_port, period_ms=60_000), container=ANCHOR)
    daemon = psutil.Process(api_daemon.proc.pid)
    tally = Tally()
    runs, execs = run_requests(netns.name, target_port), exec_requests(netns.name, target_port)

    @settings(max_examples=30, **SETTINGS)
    @given(runs, execs)
    def warm_up(run_request, exec_request):
        answer_run_probe(api_daemon, run_request, tally)
        answer_exec_probe(api_daemon, exec_request, tally)

    @settings(max_examples=150, **SETTINGS)
    @given(runs)
    def run_probe_answers(request):
        answer_run_probe(api_daemon, request, tally)

    @settings(max_examples=100, **SETTINGS)
    @given(execs)
    def exec_probe_answers(request):
        answer_exec_probe(api_daemon, request, tally)

    warm_up()  # a grpc server allocates its pools lazily: measure after they exist
    fds, rss = daemon.num_fds(), daemon.memory_info().rss
    run_probe_answers()
    exec_probe_answers()
    print("answers:", dict(sorted(tally.counts.items())))
    print(f"daemon fds {fds} -> {daemon.num_fds()}, rss {rss >> 20} -> {daemon.memory_info().rss >> 20} MiB")

    # Both kinds of answer were exercised, many times over.
    for key in ("run OK", "run INVALID_ARGUMENT", "exec OK", "exec INVALID_ARGUMENT"):
        assert tally.counts.get(key, 0) >= 20, tally.counts
    # Never crashed: the same process answers, and the worker of the sandbox never restarted.
    assert api_daemon.proc.poll() is None and daemon.is_running()
    health = health_pb2_grpc.HealthStub(api_daemon.channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    (left,) = status(api_daemon, pod_sandbox_id=netns.name).probes
    assert left.probe_id == anchor and left.status.worker.restarts == 0
    # No leak: every probe an OK answer created is gone again, and fds and memory stayed put.
    assert [p.probe_id for p in status(api_daemon).probes] == [anchor]
    assert daemon.num_fds() <= fds + 4
    assert daemon.memory_info().rss <= rss + (16 << 20)
    api_daemon.stub.StopProbe(service_pb.StopProbeRequest(probe_id=anchor), timeout=10)
