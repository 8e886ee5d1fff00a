"""probectl's command-line syntax for durations. Pure: no I/O, no grpc.

Owns: Go's time.ParseDuration syntax, plus a bare integer meaning seconds (as Kubernetes' `*Seconds` fields
count), in the ProbeSpec's whole milliseconds. Bad input raises SpecError whose message is one line naming the flag
and the input. The handler flags (`--http-get`, `--tcp`, `--grpc`, ...) and the names of the probe enums are
probe_api.handler_flags': the kubelet bridge's hand-written marker command reads them too.
"""

from __future__ import annotations

import re
from fractions import Fraction

from probe_api.gostrings import go_quote
from probe_api.handler_flags import SpecError, is_digits

# time.ParseDuration's units, in nanoseconds (both spellings of micro, as Go accepts them).
_UNIT_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000,
            "s": 1_000_000_000, "m": 60_000_000_000, "h": 3_600_000_000_000}
_DURATION_TERM_RE = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_MAX_DURATION_NS = 2**63 - 1  # Go's Duration is an int64 of nanoseconds
_DURATION_HINT = "use e.g. 500ms, 1s, 2m"


def parse_duration_ms(text: str, *, flag: str = "") -> int:
    """A duration in whole milliseconds: "500ms", "1s", "1.5s", "2m", "1m30s" (Go units ns..h); "5" = 5 s.

    Milliseconds are the unit of ProbeSpec: a duration that is not a whole number of them would be
    silently rounded (100us to 0, which means "the default"), so it is refused instead.
    """
    prefix = f"{flag}: " if flag else ""
    raw = text
    text = text.strip()
    if is_digits(text):
        ns = Fraction(int(text)) * _UNIT_NS["s"]
    else:
        if text.startswith("-") and (is_digits(text[1:]) or _is_go_duration(text[1:])):
            raise SpecError(f"{prefix}invalid duration {go_quote(raw)}: must not be negative")
        if not _is_go_duration(text.removeprefix("+")):
            raise SpecError(f"{prefix}invalid duration {go_quote(raw)}: {_DURATION_HINT}")
        ns = sum((Fraction(number) * _UNIT_NS[unit]
                  for number, unit in _DURATION_TERM_RE.findall(text.removeprefix("+"))), Fraction(0))
    if ns > _MAX_DURATION_NS:
        raise SpecError(f"{prefix}invalid duration {go_quote(raw)}: too large")
    ms = ns / _UNIT_NS["ms"]
    if ms.denominator != 1:
        raise SpecError(f"{prefix}invalid duration {go_quote(raw)}: must be a whole number of milliseconds")
    return int(ms)


def _is_go_duration(text: str) -> bool:
    """One or more `<number><unit>` terms; Go accepts a lone "0" without a unit."""
    if text == "0":
        return True
    position = 0
    while position < len(text):
        match = _DURATION_TERM_RE.match(text, position)
        if match is None:
            return False
        position = match.end()
    return position > 0
