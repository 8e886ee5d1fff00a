"""The gRPC client's pure rules (client.py does the I/O): how an answer's statuses read, and grpc-timeout's text.

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
