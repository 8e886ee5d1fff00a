"""Checks of ProbeService requests and the ids they map to. Pure: no I/O, no grpc.

Probe spec rules are the Kubernetes API's (probe_api.validation); this adds the
request's own fields, their size limits, the daemon's gate on the deprecated `host`
field (which lets the pod's own loopback through: probe_api.pod_loopback), and the
bound on how much error text one answer carries.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.field_errors import FieldError
from probe_api.pod_loopback import is_pod_loopback
from probe_api.validation import probe_errors, texts

# Size limits of the request's own fields. A registration is kept in memory, in the
# store and sent to every watcher: each field is bounded, far above any real value.
MAX_ID_BYTES = 256               # pod_sandbox_id, container_id: CRI ids are 64 hex characters
MAX_CONTAINER_NAME_BYTES = 63    # a Kubernetes container name is a DNS-1123 label
MAX_LABELS = 64
MAX_LABEL_KEY_BYTES = 317        # Kubernetes: a 253-byte prefix, "/", a 63-byte name
MAX_LABEL_VALUE_BYTES = 63       # Kubernetes label values
MAX_CONTAINER_PORTS = 256
MAX_PORT_NAME_BYTES = 15         # an IANA service name, as Kubernetes port names are
MAX_PROTOCOL_BYTES = 8           # TCP, UDP, SCTP
# The errors of one answer travel as gRPC status details, which clients cap at 8 KiB of
# metadata: past this many bytes the rest is only counted.
MAX_ERRORS_BYTES = 4096
# The same errors as data (FieldViolations) share that 8 KiB, base64-encoded on the wire (4/3 of this): the message
# and the data together stay under grpc's soft limit, past which a client rejects trailers at random
# (RESOURCE_EXHAUSTED; seen in a full run with 4 KiB of each).
MAX_VIOLATIONS_BYTES = 2560

HOST_GATE_DETAIL = (
    "the host field makes the runtime connect to any address the node can reach "
    "(blind SSRF around NetworkPolicy, kubernetes#99425). Probes run inside the pod: leave host "
    "empty for the pod IP, use 127.0.0.1, ::1 or localhost for the pod's own loopback, or set "
    "allow_host_field = true in the daemon's config to accept it"
)
HOST_GATE = f"{FieldError.FORBIDDEN}: {HOST_GATE_DETAIL}"


def host_field_errors(spec: spec_pb.ProbeSpec, allow_host: bool, root: str = "spec") -> list[FieldError]:
    if allow_host:
        return []
    errors = []
    if spec.HasField("http_get") and _gated(spec.http_get.host):
        errors.append(FieldError.forbidden(f"{root}.http_get.host", HOST_GATE_DETAIL))
    if spec.HasField("tcp_socket") and _gated(spec.tcp_socket.host):
        errors.append(FieldError.forbidden(f"{root}.tcp_socket.host", HOST_GATE_DETAIL))
    return errors


def uses_host_field(spec: spec_pb.ProbeSpec) -> bool:
    """A host that leads outside the pod (what allow_host_field lets through, and the daemon logs)."""
    return _gated(spec.http_get.host) or _gated(spec.tcp_socket.host)


def _gated(host: str) -> bool:
    return bool(host) and not is_pod_loopback(host)


def run_probe_errors(req: service_pb.RunProbeRequest, allow_host: bool) -> list[FieldError]:
    errors = []
    if not req.pod_sandbox_id:
        errors.append(FieldError.required("pod_sandbox_id"))
    if not req.container_id and not req.container_name:
        errors.append(FieldError.required("container_name", "give container_id, container_name or both"))
    errors += _too_long("pod_sandbox_id", req.pod_sandbox_id, MAX_ID_BYTES)
    errors += _too_long("container_id", req.container_id, MAX_ID_BYTES)
    errors += _too_long("container_name", req.container_name, MAX_CONTAINER_NAME_BYTES)
    errors += _label_errors(req.labels)
    errors += _container_port_errors(req.container_ports)
    errors += probe_errors(req.type, req.spec, root="spec")
    return errors + host_field_errors(req.spec, allow_host)


def exec_probe_errors(req: service_pb.ExecProbeRequest, allow_host: bool) -> list[FieldError]:
    errors = [] if req.pod_sandbox_id else [FieldError.required("pod_sandbox_id")]
    errors += _too_long("pod_sandbox_id", req.pod_sandbox_id, MAX_ID_BYTES)
    errors += _container_port_errors(req.container_ports)
    errors += probe_errors(req.type or spec_pb.READINESS, req.spec, root="spec")
    if req.lifecycle_hook and not req.spec.HasField("http_get"):
        # The kubelet runs httpGet hooks over the network; exec and sleep hooks are its own, tcpSocket hooks it
        # never runs (the API keeps the field for compatibility only).
        errors.append(FieldError.forbidden("spec", "lifecycle_hook takes an http_get handler"))
    return errors + host_field_errors(req.spec, allow_host)


def stop_probe_errors(req: service_pb.StopProbeRequest) -> list[FieldError]:
    if req.probe_id and (req.pod_sandbox_id or req.container_id):
        return [FieldError.forbidden("probe_id", "give either probe_id, or pod_sandbox_id (optionally with container_id)")]
    if req.container_id and not req.pod_sandbox_id:
        return [FieldError.required("pod_sandbox_id", "container_id selects within a sandbox")]
    if not req.probe_id and not req.pod_sandbox_id:
        return [FieldError.required("probe_id", "give probe_id, or pod_sandbox_id (optionally with container_id)")]
    return []


def field_violations(errors: Sequence[FieldError]) -> service_pb.FieldViolations:
    """The errors as data for the answer's trailing metadata: the same ones its message shows."""
    shown = bounded(texts(errors))
    kept = errors[:len(shown)] if len(shown) == len(errors) else errors[:len(shown) - 1]
    violations = [service_pb.FieldViolation(field=e.path, type=e.type, value=e.value_text(), detail=e.detail)
                  for e in kept]
    size = sum(v.ByteSize() + 3 for v in violations)  # each with its tag and length
    while len(violations) > 1 and size > MAX_VIOLATIONS_BYTES:
        size -= violations.pop().ByteSize() + 3
    return service_pb.FieldViolations(violations=violations, omitted=len(errors) - len(violations))


def bounded(errors: list[str], max_bytes: int = MAX_ERRORS_BYTES) -> list[str]:
    """The first errors that fit in max_bytes (at least one); the rest only counted."""
    size = 0
    for index, error in enumerate(errors):
        size += len(error.encode()) + 2  # "; " joins them
        if index and size > max_bytes:
            return errors[:index] + [f"and {len(errors) - index} more errors"]
    return errors


def _too_long(path: str, value: str, max_bytes: int) -> list[FieldError]:
    if _utf8_len(value) > max_bytes:
        return [FieldError.too_long(path, max_bytes)]
    return []


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _label_errors(labels) -> list[FieldError]:
    if len(labels) > MAX_LABELS:
        return [FieldError.too_many("labels", len(labels), MAX_LABELS)]
    errors = []
    for key in sorted(labels):
        if _utf8_len(key) > MAX_LABEL_KEY_BYTES:
            detail = f"a key must be no more than {MAX_LABEL_KEY_BYTES} bytes"
            errors.append(FieldError.invalid("labels", key, detail))
        else:
            errors += _too_long(f"labels[{key}]", labels[key], MAX_LABEL_VALUE_BYTES)
    return errors


def _container_port_errors(ports) -> list[FieldError]:
    if len(ports) > MAX_CONTAINER_PORTS:
        return [FieldError.too_many("container_ports", len(ports), MAX_CONTAINER_PORTS)]
    errors = []
    for index, port in enumerate(ports):
        errors += _too_long(f"container_ports[{index}].name", port.name, MAX_PORT_NAME_BYTES)
        errors += _too_long(f"container_ports[{index}].protocol", port.protocol, MAX_PROTOCOL_BYTES)
    return errors


def container_key(req: service_pb.RunProbeRequest) -> str:
    return req.container_id or req.container_name


def probe_id_for(sandbox_id: str, container: str, probe_type: int) -> str:
    """Stable across re-registration and daemon restarts: a hash of what identifies the probe."""
    digest = hashlib.sha256(f"{sandbox_id}\0{container}\0{probe_type}".encode()).hexdigest()
    return f"{spec_pb.ProbeType.Name(probe_type).lower()}-{digest[:16]}"
