"""The gRPC client's pure rules (client.py does the I/O): how an answer's statuses read, and the reconnect backoff.
grpc-timeout's text is grpc-go's, the kubelet's own (probe_api/grpc_wire_rules.py encode_timeout).

The statuses are those grpc's clients give (doc/http-grpc-status-mapping.md, doc/statuscodes.md of grpc/grpc), checked
against grpcio's client in tests/unit/test_rpc_client_answers.py.
"""

from __future__ import annotations

import grpc

from probe_api.grpc_wire_rules import encode_timeout

# HTTP statuses that are not gRPC's answer, as grpc's clients map them (doc/http-grpc-status-mapping.md).
HTTP_STATUS_CODES = {b"400": grpc.StatusCode.INTERNAL, b"401": grpc.StatusCode.UNAUTHENTICATED,
                     b"403": grpc.StatusCode.PERMISSION_DENIED, b"404": grpc.StatusCode.UNIMPLEMENTED,
                     b"429": grpc.StatusCode.UNAVAILABLE, b"502": grpc.StatusCode.UNAVAILABLE,
                     b"503": grpc.StatusCode.UNAVAILABLE, b"504": grpc.StatusCode.UNAVAILABLE}
CODES = {code.value[0]: code for code in grpc.StatusCode}
# The kubelet's CRI client (k8s.io/cri-client remote_runtime.go): grpc-go's backoff.DefaultConfig with BaseDelay
# 100 ms and MaxDelay 3 s; multiplier 1.6 and jitter 0.2 are DefaultConfig's.
BACKOFF_BASE_S, BACKOFF_MULTIPLIER, BACKOFF_JITTER, BACKOFF_MAX_S = 0.1, 1.6, 0.2, 3.0


class CallError(Exception):
    """The call ended with a status other than OK (the runtime's, or the transport's)."""

    def __init__(self, code: grpc.StatusCode, details: str, initial_metadata=(), trailing_metadata=()) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code, self.details = code, details
        self.initial_metadata, self.trailing_metadata = tuple(initial_metadata), tuple(trailing_metadata)


def status_error(code_text: bytes | None, details: str) -> CallError | None:
    """The trailers' grpc-status as grpc's clients read it: None for OK."""
    if code_text is None:
        return CallError(grpc.StatusCode.UNKNOWN, "No status received")
    try:
        number = int(code_text)
    except ValueError:
        return CallError(grpc.StatusCode.INTERNAL, "Error parsing 'grpc-status' metadata")
    code = CODES.get(number, grpc.StatusCode.UNKNOWN)  # a number no client knows: UNKNOWN, the details kept
    return None if code is grpc.StatusCode.OK else CallError(code, details)


def timeout_text(timeout_s: float) -> bytes:
    """grpc-timeout for a timeout in seconds, as grpc-go writes it. Kept for shim/rpc/client.py, which sends it.
    Rounded to the nanosecond: float seconds carry no more, and rounding up would turn 0.067 s into 67000001n."""
    return encode_timeout(round(min(timeout_s, 1e10) * 1e9)).encode("ascii")  # 1e10 s is past a Go Duration


def backoff_s(failures: int, random: float) -> float:
    """The wait before trying again after `failures` failed connects in a row (grpc-go's backoff.Exponential);
    `random` in [0, 1) spreads it by the jitter."""
    delay = BACKOFF_BASE_S
    for _ in range(failures - 1):
        if delay >= BACKOFF_MAX_S:
            break
        delay *= BACKOFF_MULTIPLIER
    return min(delay, BACKOFF_MAX_S) * (1 + BACKOFF_JITTER * (random * 2 - 1))
