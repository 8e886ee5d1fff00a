"""Reading the daemon's /metrics text: sums of counters, and their change over a window (pure)."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

PROBE_TOTAL = "prober_probe_total"
LATE_TOTAL = "probe_shim_attempts_late_total"
MISSED_TOTAL = "probe_shim_ticks_missed_total"


def sample_sums(text: str) -> dict[str, float]:
    """Every sample name -> the sum of its values over all label sets."""
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


def probe_results(text: str) -> dict[str, float]:
    """prober_probe_total summed by its `result` label (successful, failed, unknown)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == PROBE_TOTAL:
                result = sample.labels.get("result", "")
                out[result] = out.get(result, 0.0) + sample.value
    return out


def delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """after - before for every key of either (a series that appeared counts from 0)."""
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in sorted(set(before) | set(after))}


def has_punctuality_counters(text: str) -> bool:
    sums = sample_sums(text)
    return LATE_TOTAL in sums and MISSED_TOTAL in sums
