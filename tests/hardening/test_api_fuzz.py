"""Property tests of the probe API against a real daemon: anything goes in, OK or INVALID_ARGUMENT comes out, and the
daemon neither crashes nor leaks.

The daemon is a real `probe-shim serve --runtime-endpoint none` (the `api_daemon` fixture, tests/hardening/
conftest.py); sandboxes are real network namespaces with a listener inside, so requests that pass validation really
register probes and run attempts. The expected answer for each request is computed by the pure validators
(shim.api.request_rules), so the daemon must say exactly what validation says, and never anything else.
"""

from __future__ import annotations

import re
import string

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
from shim.api import request_rules as rules
from tests.support.api_requests import ANCHOR, RPC_TIMEOUT_S, assert_answer_is, call
from tests.support.daemon_env import run, status, tcp_spec

pytestmark = pytest.mark.netns

SETTINGS = dict(derandomize=True, deadline=None, database=None, print_blob=True,
                suppress_health_check=list(HealthCheck))


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
