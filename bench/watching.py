"""Watching the daemon from the benchmark: a WatchProbeStatus stream read in a thread, and the
state-change latency derived from its events (the latter pure)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import grpc

from cri_proto import probe_service_pb2 as service_pb

JOIN_TIMEOUT_S = 10.0


class StateChanges:
    """Turns watch events into "state changed" latencies: from the end of the attempt that
    changed the state (started_at + duration, the worker's wall clock) to the watcher
    receiving the event (the watcher's wall clock; same machine, same clock).

    A probe's first sighting (snapshot or registration) sets its state without counting.
    Events that do not change the state (a worker status update, say) are ignored.
    """

    def __init__(self) -> None:
        self.states: dict[str, int] = {}

    def observe(self, probe_id: str, state: int, attempt_end_ns: int, received_ns: int) -> float | None:
        """Milliseconds from attempt end to receipt when this event changes the probe's state, else None."""
        previous = self.states.get(probe_id)
        self.states[probe_id] = state
        if previous is None or previous == state or attempt_end_ns <= 0:
            return None
        return (received_ns - attempt_end_ns) / 1e6


def attempt_end_ns(probe: service_pb.Probe) -> int:
    attempt = probe.status.last_attempt
    return attempt.started_at_unix_ns + attempt.duration_ns if attempt.started_at_unix_ns else 0


class WatchThread:
    """Reads one watch stream in a daemon thread and hands every event, with the wall-clock
    time it was received, to `on_event` (which runs in that thread)."""

    def __init__(self, stub, request: service_pb.WatchProbeStatusRequest,
                 on_event: Callable[[int, service_pb.WatchProbeStatusResponse], None]) -> None:
        self.on_event = on_event
        self.error: str | None = None
        self.resyncs = 0
        self.stream = stub.WatchProbeStatus(request)
        self.thread = threading.Thread(target=self._run, name="bench-watch", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for event in self.stream:
                received = time.time_ns()
                if event.type == service_pb.RESYNC:
                    self.resyncs += 1
                self.on_event(received, event)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                self.error = f"{exc.code().name}: {exc.details()}"

    def stop(self) -> None:
        self.stream.cancel()
        self.thread.join(JOIN_TIMEOUT_S)
