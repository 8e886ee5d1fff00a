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
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import yaml

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.gostrings import go_quote
from probe_api.validation import OMIT_VALUE, FieldError, PrintedValue, port_name_errors, probe_errors
from probectl.specs import GRPC_MODES, HTTP_PROTOCOLS

PROBE_FIELDS = (("livenessProbe", spec_pb.LIVENESS), ("readinessProbe", spec_pb.READINESS),
                ("startupProbe", spec_pb.STARTUP))
EXEC_NOTE = "exec probes are run by the kubelet, not by probectl"

# Where the pod spec sits in each kind, as a path of keys from the object.
POD_SPEC_PATHS = {
    "Pod": ("spec",),
    "PodTemplate": ("template", "spec"),
    **{kind: ("spec", "template", "spec") for kind in
       ("Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job", "ReplicationController")},
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}

# core/v1 Probe and handler fields (1.32). Unknown ones are refused, as kubectl's strict field validation does:
# a typo such as `httpget` would otherwise silently leave a probe without a handler.
_PROBE_KEYS = {"exec", "httpGet", "tcpSocket", "grpc", "initialDelaySeconds", "timeoutSeconds", "periodSeconds",
               "successThreshold", "failureThreshold", "terminationGracePeriodSeconds"}
_HANDLER_KEYS = {"httpGet": {"path", "port", "host", "scheme", "httpHeaders", "protocol"}, "tcpSocket": {"port", "host"},
                 "grpc": {"port", "service", "mode"}, "exec": {"command"}}
_SCHEMES = {"HTTP": spec_pb.HTTP, "HTTPS": spec_pb.HTTPS}  # case-sensitive, like the API

# Probe field (Kubernetes name) -> (ProbeSpec field, milliseconds per unit, integer bits in Kubernetes).
_TIMING = {
    "initialDelaySeconds": ("initial_delay_ms", 1000, 32),
    "timeoutSeconds": ("timeout_ms", 1000, 32),
    "periodSeconds": ("period_ms", 1000, 32),
    "successThreshold": ("success_threshold", 1, 32),
    "failureThreshold": ("failure_threshold", 1, 32),
    "terminationGracePeriodSeconds": ("termination_grace_period_ms", 1000, 64),
}

# ProbeSpec path segments -> Kubernetes names, for translating validation errors.
_K8S_NAMES = {"http_get": "httpGet", "tcp_socket": "tcpSocket", "http_headers": "httpHeaders",
              **{proto: k8s for k8s, (proto, _, _) in _TIMING.items()}}
_MS_FIELDS = {proto for proto, per_unit, _ in _TIMING.values() if per_unit == 1000}
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


class InvalidField(Exception):
    """One manifest error, naming its path; the probe (or object) it is in is not registered."""


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


def find_pod_spec(obj: dict, kind: str, prefix: str) -> tuple[str, dict]:
    """(its path, the pod spec) of an object of a kind in POD_SPEC_PATHS; InvalidField names where it is missing."""
    path, pod_spec = prefix.rstrip("."), obj
    for key in POD_SPEC_PATHS[kind]:
        path = f"{path}.{key}" if path else key
        pod_spec = pod_spec.get(key) if isinstance(pod_spec, dict) else None
        if not isinstance(pod_spec, dict):
            raise InvalidField(f"{path}: Required value: a {kind} has a pod spec here")
    return path, pod_spec


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
        number = _integer(port.get("containerPort"), f"{port_path}.containerPort", bits=32, required=True)
        ports.append(spec_pb.ContainerPort(
            name=_string(port.get("name"), f"{port_path}.name"), container_port=number,
            protocol=_string(port.get("protocol"), f"{port_path}.protocol") or "TCP"))
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
    body = _mapping(probe, path, _PROBE_KEYS)
    spec = handler_spec({key: body[key] for key in _HANDLER_KEYS if key in body}, path, ports)
    for k8s_name, (proto_name, per_unit, bits) in _TIMING.items():
        value = body.get(k8s_name)
        if value is not None:
            setattr(spec, proto_name, _integer(value, f"{path}.{k8s_name}", bits=bits) * per_unit)
    return spec


def handler_spec(body: dict, path: str, ports: Sequence[spec_pb.ContainerPort]) -> spec_pb.ProbeSpec:
    """The handler fields of a core/v1 Probe or LifecycleHandler (`httpGet`, `tcpSocket`, `grpc`, `exec`) ->
    a ProbeSpec holding only them. `path` is where `body` sits ("" for the top); raises InvalidField."""
    spec = spec_pb.ProbeSpec()
    if body.get("httpGet") is not None:
        spec.http_get.CopyFrom(_http_get(body["httpGet"], _join(path, "httpGet"), ports))
    if body.get("tcpSocket") is not None:
        where = _join(path, "tcpSocket")
        action = _mapping(body["tcpSocket"], where, _HANDLER_KEYS["tcpSocket"])
        spec.tcp_socket.port.CopyFrom(_port(action.get("port"), f"{where}.port", ports))
        spec.tcp_socket.host = _string(action.get("host"), f"{where}.host")
    if body.get("grpc") is not None:
        where = _join(path, "grpc")
        action = _mapping(body["grpc"], where, _HANDLER_KEYS["grpc"])
        spec.grpc.port = _integer(action.get("port"), f"{where}.port", bits=32, required=True)
        if action.get("service") is not None:
            spec.grpc.service = _string(action["service"], f"{where}.service")
        spec.grpc.mode = _choice(action.get("mode"), f"{where}.mode", GRPC_MODES, spec_pb.PLAINTEXT)
    if body.get("exec") is not None:
        where = _join(path, "exec")
        action = _mapping(body["exec"], where, _HANDLER_KEYS["exec"])
        command = action.get("command") or []
        if not isinstance(command, list) or not all(isinstance(arg, str) for arg in command):
            raise InvalidField(f"{where}.command: Invalid value: {shown(command)}: must be a list of strings")
        spec.exec.command.extend(command)
    return spec


def _choice(value: object, path: str, choices: dict[str, int], default: int) -> int:
    """A string enum as the API spells it (case-sensitive), `default` when absent; any other value is NotSupported,
    with the supported values, as the API server's validation words it (scheme, httpGet.protocol, grpc.mode)."""
    if value is None:
        return default
    if not isinstance(value, str) or value not in choices:
        raise InvalidField(f"{path}: Unsupported value: {shown(value)}: supported values: "
                           f"{', '.join(go_quote(c) for c in choices)}")
    return choices[value]


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _http_get(action: object, path: str, ports: Sequence[spec_pb.ContainerPort]) -> spec_pb.HTTPGetAction:
    body = _mapping(action, path, _HANDLER_KEYS["httpGet"])
    scheme = _choice(body.get("scheme"), f"{path}.scheme", _SCHEMES, spec_pb.HTTP)
    out = spec_pb.HTTPGetAction(
        path=_string(body.get("path"), f"{path}.path") or "/",  # SetDefaults_HTTPGetAction
        port=_port(body.get("port"), f"{path}.port", ports),
        host=_string(body.get("host"), f"{path}.host"),
        scheme=scheme,
        protocol=_choice(body.get("protocol"), f"{path}.protocol", HTTP_PROTOCOLS, spec_pb.HTTP1))
    headers = body.get("httpHeaders") or []
    if not isinstance(headers, list):
        raise InvalidField(f"{path}.httpHeaders: Invalid value: {shown(headers)}: must be a list")
    for index, header in enumerate(headers):
        header_path = f"{path}.httpHeaders[{index}]"
        entry = _mapping(header, header_path, {"name", "value"})
        out.http_headers.add(name=_string(entry.get("name"), f"{header_path}.name"),
                             value=_string(entry.get("value"), f"{header_path}.value"))
    return out


def _port(value: object, path: str, ports: Sequence[spec_pb.ContainerPort]) -> spec_pb.PortRef:
    """IntOrString. A name must be one of the container's ports (the kubelet would fail every attempt)."""
    if value is None:
        return spec_pb.PortRef()  # validation reports it as required
    if isinstance(value, str):
        # An invalid name ("8080" as a string, "Web") is left to validation, which says what is wrong with it.
        if not port_name_errors(value) and value not in {port.name for port in ports}:
            raise InvalidField(f"{path}: unknown named port {go_quote(value)}")
        return spec_pb.PortRef(name=value)
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < 2**31:
            raise InvalidField(f"{path}: Invalid value: {value}: must be between 1 and 65535, inclusive")
        return spec_pb.PortRef(number=value)
    raise InvalidField(f"{path}: Invalid value: {shown(value)}: must be a port number or a port name")


# --- scalar checks ---------------------------------------------------------------------------------------------

def _mapping(value: object, path: str, known: set[str]) -> dict:
    if not isinstance(value, dict):
        raise InvalidField(f"{path}: Invalid value: {shown(value)}: must be a mapping")
    unknown = sorted(str(key) for key in value if key not in known)
    if unknown:
        raise InvalidField(f"{path}: unknown field {go_quote(unknown[0])}")
    return value


def _string(value: object, path: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidField(f"{path}: Invalid value: {shown(value)}: must be a string")
    return value


def _integer(value: object, path: str, *, bits: int, required: bool = False) -> int:
    if value is None and not required:
        return 0
    if value is None:
        raise InvalidField(f"{path}: Required value")
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidField(f"{path}: Invalid value: {shown(value)}: must be an integer")
    if not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
        raise InvalidField(f"{path}: Invalid value: {value}: must fit in a {bits}-bit integer")
    return value


# --- messages ----------------------------------------------------------------------------------------------------

def kubernetes_error(error: FieldError, root: str) -> FieldError:
    """`<root>.http_get.port` -> `<root>.httpGet.port`; a *_ms field's value back in seconds."""
    if not error.path.startswith(root):
        return error
    segments = error.path[len(root):].split(".")
    leaf = re.sub(r"\[\d+\]$", "", segments[-1])
    value = error.bad_value
    if leaf in _MS_FIELDS and isinstance(value, int) and not isinstance(value, bool):
        value = value // 1000  # the values were seconds x 1000, so the division is exact
    return error.with_path(root + ".".join(_rename(segment) for segment in segments), value)


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


def _rename(segment: str) -> str:
    name, bracket, index = segment.partition("[")
    return _K8S_NAMES.get(name, name) + bracket + index


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


def object_name(obj: dict) -> str:
    """metadata.name, or "" when there is none."""
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) else ""


def shown(value: object) -> str:
    """A value as JSON, the way messages quote what the manifest holds."""
    return json.dumps(value, default=str, ensure_ascii=False)


def json_kind(value: object) -> str:
    if isinstance(value, list):
        return "a list"
    return f"{shown(value)}"


def yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is not None:
        return f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
    return problem

