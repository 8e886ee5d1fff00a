"""A plain HTTP/1.1 response head, read without h11 when h11 would read it the same way; None otherwise.

Nearly every probe's response is one: a status line, a few ordinary headers, a Content-Length or none, all in the
first read. h11 costs about a sixth of a probe's CPU to read it (its state machine, event objects, header
normalization); this reads it with two regular expressions. It accepts only a strict subset of what h11 accepts,
and whatever it accepts it reads as h11 does (h11's own grammar, _abnf.py, narrowed): anything else (a head not
complete in the bytes given, bare LF line ends, obs-fold, bytes outside printable ASCII, HTTP/1.0, 1xx, 204, 3xx,
304, a Transfer-Encoding, several Content-Lengths) is left to h11, and so are Go's rules for heads h11 refuses.
"""

from __future__ import annotations

import re

from probe_worker.probes.http.response import ResponseHead

# h11's status_line with http_version 1.1 only, and a reason phrase of printable ASCII, space and tab only.
_STATUS_LINE = re.compile(rb"HTTP/1\.1 ([0-9]{3})(?: [\x20\x21-\x7e\t]*)?")
# h11's header_field with field values of printable ASCII only (h11 also takes obs-text and control bytes).
_HEADER = re.compile(rb"([-!#$%&'*+.^_`|~0-9a-zA-Z]+):[ \t]*([\x21-\x7e]+(?:[ \t]+[\x21-\x7e]+)*)?[ \t]*")
_DIGITS = re.compile(rb"[0-9]{1,18}")
# Heads longer than this go to h11, whose limits and errors apply to them.
MAX_FAST_HEAD = 16 * 1024


def plain_head(data: bytes) -> tuple[ResponseHead, int] | None:
    """The head at the start of `data` and where its body starts, if it is plain (module docstring)."""
    end = data.find(b"\r\n\r\n", 0, MAX_FAST_HEAD)
    if end < 0:
        return None
    lines = data[:end].split(b"\r\n")
    status_line = _STATUS_LINE.fullmatch(lines[0])
    if status_line is None:
        return None
    status = int(status_line[1])
    # 1xx (informational), 204 and 304 (no body whatever the headers say) and 3xx (redirects) are h11's.
    if not (200 <= status < 300 and status != 204 or 400 <= status < 1000):
        return None
    location = content_length = encoding = None
    for line in lines[1:]:
        header = _HEADER.fullmatch(line)
        if header is None:  # also a bare LF inside a line, or an obs-fold continuation
            return None
        name, value = header[1].lower(), header[2] or b""
        if name == b"content-length":
            if content_length is not None or _DIGITS.fullmatch(value) is None:
                return None  # h11 dedupes, joins or refuses several: its rules, not repeated here
            content_length = int(value)
        elif name == b"transfer-encoding":
            return None
        elif name == b"location" and location is None:
            location = value.decode("utf-8", "surrogateescape")
        elif name == b"content-encoding" and encoding is None:
            encoding = value.decode("latin-1")
    return ResponseHead(status=status, location=location, content_length=content_length,
                        content_encoding=encoding or ""), end + 4
