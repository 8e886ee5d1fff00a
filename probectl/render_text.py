"""probectl's plain text pieces: ids, ages, durations, sizes, table cells and rows, enum names.

Pure and without state, shared by the renderers of probes, sandboxes, attempts and events (probectl/render.py,
which re-exports them: callers say `render.age`). The conventions are render.py's (crictl tables, kubectl ages).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb

ID_WIDTH = 13
COLUMN_GAP = "   "
NONE = "-"


# --- plain building blocks -------------------------------------------------------------

def truncate_id(value: str, no_trunc: bool = False) -> str:
    return value if no_trunc else value[:ID_WIDTH]


def human_duration(seconds: float) -> str:
    """kubectl's AGE format: ~2-3 significant figures, a little clock skew reads as "0s"."""
    whole = int(seconds)
    if whole < -1:
        return "<invalid>"
    if whole < 0:
        return "0s"
    if whole < 120:
        return f"{whole}s"
    minutes = whole // 60
    if minutes < 10:
        return f"{minutes}m{whole % 60}s" if whole % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = whole // 3600
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        years, days = hours // 24 // 365, hours // 24 % 365
        return f"{years}y{days}d" if days else f"{years}y"
    return f"{hours // 24 // 365}y"


def age(since_ns: int, now_ns: int) -> str:
    return human_duration((now_ns - since_ns) / 1e9) if since_ns else NONE


def format_ms(ns: int) -> str:
    """Milliseconds with about three significant digits: 0.58ms, 12.3ms, 250ms."""
    ms = ns / 1e6
    if ms < 10:
        return f"{ms:.2f}ms"
    if ms < 100:
        return f"{ms:.1f}ms"
    return f"{ms:.0f}ms"


def human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    raise AssertionError("unreachable")


def one_line(text: str, limit: int = 80) -> str:
    """Text from a pod (probe output) made safe for one table cell: no control characters, bounded."""
    flat = "".join(ch if ch.isprintable() else " " for ch in text.replace("\r\n", " ").replace("\n", " ")).strip()
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Columns as wide as their widest cell, 3 spaces apart, no trailing blanks."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(fixed_row(row, widths) for row in cells)


def fixed_row(cells: Sequence[str], widths: Sequence[int]) -> str:
    """One row with given column widths (for streams, where later rows are not known yet)."""
    return COLUMN_GAP.join(cell.ljust(width) for cell, width in zip(cells, widths)).rstrip()


def key_values(pairs: Iterable[tuple[str, object]]) -> str:
    """`Key:   value` lines with the values aligned, as crictl version / kubectl describe print."""
    pairs = [(f"{key}:", str(value)) for key, value in pairs]
    width = max((len(key) for key, _ in pairs), default=0)
    return "\n".join(f"{key.ljust(width)}  {value}".rstrip() for key, value in pairs)


# --- enum names ------------------------------------------------------------------------

def type_name(probe_type: int) -> str:
    return NONE if probe_type == spec_pb.PROBE_TYPE_UNSPECIFIED else spec_pb.ProbeType.Name(probe_type).lower()


def state_name(state: int) -> str:
    return spec_pb.ProbeState.Name(state).removeprefix("STATE_").lower()


def result_name(result: int) -> str:
    return spec_pb.AttemptResult.Name(result).removeprefix("RESULT_").lower()


def worker_state_name(state: int) -> str:
    return service_pb.WorkerState.Name(state).removeprefix("WORKER_").lower()


def event_name(event_type: int) -> str:
    return {
        service_pb.SNAPSHOT: "snapshot", service_pb.SNAPSHOT_COMPLETE: "synced", service_pb.UPDATED: "updated",
        service_pb.REMOVED: "removed", service_pb.ATTEMPT: "attempt", service_pb.RESYNC: "resync",
    }.get(event_type, "unknown")
