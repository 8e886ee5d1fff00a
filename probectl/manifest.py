"""Kubernetes manifests -> the probe registrations `probectl apply` sends. Pure: no I/O, no grpc.

Owns: reading YAML or JSON (one or several documents), finding the pod specs in them (a Pod; a List or *List of
them; the pod template of a Deployment, ReplicaSet, StatefulSet, DaemonSet, Job, ReplicationController,
PodTemplate, or a CronJob's job template; other kinds are skipped with a note), and mapping each container's
livenessProbe / readinessProbe / startupProbe to a ProbeSpec with the Kubernetes API's defaults and
validation. Sidecars (initContainers with `restartPolicy: Always`, Kubernetes 1.29+) are probed like
containers; a probe on any other init container is refused as the API refuses it. exec probes are skipped
with a note: the container runtime runs them, not the shim.

Every message names the manifest path in Kubernetes' own (camelCase) field names:
`spec.containers[0].readinessProbe.httpGet.port: unknown named port "web"`, prefixed `items[1].` inside a List
and `documents[2].` when the text has several documents. Durations are converted from seconds to the
ProbeSpec's milliseconds; validation (probe_api.validation, which speaks proto names) is translated back,
values included (`initialDelaySeconds: Invalid value: -1: ...`).

The handler objects themselves, the timing fields and that translation are probe_api.manifest_handlers', and where the pod
spec sits in each kind is probe_api.workloads': `probectl convert`, the admission webhook and the kubelet bridge
read them alike.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import yaml

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.field_errors import OMIT_VALUE, FieldError, PrintedValue
from probe_api.gostrings import go_quote
from probe_api.handler_flags import PROBE_TYPES
from probe_api.manifest_handlers import (
    HANDLER_FIELDS, TIMING, InvalidField, handler_spec, integer_at, kubernetes_error, mapping_at, shown, string_at,
)
from probe_api.validation import probe_errors
from probe_api.workloads import POD_SPEC_PATHS, find_pod_spec, json_kind, object_name

PROBE_FIELDS = tuple((f"{name}Probe", probe_type) for name, probe_type in PROBE_TYPES.items())  # livenessProbe
EXEC_NOTE = "exec probes are run by the kubelet, not by probectl"

# core/v1 Probe fields (1.32). Unknown ones are refused, as kubectl's strict field validation does: a typo such as
# `httpget` would otherwise silently leave a probe without a handler.
_PROBE_KEYS = frozenset({*HANDLER_FIELDS, *TIMING})
_INTEGER_RE = re.compile(r"-?[0-9]+")


@dataclass(frozen=True)
class ManifestProbe:
    path: str                       # e.g. "spec.containers[0].readinessProbe"
    container_name: str
    probe_type: int
    spec: spec_pb.ProbeSpec
    container_ports: tuple[spec_pb.ContainerPort, ...]
    pod_name: str = ""              # metadata.name of the object the pod spec came from


@dataclass
class ManifestResult:
    probes: list[ManifestProbe] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def probes_from_manifest(text: str) -> ManifestResult:
    """Every probe of every container in the manifest, or the reasons why not. Registers nothing itself."""
    result = ManifestResult()
    try:
        documents = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        result.errors.append(f"not valid YAML or JSON: {yaml_problem(exc)}")
        return result
    if not documents:
        result.errors.append("the manifest has no objects")
        return result
    for index, document in enumerate(documents):
        prefix = f"documents[{index}]." if len(documents) > 1 else ""
        _read_object(document, prefix, result)
    _refuse_collisions(result)
    return result


# --- objects and pod specs -------------------------------------------------------------------------------------

def _read_object(obj: object, prefix: str, result: ManifestResult) -> None:
    where = prefix.rstrip(".") or "the manifest"
    if not isinstance(obj, dict):
        result.errors.append(f"{where}: expected a Kubernetes object, got {json_kind(obj)}")
        return
    kind = obj.get("kind")
    if not isinstance(kind, str) or not kind:
        result.errors.append(f"{prefix}kind: Required value: expected Pod, a List of Pods or a workload")
        return
    if kind.endswith("List") and kind not in POD_SPEC_PATHS:
        items = obj.get("items")
        if not isinstance(items, list):
            result.errors.append(f"{prefix}items: Invalid value: {shown(items)}: must be a list")
            return
        for index, item in enumerate(items):
            _read_object(item, f"{prefix}items[{index}].", result)
        return
    if kind not in POD_SPEC_PATHS:
        result.skipped.append(f"{where}: {kind} {go_quote(object_name(obj))} has no pod spec")
        return
    try:
        path, pod_spec = find_pod_spec(obj, kind, prefix)
    except InvalidField as exc:
        result.errors.append(str(exc))
        return
    _read_pod_spec(pod_spec, path, object_name(obj), result)


def _read_pod_spec(pod_spec: dict, path: str, pod_name: str, result: ManifestResult) -> None:
    names: set[str] = set()
    for group in ("initContainers", "containers"):
        containers = pod_spec.get(group) or []
        if not isinstance(containers, list):
            result.errors.append(f"{path}.{group}: Invalid value: {shown(containers)}: must be a list")
            continue
        for index, container in enumerate(containers):
            container_path = f"{path}.{group}[{index}]"
            try:
                name, ports = _container_identity(container, container_path)
            except InvalidField as exc:
                result.errors.append(str(exc))
                continue
            if name in names:
                result.errors.append(f"{container_path}.name: Duplicate value: {go_quote(name)}")
                continue
            names.add(name)
            may_probe = group == "containers" or container.get("restartPolicy") == "Always"  # a sidecar
            for field_name, probe_type in PROBE_FIELDS:
                probe = container.get(field_name)
                if probe is None:
                    continue
                probe_path = f"{container_path}.{field_name}"
                if not may_probe:
                    # validateInitContainers: only restartable init containers (sidecars) may have probes.
                    result.errors.append(f"{probe_path}: Forbidden: may not be set for init containers "
                                         "without restartPolicy=Always")
                    continue
                _read_probe(probe, probe_path, probe_type, name, ports, pod_name, result)


def _container_identity(container: object, path: str) -> tuple[str, tuple[spec_pb.ContainerPort, ...]]:
    if not isinstance(container, dict):
        raise InvalidField(f"{path}: Invalid value: {shown(container)}: must be a container (a mapping)")
    name = container.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidField(f"{path}.name: Required value")
    raw_ports = container.get("ports") or []
    if not isinstance(raw_ports, list):
        raise InvalidField(f"{path}.ports: Invalid value: {shown(raw_ports)}: must be a list")
    ports = []
    for index, port in enumerate(raw_ports):
        port_path = f"{path}.ports[{index}]"
        if not isinstance(port, dict):
            raise InvalidField(f"{port_path}: Invalid value: {shown(port)}: must be a mapping")
        number = integer_at(port.get("containerPort"), f"{port_path}.containerPort", bits=32, required=True)
        ports.append(spec_pb.ContainerPort(
            name=string_at(port.get("name"), f"{port_path}.name"), container_port=number,
            protocol=string_at(port.get("protocol"), f"{port_path}.protocol") or "TCP"))
    return name, tuple(ports)


# --- probes ------------------------------------------------------------------------------------------------------

def _read_probe(probe: object, path: str, probe_type: int, container_name: str,
                ports: tuple[spec_pb.ContainerPort, ...], pod_name: str, result: ManifestResult) -> None:
    try:
        spec = _probe_spec(probe, path, ports)
    except InvalidField as exc:
        result.errors.append(str(exc))
        return
    handlers = [name for name in ("exec", "http_get", "tcp_socket", "grpc") if spec.HasField(name)]
    if handlers == ["exec"]:
        result.skipped.append(f"{path}: {EXEC_NOTE}")
        return
    # probe_errors refuses exec (the shim cannot run it); the Kubernetes API accepts it, and a lone exec
    # handler was skipped above, so that refusal is not this manifest's error.
    errors = [str(kubernetes_error(error, path)) for error in probe_errors(probe_type, spec, root=path)
              if not (error.path == f"{path}.exec" and error.type == FieldError.NOT_SUPPORTED)]
    if errors:
        result.errors.extend(errors)
        return
    result.probes.append(ManifestProbe(path=path, container_name=container_name, probe_type=probe_type,
                                       spec=spec, container_ports=ports, pod_name=pod_name))


def _probe_spec(probe: object, path: str, ports: tuple[spec_pb.ContainerPort, ...]) -> spec_pb.ProbeSpec:
    body = mapping_at(probe, path, _PROBE_KEYS)
    spec = handler_spec({key: body[key] for key in HANDLER_FIELDS if key in body}, path, ports)
    for k8s_name, (proto_name, per_unit, bits) in TIMING.items():
        value = body.get(k8s_name)
        if value is not None:
            setattr(spec, proto_name, integer_at(value, f"{path}.{k8s_name}", bits=bits) * per_unit)
    return spec


# --- messages ----------------------------------------------------------------------------------------------------

def daemon_errors(violations: Sequence[service_pb.FieldViolation], probe_path: str) -> list[str]:
    """The daemon's errors of one probe (fields of its request: spec.http_get.port) in the manifest's words
    (spec.containers[0].readinessProbe.httpGet.port), durations back in seconds."""
    out = []
    for violation in violations:
        if violation.field != "spec" and not violation.field.startswith("spec."):
            continue  # a field of the request, not of the probe: the manifest has no such path
        value: object = OMIT_VALUE
        if _INTEGER_RE.fullmatch(violation.value):
            value = int(violation.value)
        elif violation.value:
            value = PrintedValue(violation.value)
        error = FieldError(violation.type, probe_path + violation.field[len("spec"):], value, violation.detail)
        out.append(str(kubernetes_error(error, probe_path)))
    return out


def _refuse_collisions(result: ManifestResult) -> None:
    """All probes go to one sandbox: a second pod's container of the same name would replace the first's probe."""
    first: dict[tuple[str, int], str] = {}
    kept = []
    for probe in result.probes:
        key = (probe.container_name, probe.probe_type)
        if key in first:
            result.errors.append(f"{probe.path}: container {go_quote(probe.container_name)} already has this probe "
                                 f"at {first[key]} (every probe goes to the one --pod sandbox)")
            continue
        first[key] = probe.path
        kept.append(probe)
    result.probes[:] = kept


def yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is not None:
        return f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
    return problem

