"""Driving the status board (shim/state/board.py) and reading its watch, for the board's tests
(tests/unit/test_board*.py): probes and watch requests built here, watch events read with a bound (a missing event
fails the test instead of hanging it), and a marker probe whose arrival as the very next event shows that nothing
else was sent."""

from __future__ import annotations

import asyncio

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from shim.state.board import StatusBoard

SNAPSHOT, COMPLETE = service_pb.SNAPSHOT, service_pb.SNAPSHOT_COMPLETE
UPDATED, REMOVED, ATTEMPT, RESYNC = service_pb.UPDATED, service_pb.REMOVED, service_pb.ATTEMPT, service_pb.RESYNC
MARKER_SANDBOX = "sb-marker"
EVENT_WAIT_S = 5.0


def probe(probe_id: str, sandbox: str = "sb1", container: str = "c1", probe_type: int = spec_pb.READINESS,
          labels: dict[str, str] | None = None) -> service_pb.Probe:
    return service_pb.Probe(probe_id=probe_id, pod_sandbox_id=sandbox, container_id=container, type=probe_type,
                            container_name="app", labels=labels or {}, spec=spec_pb.ProbeSpec(period_ms=1000))


def watch_request(instance_id: str = "", since: int = 0, every_attempt: bool = False,
                  unsuccessful_attempts: bool = False, **filter_fields) -> service_pb.WatchProbeStatusRequest:
    return service_pb.WatchProbeStatusRequest(filter=service_pb.ProbeFilter(**filter_fields), instance_id=instance_id,
                                              since_revision=since, every_attempt=every_attempt,
                                              unsuccessful_attempts=unsuccessful_attempts)


def brief(response: service_pb.WatchProbeStatusResponse) -> tuple[str, str, int]:
    return (service_pb.WatchEventType.Name(response.type), response.probe.probe_id, response.revision)


async def next_event(stream) -> service_pb.WatchProbeStatusResponse:
    """The next response; bounded so that a missing event fails the test instead of hanging it."""
    return await asyncio.wait_for(anext(stream), EVENT_WAIT_S)


async def take(stream, count: int) -> list[service_pb.WatchProbeStatusResponse]:
    return [await next_event(stream) for _ in range(count)]


async def expect_only_marker_next(board: StatusBoard, stream, marker_id: str = "marker") -> None:
    """Puts a marker every watch here sees; the next event must be it, so nothing was queued before it."""
    revision = board.put(probe(marker_id, sandbox=MARKER_SANDBOX, labels={"team": "a", "marker": "yes"}))
    assert brief(await next_event(stream)) == ("UPDATED", marker_id, revision)


def attempted(result: int):
    def apply(p: service_pb.Probe) -> None:
        p.status.last_attempt.CopyFrom(spec_pb.Attempt(result=result, output="out"))
        p.status.totals.success += 1
        p.status.consecutive_successes += 1
    return apply
