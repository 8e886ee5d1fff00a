"""What the board observed, written to the store behind it, so that a restarted daemon starts where this one was.

Durable: per probe, its row as the board has it, `status` whole (its thresholded state and what the thresholds
need to go on, its last attempt and totals, the worker status as last shown: an adopted worker shows the same);
a kubelet bridge row whole; and the board's instance id and revision, so that watchers resume across a restart.
Not durable: metrics, traces, watchers' queues.

Off the probes' path: the board tells `note` of each change (a plain call, no I/O), and the writes happen in
batches on the store's thread:
- soon (within SOON_S) after a change that matters to the thresholds: a new revision (state change, new or
  removed row) or an attempt that changed the state key (`durable_key`). A run of equal results does not change
  the key once it reaches its threshold (only `run < threshold` is ever asked), so a steady probe writes nothing;
- every LAZY_S otherwise: the attempts' last result and totals;
- everything at stop (`close`), fsynced.

Revisions: the board numbers changes; a crash can lose the last ones it issued. So revisions are reserved ahead
(REVISION_BLOCK at a time, durably) and a daemon after a crash starts numbering above the reservation: a number
is never issued twice. `revision` is the last one stored with its state: watchers that had it resume exactly.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from cri_proto import probe_service_pb2 as service_pb
from probe_api.validation import effective_timing
from shim.state.store import StoreError

log = logging.getLogger(__name__)

SOON_S = 0.02
LAZY_S = 30.0
REVISION_BLOCK = 1 << 20


def durable_key(probe: service_pb.Probe, success_threshold: int, failure_threshold: int) -> tuple:
    """What the thresholded state needs to resume exactly; writes are due when it changes."""
    status = probe.status
    return (status.state, status.on_hold, min(status.consecutive_successes, success_threshold),
            min(status.consecutive_failures, failure_threshold))


def observed_blob(probe: service_pb.Probe) -> bytes:
    """The row as the board has it, worker status included: an adopted worker shows the same, so a restart makes
    no revision for it (a worker replaced instead shows its own as soon as it starts)."""
    return probe.SerializeToString(deterministic=True)


@dataclass(frozen=True)
class BoardIdentity:
    """Where the last daemon's board left off: the new board's instance id, first revision and resume point."""

    instance_id: str
    revision: int
    resume_point: int | None


def board_identity(meta: dict[str, str]) -> BoardIdentity:
    """From the store's meta rows. A clean stop stored its last revision as the reservation: numbering goes on
    from it. After a crash, numbering starts above the reservation; the last stored revision is the resume point."""
    instance_id = meta.get("instance_id") or uuid.uuid4().hex
    stored = int(meta.get("revision", "0"))
    reserved = int(meta.get("revision_reserved", str(stored)))
    return BoardIdentity(instance_id=instance_id, revision=max(stored, reserved),
                         resume_point=stored if "revision" in meta else None)


class StateWriter:
    def __init__(self, store, board, *, soon_s: float = SOON_S, lazy_s: float = LAZY_S,
                 on_write: Callable[[int], None] | None = None) -> None:
        """on_write(rows): after each transaction (the daemon's metrics)."""
        self._store = store
        self._on_write = on_write
        self._board = board
        self._soon_s = soon_s
        self._lazy_s = lazy_s
        self._dirty: set[str] = set()
        self._keys: dict[str, tuple] = {}  # durable_key as last noted
        self._thresholds: dict[str, tuple[int, int]] = {}
        self._reserved = 0
        self._soon: asyncio.TimerHandle | None = None
        self._lazy: asyncio.Task[None] | None = None
        self._writing: asyncio.Future[None] | None = None

    async def start(self, identity: BoardIdentity) -> None:
        """Reserves revisions ahead (durably) and starts listening to the board."""
        self._reserved = identity.revision + REVISION_BLOCK
        await self._store.run(self._store.save_observed, {}, {
            "instance_id": identity.instance_id, "revision_reserved": str(self._reserved)}, True)
        for probe in self._board.list():
            self._keys[probe.probe_id] = self._key(probe)
        self._board.listen(self.note)
        self._lazy = asyncio.create_task(self._every_lazy(), name="state writer")

    @property
    def urgent(self) -> bool:
        """A write is due soon (something that matters to the thresholds changed)."""
        return self._soon is not None

    def note(self, probe_id: str, probe: service_pb.Probe | None, revision: bool) -> None:
        """The board's listener: called for every change, on the event loop; never does I/O itself."""
        self._dirty.add(probe_id)
        if probe is None:
            self._keys.pop(probe_id, None)
            self._thresholds.pop(probe_id, None)
        else:
            if revision:
                self._thresholds.pop(probe_id, None)  # the spec may have changed
            key = self._key(probe)
            if self._keys.get(probe_id) != key:
                self._keys[probe_id] = key
                revision = True
        if revision and self._soon is None:
            self._soon = asyncio.get_running_loop().call_later(self._soon_s, self._flush_soon)

    async def flush(self, durable: bool = False) -> None:
        """Writes every noted change now (waiting for a write under way first: the order of writes holds)."""
        while self._writing is not None and not self._writing.done():
            await asyncio.shield(self._writing)
        rows: dict[str, bytes | None] = {}
        for probe_id in self._dirty:
            probe = self._board.peek(probe_id)
            rows[probe_id] = observed_blob(probe) if probe is not None else None
        self._dirty.clear()
        revision = self._board.revision
        meta = {"revision": str(revision)}
        if durable:
            meta["revision_reserved"] = str(revision)  # a clean stop: the next daemon goes on from here
        elif revision + REVISION_BLOCK // 2 > self._reserved:
            self._reserved = revision + REVISION_BLOCK
            meta["revision_reserved"] = str(self._reserved)
        self._writing = asyncio.ensure_future(self._store.run(self._store.save_observed, rows, meta, durable))
        try:
            await asyncio.shield(self._writing)
        except StoreError as exc:
            # Not lost: noted again, retried with the next batch.
            self._dirty.update(rows)
            log.warning("observations not stored yet (%d rows): %s", len(rows), exc)
            return
        if self._on_write is not None:
            self._on_write(len(rows))

    async def close(self) -> None:
        """The last write, fsynced: the next daemon starts exactly here."""
        if self._soon is not None:
            self._soon.cancel()
            self._soon = None
        if self._lazy is not None:
            self._lazy.cancel()
            await asyncio.gather(self._lazy, return_exceptions=True)
        await self.flush(durable=True)

    # --- internals -------------------------------------------------------------------------------------

    def _key(self, probe: service_pb.Probe) -> tuple:
        thresholds = self._thresholds.get(probe.probe_id)
        if thresholds is None:
            timing = effective_timing(probe.spec)
            thresholds = self._thresholds[probe.probe_id] = (timing.success_threshold, timing.failure_threshold)
        return durable_key(probe, *thresholds)

    def _flush_soon(self) -> None:
        self._soon = None
        asyncio.ensure_future(self.flush()).add_done_callback(_log_failure)

    async def _every_lazy(self) -> None:
        while True:
            await asyncio.sleep(self._lazy_s)
            if self._dirty:
                await self.flush()


def _log_failure(done: asyncio.Future[None]) -> None:
    if not done.cancelled() and done.exception() is not None:
        log.error("writing observations failed", exc_info=done.exception())
