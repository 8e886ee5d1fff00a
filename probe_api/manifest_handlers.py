"""core/v1 handlers as a manifest writes them -> ProbeSpec, and the API's field names back in error texts. Pure.

Owns: reading the handler objects of a Probe or LifecycleHandler (`httpGet`, `tcpSocket`, `grpc`, `exec`) with
Kubernetes' field names, defaults (an empty path is `/`, SetDefaults_HTTPGetAction) and enum spellings
(case-sensitive, as the API server takes them), the probe's timing fields (`periodSeconds` -> `period_ms`), and
the translation of probe_api.validation's errors (proto names, milliseconds) back into the API's words
(`spec.containers[0].readinessProbe.httpGet.port`, values in seconds).

Why here: three readers share it and must agree to the letter: `probectl apply` (probectl/manifest.py), the kubelet
bridge reading the JSON of a marker command (probe_api/bridge_command.py, in the daemon), and `probectl convert` and
the admission webhook, which validate each handler as the bridge will read it (probe_api/pod_conversion.py).

A value of the wrong type or an unknown field raises InvalidField naming its path; range and cross-field rules are
probe_api.validation's, which every reader applies after this.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.cli_names import GRPC_MODE_NAMES, HTTP_PROTOCOL_NAMES, enum_name
from probe_api.field_errors import FieldError
from probe_api.gostrings import go_quote
from probe_api.validation import port_name_errors

# Enum values as the API spells them (case-sensitive), and as probectl's flags take them.
SCHEMES = {"HTTP": spec_pb.HTTP, "HTTPS": spec_pb.HTTPS}
HTTP_PROTOCOLS = {name: spec_pb.HTTPProtocol.Value(enum_name(name)) for name in HTTP_PROTOCOL_NAMES}
GRPC_MODES = {name: spec_pb.GRPCProbeMode.Value(enum_name(name)) for name in GRPC_MODE_NAMES}

# core/v1 handler fields (1.32). Unknown ones are refused, as kubectl's strict field validation does: a typo such as
# `prot` would otherwise silently probe another port.
HANDLER_FIELDS: dict[str, frozenset[str]] = {
    "httpGet": frozenset({"path", "port", "host", "scheme", "httpHeaders", "protocol"}),
    "tcpSocket": frozenset({"port", "host"}),
    "grpc": frozenset({"port", "service", "mode"}),
    "exec": frozenset({"command"}),
}

# Probe field (Kubernetes name) -> (ProbeSpec field, milliseconds per unit, integer bits in Kubernetes).
TIMING = {
    "initialDelaySeconds": ("initial_delay_ms", 1000, 32),
    "timeoutSeconds": ("timeout_ms", 1000, 32),
    "periodSeconds": ("period_ms", 1000, 32),
    "successThreshold": ("success_threshold", 1, 32),
    "failureThreshold": ("failure_threshold", 1, 32),
    "terminationGracePeriodSeconds": ("termination_grace_period_ms", 1000, 64),
}

# ProbeSpec path segments -> Kubernetes names, for translating validation errors.
_K8S_NAMES = {"http_get": "httpGet", "tcp_socket": "tcpSocket", "http_headers": "httpHeaders",
              **{proto: k8s for k8s, (proto, _, _) in TIMING.items()}}
_MS_FIELDS = {proto for proto, per_unit, _ in TIMING.values() if per_unit == 1000}


class InvalidField(Exception):
    """One manifest error, naming its path; the probe (or object) it is in is not registered."""


def handler_spec(body: dict, path: str, ports: Sequence[spec_pb.ContainerPort]) -> spec_pb.ProbeSpec:
    """The handler fields of a core/v1 Probe or LifecycleHandler (`httpGet`, `tcpSocket`, `grpc`, `exec`) ->
    a ProbeSpec holding only them. `path` is where `body` sits ("" for the top); raises InvalidField."""
    spec = spec_pb.ProbeSpec()
    if body.get("httpGet") is not None:
        spec.http_get.CopyFrom(_http_get(body["httpGet"], _join(path, "httpGet"), ports))
    if body.get("tcpSocket") is not None:
        where = _join(path, "tcpSocket")
        action = mapping_at(body["tcpSocket"], where, HANDLER_FIELDS["tcpSocket"])
        spec.tcp_socket.port.CopyFrom(_port(action.get("port"), f"{where}.port", ports))
        spec.tcp_socket.host = string_at(action.get("host"), f"{where}.host")
    if body.get("grpc") is not None:
        where = _join(path, "grpc")
        action = mapping_at(body["grpc"], where, HANDLER_FIELDS["grpc"])
        spec.grpc.port = integer_at(action.get("port"), f"{where}.port", bits=32, required=True)
        if action.get("service") is not None:
            spec.grpc.service = string_at(action["service"], f"{where}.service")
        spec.grpc.mode = _choice(action.get("mode"), f"{where}.mode", GRPC_MODES, spec_pb.PLAINTEXT)
    if body.get("exec") is not None:
        where = _join(path, "exec")
        action = mapping_at(body["exec"], where, HANDLER_FIELDS["exec"])
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
    body = mapping_at(action, path, HANDLER_FIELDS["httpGet"])
    scheme = _choice(body.get("scheme"), f"{path}.scheme", SCHEMES, spec_pb.HTTP)
    out = spec_pb.HTTPGetAction(
        path=string_at(body.get("path"), f"{path}.path") or "/",  # SetDefaults_HTTPGetAction
        port=_port(body.get("port"), f"{path}.port", ports),
        host=string_at(body.get("host"), f"{path}.host"),
        scheme=scheme,
        protocol=_choice(body.get("protocol"), f"{path}.protocol", HTTP_PROTOCOLS, spec_pb.HTTP1))
    headers = body.get("httpHeaders") or []
    if not isinstance(headers, list):
        raise InvalidField(f"{path}.httpHeaders: Invalid value: {shown(headers)}: must be a list")
    for index, header in enumerate(headers):
        header_path = f"{path}.httpHeaders[{index}]"
        entry = mapping_at(header, header_path, frozenset({"name", "value"}))
        out.http_headers.add(name=string_at(entry.get("name"), f"{header_path}.name"),
                             value=string_at(entry.get("value"), f"{header_path}.value"))
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

def mapping_at(value: object, path: str, known: frozenset[str] | set[str]) -> dict:
    """`value` when it is a mapping of known fields only; InvalidField otherwise."""
    if not isinstance(value, dict):
        raise InvalidField(f"{path}: Invalid value: {shown(value)}: must be a mapping")
    unknown = sorted(str(key) for key in value if key not in known)
    if unknown:
        raise InvalidField(f"{path}: unknown field {go_quote(unknown[0])}")
    return value


def string_at(value: object, path: str) -> str:
    """A string field; "" when absent."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidField(f"{path}: Invalid value: {shown(value)}: must be a string")
    return value


def integer_at(value: object, path: str, *, bits: int, required: bool = False) -> int:
    """An integer field that fits the API's int32 or int64; 0 when absent and not required."""
    if value is None and not required:
        return 0
    if value is None:
        raise InvalidField(f"{path}: Required value")
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidField(f"{path}: Invalid value: {shown(value)}: must be an integer")
    if not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
        raise InvalidField(f"{path}: Invalid value: {value}: must fit in a {bits}-bit integer")
    return value


def shown(value: object) -> str:
    """A value as JSON, the way messages quote what the manifest holds."""
    return json.dumps(value, default=str, ensure_ascii=False)


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


def _rename(segment: str) -> str:
    name, bracket, index = segment.partition("[")
    return _K8S_NAMES.get(name, name) + bracket + index
