"""Requests to a real daemon's probe API as the hardening tests send them (tests/hardening/test_api_validation.py,
test_api_fuzz.py, test_probe_limits.py), and the shape every INVALID_ARGUMENT answer must have.

Owns: building RunProbe requests and HTTP specs, calling an RPC with its status as a value, and the check that the
daemon said exactly what the pure validators (probe_api.request_rules) say, each error beginning with a field path.
"""

from __future__ import annotations

import re

import grpc

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb

ANCHOR = "anchor"  # a container name no generated request uses: its probe keeps the worker up
# The first words of every INVALID_ARGUMENT error: a field path of the request.
FIELD_PATH_RE = re.compile(
    r"^(type|pod_sandbox_id|container_id|container_name|labels|container_ports|spec)"
    r"(\[.*?\]|\.[a-z_]+)*: ", re.DOTALL)  # a map key is shown as given, newlines too (Kubernetes' field.Path)
MORE_ERRORS_RE = re.compile(r"^and \d+ more errors$")
RPC_TIMEOUT_S = 30


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
