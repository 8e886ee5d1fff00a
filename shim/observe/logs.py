"""Structured logs: one line per event, as text or JSON, with the event's fields.

Every line is bounded: a message, a field or a traceback may quote something a pod
chose (a sandbox id, a worker's error), and a node daemon's log must not grow with it.
"""

from __future__ import annotations

import json
import logging
import sys
import time

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}

MAX_MESSAGE_CHARS = 4096
MAX_FIELD_CHARS = 1024
MAX_TRACEBACK_CHARS = 16384


def clip(text: str, limit: int) -> str:
    """text, or its first `limit` characters and how many more there were."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...[{len(text) - limit} more characters]"


def _bounded(value: object) -> object:
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    if isinstance(value, str):
        return clip(value, MAX_FIELD_CHARS)
    text = json.dumps(value, default=str)  # a list or dict stays one, unless it is too big
    return value if len(text) <= MAX_FIELD_CHARS else clip(text, MAX_FIELD_CHARS)


def _fields(record: logging.LogRecord) -> dict:
    return {k: _bounded(v) for k, v in vars(record).items() if k not in _STANDARD}


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": clip(record.getMessage(), MAX_MESSAGE_CHARS),
        }
        entry.update(_fields(record))
        if record.exc_info:
            entry["error"] = clip(self.formatException(record.exc_info), MAX_TRACEBACK_CHARS)
        return json.dumps(entry, default=str)


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        extra = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        message = clip(record.getMessage(), MAX_MESSAGE_CHARS)
        line = f"{self.formatTime(record)} {record.levelname.lower():7} {record.name}: {message}"
        line = f"{line} {extra}" if extra else line
        if record.exc_info:
            line += "\n" + clip(self.formatException(record.exc_info), MAX_TRACEBACK_CHARS)
        return line


def setup(log_format: str = "text", level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if log_format == "json" else _TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
