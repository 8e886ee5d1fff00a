import pytest

from probe_worker.trace import Trace


class FakeClock:
    def __init__(self):
        self.now = 1000

    def __call__(self):
        return self.now


def test_phases_are_offsets_from_the_attempt_origin_and_nest():
    clock = FakeClock()
    trace = Trace(clock)
    with trace.phase("connect", "10.0.0.1:80"):
        clock.now += 5
    with trace.sub("redirect", "http://10.0.0.1:80/b") as hop:
        clock.now += 1
        with hop.phase("connect"):
            clock.now += 2
    (connect, redirect) = trace.to_proto()
    assert (connect.name, connect.start_offset_ns, connect.duration_ns, connect.detail) == ("connect", 0, 5, "10.0.0.1:80")
    assert (redirect.start_offset_ns, redirect.duration_ns) == (5, 3)
    assert [(c.name, c.start_offset_ns, c.duration_ns) for c in redirect.children] == [("connect", 6, 2)]


def test_a_failing_phase_records_its_error_and_duration():
    clock = FakeClock()
    trace = Trace(clock)
    with pytest.raises(ConnectionRefusedError):
        with trace.phase("connect"):
            clock.now += 3
            raise ConnectionRefusedError(111, "Connection refused")
    (phase,) = trace.to_proto()
    assert phase.duration_ns == 3 and "Connection refused" in phase.error
