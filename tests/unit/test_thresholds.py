"""Threshold bookkeeping: kubelet worker.doProbe and the results manager's emit-on-change."""

from __future__ import annotations

import pytest

from cri_proto import probe_spec_pb2 as pb
from probe_worker.thresholds import ThresholdTracker, container_started

LIVENESS, READINESS, STARTUP = pb.LIVENESS, pb.READINESS, pb.STARTUP
S, W, F, U = pb.RESULT_SUCCESS, pb.RESULT_WARNING, pb.RESULT_FAILURE, pb.RESULT_UNKNOWN
OK, BAD, UNK = pb.STATE_SUCCESS, pb.STATE_FAILURE, pb.STATE_UNKNOWN


def run(tracker: ThresholdTracker, results) -> list[tuple[int, bool, int, int, bool]]:
    """(state, changed, successes, failures, on_hold) after each observed result."""
    trace = []
    for result in results:
        changed = tracker.observe(result)
        trace.append((tracker.state, changed, tracker.consecutive_successes,
                      tracker.consecutive_failures, tracker.on_hold))
    return trace


@pytest.mark.parametrize("probe_type, initial", [
    (READINESS, BAD), (LIVENESS, OK), (STARTUP, UNK),
])
def test_initial_state(probe_type, initial):
    tracker = ThresholdTracker(probe_type, 1, 3)
    assert (tracker.state, tracker.on_hold) == (initial, False)
    assert (tracker.consecutive_successes, tracker.consecutive_failures) == (0, 0)


@pytest.mark.parametrize("probe_type, success_threshold, failure_threshold, results, expected", [
    # Readiness, failure threshold 3: F,F,S,F,F,F. The S resets the failure run.
    (READINESS, 1, 3, [F, F, S, F, F, F], [
        (BAD, False, 0, 1, False),
        (BAD, False, 0, 2, False),
        (OK, True, 1, 0, False),
        (OK, False, 0, 1, False),
        (OK, False, 0, 2, False),
        (BAD, True, 0, 3, False),
    ]),
    # Readiness, success threshold 3: needs three successes in a row to become ready.
    (READINESS, 3, 3, [S, S, F, S, S, S, S], [
        (BAD, False, 1, 0, False),
        (BAD, False, 2, 0, False),
        (BAD, False, 0, 1, False),
        (BAD, False, 1, 0, False),
        (BAD, False, 2, 0, False),
        (OK, True, 3, 0, False),
        (OK, False, 4, 0, False),          # already ready: no change emitted
    ]),
    # A warning counts as a success and continues the success run.
    (READINESS, 3, 3, [S, W, S], [
        (BAD, False, 1, 0, False),
        (BAD, False, 2, 0, False),
        (OK, True, 3, 0, False),
    ]),
    (READINESS, 1, 1, [W, F, W], [
        (OK, True, 1, 0, False),
        (BAD, True, 0, 1, False),
        (OK, True, 1, 0, False),
    ]),
    # Unknown results are thrown away: they neither count nor break a run.
    (READINESS, 2, 3, [U, S, U, U, S, F, U, F, U, F], [
        (BAD, False, 0, 0, False),
        (BAD, False, 1, 0, False),
        (BAD, False, 1, 0, False),
        (BAD, False, 1, 0, False),
        (OK, True, 2, 0, False),
        (OK, False, 0, 1, False),
        (OK, False, 0, 1, False),
        (OK, False, 0, 2, False),
        (OK, False, 0, 2, False),
        (BAD, True, 0, 3, False),
    ]),
    # Readiness never goes on hold: failures keep counting past the threshold.
    (READINESS, 1, 2, [F, F, F, F], [
        (BAD, False, 0, 1, False),
        (BAD, False, 0, 2, False),
        (BAD, False, 0, 3, False),
        (BAD, False, 0, 4, False),
    ]),
    # Liveness: failure threshold reached => FAILURE, on hold, run reset; later results ignored.
    (LIVENESS, 1, 3, [F, S, F, F, F, S, F], [
        (OK, False, 0, 1, False),
        (OK, False, 1, 0, False),
        (OK, False, 0, 1, False),
        (OK, False, 0, 2, False),
        (BAD, True, 0, 0, True),
        (BAD, False, 0, 0, True),
        (BAD, False, 0, 0, True),
    ]),
    (LIVENESS, 1, 1, [S, S, F, F], [
        (OK, False, 1, 0, False),
        (OK, False, 2, 0, False),
        (BAD, True, 0, 0, True),
        (BAD, False, 0, 0, True),
    ]),
    # Startup: unknown until the first decision; success is final for this container.
    (STARTUP, 1, 3, [F, F, S, S], [
        (UNK, False, 0, 1, False),
        (UNK, False, 0, 2, False),
        (OK, True, 1, 0, False),
        (OK, False, 2, 0, False),
    ]),
    (STARTUP, 1, 2, [F, U, F, S], [
        (UNK, False, 0, 1, False),
        (UNK, False, 0, 1, False),
        (BAD, True, 0, 0, True),
        (BAD, False, 0, 0, True),
    ]),
])
def test_sequences(probe_type, success_threshold, failure_threshold, results, expected):
    tracker = ThresholdTracker(probe_type, success_threshold, failure_threshold)
    assert run(tracker, results) == expected


@pytest.mark.parametrize("probe_type, initial", [(LIVENESS, OK), (STARTUP, UNK)])
def test_new_container_lifts_hold_and_restarts_counting(probe_type, initial):
    tracker = ThresholdTracker(probe_type, 1, 2)
    run(tracker, [F, F])
    assert (tracker.state, tracker.on_hold) == (BAD, True)

    assert tracker.new_container() is True
    assert (tracker.state, tracker.on_hold) == (initial, False)
    assert (tracker.consecutive_successes, tracker.consecutive_failures) == (0, 0)
    # A full run of failures is needed again on the new container.
    assert run(tracker, [F, F]) == [
        (initial, False, 0, 1, False),
        (BAD, True, 0, 0, True),
    ]


def test_new_container_keeps_the_run_like_the_kubelet():
    # The kubelet resets neither lastResult nor resultRun on a new container ID.
    tracker = ThresholdTracker(READINESS, 3, 3)
    run(tracker, [S, S, S])
    assert tracker.state == OK
    assert tracker.new_container() is True
    assert (tracker.state, tracker.consecutive_successes) == (BAD, 3)
    assert run(tracker, [S]) == [(OK, True, 4, 0, False)]

    liveness = ThresholdTracker(LIVENESS, 1, 3)
    run(liveness, [F, F])
    assert liveness.new_container() is False          # was SUCCESS, is SUCCESS
    assert run(liveness, [F]) == [(BAD, True, 0, 0, True)]


def test_new_container_without_change_reports_no_change():
    tracker = ThresholdTracker(READINESS, 1, 3)
    assert tracker.new_container() is False
    assert tracker.state == BAD


@pytest.mark.parametrize("args", [(READINESS, 0, 3), (READINESS, 1, 0), (pb.PROBE_TYPE_UNSPECIFIED, 1, 3),
                                  (7, 1, 3)])
def test_rejects_invalid_construction(args):
    with pytest.raises(ValueError):
        ThresholdTracker(*args)


def test_rejects_unknown_result_number():
    with pytest.raises(ValueError):
        ThresholdTracker(READINESS, 1, 3).observe(9)


@pytest.mark.parametrize("startup_state, started", [
    (None, True), (OK, True), (BAD, False), (UNK, False),
])
def test_container_started(startup_state, started):
    assert container_started(startup_state) is started


# --- resume: a restarted worker or daemon goes on from where the probe stood ------------------------------------

@pytest.mark.parametrize("probe_type, success_threshold, failure_threshold, before, after", [
    (READINESS, 3, 3, [S, S, S, F, F], [F, S]),
    (READINESS, 2, 3, [S, S, S, S, S, S], [F, F, F, S]),
    (LIVENESS, 1, 3, [S, F, F], [F, S]),
    (STARTUP, 1, 2, [F], [F, S]),
    (STARTUP, 2, 3, [S, S, F], [S, S]),
])
def test_a_resumed_tracker_behaves_as_the_one_that_ran_on(probe_type, success_threshold, failure_threshold,
                                                            before, after):
    ran_on = ThresholdTracker(probe_type, success_threshold, failure_threshold)
    run(ran_on, before)
    # What the daemon stores: state, the run capped at its threshold (only `run < threshold` is ever asked), hold.
    capped_s = min(ran_on.consecutive_successes, success_threshold)
    capped_f = min(ran_on.consecutive_failures, failure_threshold)
    resumed = ThresholdTracker(probe_type, success_threshold, failure_threshold)
    resumed.resume(ran_on.state, capped_s, capped_f, ran_on.on_hold)
    assert [t[:2] + (t[4],) for t in run(resumed, after)] == [t[:2] + (t[4],) for t in run(ran_on, after)]


def test_resume_keeps_the_state_with_no_attempt():
    tracker = ThresholdTracker(READINESS, 1, 3)
    tracker.resume(OK, 5, 0, False)
    assert (tracker.state, tracker.consecutive_successes, tracker.consecutive_failures) == (OK, 5, 0)
    assert run(tracker, [U]) == [(OK, False, 5, 0, False)]  # an unknown result changes nothing, as before


def test_resume_on_hold_waits_for_a_new_container():
    tracker = ThresholdTracker(LIVENESS, 1, 1)
    tracker.resume(BAD, 0, 0, True)
    assert run(tracker, [S]) == [(BAD, False, 0, 0, True)]
    assert tracker.new_container() is True and tracker.state == OK


def test_resume_rejects_an_unknown_state():
    with pytest.raises(ValueError):
        ThresholdTracker(READINESS, 1, 3).resume(9, 0, 0, False)
