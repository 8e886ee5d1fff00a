"""What a watch of the status board (shim/state/board.py) is sent: its filter (sandbox, container, type, labels,
state), removals when a probe leaves the filter, attempts only when asked for. No sleeps: each test drives the board
and consumes the watch iterator; "nothing else was sent" is shown by a marker probe being the very next event."""

from __future__ import annotations

import asyncio

import pytest

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from shim.state.board import StatusBoard
from tests.support.board_watch import COMPLETE, SNAPSHOT, attempted, brief, next_event, probe, take, watch_request


def test_watch_filters_by_sandbox_container_type_and_labels():
    async def main():
        board = StatusBoard()
        board.put(probe("s1-c1-r", sandbox="s1", container="c1", probe_type=spec_pb.READINESS, labels={"team": "a"}))
        board.put(probe("s1-c2-l", sandbox="s1", container="c2", probe_type=spec_pb.LIVENESS, labels={"team": "b"}))
        board.put(probe("s2-c3-r", sandbox="s2", container="c3", probe_type=spec_pb.READINESS, labels={"team": "a"}))
        cases = {
            "sandbox": (dict(pod_sandbox_id="s1"), ["s1-c1-r", "s1-c2-l"]),
            "container": (dict(container_id="c2"), ["s1-c2-l"]),
            "type": (dict(type=spec_pb.READINESS), ["s1-c1-r", "s2-c3-r"]),
            "labels": (dict(label_selector={"team": "a"}), ["s1-c1-r", "s2-c3-r"]),
            "combined": (dict(pod_sandbox_id="s1", label_selector={"team": "a"}), ["s1-c1-r"]),
        }
        streams = {}
        for name, (fields, expected) in cases.items():
            stream = board.watch(watch_request(**fields))
            got = await take(stream, len(expected) + 1)
            assert [r.probe.probe_id for r in got[:-1]] == expected, name
            assert got[-1].type == COMPLETE, name
            streams[name] = stream
        # Live events go through the same filters.
        board.put(probe("s2-c4-l", sandbox="s2", container="c4", probe_type=spec_pb.LIVENESS, labels={"team": "b"}))
        board.remove("s1-c1-r")
        expected_live = {
            "sandbox": [("REMOVED", "s1-c1-r", 5)],
            "container": [],
            "type": [("REMOVED", "s1-c1-r", 5)],
            "labels": [("REMOVED", "s1-c1-r", 5)],
            "combined": [("REMOVED", "s1-c1-r", 5)],
        }
        for name, stream in streams.items():
            assert [brief(r) for r in await take(stream, len(expected_live[name]))] == expected_live[name], name
        # The marker matches only the unfiltered-by-sandbox watches; check the sandbox ones with their own marker.
        board.put(probe("marker-s1", sandbox="s1", container="c2", probe_type=spec_pb.READINESS, labels={"team": "a"}))
        for name in ("sandbox", "type", "labels", "combined"):
            assert brief(await next_event(streams[name]))[1] == "marker-s1", name
        board.put(probe("marker-c2", sandbox="s9", container="c2"))
        assert brief(await next_event(streams["container"]))[1] == "marker-s1"
        assert brief(await next_event(streams["container"]))[1] == "marker-c2"
        for stream in streams.values():
            await stream.aclose()
        assert board.watcher_count == 0

    asyncio.run(main())


def test_a_probe_whose_labels_leave_the_filter_is_removed_for_that_watcher():
    async def main():
        board = StatusBoard()
        board.put(probe("p1", labels={"team": "a"}))
        team_a = board.watch(watch_request(label_selector={"team": "a"}))
        everyone = board.watch(watch_request())
        assert [r.type for r in await take(team_a, 2)] == [SNAPSHOT, COMPLETE]
        assert [r.type for r in await take(everyone, 2)] == [SNAPSHOT, COMPLETE]
        board.put(probe("p1", labels={"team": "b"}))  # re-registered with other labels
        gone = await next_event(team_a)
        assert brief(gone) == ("REMOVED", "p1", 2) and dict(gone.probe.labels) == {"team": "a"}
        changed = await next_event(everyone)
        assert brief(changed) == ("UPDATED", "p1", 2) and dict(changed.probe.labels) == {"team": "b"}
        board.put(probe("p1", labels={"team": "a"}))  # and back: an update again
        assert brief(await next_event(team_a)) == ("UPDATED", "p1", 3)
        # Resuming replays the same view.
        resumed = board.watch(watch_request(instance_id=board.instance_id, since=1, label_selector={"team": "a"}))
        assert [brief(r) for r in await take(resumed, 2)] == [("REMOVED", "p1", 2), ("UPDATED", "p1", 3)]
        for stream in (team_a, everyone, resumed):
            await stream.aclose()

    asyncio.run(main())


def test_a_probe_that_leaves_a_watched_state_is_removed_for_that_watcher():
    async def main():
        board = StatusBoard()
        board.put(probe("p1"))
        failing = board.watch(watch_request(state=spec_pb.STATE_FAILURE))
        assert [r.type for r in await take(failing, 1)] == [COMPLETE]  # p1 is unknown, not failing
        board.update("p1", lambda p: setattr(p.status, "state", spec_pb.STATE_FAILURE))
        assert brief(await next_event(failing)) == ("UPDATED", "p1", 2)
        board.update("p1", lambda p: setattr(p.status, "state", spec_pb.STATE_SUCCESS))
        gone = await next_event(failing)
        assert brief(gone) == ("REMOVED", "p1", 3) and gone.probe.status.state == spec_pb.STATE_FAILURE
        await failing.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("container, matched", [
    ("app", ["p1", "p2"]), ("c1-0123456789", ["p1"]), ("c1-", ["p1"]), ("c1", []), ("", ["p1", "p2"]), ("db", []),
])
def test_a_container_filter_takes_a_name_an_id_or_an_id_prefix(container, matched):
    board = StatusBoard()
    board.put(probe("p1", container="c1-0123456789"))
    board.put(probe("p2", container="c2-9876543210"))
    assert [p.probe_id for p in board.list(service_pb.ProbeFilter(container=container))] == matched


def test_a_state_filter_of_unknown_is_not_an_unset_filter():
    board = StatusBoard()
    board.put(probe("p1"))
    board.put(probe("p2"))
    board.update("p2", lambda p: setattr(p.status, "state", spec_pb.STATE_SUCCESS))
    assert [p.probe_id for p in board.list(service_pb.ProbeFilter(state=spec_pb.STATE_UNKNOWN))] == ["p1"]
    assert len(board.list(service_pb.ProbeFilter())) == 2


def test_unsuccessful_attempts_only_reach_watchers_that_asked_for_them():
    async def main():
        board = StatusBoard()
        board.put(probe("p1", sandbox="s1"))
        unsuccessful = board.watch(watch_request(unsuccessful_attempts=True))
        await take(unsuccessful, 2)
        board.record_attempt("p1", attempted(spec_pb.RESULT_SUCCESS))  # a healthy attempt: nothing to send
        for result in (spec_pb.RESULT_FAILURE, spec_pb.RESULT_WARNING, spec_pb.RESULT_UNKNOWN):
            board.record_attempt("p1", attempted(result))
            event = await next_event(unsuccessful)
            assert brief(event) == ("ATTEMPT", "p1", 1) and event.probe.status.last_attempt.result == result
        board.put(probe("marker", sandbox="s1", container="m"))
        assert brief(await next_event(unsuccessful)) == ("UPDATED", "marker", 2), "no ATTEMPT for the success"
        await unsuccessful.aclose()

    asyncio.run(main())


def test_every_attempt_only_for_watchers_that_asked():
    async def main():
        board = StatusBoard()
        board.put(probe("p1", sandbox="s1"))
        board.put(probe("p2", sandbox="s2"))
        attempts = board.watch(watch_request(every_attempt=True, pod_sandbox_id="s1"))
        changes = board.watch(watch_request(pod_sandbox_id="s1"))
        await take(attempts, 2)
        await take(changes, 2)
        board.record_attempt("p1", attempted(spec_pb.RESULT_SUCCESS))
        board.record_attempt("p2", attempted(spec_pb.RESULT_SUCCESS))  # outside the filter
        event = await next_event(attempts)
        assert brief(event) == ("ATTEMPT", "p1", 2), "the current revision: an attempt does not bump it"
        assert event.probe.status.last_attempt.result == spec_pb.RESULT_SUCCESS and event.probe.status.totals.success == 1
        assert event.probe.revision == 1
        board.put(probe("marker", sandbox="s1", container="m"))
        assert brief(await next_event(attempts)) == ("UPDATED", "marker", 3)
        assert brief(await next_event(changes)) == ("UPDATED", "marker", 3), "no ATTEMPT before the marker"
        for stream in (attempts, changes):
            await stream.aclose()

    asyncio.run(main())
