"""Exponential restart delays (workers, zygotes, sandboxes that cannot be attached)."""

from __future__ import annotations


class Backoff:
    """Exponential restart delays, back to the initial one after a life long enough."""

    def __init__(self, initial_s: float, max_s: float, reset_after_s: float) -> None:
        self.initial_s, self.max_s, self.reset_after_s = initial_s, max_s, reset_after_s
        self._next = initial_s

    def next_delay(self, lived_s: float) -> float:
        if lived_s >= self.reset_after_s:
            self._next = self.initial_s
        delay = self._next
        self._next = min(self.max_s, self._next * 2)
        return delay
