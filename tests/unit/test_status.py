"""The status board and its resumable, revisioned watch.

No sleeps: each test drives the board and consumes the watch iterator. "Nothing else was sent" is shown by putting
a marker probe and checking it is the very next event.
"""

from __future__ import annotations

import asyncio

import pytest

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from shim.state.board import Change, StatusBoard, changes_since, matches, replay_responses, snapshot_responses

SNAPSHOT, COMPLETE = service_pb.SNAPSHOT, service_pb.SNAPSHOT_COMPLETE
UPDATED, REMOVED, ATTEMPT, RESYNC = service_pb.UPDATED, service_pb.REMOVED, service_pb.ATTEMPT, service_pb.RESYNC
MARKER_SANDBOX = "sb-marker"
EVENT_WAIT_S = 5.0


def probe(probe_id: str, sandbox: str = "sb1", container: str = "c1", probe_type: int = spec_pb.READINESS,
          labels: dict[str, str] | None = None) -> service_pb.Probe:
    return service_pb.Probe(probe_id=probe_id, pod_sandbox_id=sandbox, container_id=container, type=probe_type,
                            container_name="app", labels=labels or {}, spec=spec_pb.ProbeSpec(period_ms=1000))


def watch_request(instance_id: str = "", since: int = 0, every_attempt: bool = False,
                  **filter_fields) -> service_pb.WatchProbeStatusRequest:
    return service_pb.WatchProbeStatusRequest(filter=service_pb.ProbeFilter(**filter_fields), instance_id=instance_id,
                                              since_revision=since, every_attempt=every_attempt)


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


# --- pure logic ----------------------------------------------------------------------------------------------------


def test_matches_empty_filter_and_each_field():
    p = probe("p1", sandbox="sb1", container="c1", probe_type=spec_pb.LIVENESS, labels={"team": "a", "tier": "web"})
    f = service_pb.ProbeFilter
    assert matches(f(), p)
    assert matches(f(probe_id="p1"), p) and not matches(f(probe_id="p2"), p)
    assert matches(f(pod_sandbox_id="sb1"), p) and not matches(f(pod_sandbox_id="sb2"), p)
    assert matches(f(container_id="c1"), p) and not matches(f(container_id="c2"), p)
    assert matches(f(type=spec_pb.LIVENESS), p) and not matches(f(type=spec_pb.READINESS), p)
    assert matches(f(label_selector={"team": "a"}), p)
    assert matches(f(label_selector={"team": "a", "tier": "web"}), p)
    assert not matches(f(label_selector={"team": "a", "tier": "db"}), p)
    assert not matches(f(label_selector={"zone": ""}), p), "a missing label is not an empty one"
    assert "zone" not in p.labels, "matching must not insert keys into the probe's map"


def _history(first: int, last: int) -> list[Change]:
    return [Change(r, service_pb.WatchProbeStatusResponse(revision=r, type=UPDATED, probe=probe(f"p{r}")))
            for r in range(first, last + 1)]


def test_changes_since_selects_exactly_what_was_missed_or_refuses():
    history = _history(5, 9)  # revisions 1..4 were evicted
    assert [c.revision for c in changes_since(history, 9, 4)] == [5, 6, 7, 8, 9]
    assert [c.revision for c in changes_since(history, 9, 7)] == [8, 9]
    assert changes_since(history, 9, 9) == []
    assert changes_since(history, 9, 3) is None, "revision 4 is gone"
    assert changes_since(history, 9, 10) is None, "a revision from the future"
    assert changes_since([], 0, 0) == [], "a fresh board"
    assert changes_since([], 3, 2) is None, "no history at all"


def test_replay_and_snapshot_responses_apply_the_filter():
    history = [Change(1, service_pb.WatchProbeStatusResponse(revision=1, type=UPDATED, probe=probe("a", sandbox="s1"))),
               Change(2, service_pb.WatchProbeStatusResponse(revision=2, type=REMOVED, probe=probe("b", sandbox="s2")))]
    assert [brief(r) for r in replay_responses(history, service_pb.ProbeFilter(pod_sandbox_id="s2"))] == [
        ("REMOVED", "b", 2)]
    probes = [probe("z", sandbox="s1"), probe("y", sandbox="s2"), probe("x", sandbox="s1", container="c0")]
    snap = snapshot_responses(probes, service_pb.ProbeFilter(pod_sandbox_id="s1"), "inst", 7)
    assert [brief(r) for r in snap] == [("SNAPSHOT", "x", 7), ("SNAPSHOT", "z", 7), ("SNAPSHOT_COMPLETE", "", 7)]
    assert {r.instance_id for r in snap} == {"inst"}


# --- the board -----------------------------------------------------------------------------------------------------


def test_revision_is_monotonic_and_only_changes_bump_it():
    board = StatusBoard()
    assert board.revision == 0
    assert len(board.instance_id) == 32 and board.instance_id != StatusBoard().instance_id
    assert board.put(probe("p1")) == 1
    assert board.put(probe("p2", container="c2")) == 2
    assert board.update("p1", lambda p: setattr(p.status, "state", spec_pb.STATE_SUCCESS)) == 3
    board.record_attempt("p1", attempted(spec_pb.RESULT_SUCCESS))
    assert board.revision == 3, "an attempt is not a revision"
    assert board.get("p1").status.totals.success == 1 and board.get("p1").revision == 3
    assert board.remove("p2") == 4
    assert board.remove("p2") is None and board.remove("never") is None
    assert board.update("never", lambda p: None) is None
    board.record_attempt("never", attempted(spec_pb.RESULT_SUCCESS))
    assert board.revision == 4
    assert [p.probe_id for p in board.list()] == ["p1"] and len(board) == 1


def test_the_board_keeps_its_own_copies():
    board = StatusBoard()
    mine = probe("p1")
    board.put(mine)
    mine.container_name = "changed-after-put"
    got = board.get("p1")
    got.container_name = "changed-after-get"
    board.list()[0].container_name = "changed-after-list"
    assert board.get("p1").container_name == "app"
    assert board.get("p1").revision == 1


def test_update_that_raises_changes_nothing():
    board = StatusBoard()
    board.put(probe("p1"))

    def broken(p: service_pb.Probe) -> None:
        p.status.state = spec_pb.STATE_FAILURE
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        board.update("p1", broken)
    assert board.get("p1").status.state == spec_pb.STATE_UNKNOWN and board.revision == 1
    with pytest.raises(ValueError):
        board.update("p1", lambda p: setattr(p, "probe_id", "other"))


def test_list_filters_and_sorts_by_sandbox_container_type():
    board = StatusBoard()
    board.put(probe("d", sandbox="s2", container="c1", probe_type=spec_pb.READINESS))
    board.put(probe("c", sandbox="s1", container="c2", probe_type=spec_pb.LIVENESS))
    board.put(probe("b", sandbox="s1", container="c1", probe_type=spec_pb.STARTUP))
    board.put(probe("a", sandbox="s1", container="c1", probe_type=spec_pb.LIVENESS))
    assert [p.probe_id for p in board.list(service_pb.ProbeFilter())] == ["a", "b", "c", "d"]
    assert [p.probe_id for p in board.list(service_pb.ProbeFilter(pod_sandbox_id="s1", container_id="c1"))] == [
        "a", "b"]


def test_count_counts_what_a_predicate_selects_and_changes_nothing():
    board = StatusBoard()
    board.put(probe("a", sandbox="s1"))
    board.put(probe("b", sandbox="s2"))
    board.put(probe("c", sandbox="s2"))
    assert board.count(lambda p: p.pod_sandbox_id == "s2") == 2 and board.count(lambda p: False) == 0
    assert board.revision == 3 and len(board) == 3


# --- watch ---------------------------------------------------------------------------------------------------------


def test_snapshot_then_complete_then_live_without_gap_or_duplicate():
    async def main():
        board = StatusBoard(instance_id="inst-1")
        board.put(probe("p2", sandbox="s2"))
        board.put(probe("p1", sandbox="s1"))
        stream = board.watch(watch_request())
        first = await take(stream, 3)
        assert [brief(r) for r in first] == [("SNAPSHOT", "p1", 2), ("SNAPSHOT", "p2", 2), ("SNAPSHOT_COMPLETE", "", 2)]
        assert first[0].probe.revision == 2 and first[1].probe.revision == 1, "each probe keeps its own revision"
        assert board.watcher_count == 1
        board.update("p1", lambda p: setattr(p.status, "state", spec_pb.STATE_SUCCESS))
        board.put(probe("p3", sandbox="s3"))
        board.remove("p2")
        live = await take(stream, 3)
        assert [brief(r) for r in live] == [("UPDATED", "p1", 3), ("UPDATED", "p3", 4), ("REMOVED", "p2", 5)]
        assert live[0].probe.status.state == spec_pb.STATE_SUCCESS
        removed = live[2].probe
        assert (removed.pod_sandbox_id, removed.container_id, removed.type) == ("s2", "c1", spec_pb.READINESS)
        assert {r.instance_id for r in first + live} == {"inst-1"}
        await expect_only_marker_next(board, stream)
        await stream.aclose()
        assert board.watcher_count == 0

    asyncio.run(main())


def test_changes_between_creating_and_iterating_the_watch_are_neither_lost_nor_doubled():
    async def main():
        board = StatusBoard()
        board.put(probe("p1"))
        stream = board.watch(watch_request())
        board.put(probe("p2", container="c2"))  # before the first anext: part of the snapshot, not an event
        got = await take(stream, 3)
        assert [brief(r) for r in got] == [("SNAPSHOT", "p1", 2), ("SNAPSHOT", "p2", 2), ("SNAPSHOT_COMPLETE", "", 2)]
        await expect_only_marker_next(board, stream)
        await stream.aclose()

    asyncio.run(main())


def test_watches_opened_while_a_producer_runs_see_every_revision_exactly_once():
    """Producer and watchers interleave on the loop; each watcher's view must end equal to the board."""

    async def main():
        board = StatusBoard(watcher_queue=10_000)

        async def produce():
            for n in range(300):
                if n % 7 == 3:
                    board.remove(f"p{(n * 5) % 20}")
                else:
                    board.put(probe(f"p{n % 20}", container=f"c{n % 20}", labels={"n": str(n)}))
                await asyncio.sleep(0)  # a scheduling point, so that watches start in between changes

        async def follow() -> None:
            stream = board.watch(watch_request())
            snapshot: dict[str, int] = {}
            view: dict[str, int] | None = None
            seen: list[int] = []
            async for response in stream:
                if response.type == SNAPSHOT:
                    snapshot[response.probe.probe_id] = response.probe.revision
                elif response.type == COMPLETE:
                    view, start = dict(snapshot), response.revision
                elif response.type == UPDATED:
                    seen.append(response.revision)
                    view[response.probe.probe_id] = response.probe.revision
                else:
                    assert response.type == REMOVED and response.probe.probe_id in view
                    seen.append(response.revision)
                    del view[response.probe.probe_id]
                if view is not None and "end" in view:
                    break
            await stream.aclose()
            assert seen == list(range(start + 1, board.revision + 1)), "a gap or a duplicate"
            assert view == {p.probe_id: p.revision for p in board.list()}

        producer = asyncio.create_task(produce())
        followers = []
        for _ in range(8):
            followers.append(asyncio.create_task(follow()))
            for _ in range(30):
                await asyncio.sleep(0)  # let the producer move on before the next watch starts
        await producer
        board.put(probe("end"))
        await asyncio.wait_for(asyncio.gather(*followers), EVENT_WAIT_S)
        assert board.watcher_count == 0

    asyncio.run(main())


def test_empty_state_is_just_snapshot_complete():
    async def main():
        board = StatusBoard()
        stream = board.watch(watch_request())
        assert [brief(r) for r in await take(stream, 1)] == [("SNAPSHOT_COMPLETE", "", 0)]
        await expect_only_marker_next(board, stream)
        await stream.aclose()

    asyncio.run(main())


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


def test_resume_with_same_instance_gets_only_what_was_missed_including_removals():
    async def main():
        board = StatusBoard(instance_id="inst")
        board.put(probe("p1", sandbox="s1"))
        board.put(probe("p2", sandbox="s1", container="c2"))
        board.put(probe("other", sandbox="s2"))
        first = board.watch(watch_request(pod_sandbox_id="s1"))
        got = await take(first, 3)
        last_seen = got[-1].revision
        assert got[-1].type == COMPLETE and last_seen == 3
        await first.aclose()
        # While disconnected:
        board.update("p1", lambda p: setattr(p.status, "state", spec_pb.STATE_FAILURE))  # 4
        board.remove("p2")  # 5
        board.put(probe("other", sandbox="s2", container="c9"))  # 6, not in the filter
        board.put(probe("p3", sandbox="s1", container="c3"))  # 7
        resumed = board.watch(watch_request(instance_id="inst", since=last_seen, pod_sandbox_id="s1"))
        missed = await take(resumed, 3)
        assert [brief(r) for r in missed] == [("UPDATED", "p1", 4), ("REMOVED", "p2", 5), ("UPDATED", "p3", 7)]
        assert missed[0].probe.status.state == spec_pb.STATE_FAILURE
        board.put(probe("p4", sandbox="s1", container="c4"))  # live after the replay
        assert brief(await next_event(resumed)) == ("UPDATED", "p4", 8)
        await resumed.aclose()

    asyncio.run(main())


def test_resume_at_the_current_revision_gets_nothing_but_live_changes():
    async def main():
        board = StatusBoard(instance_id="inst")
        board.put(probe("p1"))
        stream = board.watch(watch_request(instance_id="inst", since=board.revision))
        await expect_only_marker_next(board, stream)
        await stream.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("case", ["other-instance", "older-than-history", "future-revision", "no-instance"])
def test_resume_that_cannot_be_served_gets_a_full_snapshot(case):
    async def main():
        board = StatusBoard(instance_id="inst", history_size=2)
        for n in range(5):
            board.put(probe(f"p{n}", container=f"c{n}"))
        request = {
            "other-instance": watch_request(instance_id="previous-daemon", since=4),
            "older-than-history": watch_request(instance_id="inst", since=2),  # history holds 4 and 5 only
            "future-revision": watch_request(instance_id="inst", since=99),
            "no-instance": watch_request(since=4),
        }[case]
        stream = board.watch(request)
        got = await take(stream, 6)
        assert [brief(r) for r in got] == [("SNAPSHOT", f"p{n}", 5) for n in range(5)] + [("SNAPSHOT_COMPLETE", "", 5)]
        assert {r.instance_id for r in got} == {"inst"}
        await expect_only_marker_next(board, stream)
        await stream.aclose()

    asyncio.run(main())


def test_the_oldest_retained_revision_can_still_be_resumed_from_just_before_it():
    async def main():
        board = StatusBoard(instance_id="inst", history_size=2)
        for n in range(5):
            board.put(probe(f"p{n}", container=f"c{n}"))
        stream = board.watch(watch_request(instance_id="inst", since=3))  # needs 4 and 5: both retained
        assert [brief(r) for r in await take(stream, 2)] == [("UPDATED", "p3", 4), ("UPDATED", "p4", 5)]
        await stream.aclose()

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


def test_slow_watcher_gets_resync_and_never_blocks_puts_or_other_watchers():
    async def main():
        board = StatusBoard(watcher_queue=3)
        slow = board.watch(watch_request())
        fast = board.watch(watch_request())
        assert [r.type for r in await take(slow, 1)] == [COMPLETE]
        assert [r.type for r in await take(fast, 1)] == [COMPLETE]
        assert board.watcher_count == 2
        for n in range(10):  # put() is synchronous: it returns whatever the slow watcher does
            assert board.put(probe(f"p{n}", container=f"c{n}")) == n + 1
            assert brief(await next_event(fast)) == ("UPDATED", f"p{n}", n + 1)
            board.record_attempt(f"p{n}", attempted(spec_pb.RESULT_SUCCESS))
        assert board.watcher_count == 1, "the slow watcher was dropped as soon as it overflowed"
        resync = await next_event(slow)
        assert brief(resync) == ("RESYNC", "", 0), "it had delivered the snapshot at revision 0, nothing since"
        assert resync.instance_id == board.instance_id
        with pytest.raises(StopAsyncIteration):
            await next_event(slow)
        # The fast watcher goes on.
        await expect_only_marker_next(board, fast)
        await fast.aclose()
        assert board.watcher_count == 0

    asyncio.run(main())


def test_resync_revision_is_a_safe_resume_point():
    async def main():
        board = StatusBoard(instance_id="inst", watcher_queue=2)
        board.put(probe("p0"))
        stream = board.watch(watch_request())
        await take(stream, 2)  # snapshot at 1
        board.put(probe("p1", container="c1"))  # 2
        assert brief(await next_event(stream)) == ("UPDATED", "p1", 2)
        for n in range(2, 5):  # 3, 4, 5: one more than the buffer holds
            board.put(probe(f"p{n}", container=f"c{n}"))
        resync = await next_event(stream)
        assert brief(resync) == ("RESYNC", "", 2)
        resumed = board.watch(watch_request(instance_id="inst", since=resync.revision))
        assert [brief(r) for r in await take(resumed, 3)] == [
            ("UPDATED", "p2", 3), ("UPDATED", "p3", 4), ("UPDATED", "p4", 5)]
        await resumed.aclose()

    asyncio.run(main())


def test_overflow_during_the_snapshot_ends_it_with_resync_at_revision_zero():
    async def main():
        board = StatusBoard(watcher_queue=1)
        for n in range(3):
            board.put(probe(f"p{n}", container=f"c{n}"))
        stream = board.watch(watch_request())
        assert brief(await next_event(stream)) == ("SNAPSHOT", "p0", 3)
        board.put(probe("late-1", container="l1"))
        board.put(probe("late-2", container="l2"))  # the buffer holds one
        assert brief(await next_event(stream)) == ("RESYNC", "", 0), "an incomplete snapshot is no resume point"
        with pytest.raises(StopAsyncIteration):
            await next_event(stream)
        assert board.watcher_count == 0

    asyncio.run(main())


def test_cancelling_a_waiting_watch_unregisters_it():
    async def main():
        board = StatusBoard()
        synced = asyncio.Event()
        received = []

        async def consume():  # what the gRPC servicer does; grpc cancels its task when the client goes
            async for response in board.watch(watch_request()):
                received.append(response.type)
                if response.type == COMPLETE:
                    synced.set()

        task = asyncio.create_task(consume())
        await synced.wait()  # the consumer is now parked waiting for the next change
        assert board.watcher_count == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert board.watcher_count == 0
        assert board.put(probe("p1")) == 1  # nobody to feed; nothing breaks
        assert received == [COMPLETE]

    asyncio.run(main())


def test_closing_the_iterator_unregisters_it():
    async def main():
        board = StatusBoard()
        board.put(probe("p1"))
        stream = board.watch(watch_request())
        await next_event(stream)  # parked in the middle of the snapshot
        assert board.watcher_count == 1
        await stream.aclose()
        assert board.watcher_count == 0

    asyncio.run(main())


def test_history_is_bounded():
    board = StatusBoard(history_size=3)
    for n in range(10):
        board.put(probe(f"p{n}", container=f"c{n}"))
    assert [c.revision for c in board._history] == [8, 9, 10]
    assert changes_since(board._history, board.revision, 7) is not None
    assert changes_since(board._history, board.revision, 6) is None


def test_invalid_sizes_are_refused():
    with pytest.raises(ValueError):
        StatusBoard(watcher_queue=0)
    with pytest.raises(ValueError):
        StatusBoard(history_size=-1)
    with pytest.raises(ValueError):
        StatusBoard().put(service_pb.Probe())
