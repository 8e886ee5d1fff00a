"""One attempt's deadline for the timeout scopes it enters one after another, on one timer.

`asyncio.timeout_at(deadline)` arms a timer per scope (a TimerHandle, a heap push, a cancel, a heap pop later),
and an HTTP attempt enters four or five such scopes with the same deadline: a tenth of its Python work. A scope of
`AttemptDeadline` keeps asyncio.timeout_at's semantics: the task is cancelled at the deadline while inside a
scope, and that scope turns the cancellation into TimeoutError (task.cancel / task.uncancel as asyncio counts
them). The timer is one for the attempt: armed at the first scope, it stays armed between scopes; when it fires
with no scope open, the next scope cancels at its first suspension, as asyncio.timeout_at of a deadline already
past does. A scope entered inside another one, or from another task, is a plain asyncio.timeout_at.
"""

from __future__ import annotations

import asyncio


class AttemptDeadline:
    __slots__ = ("when", "_loop", "_task", "_timer", "_open", "_passed")

    def __init__(self, when: float) -> None:
        """`when` on the running loop's clock; the scopes belong to the current task."""
        self.when = when
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._timer: asyncio.Handle | None = None
        self._open: _Scope | None = None
        self._passed = False  # the timer fired while no scope was open

    def scope(self) -> "_Scope | asyncio.Timeout":
        if self._open is not None or asyncio.current_task() is not self._task:
            return asyncio.timeout_at(self.when)
        return _Scope(self)

    def close(self) -> None:
        """The attempt is over: its timer goes."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _enter(self, scope: "_Scope") -> None:
        self._open = scope
        if self._timer is None:
            if self._passed or self.when <= self._loop.time():
                self._timer = self._loop.call_soon(self._fire)
            else:
                self._timer = self._loop.call_at(self.when, self._fire)

    def _fire(self) -> None:
        self._timer = None
        scope = self._open
        if scope is None:
            self._passed = True
            return
        scope.expiring = True
        self._task.cancel()  # type: ignore[union-attr]


class _Scope:
    __slots__ = ("_deadline", "expiring")

    def __init__(self, deadline: AttemptDeadline) -> None:
        self._deadline = deadline
        self.expiring = False

    async def __aenter__(self) -> "_Scope":
        self._deadline._enter(self)
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        deadline = self._deadline
        deadline._open = None
        if self.expiring and deadline._task.uncancel() == 0 and exc_type is asyncio.CancelledError:  # type: ignore[union-attr]
            raise TimeoutError
        return None
