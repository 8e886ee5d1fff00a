"""grpc-go's status codes as Go prints them (google.golang.org/grpc/codes, Code.String()).

The kubelet's gRPC probe output embeds these names (`rpc error: code = Unavailable desc = ...`), the worker produces
them, and the daemon reads them back for spans; one table for all.
"""

from __future__ import annotations

from cri_proto import probe_spec_pb2 as spec_pb

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


def serving_status_of(health_status: int) -> int:
    """grpc.health.v1 ServingStatus -> Attempt.grpc_serving_status (the same, one up: 0 means no answer)."""
    return health_status + 1


def attempt_grpc_status(attempt: spec_pb.Attempt) -> str:
    """For display: the code's Go name when the Check call failed, the serving status the service answered
    (as grpc.health.v1 names it), or "" for an attempt that has neither."""
    if attempt.HasField("grpc_code"):
        return code_name(attempt.grpc_code)
    return serving_status_text(attempt.grpc_serving_status)


def serving_status_text(serving_status: int) -> str:
    if not serving_status:
        return ""
    try:
        return spec_pb.GRPCServingStatus.Name(serving_status).removeprefix("GRPC_")
    except ValueError:  # an answer beyond the enum: protobuf-go prints the number
        return str(serving_status - 1)
