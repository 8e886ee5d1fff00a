import asyncio

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


def test_a_cancelled_phase_says_deadline_exceeded_and_keeps_an_earlier_error():
    clock = FakeClock()
    trace = Trace(clock)
    with pytest.raises(asyncio.CancelledError):
        with trace.phase("processing"):
            clock.now += 7
            raise asyncio.CancelledError()
    with pytest.raises(asyncio.CancelledError):
        with trace.phase("transfer") as record:
            record.error = "unexpected EOF"
            raise asyncio.CancelledError()
    processing, transfer = trace.to_proto()
    assert (processing.error, processing.duration_ns) == ("deadline exceeded", 7)
    assert transfer.error == "unexpected EOF"


def test_a_long_detail_or_error_is_clipped_and_a_short_one_kept_as_it_is():
    from probe_worker.trace import MAX_PHASE_TEXT_CHARS

    trace = Trace(FakeClock())
    with trace.phase("redirect", "x" * (MAX_PHASE_TEXT_CHARS + 1)) as record:
        record.error = "e" * (10 * MAX_PHASE_TEXT_CHARS)
    with trace.phase("connect", "y" * MAX_PHASE_TEXT_CHARS) as record:
        record.error = "refused"
    long, short = trace.to_proto()
    assert (long.detail, long.error) == ("x" * MAX_PHASE_TEXT_CHARS + "...", "e" * MAX_PHASE_TEXT_CHARS + "...")
    assert (short.detail, short.error) == ("y" * MAX_PHASE_TEXT_CHARS, "refused")
