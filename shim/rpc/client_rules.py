"""The gRPC client's pure rules (client.py does the I/O): how an answer's statuses read, grpc-timeout's text, and
the reconnect backoff.

The statuses are those grpc's clients give (doc/http-grpc-status-mapping.md, doc/statuscodes.md of grpc/grpc), checked
against grpcio's client in tests/unit/test_grpc_client_answers.py.
"""

from __future__ import annotations

import math

import grpc

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
    """grpc-timeout: the finest unit whose count fits in 8 digits, rounded up."""
    for unit, seconds in ((b"u", 1e-6), (b"m", 1e-3), (b"S", 1.0), (b"M", 60.0), (b"H", 3600.0)):
        count = math.ceil(max(timeout_s, 0.0) / seconds)
        if count < 100_000_000:
            return b"%d%s" % (max(count, 1), unit)
    return b"99999999H"


def backoff_s(failures: int, random: float) -> float:
    """The wait before trying again after `failures` failed connects in a row (grpc-go's backoff.Exponential);
    `random` in [0, 1) spreads it by the jitter."""
    delay = BACKOFF_BASE_S
    for _ in range(failures - 1):
        if delay >= BACKOFF_MAX_S:
            break
        delay *= BACKOFF_MULTIPLIER
    return min(delay, BACKOFF_MAX_S) * (1 + BACKOFF_JITTER * (random * 2 - 1))
