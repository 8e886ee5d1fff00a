"""Property tests of the probe API against a real daemon: anything goes in, OK or INVALID_ARGUMENT comes out, the
refusals say exactly what the Kubernetes rules (and the daemon's documented additions) say, and the daemon neither
crashes nor leaks.

The daemon is a real `probe-shim serve --runtime-endpoint none` (the `api_daemon` fixture, tests/hardening/
conftest.py); sandboxes are real network namespaces with a listener inside, so requests that pass validation really
register probes and run attempts. Each request is a valid one (answered OK), the same with one field changed (each
change carries its answer as literal text: the field error Kubernetes' validation prints, pkg/apis/core/validation
validateProbe and k8s.io/apimachinery's field.Error, or the addition probe_api/validation.py and
probe_api/request_rules.py document), or an arbitrary message of the request's type (only OK or INVALID_ARGUMENT, each error
beginning with a field path: nothing computes its answer, so nothing here can agree with a wrong validator).
"""

from __future__ import annotations

import hashlib
import re
import string
from collections.abc import Callable

import grpc
import psutil
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import FieldDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import given, settings
from hypothesis import strategies as st

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from tests.support.api_requests import ANCHOR, FIELD_PATH_RE, RPC_TIMEOUT_S, assert_answer_is, call
from tests.support.daemon_env import run, status, tcp_spec

pytestmark = pytest.mark.netns

SETTINGS = dict(derandomize=True, deadline=None, database=None, print_blob=True)


# --- arbitrary requests ---------------------------------------------------------------------------------------

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


# --- valid requests -------------------------------------------------------------------------------------------

def valid_specs(probe_type: int, port: int) -> st.SearchStrategy[spec_pb.ProbeSpec]:
    """Specs Kubernetes accepts for probe_type (and the daemon with them): every choice below is inside the rules."""
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
    one_success = probe_type in (spec_pb.LIVENESS, spec_pb.STARTUP)  # validateLivenessProbe: successThreshold 1

    def timed(spec, period, timeout, delay, success, failure, target, family):
        spec.period_ms, spec.timeout_ms, spec.initial_delay_ms = period, timeout, delay
        spec.success_threshold = min(success, 1) if one_success else success
        spec.failure_threshold, spec.target, spec.ip_family = failure, target, family
        return spec

    return st.builds(timed, handlers, st.sampled_from([0, 1000, 60_000]), st.sampled_from([0, 1, 300]),
                     st.sampled_from([0, 100]), st.integers(0, 3), st.integers(0, 5),
                     st.sampled_from(list(spec_pb.Target.values())), st.sampled_from(list(spec_pb.IPFamily.values())))


# --- one field changed, with its answer written out --------------------------------------------------------------
# A change edits a request in place and returns the errors its answer must list, in order ([] for OK). The texts are
# literal: the Kubernetes messages (field.Error.Error(): "<path>: <type>: <value>: <detail>", values the Go way) and
# the additions' own.

Change = Callable[[object], list[str]]

MAX_DURATION_MS = 2_147_483_647_000  # int32 seconds, the most a Kubernetes probe holds, in ms
NEGATIVE = "must be greater than or equal to 0"                                     # IsNegativeErrorMsg
TOO_BIG = "must be no more than 2147483647000 (2147483647 s, the most a Kubernetes probe can hold)"
PORT_RANGE = "must be between 1 and 65535, inclusive"                                # InclusiveRangeError(1, 65535)
HOST_GATE = ("Forbidden: the host field makes the runtime connect to any address the node can reach (blind SSRF "
             "around NetworkPolicy, kubernetes#99425). Probes run inside the pod: leave host empty for the pod IP, "
             "use 127.0.0.1, ::1 or localhost for the pod's own loopback, or set allow_host_field = true in the "
             "daemon's config to accept it")
HEADER_NAME = ("a valid HTTP header must consist of alphanumeric characters or '-' (e.g. 'X-Header-Name', regex used "
               "for validation is '[-A-Za-z0-9]+')")
PORT_NAME_CHARSET = "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)"
PORT_NAME_LETTER = "must contain at least one letter (a-z)"
EXEC = 'Unsupported value: "exec": exec probes are run by the container runtime, not by cri-probe-shim'
UNSUPPORTED_TYPE = 'Unsupported value: {}: supported values: "LIVENESS", "READINESS", "STARTUP"'
I32_NEGATIVE, I64_NEGATIVE = st.integers(-(2**31), -1), st.integers(-(2**63), -1)
I64_TOO_BIG = st.integers(MAX_DURATION_MS + 1, 2**63 - 1)


def probe_type_of(request) -> int:
    """The type the spec is checked as: an ExecProbe without one is checked as a readiness probe."""
    if isinstance(request, service_pb.ExecProbeRequest):
        return request.type or spec_pb.READINESS
    return request.type


def setting(path: str, value, errors: list[str]) -> Change:
    """Sets one field (a dotted path from the request) to value; the answer lists errors."""
    def change(request) -> list[str]:
        *parents, name = path.split(".")
        message = request
        for parent in parents:
            message = getattr(message, parent)
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
        return errors
    return change


def handler(**action) -> Change:
    """The spec's handler replaced by the one given (the others cleared)."""
    def change(request) -> list[str]:
        for name in ("exec", "http_get", "tcp_socket", "grpc"):
            request.spec.ClearField(name)
        for name, value in action.items():
            getattr(request.spec, name).CopyFrom(value)
        return []
    return change


def then(first: Change, errors: list[str]) -> Change:
    def change(request) -> list[str]:
        return first(request) + errors
    return change


def _duration(name: str) -> st.SearchStrategy[Change]:
    path = f"spec.{name}"
    valid = st.integers(10 if name == "period_ms" else 0, MAX_DURATION_MS)
    changes = [
        valid.map(lambda v: setting(path, v, [])),
        I64_NEGATIVE.map(lambda v: setting(path, v, [f"{path}: Invalid value: {v}: {NEGATIVE}"])),
        I64_TOO_BIG.map(lambda v: setting(path, v, [f"{path}: Invalid value: {v}: {TOO_BIG}"])),
    ]
    if name == "period_ms":  # addition: milliseconds, where Kubernetes has whole seconds
        changes.append(st.integers(1, 9).map(
            lambda v: setting(path, v, [f"{path}: Invalid value: {v}: must be at least 10ms"])))
    return st.one_of(changes)


def _success_threshold(value: int) -> Change:
    path = "spec.success_threshold"

    def change(request) -> list[str]:
        request.spec.success_threshold = value
        errors = [f"{path}: Invalid value: {value}: {NEGATIVE}"] if value < 0 else []
        if probe_type_of(request) in (spec_pb.LIVENESS, spec_pb.STARTUP) and value not in (0, 1):
            errors.append(f"{path}: Invalid value: {value}: must be 1")  # validateLivenessProbe, after defaulting
        return errors
    return change


def _grace_period(value: int) -> Change:
    path = "spec.termination_grace_period_ms"

    def change(request) -> list[str]:
        request.spec.termination_grace_period_ms = value
        errors = []
        if value <= 0:
            errors.append(f"{path}: Invalid value: {value}: must be greater than 0")
        elif value > MAX_DURATION_MS:
            errors.append(f"{path}: Invalid value: {value}: {TOO_BIG}")
        if probe_type_of(request) == spec_pb.READINESS:
            errors.append(f"{path}: Invalid value: {value}: must not be set for readinessProbes")
        return errors
    return change


def _unknown(values) -> st.SearchStrategy[int]:
    """An int32 that is no value of the enum: below it, or above it."""
    return st.one_of(st.integers(-(2**31), min(values) - 1), st.integers(max(values) + 1, 2**31 - 1))


def _port(path: str, action: Callable[[int], dict]) -> st.SearchStrategy[Change]:
    return st.one_of(
        st.integers(1, 65535).map(lambda v: handler(**action(v))),
        _unknown([1, 65535]).map(lambda v: then(handler(**action(v)), [f"{path}: Invalid value: {v}: {PORT_RANGE}"])),
    )


def _http(**fields) -> dict:
    fields.setdefault("port", spec_pb.PortRef(number=8080))
    return {"http_get": spec_pb.HTTPGetAction(**fields)}


def _headers(*pairs) -> list[spec_pb.HTTPHeader]:
    return [spec_pb.HTTPHeader(name=n, value=v) for n, v in pairs]


HTTP_PORT = "spec.http_get.port"
HEADERS = "spec.http_get.http_headers"
# (the changed handler, the answer's errors): IsValidPortName, the URL path and host additions, header rules.
HANDLER_CASES = [
    (_http(port=spec_pb.PortRef(name="web")), []),
    (_http(port=spec_pb.PortRef(name="Web")), [f'{HTTP_PORT}: Invalid value: "Web": {PORT_NAME_CHARSET}']),
    (_http(port=spec_pb.PortRef(name="123")), [f'{HTTP_PORT}: Invalid value: "123": {PORT_NAME_LETTER}']),
    (_http(port=spec_pb.PortRef(name="a--b")),
     [f'{HTTP_PORT}: Invalid value: "a--b": must not contain consecutive hyphens']),
    (_http(port=spec_pb.PortRef(name="-web")),
     [f'{HTTP_PORT}: Invalid value: "-web": must not begin or end with a hyphen']),
    (_http(port=spec_pb.PortRef(name="a" * 16)),
     [f'{HTTP_PORT}: Invalid value: "{"a" * 16}": must be no more than 15 characters']),
    (_http(port=spec_pb.PortRef(name="")),
     [f'{HTTP_PORT}: Invalid value: "": {PORT_NAME_CHARSET}', f'{HTTP_PORT}: Invalid value: "": {PORT_NAME_LETTER}']),
    (_http(port=spec_pb.PortRef()), [f"{HTTP_PORT}: Required value"]),
    (_http(scheme=7), ['spec.http_get.scheme: Unsupported value: 7: supported values: "HTTP", "HTTPS"']),
    (_http(path="healthz"),
     ['spec.http_get.path: Invalid value: "healthz": must be an absolute path: start with \'/\'']),
    (_http(path="/a\0"), ['spec.http_get.path: Invalid value: "/a\\x00": must not contain control characters']),
    (_http(path="/" * 2049), ["spec.http_get.path: Too long: may not be more than 2048 bytes"]),
    (_http(host="localhost"), []),
    (_http(host="::1"), []),
    (_http(host="example.com"), [f"spec.http_get.host: {HOST_GATE}"]),
    ({"tcp_socket": spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=80), host="169.254.169.254")},
     [f"spec.tcp_socket.host: {HOST_GATE}"]),
    ({"tcp_socket": spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=80), host="127.0.0.1")}, []),
    (_http(http_headers=_headers(("X A", "v"))), [f'{HEADERS}: Invalid value: "X A": {HEADER_NAME}']),
    (_http(http_headers=_headers(("X-A", "v"), ("X-B", "a\r\nb"))),
     [f"{HEADERS}[1].value: Invalid value: must not contain CR, LF or NUL characters"]),
    (_http(http_headers=_headers(("X", "v")) * 65), [f"{HEADERS}: Too many: 65: must have at most 64 items"]),
    (_http(http_headers=_headers(("X", "v" * 4097))),
     [f"{HEADERS}[0].value: Too long: may not be more than 4096 bytes"]),
    ({"grpc": spec_pb.GRPCAction(port=80, service="s" * 1025)},
     ["spec.grpc.service: Too long: may not be more than 1024 bytes"]),
    ({"grpc": spec_pb.GRPCAction(port=80, mode=5)},
     ['spec.grpc.mode: Unsupported value: 5: supported values: "Plaintext", "TLS"']),  # core.GRPCProbeMode
    ({"exec": spec_pb.ExecAction(command=["true"])}, [f"spec.exec: {EXEC}"]),
    ({}, ["spec: Required value: must specify a handler type"]),
    ({**_http(), "tcp_socket": spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=80))},
     ["spec.tcp_socket: Forbidden: may not specify more than 1 handler type"]),
]

SPEC_CHANGES = [
    *(_duration(name) for name in ("initial_delay_ms", "timeout_ms", "period_ms")),
    st.one_of(I32_NEGATIVE, st.integers(0, 2**31 - 1)).map(_success_threshold),
    I32_NEGATIVE.map(lambda v: setting("spec.failure_threshold", v,
                                       [f"spec.failure_threshold: Invalid value: {v}: {NEGATIVE}"])),
    st.integers(0, 2**31 - 1).map(lambda v: setting("spec.failure_threshold", v, [])),
    st.one_of(st.integers(-(2**63), 0), st.integers(1, MAX_DURATION_MS), I64_TOO_BIG).map(_grace_period),
    _unknown(list(spec_pb.Target.values())).map(lambda v: setting("spec.target", v, [
        f'spec.target: Unsupported value: {v}: supported values: "POD_IP", "LOOPBACK"'])),
    _unknown(list(spec_pb.IPFamily.values())).map(lambda v: setting("spec.ip_family", v, [
        f'spec.ip_family: Unsupported value: {v}: supported values: "PRIMARY", "IPV4", "IPV6", "ANY"'])),
    _port("spec.tcp_socket.port", lambda v: {"tcp_socket": spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=v))}),
    _port("spec.grpc.port", lambda v: {"grpc": spec_pb.GRPCAction(port=v)}),
    st.sampled_from(HANDLER_CASES).map(lambda case: then(handler(**case[0]), case[1])),
]
SANDBOX_CHANGES = [
    st.just(setting("pod_sandbox_id", "", ["pod_sandbox_id: Required value"])),
    st.just(setting("pod_sandbox_id", "s" * 257, ["pod_sandbox_id: Too long: may not be more than 256 bytes"])),
]
RUN_CHANGES = SPEC_CHANGES + SANDBOX_CHANGES + [
    st.just(setting("type", 0, ["type: Required value"])),
    st.one_of(st.integers(-(2**31), -1), st.integers(4, 2**31 - 1)).map(
        lambda v: setting("type", v, [f"type: {UNSUPPORTED_TYPE.format(v)}"])),
    st.just(setting("container_name", "",
                    ["container_name: Required value: give container_id, container_name or both"])),
    st.just(setting("container_name", "c" * 64, ["container_name: Too long: may not be more than 63 bytes"])),
    st.from_regex(r"c-[a-z0-9]{1,8}", fullmatch=True).map(lambda v: setting("container_name", v, [])),
    TEXT.filter(lambda v: v != ANCHOR and len(v.encode("utf-8", "surrogatepass")) <= 256).map(
        lambda v: setting("container_id", v, [])),
    st.just(setting("container_id", "i" * 257, ["container_id: Too long: may not be more than 256 bytes"])),
    st.just(setting("labels", {f"k{i}": "v" for i in range(65)}, ["labels: Too many: 65: must have at most 64 items"])),
    st.just(setting("labels", {"team": "v" * 64}, ["labels[team]: Too long: may not be more than 63 bytes"])),
    st.just(setting("labels", {"k" * 318: "v"},
                    [f'labels: Invalid value: "{"k" * 256}"...: a key must be no more than 317 bytes'])),
    st.just(setting("container_ports", [spec_pb.ContainerPort(container_port=80)] * 257,
                    ["container_ports: Too many: 257: must have at most 256 items"])),
    st.just(setting("container_ports", [spec_pb.ContainerPort(name="p" * 16, container_port=80)],
                    ["container_ports[0].name: Too long: may not be more than 15 bytes"])),
    st.just(setting("container_ports", [spec_pb.ContainerPort(container_port=80, protocol="TCPTCPTCP")],
                    ["container_ports[0].protocol: Too long: may not be more than 8 bytes"])),
    INT64.map(lambda v: setting("container_started_at", v, [])),
]
EXEC_CHANGES = SPEC_CHANGES + SANDBOX_CHANGES + [
    st.just(setting("type", 0, [])),  # checked as a readiness probe
    _unknown([0, 3]).map(lambda v: setting("type", v, [f"type: {UNSUPPORTED_TYPE.format(v)}"])),
]
# Near-valid requests (one field changed) are the most telling: weighted double.
KINDS = st.sampled_from(["valid", "one field", "one field", "arbitrary"])


def varied(draw, request, changes: list, ns_name: str):
    """(request, the errors its answer lists, or None for an arbitrary one whose answer only has a shape): the
    request as it is, with one field changed, or an arbitrary message of its type (KINDS)."""
    kind = draw(KINDS)
    if kind == "valid":
        return request, []
    if kind == "one field":
        change = draw(st.one_of(changes))
        return request, change(request)
    request = draw(arbitrary(request.DESCRIPTOR))
    # A sandbox that does not exist is NOT_FOUND, a different answer: keep to ours, empty, or too long.
    request.pod_sandbox_id = draw(st.sampled_from([ns_name, "", "s" * 257]))
    for field in ("container_id", "container_name"):  # a RunProbe for the anchor's container would replace it
        if getattr(request, field, None) == ANCHOR:
            setattr(request, field, "c-anchor")
    return request, None


@st.composite
def run_requests(draw, ns_name: str, port: int):
    probe_type = draw(st.sampled_from([spec_pb.LIVENESS, spec_pb.READINESS, spec_pb.STARTUP]))
    request = service_pb.RunProbeRequest(
        pod_sandbox_id=ns_name, type=probe_type, spec=draw(valid_specs(probe_type, port)),
        container_name=draw(st.from_regex(r"c-[a-z0-9]{1,8}", fullmatch=True)),
        container_ports=[spec_pb.ContainerPort(name="web", container_port=port, protocol="TCP")],
        labels=draw(st.dictionaries(st.sampled_from(["team", "app.kubernetes.io/name"]), st.text(max_size=8))))
    return varied(draw, request, RUN_CHANGES, ns_name)


@st.composite
def exec_requests(draw, ns_name: str, port: int):
    probe_type = draw(st.sampled_from([spec_pb.PROBE_TYPE_UNSPECIFIED, spec_pb.LIVENESS, spec_pb.READINESS]))
    request = service_pb.ExecProbeRequest(
        pod_sandbox_id=ns_name, type=probe_type, spec=draw(valid_specs(probe_type or spec_pb.READINESS, port)),
        container_ports=[spec_pb.ContainerPort(name="web", container_port=port)])
    return varied(draw, request, EXEC_CHANGES, ns_name)


class Tally:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, key: str) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1


def accepted_answer(rpc, request, expected: list[str] | None, tally: Tally, verb: str):
    """Calls rpc with request and checks the answer against expected (None: OK or a refusal shaped like one);
    returns the answer if it was OK."""
    code, details, answer = call(rpc, request)
    tally.add(f"{verb} {code.name}")
    if expected is None:
        assert code in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT), (code, details)
        assert code == grpc.StatusCode.OK or FIELD_PATH_RE.match(details), details[:300]
    elif expected:
        tally.add("field " + re.split(r"[.:\[]", expected[0])[0])
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details, request)
        assert_answer_is(details, expected)
    else:
        assert code == grpc.StatusCode.OK, (code, details, request)
    return answer


def probe_id(request: service_pb.RunProbeRequest) -> str:
    """The probe's id as the API documents it: the type's name and a hash of sandbox, container and type."""
    key = f"{request.pod_sandbox_id}\0{request.container_id or request.container_name}\0{request.type}"
    return f"{spec_pb.ProbeType.Name(request.type).lower()}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def answer_run_probe(daemon, drawn, tally: Tally) -> None:
    request, expected = drawn
    answer = accepted_answer(daemon.stub.RunProbe, request, expected, tally, "run")
    if answer is None:
        return
    assert answer.probe_id == probe_id(request)
    stopped = daemon.stub.StopProbe(service_pb.StopProbeRequest(probe_id=answer.probe_id), timeout=RPC_TIMEOUT_S)
    assert list(stopped.stopped_probe_ids) == [answer.probe_id]


def answer_exec_probe(daemon, drawn, tally: Tally) -> None:
    request, expected = drawn
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
