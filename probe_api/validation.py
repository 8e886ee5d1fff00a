"""Probe spec validation with Kubernetes API semantics, and the defaults the kubelet applies.

Owns: which ProbeSpecs are accepted (pkg/apis/core/validation validateProbe and its
liveness/readiness/startup wrappers, Kubernetes 1.32), the exact error strings
(field.Error.Error(): `<path>: <ErrorBody>`), and the effective timing after the
API server's defaulting (SetDefaults_Probe). Pure functions, no I/O.

Field paths use this project's proto names (spec.http_get.port), not the
Kubernetes JSON names (spec.httpGet.port): they name the fields the caller sent.

Our additions to the Kubernetes rules, each marked `# addition` below:
- exec handlers are rejected (the container runtime runs them, not us);
- period_ms below 10 and (effective) timeout_ms below 1 are rejected, because our
  durations are milliseconds where Kubernetes has whole seconds;
- header values containing CR, LF or NUL are rejected;
- unknown enum numbers (probe type, target, ip_family) are reported as unsupported;
- size limits on every string and list Kubernetes leaves unbounded, an upper bound on
  durations, and a path that must start with "/" (the MAX_* constants below); values
  echoed in messages are cut to MAX_ECHOED_BYTES (field_errors.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from cri_proto import probe_spec_pb2 as spec_pb

# core.HTTPProtocol (KEP-5999) and core.GRPCProbeMode (KEP-4939) values, already sorted as sets.List sorts them.
from probe_api.cli_names import GRPC_MODE_NAMES, HTTP_PROTOCOL_NAMES
from probe_api.field_errors import OMIT_VALUE, FieldError

# SetDefaults_Probe (pkg/apis/core/v1/defaults.go); 0 means "not set" in our proto.
DEFAULT_TIMEOUT_MS = 1_000
DEFAULT_PERIOD_MS = 10_000
DEFAULT_SUCCESS_THRESHOLD = 1
DEFAULT_FAILURE_THRESHOLD = 3

# addition: Kubernetes cannot go below 1 s. A probe loop faster than every 10 ms
# keeps a worker process (and the target) permanently busy: it burns a core.
MIN_PERIOD_MS = 10
# addition: a 0 ms deadline could never be met. Defaulting turns 0 into 1 s and
# negatives are already refused, so this only guards the defaults themselves.
MIN_TIMEOUT_MS = 1

# addition: limits. Every byte of a registration is held in memory, written to the
# store, sent to every watcher and may be echoed in an error message, and none of
# these fields has a bound in Kubernetes. Each limit is far above any real probe.
MAX_PATH_BYTES = 2048                 # a URL longer than this is refused by most servers anyway
MAX_HOST_BYTES = 253                  # the longest DNS name
MAX_HTTP_HEADERS = 64
MAX_HEADER_NAME_BYTES = 256
MAX_HEADER_VALUE_BYTES = 4096         # room for a bearer token
MAX_HEADERS_TOTAL_BYTES = 16384       # names and values together; servers commonly cap at 8-16 KiB
MAX_GRPC_SERVICE_BYTES = 1024
# The longest duration a Kubernetes Probe can hold (int32 seconds), in ms: anything the
# API server accepts is accepted here, and ms * 1e6 stays far inside int64 nanoseconds.
MAX_DURATION_MS = (2**31 - 1) * 1000

_HANDLER_FIELDS = ("exec", "http_get", "tcp_socket", "grpc")  # validateHandler's order
_PROBE_TYPE_NAMES = {spec_pb.LIVENESS: "LIVENESS", spec_pb.READINESS: "READINESS",
                     spec_pb.STARTUP: "STARTUP"}
_SCHEME_NAMES = ("HTTP", "HTTPS")  # sets.List(supportedHTTPSchemes): sorted

# k8s.io/apimachinery/pkg/util/validation texts.
_PORT_RANGE_MSG = "must be between 1 and 65535, inclusive"          # InclusiveRangeError(1, 65535)
_NEGATIVE_MSG = "must be greater than or equal to 0"                 # IsNegativeErrorMsg
_HEADER_NAME_FMT = "[-A-Za-z0-9]+"
_HEADER_NAME_MSG = ("a valid HTTP header must consist of alphanumeric characters or '-' "
                    f"(e.g. 'X-Header-Name', regex used for validation is '{_HEADER_NAME_FMT}')")
_HEADER_NAME_RE = re.compile(_HEADER_NAME_FMT)
_PORT_NAME_CHARSET_RE = re.compile("[-a-z0-9]+")
_PORT_NAME_LETTER_RE = re.compile("[a-z]")
_HEADER_VALUE_FORBIDDEN = ("\r", "\n", "\0")
# Go's url.Parse refuses these bytes (stringContainsCTLByte): such a probe could never run.
_CONTROL_RE = re.compile("[\x00-\x1f\x7f]")
_DURATION_FIELDS = ("initial_delay_ms", "timeout_ms", "period_ms")

_CONTROL_MSG = "must not contain control characters"
_MAX_DURATION_MSG = f"must be no more than {MAX_DURATION_MS} (2147483647 s, the most a Kubernetes probe can hold)"
_EXEC_DETAIL = "exec probes are run by the container runtime, not by cri-probe-shim"


@dataclass(frozen=True)
class Timing:
    initial_delay_ms: int
    period_ms: int
    timeout_ms: int
    success_threshold: int
    failure_threshold: int


def effective_timing(spec: spec_pb.ProbeSpec) -> Timing:
    """The timing the kubelet would run with: 0 means the Kubernetes default."""
    return Timing(
        initial_delay_ms=spec.initial_delay_ms,
        period_ms=spec.period_ms or DEFAULT_PERIOD_MS,
        timeout_ms=spec.timeout_ms or DEFAULT_TIMEOUT_MS,
        success_threshold=spec.success_threshold or DEFAULT_SUCCESS_THRESHOLD,
        failure_threshold=spec.failure_threshold or DEFAULT_FAILURE_THRESHOLD,
    )


def validate_probe(probe_type: int, spec: spec_pb.ProbeSpec, root: str = "spec") -> list[str]:
    """All errors as text, in Kubernetes order; an empty list means the probe may run."""
    return texts(probe_errors(probe_type, spec, root))


def texts(errors: Sequence[FieldError]) -> list[str]:
    """Errors for display: field.Error.Error() of each."""
    return [str(error) for error in errors]


def probe_errors(probe_type: int, spec: spec_pb.ProbeSpec, root: str = "spec") -> list[FieldError]:
    """All errors, structured, in Kubernetes order (validate_probe is the same as text)."""
    errors: list[FieldError] = []
    if probe_type == spec_pb.PROBE_TYPE_UNSPECIFIED:
        # The type sits beside the spec in every request, hence a path outside root.
        errors.append(FieldError.required("type"))
    elif probe_type not in _PROBE_TYPE_NAMES:  # addition
        errors.append(FieldError.not_supported("type", probe_type, tuple(_PROBE_TYPE_NAMES.values())))

    # validateProbe
    errors += _validate_handler(spec, root)
    for name in ("initial_delay_ms", "timeout_ms", "period_ms",
                 "success_threshold", "failure_threshold"):
        value = getattr(spec, name)
        if value < 0:
            errors.append(FieldError.invalid(f"{root}.{name}", value, _NEGATIVE_MSG))
        elif name in _DURATION_FIELDS and value > MAX_DURATION_MS:  # addition
            errors.append(FieldError.invalid(f"{root}.{name}", value, _MAX_DURATION_MSG))
    has_grace = spec.HasField("termination_grace_period_ms")
    if has_grace and spec.termination_grace_period_ms <= 0:
        errors.append(FieldError.invalid(f"{root}.termination_grace_period_ms",
                                         spec.termination_grace_period_ms, "must be greater than 0"))
    elif has_grace and spec.termination_grace_period_ms > MAX_DURATION_MS:  # addition
        errors.append(FieldError.invalid(f"{root}.termination_grace_period_ms",
                                         spec.termination_grace_period_ms, _MAX_DURATION_MSG))

    # validateLivenessProbe / validateStartupProbe / validateReadinessProbe. The API
    # server validates after defaulting, so an unset (0) success threshold is 1 here.
    timing = effective_timing(spec)
    if probe_type in (spec_pb.LIVENESS, spec_pb.STARTUP) and timing.success_threshold != 1:
        errors.append(FieldError.invalid(f"{root}.success_threshold",
                                         timing.success_threshold, "must be 1"))
    if probe_type == spec_pb.READINESS and has_grace:
        errors.append(FieldError.invalid(f"{root}.termination_grace_period_ms",
                                         spec.termination_grace_period_ms,
                                         "must not be set for readinessProbes"))

    # addition: millisecond floors. Negative values were reported above already.
    if spec.period_ms >= 0 and timing.period_ms < MIN_PERIOD_MS:
        errors.append(FieldError.invalid(f"{root}.period_ms", spec.period_ms,
                                         f"must be at least {MIN_PERIOD_MS}ms"))
    if spec.timeout_ms >= 0 and timing.timeout_ms < MIN_TIMEOUT_MS:
        errors.append(FieldError.invalid(f"{root}.timeout_ms", spec.timeout_ms,
                                         f"must be at least {MIN_TIMEOUT_MS}ms"))
    # addition: proto3 enums are open, an unknown number would reach the executors.
    errors += _validate_enum(f"{root}.target", spec.target, spec_pb.Target)
    errors += _validate_enum(f"{root}.ip_family", spec.ip_family, spec_pb.IPFamily)
    return errors


def port_name_errors(name: str) -> list[str]:
    """validation.IsValidPortName: an IANA_SVC_NAME (RFC 6335), lower case only."""
    errors = []
    if len(name) > 15:
        errors.append("must be no more than 15 characters")  # MaxLenError(15)
    if not _PORT_NAME_CHARSET_RE.fullmatch(name):
        errors.append("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)")
    if not _PORT_NAME_LETTER_RE.search(name):
        errors.append("must contain at least one letter (a-z)")
    if "--" in name:
        errors.append("must not contain consecutive hyphens")
    if name and (name[0] == "-" or name[-1] == "-"):
        errors.append("must not begin or end with a hyphen")
    return errors


def _validate_handler(spec: spec_pb.ProbeSpec, root: str) -> list[FieldError]:
    errors: list[FieldError] = []
    handlers = 0
    for name in _HANDLER_FIELDS:
        if not spec.HasField(name):
            continue
        path = f"{root}.{name}"
        if handlers:
            errors.append(FieldError.forbidden(path, "may not specify more than 1 handler type"))
            continue
        handlers += 1
        errors += _HANDLER_VALIDATORS[name](getattr(spec, name), path)
    if not handlers:
        errors.append(FieldError.required(root, "must specify a handler type"))
    return errors


def _validate_exec(_action: spec_pb.ExecAction, path: str) -> list[FieldError]:
    # addition: it still counts as the handler, so a second one is "Forbidden" as in Kubernetes.
    return [FieldError(FieldError.NOT_SUPPORTED, path, "exec", _EXEC_DETAIL)]


def _validate_http_get(action: spec_pb.HTTPGetAction, path: str) -> list[FieldError]:
    # An empty path is not "Required" here: the proto defaults it to "/".
    errors = _validate_port_ref(action.port, f"{path}.port")
    if action.scheme not in (spec_pb.HTTP, spec_pb.HTTPS):
        errors.append(FieldError.not_supported(f"{path}.scheme", action.scheme, _SCHEME_NAMES))
    errors += _validate_headers(action.http_headers, f"{path}.http_headers")
    errors += _validate_protocol(action, path)
    errors += _validate_url_path(action.path, f"{path}.path")  # addition
    errors += _validate_host(action.host, f"{path}.host")  # addition
    return errors


def _validate_protocol(action: spec_pb.HTTPGetAction, path: str) -> list[FieldError]:
    """validateHTTPGetAction's protocol rules (1.37, KEP-5999, pkg/apis/core/validation/validation.go): one error
    at most, after the headers' errors."""
    if action.protocol not in (spec_pb.HTTP1, spec_pb.HTTP2):
        return [FieldError.not_supported(f"{path}.protocol", action.protocol, HTTP_PROTOCOL_NAMES)]
    if action.protocol == spec_pb.HTTP2 and action.scheme != spec_pb.HTTP:
        return [FieldError.invalid(f"{path}.protocol", "HTTP2", "is only supported with HTTP (H2C)")]
    if action.protocol == spec_pb.HTTP2 and action.host:
        return [FieldError.invalid(f"{path}.host", action.host, 'must be empty when `protocol` is "HTTP2"')]
    return []


def _validate_headers(headers, path: str) -> list[FieldError]:
    if len(headers) > MAX_HTTP_HEADERS:  # addition; the items are not looked at
        return [FieldError.too_many(path, len(headers), MAX_HTTP_HEADERS)]
    errors = []
    total = 0
    for index, header in enumerate(headers):
        name_bytes, value_bytes = _utf8_len(header.name), _utf8_len(header.value)
        total += name_bytes + value_bytes
        if name_bytes > MAX_HEADER_NAME_BYTES:  # addition
            errors.append(FieldError.too_long(f"{path}[{index}].name", MAX_HEADER_NAME_BYTES))
        elif not _HEADER_NAME_RE.fullmatch(header.name):
            errors.append(FieldError.invalid(path, header.name, _HEADER_NAME_MSG))
        if value_bytes > MAX_HEADER_VALUE_BYTES:  # addition
            errors.append(FieldError.too_long(f"{path}[{index}].value", MAX_HEADER_VALUE_BYTES))
        elif any(char in header.value for char in _HEADER_VALUE_FORBIDDEN):
            # addition. The value itself is left out of the message: header values
            # carry credentials (Authorization) and these errors end up in logs.
            errors.append(FieldError.invalid(f"{path}[{index}].value", OMIT_VALUE,
                                             "must not contain CR, LF or NUL characters"))
    if total > MAX_HEADERS_TOTAL_BYTES:  # addition
        errors.append(FieldError.too_long(path, MAX_HEADERS_TOTAL_BYTES))
    return errors


def _validate_url_path(url_path: str, path: str) -> list[FieldError]:
    if _utf8_len(url_path) > MAX_PATH_BYTES:
        return [FieldError.too_long(path, MAX_PATH_BYTES)]
    errors = []
    if url_path and not url_path.startswith("/"):
        errors.append(FieldError.invalid(path, url_path, "must be an absolute path: start with '/'"))
    if _CONTROL_RE.search(url_path):
        errors.append(FieldError.invalid(path, url_path, _CONTROL_MSG))
    return errors


def _validate_host(host: str, path: str) -> list[FieldError]:
    if _utf8_len(host) > MAX_HOST_BYTES:
        return [FieldError.too_long(path, MAX_HOST_BYTES)]
    if _CONTROL_RE.search(host):
        return [FieldError.invalid(path, host, _CONTROL_MSG)]
    return []


def _validate_tcp_socket(action: spec_pb.TCPSocketAction, path: str) -> list[FieldError]:
    return _validate_port_ref(action.port, f"{path}.port") + _validate_host(action.host, f"{path}.host")


def _validate_grpc(action: spec_pb.GRPCAction, path: str) -> list[FieldError]:
    errors = _port_number_errors(action.port, f"{path}.port")
    if action.mode not in (spec_pb.PLAINTEXT, spec_pb.TLS):  # validateGRPCAction (1.37): NotSupported
        errors.append(FieldError.not_supported(f"{path}.mode", action.mode, GRPC_MODE_NAMES))
    if _utf8_len(action.service) > MAX_GRPC_SERVICE_BYTES:  # addition
        errors.append(FieldError.too_long(f"{path}.service", MAX_GRPC_SERVICE_BYTES))
    return errors


def _utf8_len(text: str) -> int:
    """Limits count bytes, as they go on the wire, not characters."""
    return len(text.encode("utf-8", "surrogatepass"))


_HANDLER_VALIDATORS = {
    "exec": _validate_exec,
    "http_get": _validate_http_get,
    "tcp_socket": _validate_tcp_socket,
    "grpc": _validate_grpc,
}


def _validate_port_ref(ref: spec_pb.PortRef, path: str) -> list[FieldError]:
    """ValidatePortNumOrName."""
    kind = ref.WhichOneof("port")
    if kind == "number":
        return _port_number_errors(ref.number, path)
    if kind == "name":
        return [FieldError.invalid(path, ref.name, msg) for msg in port_name_errors(ref.name)]
    # An IntOrString is never empty in Kubernetes; our oneof can be.
    return [FieldError.required(path)]


def _port_number_errors(number: int, path: str) -> list[FieldError]:
    if 1 <= number <= 65535:
        return []
    return [FieldError.invalid(path, number, _PORT_RANGE_MSG)]


def _validate_enum(path: str, value: int, enum) -> list[FieldError]:
    if value in enum.values():
        return []
    return [FieldError.not_supported(path, value, tuple(enum.keys()))]
