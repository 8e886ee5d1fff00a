"""Checks of ProbeService requests and the ids they map to. Pure: no I/O, no grpc.

Probe spec rules are the Kubernetes API's (probe_worker.validation); this adds the
request's own fields and the daemon's gate on the deprecated `host` field.
"""

from __future__ import annotations

import hashlib

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from probe_worker.validation import validate_probe

HOST_GATE = (
    "Forbidden: the host field makes the runtime connect to any address the node can reach "
    "(blind SSRF around NetworkPolicy); probes run inside the pod, so leave host empty, or set "
    "allow_host_field = true in the daemon's config to accept it"
)


def host_field_errors(spec: spec_pb.ProbeSpec, allow_host: bool, root: str = "spec") -> list[str]:
    if allow_host:
        return []
    errors = []
    if spec.HasField("http_get") and spec.http_get.host:
        errors.append(f"{root}.http_get.host: {HOST_GATE}")
    if spec.HasField("tcp_socket") and spec.tcp_socket.host:
        errors.append(f"{root}.tcp_socket.host: {HOST_GATE}")
    return errors


def uses_host_field(spec: spec_pb.ProbeSpec) -> bool:
    return bool(spec.http_get.host or spec.tcp_socket.host)


def validate_run_probe(req: service_pb.RunProbeRequest, allow_host: bool) -> list[str]:
    errors = []
    if not req.pod_sandbox_id:
        errors.append("pod_sandbox_id: Required value")
    if not req.container_id and not req.container_name:
        errors.append("container_name: Required value: give container_id, container_name or both")
    errors += validate_probe(req.type, req.spec, root="spec")
    errors += host_field_errors(req.spec, allow_host)
    return errors


def validate_exec_probe(req: service_pb.ExecProbeRequest, allow_host: bool) -> list[str]:
    errors = [] if req.pod_sandbox_id else ["pod_sandbox_id: Required value"]
    errors += validate_probe(req.type or spec_pb.READINESS, req.spec, root="spec")
    return errors + host_field_errors(req.spec, allow_host)


def validate_stop_probe(req: service_pb.StopProbeRequest) -> list[str]:
    if req.probe_id and (req.pod_sandbox_id or req.container_id):
        return ["probe_id: Forbidden: give either probe_id, or pod_sandbox_id (optionally with container_id)"]
    if req.container_id and not req.pod_sandbox_id:
        return ["pod_sandbox_id: Required value: container_id selects within a sandbox"]
    if not req.probe_id and not req.pod_sandbox_id:
        return ["probe_id: Required value: give probe_id, or pod_sandbox_id (optionally with container_id)"]
    return []


def container_key(req: service_pb.RunProbeRequest) -> str:
    return req.container_id or req.container_name


def probe_id_for(sandbox_id: str, container: str, probe_type: int) -> str:
    """Stable across re-registration and daemon restarts: a hash of what identifies the probe."""
    digest = hashlib.sha256(f"{sandbox_id}\0{container}\0{probe_type}".encode()).hexdigest()
    return f"{spec_pb.ProbeType.Name(probe_type).lower()}-{digest[:16]}"
