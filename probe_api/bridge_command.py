"""The kubelet bridge's marker command: the exec probe or exec hook that names the shim. Pure: no I/O, no grpc.

A kubelet runs an exec probe or an exec lifecycle hook by sending the runtime CRI ExecSync(container_id, cmd,
timeout). When cmd[0] is MARKER, the shim answers that call itself (shim/bridge/service.py): it runs the network
handler the rest of the command describes, inside the pod's network namespace. The command reads

    cri-probe-shim ROLE '{"httpGet":{"path":"/healthz","port":8080}}'   mechanical: what `probectl convert` writes
    cri-probe-shim ROLE --http-get :8080/healthz [--header 'N: v']...   hand-written: probectl's handler flags,
                                                [--http-protocol HTTP1|HTTP2]
    cri-probe-shim ROLE --tcp 8080                 also --grpc PORT [--service NAME] [--grpc-mode Plaintext|TLS]
    ... [--target pod-ip|loopback] [--ip-family primary|ipv4|ipv6|any]  after either form

ROLE is `liveness`, `readiness` or `startup` (kubelet probe semantics) or `postStart` or `preStop` (kubelet
lifecycle-hook semantics). The JSON is exactly one `httpGet`, `tcpSocket` or `grpc` object of a Pod spec, with
Kubernetes' field names (probe_api.manifest_handlers). The timeout is ExecSync's, which the kubelet sets from the probe's
timeoutSeconds (hooks get none, see service.py); period, thresholds and delays stay with the kubelet, which owns
them.

MARKER is a name no image carries: where the shim is not on the CRI path, the runtime fails to start it inside the
container, ExecSync ends in an error rather than an exit code, and the kubelet discards the result (readiness stays
not ready, liveness never restarts). That is the bridge's fail-closed default.

The kubelet expands `$(VAR)` in an exec probe's command from the container's static env
(kubecontainer.ExpandContainerCommandOnlyStatic) and turns `$$` into `$`; it does not for hooks. So `command_for`
writes every `$` of a probe's JSON as `$$`, which the kubelet's expansion turns back into exactly what was written.

Errors name the field in Kubernetes' words (`httpGet.port: Invalid value: 0: must be between 1 and 65535,
inclusive`), with RunProbe's validation plus the reader's `gate` (the daemon's: the `host` gate of
probe_api/request_rules.py).

Why in the contract: the grammar has a writer (`probectl convert`, and the admission webhook through
probe_api/pod_conversion.py) and a reader (the daemon's bridge, shim/bridge/command.py), and a command that one
writes the other must read exactly so; neither side imports the other.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.cli_names import MARKER
from probe_api.field_errors import FieldError
from probe_api.gostrings import go_quote
from probe_api.handler_flags import (
    IP_FAMILIES, PROBE_TYPES, TARGETS, SpecError, grpc_action, http_get_action, tcp_socket_action,
)
from probe_api.manifest_handlers import InvalidField, handler_spec, kubernetes_error
from probe_api.validation import probe_errors

PROBE_ROLES: dict[str, int] = PROBE_TYPES  # a probe's role is its kubelet probe name
HOOK_ROLES: tuple[str, ...] = ("postStart", "preStop")
ROLES: tuple[str, ...] = (*PROBE_ROLES, *HOOK_ROLES)
HANDLER_KEYS: tuple[str, ...] = ("httpGet", "tcpSocket", "grpc")
HOOK_HANDLER_KEYS: tuple[str, ...] = ("httpGet", "tcpSocket")  # core/v1 LifecycleHandler has no grpc

# What a reader refuses beyond RunProbe's validation, as errors of `spec.*` fields (the daemon's host gate).
Gate = Callable[[spec_pb.ProbeSpec], list[FieldError]]

_HANDLER_FLAGS = ("--http-get", "--tcp", "--grpc")
_REPEATABLE = frozenset({"--header"})
_FLAGS = frozenset({*_HANDLER_FLAGS, "--header", "--http-protocol", "--service", "--grpc-mode", "--target",
                    "--ip-family"})
_USAGE = (f"use {MARKER} ROLE '{{\"httpGet\":{{...}}}}' or {MARKER} ROLE --http-get|--tcp|--grpc ...; "
          f"ROLE is one of {', '.join(ROLES)}")


class BadArguments(ValueError):
    """The command cannot be run; `errors` name the argument or field, Kubernetes style."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("; ".join(self.errors))


@dataclass(frozen=True)
class BridgedCall:
    role: str                  # one of ROLES
    spec: spec_pb.ProbeSpec    # the handler, target, family and timeout; validated

    @property
    def is_hook(self) -> bool:
        return self.role in HOOK_ROLES

    @property
    def probe_type(self) -> int:
        """The probe type for validation and metrics; hooks validate as readiness (no threshold rule applies)."""
        return PROBE_ROLES.get(self.role, spec_pb.READINESS)


def is_marker(cmd: Sequence[str]) -> bool:
    return bool(cmd) and cmd[0] == MARKER


# --- writing (probectl convert) ---------------------------------------------------------------------------------

def command_for(role: str, handler: dict) -> list[str]:
    """The mechanical command for a handler object ({"httpGet": {...}}), escaped for the kubelet's expansion."""
    text = json.dumps(handler, separators=(",", ":"), ensure_ascii=False)
    if role in PROBE_ROLES:
        text = text.replace("$", "$$")
    return [MARKER, role, text]


def handler_in(command: Sequence[str]) -> tuple[str, dict] | None:
    """(role, handler object) of a mechanical marker command as `command_for` wrote it, else None."""
    if len(command) != 3 or command[0] != MARKER or command[1] not in ROLES:
        return None
    text = command[2]
    if command[1] in PROBE_ROLES:
        text = text.replace("$$", "$")
    try:
        handler = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(handler, dict) or len(handler) != 1 or next(iter(handler)) not in HANDLER_KEYS:
        return None
    return command[1], handler


# --- reading (the daemon; convert, to say what the daemon will say) ---------------------------------------------

def parse_command(cmd: Sequence[str], *, ports: Sequence[spec_pb.ContainerPort], timeout_ms: int,
                  gate: Gate) -> BridgedCall:
    """The call a marker command asks for, validated as RunProbe validates and by `gate`; raises BadArguments."""
    if not is_marker(cmd):
        raise BadArguments([f"command: must start with {MARKER}"])
    if len(cmd) < 3:
        raise BadArguments([f"command: Required value: {_USAGE}"])
    role, rest = cmd[1], list(cmd[2:])
    if role not in ROLES:
        raise BadArguments([f"role: Unsupported value: {go_quote(role)}: supported values: "
                            f"{', '.join(go_quote(r) for r in ROLES)}"])
    if rest[0].lstrip()[:1] in ("{", "["):
        spec = _json_handler(rest[0], role, ports)
        flags = _flags(rest[1:])
        if handler_flags := [name for name in (*_HANDLER_FLAGS, "--header", "--http-protocol", "--service",
                                               "--grpc-mode") if name in flags]:
            raise BadArguments([f"{handler_flags[0]}: Forbidden: the JSON argument gives the handler whole "
                                "(headers in httpGet.httpHeaders, the protocol in httpGet.protocol, the service "
                                "in grpc.service, the mode in grpc.mode)"])
    else:
        flags = _flags(rest)
        spec = _flag_handler(flags, role)
    _apply_placement(spec, flags)
    spec.timeout_ms = timeout_ms
    call = BridgedCall(role, spec)
    errors = [_argument_path(str(kubernetes_error(error, "spec")))
              for error in probe_errors(call.probe_type, spec, root="spec") + gate(spec)]
    if errors:
        raise BadArguments(errors)
    if errors := _named_port_errors(spec, ports):  # only for names that are valid: one error per field
        raise BadArguments(errors)
    return call


def _argument_path(error: str) -> str:
    """`spec.httpGet.port: ...` -> `httpGet.port: ...`; an error of the whole spec is the handler's."""
    if error.startswith("spec: "):
        return "handler: " + error.removeprefix("spec: ")
    return error.removeprefix("spec.")


def _json_handler(text: str, role: str, ports: Sequence[spec_pb.ContainerPort]) -> spec_pb.ProbeSpec:
    try:
        handler = json.loads(text, object_pairs_hook=_without_duplicates)
    except ValueError as exc:
        raise BadArguments([f"handler: not valid JSON: {exc}"]) from None
    except RecursionError:  # nesting deeper than the interpreter's stack: no handler is like that
        raise BadArguments(["handler: not valid JSON: nested too deeply"]) from None
    allowed = HOOK_HANDLER_KEYS if role in HOOK_ROLES else HANDLER_KEYS
    if not isinstance(handler, dict):
        raise BadArguments([f"handler: Invalid value: must be an object with one of {', '.join(allowed)}"])
    unknown = sorted(str(key) for key in handler if key not in allowed)
    if unknown:
        kind = "lifecycle hook" if role in HOOK_ROLES else "probe"
        raise BadArguments([f"handler: unknown field {go_quote(unknown[0])}: a {kind} handler is one of "
                            f"{', '.join(allowed)}"])
    # Two handlers are left to validation, which words it as the API server does.
    try:
        return handler_spec(handler, "", ports)
    except InvalidField as exc:
        raise BadArguments([str(exc)]) from None


def _without_duplicates(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object whose key repeats is refused: which value Go's decoder keeps is not what the writer meant."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {go_quote(key)}")
        out[key] = value
    return out


def _flags(tokens: Sequence[str]) -> dict[str, list[str]]:
    """`--name value` and `--name=value` pairs, by name, in order; every flag takes a value."""
    out: dict[str, list[str]] = {}
    index = 0
    while index < len(tokens):
        token = tokens[index]
        name, equals, value = token.partition("=")
        if name not in _FLAGS:
            raise BadArguments([f"unknown argument {go_quote(token)}: {_USAGE}"])
        if not equals:
            if index + 1 >= len(tokens):
                raise BadArguments([f"{name}: Required value: the flag needs a value"])
            index += 1
            value = tokens[index]
        if name in out and name not in _REPEATABLE:
            raise BadArguments([f"{name}: Duplicate value: given more than once"])
        out.setdefault(name, []).append(value)
        index += 1
    return out


def _flag_handler(flags: dict[str, list[str]], role: str) -> spec_pb.ProbeSpec:
    given = [name for name in _HANDLER_FLAGS if name in flags]
    if len(given) != 1:
        raise BadArguments([f"handler: Required value: exactly one of {', '.join(_HANDLER_FLAGS)} ({_USAGE})"])
    name, value = given[0], flags[given[0]][0]
    for http_only in ("--header", "--http-protocol"):
        if http_only in flags and name != "--http-get":
            raise BadArguments([f"{http_only}: Forbidden: only with --http-get"])
    for grpc_only in ("--service", "--grpc-mode"):
        if grpc_only in flags and name != "--grpc":
            raise BadArguments([f"{grpc_only}: Forbidden: only with --grpc"])
    if name == "--grpc" and role in HOOK_ROLES:
        raise BadArguments(["--grpc: Forbidden: a lifecycle hook handler is httpGet or tcpSocket"])
    spec = spec_pb.ProbeSpec()
    try:
        if name == "--http-get":
            spec.http_get.CopyFrom(http_get_action(value, flags.get("--header", ()),
                                                   flags.get("--http-protocol", [None])[0]))
        elif name == "--tcp":
            spec.tcp_socket.CopyFrom(tcp_socket_action(value))
        else:
            spec.grpc.CopyFrom(grpc_action(value, flags.get("--service", [None])[0],
                                           flags.get("--grpc-mode", [None])[0]))
    except SpecError as exc:
        raise BadArguments([str(exc)]) from None
    return spec


def _apply_placement(spec: spec_pb.ProbeSpec, flags: dict[str, list[str]]) -> None:
    for flag, table, field in (("--target", TARGETS, "target"), ("--ip-family", IP_FAMILIES, "ip_family")):
        if flag not in flags:
            continue
        value = flags[flag][0]
        if value not in table:
            raise BadArguments([f"{flag}: Unsupported value: {go_quote(value)}: supported values: "
                                f"{', '.join(go_quote(name) for name in table)}"])
        setattr(spec, field, table[value])


def _named_port_errors(spec: spec_pb.ProbeSpec, ports: Sequence[spec_pb.ContainerPort]) -> list[str]:
    """A port name the container does not declare: the kubelet could not resolve it either."""
    names = [port.name for port in ports if port.name]
    known = f"the container's named ports are {', '.join(go_quote(n) for n in names)}" if names else \
        "the container declares no named port"
    for field, ref in (("httpGet.port", spec.http_get.port), ("tcpSocket.port", spec.tcp_socket.port)):
        if ref.WhichOneof("port") == "name" and ref.name not in names:
            return [f"{field}: unknown named port {go_quote(ref.name)}: {known}"]
    return []
