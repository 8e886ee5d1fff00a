"""What a call to the shim can end in, for a caller to act on: nobody answers (ShimUnavailable), an unknown probe or
sandbox (NotFoundError), the runtime behind the shim down (RuntimeUnavailableError), any other answer (ShimError).
Their texts are probectl's messages, one line each.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from cri_proto import probe_service_pb2 as service_pb

if TYPE_CHECKING:
    import grpc

ENDPOINT_ENV = "PROBE_SHIM_ENDPOINT"


class ShimUnavailable(Exception):
    """Nobody answers at the endpoint (no socket, nobody listening, connection lost, no permission)."""

    def __init__(self, endpoint: str, details: str = "", permission_denied: bool = False) -> None:
        self.endpoint = endpoint
        self.details = details
        if permission_denied:
            hint = "permission denied on its socket (run as root or as a member of the socket's group)"
        else:
            hint = ("is `probe-shim serve` running? "
                    f"(set -r/--runtime-endpoint or {ENDPOINT_ENV})")
        super().__init__(f"cannot reach the probe shim at {endpoint}: {hint}")


class ShimError(Exception):
    """The shim answered with an error; str() is `CODE: details` on one line. An INVALID_ARGUMENT carries its
    errors as data too (`violations`: FieldViolation messages naming each field)."""

    def __init__(self, code: grpc.StatusCode, details: str,
                 violations: Sequence[service_pb.FieldViolation] = ()) -> None:
        self.code = code
        self.details = details
        self.violations = list(violations)
        super().__init__(f"{code.name}: {_one_line(details)}")


class NotFoundError(ShimError):
    """An unknown probe id, sandbox or network namespace."""


class RuntimeUnavailableError(ShimError):
    """The shim is up but the container runtime behind it does not answer a proxied CRI call."""


def _one_line(text: str) -> str:
    return "; ".join(part.strip() for part in text.splitlines() if part.strip())
