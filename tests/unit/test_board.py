"""The status board (shim/state/board.py): its pure rules (filter matching, what a resume missed, replay and snapshot
responses), revisions, its own copies of what it is given, listing, counting, bounded history. (Its watch:
tests/unit/test_board_watch*.py, test_board_watchers.py.)
"""

from __future__ import annotations

import pytest

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from shim.state.board import Change, StatusBoard, changes_since, matches, replay_responses, snapshot_responses
from tests.support.board_watch import REMOVED, UPDATED, attempted, brief, probe

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
