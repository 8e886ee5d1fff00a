"""probectl's durations (probectl/specs.py: --period, --timeout and the like), Go's time.ParseDuration spellings in
whole milliseconds, table-driven, no I/O."""

from __future__ import annotations

import argparse

import pytest

from probe_api.handler_flags import SpecError
from probectl.specs import parse_duration_ms


@pytest.mark.parametrize("text, ms", [
    ("500ms", 500), ("1s", 1000), ("1.5s", 1500), ("2m", 120_000), ("1m30s", 90_000), ("1h", 3_600_000),
    ("5", 5000), ("0", 0), (".5s", 500), ("+2s", 2000), ("1.s", 1000), ("2000000ns", 2), ("3000us", 3),
    ("3000µs", 3), (" 2s ", 2000), ("1h1m1s1ms", 3_661_001),
])
def test_durations(text, ms):
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text, message", [
    ("5x", 'invalid duration "5x": use e.g. 500ms, 1s, 2m'),
    ("", 'invalid duration "": use e.g. 500ms, 1s, 2m'),
    ("s", 'invalid duration "s": use e.g. 500ms, 1s, 2m'),
    ("1.5", 'invalid duration "1.5": use e.g. 500ms, 1s, 2m'),   # bare numbers are whole seconds only
    ("1e3s", 'invalid duration "1e3s": use e.g. 500ms, 1s, 2m'),
    ("1s 2s", 'invalid duration "1s 2s": use e.g. 500ms, 1s, 2m'),
    ("-1s", 'invalid duration "-1s": must not be negative'),
    ("-5", 'invalid duration "-5": must not be negative'),
    ("1500us", 'invalid duration "1500us": must be a whole number of milliseconds'),
    ("100ns", 'invalid duration "100ns": must be a whole number of milliseconds'),
    ("9999999999h", 'invalid duration "9999999999h": too large'),
    ("²", 'invalid duration "²": use e.g. 500ms, 1s, 2m'),  # a digit to str.isdigit(), not to int()
])
def test_bad_durations(text, message):
    with pytest.raises(ValueError) as err:
        parse_duration_ms(text)
    assert str(err.value) == message


def test_duration_errors_name_the_flag_and_read_well_through_argparse():
    with pytest.raises(SpecError, match=r'^--period: invalid duration "5x"'):
        parse_duration_ms("5x", flag="--period")
    parser = argparse.ArgumentParser(prog="probectl", exit_on_error=False)
    parser.add_argument("--period", type=parse_duration_ms)
    with pytest.raises(argparse.ArgumentError) as err:
        parser.parse_args(["--period", "5x"])
    assert str(err.value) == 'argument --period: invalid duration "5x": use e.g. 500ms, 1s, 2m'
