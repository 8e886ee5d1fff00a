"""The command-line syntax of a handler -> ProbeSpec parts. Pure: no I/O, no grpc.

Owns: `--http-get [SCHEME://][HOST:]PORT[/PATH[?QUERY]]`, `--header 'Name: value'`, `--http-protocol`, `--tcp
[HOST:]PORT`, `--grpc PORT` with `--service` and `--grpc-mode`, and the names of `--type`, `--target` and
`--ip-family`. Bad input raises SpecError (a ValueError) whose message is one line naming the flag and the input.

Why here: two sides read the same flags and must agree: probectl's `run` and `exec` (probectl/cli.py), and the
hand-written form of the kubelet bridge's marker command (`cri-probe-shim readiness --http-get :8080/healthz`,
probe_api/bridge_command.py), which the daemon reads. Range and cross-field rules (port 1-65535 aside) are
probe_api.validation's, applied to every spec after this.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence

from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.cli_names import IP_FAMILY_NAMES, PROBE_TYPE_NAMES, TARGET_NAMES, enum_name
from probe_api.gostrings import go_quote
from probe_api.manifest_handlers import GRPC_MODES, HTTP_PROTOCOLS
from probe_api.validation import port_name_errors

# The kubelet's probe names, as `--type` and the bridge's ROLE spell them; placement names (probe_api.cli_names).
PROBE_TYPES = {name: spec_pb.ProbeType.Value(enum_name(name)) for name in PROBE_TYPE_NAMES}
TARGETS = {name: spec_pb.Target.Value(enum_name(name)) for name in TARGET_NAMES}
IP_FAMILIES = {name: spec_pb.IPFamily.Value(enum_name(name)) for name in IP_FAMILY_NAMES}
URL_SCHEMES = {"http": spec_pb.HTTP, "https": spec_pb.HTTPS}  # any case in a URL, as Go's url.Parse takes them

_DIGITS_RE = re.compile(r"[0-9]+")  # ASCII only: str.isdigit() also takes "²", which int() refuses
_SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


class SpecError(argparse.ArgumentTypeError, ValueError):
    """Bad probe syntax. An ArgumentTypeError too, so that argparse `type=` functions print the message as is
    (`argument --period: invalid duration "5x": ...`) instead of a generic "invalid value"."""


def is_digits(text: str) -> bool:
    return _DIGITS_RE.fullmatch(text) is not None


def http_get_action(target: str, headers: Sequence[str] = (), protocol: str | None = None) -> spec_pb.HTTPGetAction:
    """`[SCHEME://][HOST:]PORT[/PATH[?QUERY]]` and `Name: value` headers -> HTTPGetAction.

    The scheme is http or https (any case), the port a number or a container port name, the path "/" when
    omitted; path and query are kept verbatim (the worker sends them as written, like the kubelet). protocol is
    httpGet.protocol's value, HTTP1 (the default) or HTTP2 (h2c, KEP-5999).
    """
    flag = "--http-get"
    rest = target.strip()
    scheme = spec_pb.HTTP
    if _SCHEME_RE.match(rest):
        name, _, rest = rest.partition("://")
        if name.lower() not in URL_SCHEMES:
            raise SpecError(f"{flag} {go_quote(target)}: unsupported scheme {go_quote(name)}: use http or https")
        scheme = URL_SCHEMES[name.lower()]
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    host_port, path = rest[:cut], rest[cut:]
    if path.startswith("?"):
        path = "/" + path
    host, port = _host_port(host_port, flag, target)
    action = spec_pb.HTTPGetAction(path=path or "/", port=port, host=host, scheme=scheme)
    if protocol is not None:
        action.protocol = _choice("--http-protocol", protocol, HTTP_PROTOCOLS)
    for header in headers:
        name, value = parse_header(header)
        action.http_headers.add(name=name, value=value)
    return action


def parse_header(text: str) -> tuple[str, str]:
    """`Name: value` -> (name, value); the value may be empty (`User-Agent:` removes that header, as in Kubernetes)."""
    name, colon, value = text.partition(":")
    if not colon:
        raise SpecError(f"--header {go_quote(text)}: use 'Name: value'")
    if not name.strip():
        raise SpecError(f"--header {go_quote(text)}: empty header name; use 'Name: value'")
    return name.strip(), value.strip()


def tcp_socket_action(target: str) -> spec_pb.TCPSocketAction:
    """`[HOST:]PORT` (the port may be a container port name) -> TCPSocketAction."""
    host, port = _host_port(target.strip(), "--tcp", target)
    return spec_pb.TCPSocketAction(port=port, host=host)


def grpc_action(port: str, service: str | None = None, mode: str | None = None) -> spec_pb.GRPCAction:
    """gRPC probes take a port number only (Kubernetes' GRPCAction.port is an int32, not a name); mode is
    grpc.mode's value, Plaintext (the default) or TLS (KEP-4939)."""
    text = port.strip()
    if not is_digits(text):
        raise SpecError(f"--grpc {go_quote(port)}: the port must be a number (gRPC probes take no named ports)")
    action = spec_pb.GRPCAction(port=_port_number(text, "--grpc", port))
    if service is not None:
        action.service = service
    if mode is not None:
        action.mode = _choice("--grpc-mode", mode, GRPC_MODES)
    return action


def _choice(flag: str, value: str, choices: dict[str, int]) -> int:
    """An enum flag spelled as the API spells its values (case-sensitive)."""
    if value not in choices:
        raise SpecError(f"{flag} {go_quote(value)}: supported values: {', '.join(go_quote(c) for c in choices)}")
    return choices[value]


def _host_port(text: str, flag: str, whole: str) -> tuple[str, spec_pb.PortRef]:
    """`[HOST:]PORT` with IPv6 hosts in brackets -> (host without brackets, PortRef)."""
    if text.startswith("["):
        host, bracket, port = text[1:].partition("]")
        if not bracket or not port.startswith(":"):
            raise SpecError(f"{flag} {go_quote(whole)}: use [IPV6]:PORT for an IPv6 host")
        return host, _port_ref(port[1:], flag, whole)
    if text.count(":") > 1:
        raise SpecError(f"{flag} {go_quote(whole)}: put an IPv6 host in brackets, e.g. [::1]:8080")
    host, _, port = text.rpartition(":")
    return host, _port_ref(port, flag, whole)


def _port_ref(text: str, flag: str, whole: str) -> spec_pb.PortRef:
    if not text:
        raise SpecError(f"{flag} {go_quote(whole)}: missing port")
    if is_digits(text):
        return spec_pb.PortRef(number=_port_number(text, flag, whole))
    problems = port_name_errors(text)
    if problems:
        raise SpecError(f"{flag} {go_quote(whole)}: port {go_quote(text)} is neither a number nor a valid "
                        f"port name: {problems[0]}")
    return spec_pb.PortRef(name=text)


def _port_number(text: str, flag: str, whole: str) -> int:
    number = int(text)
    if not 1 <= number <= 65535:
        raise SpecError(f"{flag} {go_quote(whole)}: port {text} is out of range 1-65535")
    return number
