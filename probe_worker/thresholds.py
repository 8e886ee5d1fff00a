"""Success/failure thresholds of one probe: the bookkeeping of the kubelet's worker.doProbe.

Owns how attempt results become the probe's state (pkg/kubelet/prober/worker.go and
results manager, 1.32): runs of identical results, the thresholds, "on hold" after a
liveness/startup failure, and the initial state per probe type. Pure, no clock.
"""

from __future__ import annotations

from cri_proto import probe_spec_pb2 as spec_pb

# worker.initialValue: readiness starts "not ready", liveness "alive", startup "unknown".
INITIAL_STATE = {
    spec_pb.READINESS: spec_pb.STATE_FAILURE,
    spec_pb.LIVENESS: spec_pb.STATE_SUCCESS,
    spec_pb.STARTUP: spec_pb.STATE_UNKNOWN,
}
_HOLDS_ON_FAILURE = (spec_pb.LIVENESS, spec_pb.STARTUP)
# prober.probe maps probe.Warning to results.Success (it only adds an event).
_COUNTED_AS = {
    spec_pb.RESULT_SUCCESS: spec_pb.RESULT_SUCCESS,
    spec_pb.RESULT_WARNING: spec_pb.RESULT_SUCCESS,
    spec_pb.RESULT_FAILURE: spec_pb.RESULT_FAILURE,
}


class ThresholdTracker:
    def __init__(self, probe_type: int, success_threshold: int, failure_threshold: int):
        if probe_type not in INITIAL_STATE:
            raise ValueError(f"unknown probe type {probe_type}")
        if success_threshold < 1 or failure_threshold < 1:
            raise ValueError("thresholds must be at least 1 (apply effective_timing first)")
        self.probe_type = probe_type
        self.success_threshold = success_threshold
        self.failure_threshold = failure_threshold
        self.state: int = INITIAL_STATE[probe_type]
        self.on_hold = False
        self._last_result = spec_pb.RESULT_UNKNOWN  # no attempt counted yet
        self._run = 0

    @property
    def consecutive_successes(self) -> int:
        return self._run if self._last_result == spec_pb.RESULT_SUCCESS else 0

    @property
    def consecutive_failures(self) -> int:
        return self._run if self._last_result == spec_pb.RESULT_FAILURE else 0

    def observe(self, result: int) -> bool:
        """Count one attempt; True iff the thresholded state changed."""
        if self.on_hold:
            return False  # the kubelet does not even probe until a new container
        if result == spec_pb.RESULT_UNKNOWN:
            return False  # "Prober error, throw away the result."
        counted = _COUNTED_AS.get(result)
        if counted is None:
            raise ValueError(f"unknown attempt result {result}")

        if counted == self._last_result:
            self._run += 1
        else:
            self._last_result = counted
            self._run = 1

        is_success = counted == spec_pb.RESULT_SUCCESS
        if self._run < (self.success_threshold if is_success else self.failure_threshold):
            return False
        previous = self.state
        self.state = spec_pb.STATE_SUCCESS if is_success else spec_pb.STATE_FAILURE
        if not is_success and self.probe_type in _HOLDS_ON_FAILURE:
            # The container is going to be restarted: stop probing until a new one.
            self.on_hold = True
            self._run = 0
        return self.state != previous

    def resume(self, state: int, consecutive_successes: int, consecutive_failures: int, on_hold: bool) -> None:
        """Goes on from where the probe stood (a restarted worker or daemon), instead of the initial state.

        A run longer than its threshold behaves exactly like one at the threshold (only `run < threshold` is ever
        asked), which is why the daemon may store runs capped at the threshold and still resume exactly."""
        if state not in (spec_pb.STATE_SUCCESS, spec_pb.STATE_FAILURE, spec_pb.STATE_UNKNOWN):
            raise ValueError(f"unknown probe state {state}")
        self.state = state
        self.on_hold = on_hold
        if consecutive_successes > 0:
            self._last_result, self._run = spec_pb.RESULT_SUCCESS, consecutive_successes
        elif consecutive_failures > 0:
            self._last_result, self._run = spec_pb.RESULT_FAILURE, consecutive_failures
        else:
            self._last_result, self._run = spec_pb.RESULT_UNKNOWN, 0

    def new_container(self) -> bool:
        """A new container ID: back to the initial state, hold lifted; True iff the state changed.

        Like the kubelet, the run of identical results is NOT cleared: a readiness
        probe that saw S,S before the restart needs one more S with threshold 3.
        After a liveness/startup failure the run was already reset when going on hold.
        """
        previous = self.state
        self.state = INITIAL_STATE[self.probe_type]
        self.on_hold = False
        return self.state != previous


def container_started(startup_state: int | None) -> bool:
    """Liveness and readiness wait until the startup probe (if any) has succeeded."""
    return startup_state is None or startup_state == spec_pb.STATE_SUCCESS
