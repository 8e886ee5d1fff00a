"""How an attempt counts, for the daemon, the worker and probectl alike: its worst-case duration (a caller's
deadline) and its place in the totals."""

from __future__ import annotations

from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.defaults import MAX_TRIES
from probe_api.validation import effective_timing


def longest_attempt_ms(spec: spec_pb.ProbeSpec) -> int:
    """How long one attempt of the spec may take in the worst case: every try to its timeout."""
    return MAX_TRIES * effective_timing(spec).timeout_ms


# An attempt's result -> its field of the totals (AttemptTotals).
_TOTAL_FIELD = {
    spec_pb.RESULT_SUCCESS: "success",
    spec_pb.RESULT_WARNING: "warning",
    spec_pb.RESULT_FAILURE: "failure",
    spec_pb.RESULT_UNKNOWN: "unknown",
}


def count_attempt(totals, result: int) -> None:
    """Adds one attempt to `totals` (an AttemptTotals, the daemon's or the worker's)."""
    field = _TOTAL_FIELD.get(result, "unknown")
    setattr(totals, field, getattr(totals, field) + 1)
