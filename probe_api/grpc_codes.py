"""grpc-go's status codes as Go prints them (google.golang.org/grpc/codes, Code.String()).

The kubelet's gRPC probe output embeds these names (`rpc error: code = Unavailable desc = ...`), the worker produces
them, and the daemon reads them back for spans; one table for all.
"""

from __future__ import annotations

# grpc-go codes.Code values and their String() spelling.
OK, CANCELED, UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED, NOT_FOUND = 0, 1, 2, 3, 4, 5
ALREADY_EXISTS, PERMISSION_DENIED, RESOURCE_EXHAUSTED, FAILED_PRECONDITION = 6, 7, 8, 9
ABORTED, OUT_OF_RANGE, UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS = 10, 11, 12, 13, 14, 15
UNAUTHENTICATED = 16
CODE_NAMES = (
    "OK", "Canceled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound",
    "AlreadyExists", "PermissionDenied", "ResourceExhausted", "FailedPrecondition",
    "Aborted", "OutOfRange", "Unimplemented", "Internal", "Unavailable", "DataLoss",
    "Unauthenticated",
)


def code_name(code: int) -> str:
    """codes.Code.String(): the Go identifier, or Code(N) beyond the known ones."""
    return CODE_NAMES[code] if 0 <= code < len(CODE_NAMES) else f"Code({code})"
