"""Exponential restart delays (workers, zygotes, sandboxes that cannot be attached): the policy, and one
sequence of delays drawn from it.

The kubelet's container restarts are the model (pkg/kubelet/container backoff: doubled per crash up to a cap, and
back to the first delay once a container lived long enough); this project's numbers are much smaller, since a
worker is cheap to start and its group waits for it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BackoffPolicy:
    """The first delay, the cap, and how long a life must last for the next delay to be the first again."""

    initial_s: float = 0.2
    max_s: float = 30.0
    reset_after_s: float = 60.0


class Backoff:
    """One sequence of delays under a policy (one per worker group, per sandbox, per zygote pool)."""

    def __init__(self, policy: BackoffPolicy) -> None:
        self.policy = policy
        self._next = policy.initial_s

    def next_delay(self, lived_s: float) -> float:
        if lived_s >= self.policy.reset_after_s:
            self._next = self.policy.initial_s
        delay = self._next
        self._next = min(self.policy.max_s, self._next * 2)
        return delay
