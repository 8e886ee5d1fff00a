"""Per-phase timings of one attempt, in the spirit of blackbox_exporter.

The worker reports phases as data (offsets from the attempt start); the daemon
turns them into OpenTelemetry spans, so no tracing SDK is loaded in the worker.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from cri_proto import probe_spec_pb2 as spec_pb

# A detail or error may quote the target (a redirect URL of up to 64 KiB); ten hops of those
# would overflow the worker's 1 MiB frame and lose the attempt. Cut each one to this size.
MAX_PHASE_TEXT_CHARS = 1024


@dataclass
class PhaseRecord:
    name: str
    start_ns: int
    duration_ns: int = 0
    detail: str = ""
    error: str = ""
    children: list["PhaseRecord"] = field(default_factory=list)

    def to_proto(self, origin_ns: int) -> spec_pb.Phase:
        phase = spec_pb.Phase(
            name=self.name,
            start_offset_ns=self.start_ns - origin_ns,
            duration_ns=self.duration_ns,
            # Inline length checks: most texts are short, and two calls per phase add up (4 phases per attempt).
            detail=self.detail if len(self.detail) <= MAX_PHASE_TEXT_CHARS else _clip(self.detail),
            error=self.error if len(self.error) <= MAX_PHASE_TEXT_CHARS else _clip(self.error),
        )
        if self.children:
            phase.children.extend(c.to_proto(origin_ns) for c in self.children)
        return phase


class _PhaseScope:
    """The context manager of Trace.phase: a class rather than @contextmanager, whose
    generator costs more than the phase's own bookkeeping, several times per attempt."""

    __slots__ = ("_clock", "_record")

    def __init__(self, clock: Callable[[], int], record: PhaseRecord) -> None:
        self._clock = clock
        self._record = record

    def __enter__(self) -> PhaseRecord:
        return self._record

    def __exit__(self, exc_type, exc: BaseException | None, tb) -> bool:
        record = self._record
        if exc is not None:
            # Cancellation by the attempt deadline is the common case here.
            record.error = record.error or _describe(exc)
        record.duration_ns = self._clock() - record.start_ns
        return False


class Trace:
    """Records named phases; `sub()` opens a nested trace (e.g. one redirect hop)."""

    def __init__(self, clock: Callable[[], int] = time.monotonic_ns, origin_ns: int | None = None) -> None:
        self._clock = clock
        self.origin_ns = clock() if origin_ns is None else origin_ns
        self.phases: list[PhaseRecord] = []

    def phase(self, name: str, detail: str = "") -> _PhaseScope:
        """`with trace.phase(...) as record:` times the block; an exception leaving it is its error."""
        record = PhaseRecord(name=name, start_ns=self._clock(), detail=detail)
        self.phases.append(record)
        return _PhaseScope(self._clock, record)

    @contextmanager
    def sub(self, name: str, detail: str = "") -> Iterator["Trace"]:
        """A phase whose children are recorded by the yielded Trace."""
        with self.phase(name, detail) as record:
            child = Trace(self._clock, self.origin_ns)
            child.phases = record.children
            yield child

    def to_proto(self) -> list[spec_pb.Phase]:
        return [p.to_proto(self.origin_ns) for p in self.phases]


def _clip(text: str) -> str:
    return text if len(text) <= MAX_PHASE_TEXT_CHARS else text[:MAX_PHASE_TEXT_CHARS] + "..."


def _describe(exc: BaseException) -> str:
    if isinstance(exc, (TimeoutError,)) or type(exc).__name__ == "CancelledError":
        return "deadline exceeded"
    return str(exc) or type(exc).__name__
