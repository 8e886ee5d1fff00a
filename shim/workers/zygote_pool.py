"""The zygotes a daemon uses: the one new workers are forked from, and earlier daemons' ones whose workers it adopted.

The spawner is started here, or, after a restart, is the earlier daemon's zygote if that runs this very version
(same code, so its workers are as good as new ones). After an upgrade the earlier zygote stays only as the broker
of the workers adopted from it, and is stopped once the last of them ends. A zygote that speaks another zygote or
worker protocol cannot be adopted: it is stopped with its workers, which the supervisor replaces (their probes go
on from the daemon's stored state). Which is which is `adoption_verdict`'s rule (shim/workers/adoption.py).

A spawner that dies is started again with a backoff, ahead of demand. Nothing here knows about groups or sandboxes:
that is the supervisor's; a worker's life says when it is done with an adopted zygote (`release`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from probe_api.zygote_protocol import handover_sockets
from shim.workers.adoption import SPAWN_FROM, adoption_verdict
from shim.workers.backoff import Backoff, BackoffPolicy
from shim.workers.process import set_child_subreaper
from shim.workers.zygote_handle import AdoptableWorker, Zygote, ZygoteError

log = logging.getLogger(__name__)

ZygoteFactory = Callable[[], Awaitable[Zygote]]
CONNECT_TIMEOUT_S = 5.0


@dataclass
class Adoption:
    zygote: Zygote
    worker: AdoptableWorker


class ZygotePool:
    def __init__(self, factory: ZygoteFactory, backoff: BackoffPolicy, handover_dir: str = "") -> None:
        self._factory = factory
        self._handover_dir = handover_dir
        self._spawner: Zygote | None = None
        # Earlier daemons' zygotes kept as brokers of adopted workers, with how many of those are not released yet.
        self._adopted: dict[Zygote, int] = {}
        self._lock = asyncio.Lock()
        self._backoff = Backoff(backoff)
        self._started_at = 0.0
        self._restart: asyncio.Task[None] | None = None
        self._closing = False
        self._was_subreaper: int | None = None

    @property
    def spawner(self) -> Zygote | None:
        return self._spawner

    async def start(self, adopt: bool = True) -> list[Adoption]:
        """Finds earlier daemons' zygotes (with `adopt`), and has a spawner; returns the workers to adopt."""
        adoptions: list[Adoption] = []
        if adopt and self._handover_dir:
            for path in handover_sockets(self._handover_dir):
                adoptions += await self._take_over(path)
        await self.get()
        return adoptions

    async def get(self) -> Zygote:
        """The zygote to fork new workers from, started if there is none (or it died)."""
        async with self._lock:
            if self._closing:
                raise ZygoteError("the supervisor is closing")
            if self._spawner is None or not self._spawner.alive:
                self._become_subreaper()
                self._spawner = await self._factory()
                self._watch(self._spawner)
            return self._spawner

    def release(self, zygote: Zygote) -> None:
        """One of the workers adopted from `zygote` ended (or was stopped): with its last one, an adopted zygote
        that is not the spawner is stopped."""
        if zygote not in self._adopted or zygote is self._spawner:
            return
        self._adopted[zygote] -= 1
        if self._adopted[zygote] <= 0:
            del self._adopted[zygote]
            asyncio.get_running_loop().create_task(zygote.close(), name=f"stop zygote {zygote.pid}")

    async def close(self) -> None:
        """Stops every zygote (and so every worker)."""
        await self._end()
        async with self._lock:
            zygotes = [z for z in [self._spawner, *self._adopted] if z is not None]
            self._adopted.clear()
            await asyncio.gather(*(z.close() for z in zygotes), return_exceptions=True)
        self._restore_subreaper()

    async def hand_over(self) -> None:
        """Leaves every zygote and its workers running for the next daemon."""
        await self._end()
        async with self._lock:
            for zygote in [self._spawner, *self._adopted]:
                if zygote is not None:
                    zygote.detach()
            self._adopted.clear()
        self._restore_subreaper()

    # --- internals ---------------------------------------------------------------------------------------

    async def _take_over(self, path: str) -> list[Adoption]:
        try:
            zygote = await Zygote.connect(path, timeout_s=CONNECT_TIMEOUT_S)
        except ZygoteError as exc:
            log.warning("not adopting the workers at %s: %s", path, exc)
            if "Connection refused" in str(exc) or "No such file" in str(exc):
                with contextlib.suppress(OSError):
                    os.unlink(path)  # its zygote is gone: a leftover of a crash
            return []
        hello = zygote.hello.result()
        verdict = adoption_verdict(hello, have_spawner=self._spawner is not None)
        if verdict.reason:
            log.warning("replacing the workers of zygote %d: %s", zygote.pid, verdict.reason)
            await zygote.close()
            return []
        try:
            workers = await zygote.adopt()
        except (ZygoteError, TimeoutError) as exc:
            log.warning("replacing the workers of zygote %d: it did not list them: %s", zygote.pid, exc or "timeout")
            await zygote.close()
            return []
        log.info("adopting %d workers of zygote %d (version %s)", len(workers), zygote.pid, hello.version,
                 extra={"pid": zygote.pid})
        if verdict.use == SPAWN_FROM:
            self._spawner = zygote
            self._watch(zygote)
        else:
            self._adopted[zygote] = len(workers)
        return [Adoption(zygote, worker) for worker in workers]

    def _watch(self, zygote: Zygote) -> None:
        self._started_at = asyncio.get_running_loop().time()
        zygote.died.add_done_callback(lambda died: self._on_died(zygote, died))

    def _on_died(self, zygote: Zygote, died: asyncio.Future[str]) -> None:
        if self._closing or died.cancelled() or zygote is not self._spawner:
            return
        lived = asyncio.get_running_loop().time() - self._started_at
        delay = self._backoff.next_delay(lived)
        log.warning("%s; starting a new one in %.3gs", died.result(), delay)
        # Started ahead of demand, so that the next new sandbox does not wait for its imports.
        if self._restart is None or self._restart.done():
            self._restart = asyncio.create_task(self._restart_after(delay), name="zygote restart")

    async def _restart_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        try:
            await self.get()
        except ZygoteError as exc:
            log.error("zygote restart failed: %s", exc)

    async def _end(self) -> None:
        self._closing = True
        if self._restart is not None:
            self._restart.cancel()
            await asyncio.gather(self._restart, return_exceptions=True)

    def _become_subreaper(self) -> None:
        if self._was_subreaper is None:
            # Before the first fork: a worker orphaned by a dead zygote must become our child (reaped here,
            # with its exit status), not init's.
            self._was_subreaper = set_child_subreaper(1)

    def _restore_subreaper(self) -> None:
        if self._was_subreaper is not None:
            set_child_subreaper(self._was_subreaper)
            self._was_subreaper = None
