"""Kubernetes' field errors (k8s.io/apimachinery/pkg/util/validation/field): a bad field as data, printed exactly
like field.Error.Error() (`<path>: <ErrorBody>`), with the bad value the Go way.

Errors stay data until the edge: validation.py and the handler grammar return them, the daemon sends them as
FieldViolations, probectl renames their paths into a manifest's words, and only then are they text.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from probe_api.gostrings import go_quote

# Error messages go back as gRPC status details (clients cap metadata at 8 KiB) and into
# logs: a bad value is quoted only up to this many bytes.
MAX_ECHOED_BYTES = 256


@dataclass(frozen=True)
class PrintedValue:
    """A bad value already printed the Go way (a FieldViolation's value): shown as it is."""

    text: str


class _OmitValue:
    """field.omitValue: the body shows the error type without the bad value."""


OMIT_VALUE = _OmitValue()


@dataclass(frozen=True)
class FieldError:
    """k8s.io/apimachinery/pkg/util/validation/field.Error, printed exactly like Error()."""

    REQUIRED = "Required value"
    INVALID = "Invalid value"
    NOT_SUPPORTED = "Unsupported value"
    FORBIDDEN = "Forbidden"
    TOO_LONG = "Too long"
    TOO_MANY = "Too many"

    type: str
    path: str
    bad_value: object = OMIT_VALUE
    detail: str = ""

    @classmethod
    def required(cls, path: str, detail: str = "") -> FieldError:
        return cls(cls.REQUIRED, path, OMIT_VALUE, detail)

    @classmethod
    def forbidden(cls, path: str, detail: str) -> FieldError:
        return cls(cls.FORBIDDEN, path, OMIT_VALUE, detail)

    @classmethod
    def invalid(cls, path: str, value: object, detail: str) -> FieldError:
        return cls(cls.INVALID, path, value, detail)

    @classmethod
    def not_supported(cls, path: str, value: object, supported: Sequence[str]) -> FieldError:
        detail = ""
        if supported:
            detail = "supported values: " + ", ".join(go_quote(s) for s in supported)
        return cls(cls.NOT_SUPPORTED, path, value, detail)

    @classmethod
    def too_long(cls, path: str, max_bytes: int) -> FieldError:
        """field.TooLong: the value is not shown (it is what was too long)."""
        return cls(cls.TOO_LONG, path, OMIT_VALUE, f"may not be more than {max_bytes} bytes")

    @classmethod
    def too_many(cls, path: str, count: int, max_count: int) -> FieldError:
        return cls(cls.TOO_MANY, path, count, f"must have at most {max_count} items")

    def with_path(self, path: str, bad_value: object = OMIT_VALUE) -> FieldError:
        """The same error under another name (and, when given, with its value shown another way)."""
        return dataclasses.replace(self, path=path,
                                   bad_value=self.bad_value if bad_value is OMIT_VALUE else bad_value)

    def value_text(self) -> str:
        """The bad value as the body prints it; "" when the body does not show it."""
        if self.type in (self.REQUIRED, self.FORBIDDEN, self.TOO_LONG) or self.bad_value is OMIT_VALUE:
            return ""
        return _go_value(self.bad_value)

    def body(self) -> str:
        """ErrorBody(): Required, Forbidden and Too long never show the value."""
        text = self.type
        if value := self.value_text():
            text += ": " + value
        if self.detail:
            text += ": " + self.detail
        return text

    def __str__(self) -> str:
        return f"{self.path}: {self.body()}"


def _go_value(value: object) -> str:
    if isinstance(value, PrintedValue):
        return value.text
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        encoded = value.encode("utf-8", "surrogatepass")
        if len(encoded) > MAX_ECHOED_BYTES:  # addition; "ignore" drops a character cut in half
            return go_quote(encoded[:MAX_ECHOED_BYTES].decode("utf-8", "ignore")) + "..."
        return go_quote(value)
    return str(value)
