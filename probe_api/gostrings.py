"""Text exactly as the kubelet (a Go program) prints it, so probe outputs match.

Pure functions: no I/O. The kubelet's outputs embed Go's formatting of durations,
host:port pairs, errno names and dial errors; operators grep for these strings.
"""

from __future__ import annotations

import errno
import ipaddress
import os


def join_host_port(host: str, port: int) -> str:
    """net.JoinHostPort: brackets around any host containing a colon (IPv6)."""
    if ":" in host:
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def go_duration(ns: int) -> str:
    """time.Duration.String(): 1s, 500ms, 1.5s, 2m0s, 1h0m0s, 0s, 1.5µs."""
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if ns >= size:
                return sign + _fraction(ns, size) + unit
    hours, rem = divmod(ns, 3_600_000_000_000)
    minutes, rem = divmod(rem, 60_000_000_000)
    seconds = _fraction(rem, 1_000_000_000) + "s"
    if hours:
        return f"{sign}{hours}h{minutes}m{seconds}"
    if minutes:
        return f"{sign}{minutes}m{seconds}"
    return sign + seconds


def _fraction(value: int, unit: int) -> str:
    whole, frac = divmod(value, unit)
    if not frac:
        return str(whole)
    digits = len(str(unit)) - 1
    return f"{whole}.{frac:0{digits}d}".rstrip("0")


def errno_text(code: int) -> str:
    """Go's syscall.Errno strings are libc's, lower-cased at the start."""
    if code == errno.ETIMEDOUT:
        return "connection timed out"
    text = os.strerror(code)
    return text[:1].lower() + text[1:]


def dial_error(address: str, exc: BaseException | None, timed_out: bool = False) -> str:
    """The error text of net.Dial: `dial tcp 10.0.0.1:80: connect: connection refused`."""
    if timed_out:
        return f"dial tcp {address}: i/o timeout"
    if isinstance(exc, OSError) and exc.errno:
        return f"dial tcp {address}: connect: {errno_text(exc.errno)}"
    return f"dial tcp {address}: {exc}"


def is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def go_quote(data: str | bytes) -> str:
    """strconv.Quote (fmt's %q), which Go error messages use for URLs, names and values.

    Bytes that are not valid UTF-8 (kept by surrogateescape) come out as \\xNN like Go.
    """
    raw = data if isinstance(data, bytes) else data.encode("utf-8", "surrogateescape")
    out = ['"']
    for ch in raw.decode("utf-8", "surrogateescape"):
        cp = ord(ch)
        if 0xDC80 <= cp <= 0xDCFF:
            out.append(f"\\x{cp - 0xDC00:02x}")
        elif ch in '"\\':
            out.append("\\" + ch)
        elif ch.isprintable():  # the same classes as Go's unicode.IsPrint, ASCII space included
            out.append(ch)
        elif ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif cp < 0x20 or cp == 0x7F:
            out.append(f"\\x{cp:02x}")
        elif cp < 0x10000:
            out.append(f"\\u{cp:04x}")
        else:
            out.append(f"\\U{cp:08x}")
    out.append('"')
    return "".join(out)
