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


@dataclass
class PhaseRecord:
    name: str
    start_ns: int
    duration_ns: int = 0
    detail: str = ""
    error: str = ""
    children: list["PhaseRecord"] = field(default_factory=list)

    def to_proto(self, origin_ns: int) -> spec_pb.Phase:
        return spec_pb.Phase(
            name=self.name,
            start_offset_ns=self.start_ns - origin_ns,
            duration_ns=self.duration_ns,
            detail=self.detail,
            error=self.error,
            children=[c.to_proto(origin_ns) for c in self.children],
        )


class Trace:
    """Records named phases; `sub()` opens a nested trace (e.g. one redirect hop)."""

    def __init__(self, clock: Callable[[], int] = time.monotonic_ns, origin_ns: int | None = None) -> None:
        self._clock = clock
        self.origin_ns = clock() if origin_ns is None else origin_ns
        self.phases: list[PhaseRecord] = []

    @contextmanager
    def phase(self, name: str, detail: str = "") -> Iterator[PhaseRecord]:
        record = PhaseRecord(name=name, start_ns=self._clock(), detail=detail)
        self.phases.append(record)
        try:
            yield record
        except BaseException as exc:
            # Cancellation by the attempt deadline is the common case here.
            record.error = record.error or _describe(exc)
            raise
        finally:
            record.duration_ns = self._clock() - record.start_ns

    @contextmanager
    def sub(self, name: str, detail: str = "") -> Iterator["Trace"]:
        """A phase whose children are recorded by the yielded Trace."""
        with self.phase(name, detail) as record:
            child = Trace(self._clock, self.origin_ns)
            child.phases = record.children
            yield child

    def to_proto(self) -> list[spec_pb.Phase]:
        return [p.to_proto(self.origin_ns) for p in self.phases]


def _describe(exc: BaseException) -> str:
    if isinstance(exc, (TimeoutError,)) or type(exc).__name__ == "CancelledError":
        return "deadline exceeded"
    return str(exc) or type(exc).__name__
