"""What the kubelet's gRPC health probe decides outside the call itself, as pure functions (no I/O).

The kubelet (pkg/probe/grpc, 1.37) is a grpc-go 1.82 client: grpc.DialContext
with WithBlock, then one unary Health/Check. This module holds, as grpc-go and the
kubelet decide them: the request (headers, the framed HealthCheckRequest), the
bounds of an attempt, the dial's connection backoff (backoff/backoff.go,
internal/backoff, minConnectTimeout), and the kubelet's own output strings for the
call's result. grpc-timeout's text and the message prefix are gRPC's own, shared
with the daemon in probe_api/grpc_wire_rules.py. How what the server sends becomes
that result is probes/grpc/unary_call.py's; the HTTP/2 bytes are probes/grpc/wire.py's;
probes/grpc/executor.py does the I/O and applies these decisions.
"""

from __future__ import annotations

from collections.abc import Callable

from google.protobuf.message import DecodeError

from cri_proto import grpc_health_pb2 as health_pb
from probe_api.gostrings import go_duration, go_quote
from probe_api.grpc_wire_rules import encode_timeout, frame_message
from probe_api.grpc_codes import DEADLINE_EXCEEDED, INTERNAL, UNIMPLEMENTED, serving_status_of
from probe_worker.attempt import FAILURE, SUCCESS, Outcome
from probe_worker.go_errors import CONTEXT_DEADLINE
from probe_worker.probes.grpc.unary_call import RpcError

# google.golang.org/grpc version in kubelet 1.37.2's go.mod (1.35.4: 1.72.2); grpc-go appends
# "grpc-go/<version>" to every user agent, so servers see the pair.
GRPC_GO_VERSION = "1.82.1"

HEALTH_SERVICE = "grpc.health.v1.Health"
CHECK_PATH = f"/{HEALTH_SERVICE}/Check"

# Bounds of one probe attempt against a possibly hostile server (a message's is unary_call.MAX_MESSAGE_BYTES).
# grpc-go's own limit (16 MiB header lists) is far beyond what a probe may buffer.
MAX_HEADER_LIST_BYTES = 16 * 1024
MAX_READ_BYTES = 64 * 1024


# Connection backoff (grpc-go backoff.DefaultConfig) and minConnectTimeout.
BACKOFF_BASE_S = 1.0
BACKOFF_MULTIPLIER = 1.6
BACKOFF_JITTER = 0.2
BACKOFF_MAX_S = 120.0
MIN_CONNECT_TIMEOUT_S = 20.0


# ---------------------------------------------------------------- the request


def user_agent(kube_agent: str) -> str:
    return f"{kube_agent} grpc-go/{GRPC_GO_VERSION}"


def request_headers(authority: str, kube_agent: str, remaining_ns: int, tls: bool = False) -> list[tuple[str, str]]:
    """http2Client.createHeaderFields for a call with a deadline and no metadata."""
    return fixed_request_headers(authority, kube_agent, tls) + [("grpc-timeout", encode_timeout(remaining_ns))]


def fixed_request_headers(authority: str, kube_agent: str, tls: bool = False) -> list[tuple[str, str]]:
    """The request headers before grpc-timeout, the only one that changes from call to call. :scheme is https
    over TLS transport credentials (grpc-go's http2Client: "https" when the transport is secure)."""
    return [
        (":method", "POST"),
        (":scheme", "https" if tls else "http"),
        (":path", CHECK_PATH),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("user-agent", user_agent(kube_agent)),
        ("te", "trailers"),
    ]


# grpc-go's credentials/tls.go ClientHandshake, when the server selected no ALPN protocol (enforced by default since
# grpc-go 1.67, which kubelet 1.37 builds with); like any handshake failure, the dial retries until its deadline.
MISSING_ALPN = "credentials: cannot check peer: missing selected ALPN property"


def check_request(service: str) -> bytes:
    return frame_message(health_pb.HealthCheckRequest(service=service).SerializeToString())


# ---------------------------------------------------------------- backoff


def backoff_delay(retries: int, uniform: Callable[[], float]) -> float:
    """backoff.Exponential.Backoff, seconds; `uniform` is a [0, 1) random source.

    The first retry waits exactly the base delay: grpc-go applies no jitter to it.
    """
    if retries == 0:
        return BACKOFF_BASE_S
    delay = BACKOFF_BASE_S
    while delay < BACKOFF_MAX_S and retries > 0:
        delay *= BACKOFF_MULTIPLIER
        retries -= 1
    delay = min(delay, BACKOFF_MAX_S)
    delay *= 1 + BACKOFF_JITTER * (uniform() * 2 - 1)
    return max(delay, 0.0)


def connect_window(backoff: float) -> float:
    """How long one connection attempt (TCP + HTTP/2 preface) may take: resetTransport's dialDuration."""
    return max(MIN_CONNECT_TIMEOUT_S, backoff)


# ---------------------------------------------------------------- kubelet outputs


def serving_status_name(value: int) -> str:
    """protobuf-go enum String(): the name, or the number for values it does not know."""
    try:
        return health_pb.HealthCheckResponse.ServingStatus.Name(value)
    except ValueError:
        return str(value)


def check_outcome(result: bytes | RpcError, timeout_ns: int) -> Outcome:
    """The kubelet's verdict on the Check call (grpcProber.Probe after DialContext)."""
    if isinstance(result, RpcError):
        return Outcome(FAILURE, rpc_error_output(result, timeout_ns), grpc_code=result.code)
    try:
        response = health_pb.HealthCheckResponse.FromString(result)
    except DecodeError:
        # Go's proto.Unmarshal wording; protobuf-python's text differs.
        error = RpcError(INTERNAL, "grpc: failed to unmarshal the received message: proto: cannot parse invalid wire-format data")
        return check_outcome(error, timeout_ns)
    name = serving_status_name(response.status)
    serving = serving_status_of(response.status)
    if response.status != health_pb.HealthCheckResponse.SERVING:
        return Outcome(FAILURE, f"service unhealthy (responded with {go_quote(name)})", grpc_serving=serving)
    return Outcome(SUCCESS, "service healthy", grpc_serving=serving)


def rpc_error_output(error: RpcError, timeout_ns: int) -> str:
    if error.is_status and error.code == UNIMPLEMENTED:
        return f"error: this server does not implement the grpc health protocol ({HEALTH_SERVICE}): {error.message}"
    if error.is_status and error.code == DEADLINE_EXCEEDED:
        return f"timeout: health rpc did not complete within {go_duration(timeout_ns)}"
    return f"error: health rpc probe failed: {error.text()}"


def dial_timeout_output(target: str, timeout_ns: int) -> str:
    """DialContext with WithBlock gives up only when the probe deadline passes."""
    return f"timeout: failed to connect service {go_quote(target)} within {go_duration(timeout_ns)}: {CONTEXT_DEADLINE}"

