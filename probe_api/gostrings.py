"""Go's formatting of values, so that texts read like the kubelet's (a Go program). Pure, no I/O.

The kubelet's outputs and the API server's field errors embed Go's formatting of durations
(time.Duration.String), host:port pairs (net.JoinHostPort) and quoted strings (strconv.Quote);
the daemon, probectl and the worker share these. Go's error texts (net, net/http, crypto/tls),
which only a worker meets, are probe_worker/go_errors.py's.
"""

from __future__ import annotations

import ipaddress


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
