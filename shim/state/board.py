"""The in-memory status of every probe, and the resumable, revisioned watch over it (KEP-2104 / KPNG style).

Owns: the current Probe messages (registration, metadata and `status`), the board's random instance id, its revision
counter (+1 per change, from 0), a bounded history of changes, and the watchers.

Watch protocol, as the client sees it:
- A watch that sends this board's instance id and a `since_revision` still covered by the history gets exactly the
  changes it missed (UPDATED / REMOVED after since_revision that match its filter), then live changes.
- Any other watch first gets the full state: one SNAPSHOT per matching probe, all at the snapshot's revision, then
  SNAPSHOT_COMPLETE; the client replaces its state with the snapshot on SNAPSHOT_COMPLETE (an empty state sends only
  SNAPSHOT_COMPLETE). Live changes follow with no gap and no duplicate.
- A probe that stops matching a filter because an update changed its labels, container or state is REMOVED for
  that watcher, as Kubernetes does for label-selector watches, so a client's view never keeps a probe outside its
  filter.
- ATTEMPT events (every_attempt, or unsuccessful_attempts for an attempt that did not succeed) carry the board's
  current revision; they are best effort and never replayed.
- A watcher whose buffer fills up is dropped at once (producers never wait) and its stream ends with RESYNC. The
  RESYNC revision is a safe resume point: everything up to it that matched was delivered (0 if the snapshot had not
  completed). Resume from the last revision received, and only once SNAPSHOT_COMPLETE has been seen.

Not thread-safe, by design: everything runs on the daemon's event loop. put/update/remove/record_attempt are plain
functions that never await, so a watch registers at the very instant its snapshot or replay is computed.
Responses handed to watchers are shared between them and must be treated as read-only.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb

Probe = service_pb.Probe
ProbeFilter = service_pb.ProbeFilter
WatchResponse = service_pb.WatchProbeStatusResponse

MIN_CONTAINER_ID_PREFIX = 3


# --- pure logic ----------------------------------------------------------------------------------------------------

def matches(filter: ProbeFilter, probe: Probe) -> bool:
    """Empty filter fields match everything; every label_selector pair must be present with an equal value."""
    if filter.probe_id and filter.probe_id != probe.probe_id:
        return False
    if filter.pod_sandbox_id and filter.pod_sandbox_id != probe.pod_sandbox_id:
        return False
    if filter.container_id and filter.container_id != probe.container_id:
        return False
    if filter.type != spec_pb.PROBE_TYPE_UNSPECIFIED and filter.type != probe.type:
        return False
    if filter.container and not container_matches(filter.container, probe):
        return False
    if filter.HasField("state") and filter.state != probe.status.state:
        return False
    # .get, not []: indexing a protobuf map inserts the missing key.
    return all(probe.labels.get(key) == value for key, value in filter.label_selector.items())


def container_matches(container: str, probe: Probe) -> bool:
    """A container's name, its id, or a long enough prefix of its id."""
    return container in (probe.container_name, probe.container_id) or (
        len(container) >= MIN_CONTAINER_ID_PREFIX and probe.container_id.startswith(container))


def identity(probe: Probe) -> Probe:
    """The fields a filter looks at, and nothing else: the body of a REMOVED event. A change of any of them may
    take a probe out of a watcher's view, which then gets REMOVED."""
    out = Probe(probe_id=probe.probe_id, pod_sandbox_id=probe.pod_sandbox_id, container_id=probe.container_id,
                container_name=probe.container_name, type=probe.type, status=service_pb.ProbeStatus(state=probe.status.state))
    out.labels.update(probe.labels)
    return out


def _copy(probe: Probe) -> Probe:
    out = Probe()
    out.CopyFrom(probe)
    return out


def sort_key(probe: Probe) -> tuple[str, str, int, str]:
    return (probe.pod_sandbox_id, probe.container_id, probe.type, probe.probe_id)


@dataclass(frozen=True, slots=True)
class Change:
    """One revision of the board, as kept in the history and fanned out to watchers.

    `left_view` is a REMOVED for the probe's previous identity, set when an update changed what filters look at:
    a watcher whose filter matched the old identity but not the new one receives it instead of `response`.
    """

    revision: int
    response: WatchResponse
    left_view: WatchResponse | None = None


def response_for(filter: ProbeFilter, change: Change) -> WatchResponse | None:
    """What a watcher with this filter receives for a change, if anything."""
    if matches(filter, change.response.probe):
        return change.response
    if change.left_view is not None and matches(filter, change.left_view.probe):
        return change.left_view
    return None


def changes_since(history: Sequence[Change], current_revision: int, since_revision: int) -> list[Change] | None:
    """The changes after since_revision, or None when they cannot all be replayed (too old, or in the future).

    The history holds consecutive revisions ending at current_revision, so coverage is a bound check.
    """
    if since_revision > current_revision:
        return None
    if since_revision == current_revision:
        return []
    if not history or history[0].revision > since_revision + 1:
        return None
    start = since_revision + 1 - history[0].revision
    return list(itertools.islice(history, start, None))


def replay_responses(changes: Iterable[Change], filter: ProbeFilter) -> list[WatchResponse]:
    return [r for r in (response_for(filter, c) for c in changes) if r is not None]


def snapshot_responses(probes: Iterable[Probe], filter: ProbeFilter, instance_id: str,
                       revision: int) -> list[WatchResponse]:
    """The full state for one filter: SNAPSHOT per matching probe (copied now), then SNAPSHOT_COMPLETE."""
    selected = sorted((p for p in probes if matches(filter, p)), key=sort_key)
    out = [WatchResponse(instance_id=instance_id, revision=revision, type=service_pb.SNAPSHOT, probe=p)
           for p in selected]
    out.append(WatchResponse(instance_id=instance_id, revision=revision, type=service_pb.SNAPSHOT_COMPLETE))
    return out


# --- watchers ------------------------------------------------------------------------------------------------------

class _Watcher:
    """One watch stream's bounded buffer. Producers never wait: a full buffer marks the watcher overflowed."""

    def __init__(self, filter: ProbeFilter, every_attempt: bool, capacity: int, *,
                 unsuccessful_attempts: bool = False) -> None:
        self.filter = filter
        self.every_attempt = every_attempt
        self.unsuccessful_attempts = unsuccessful_attempts
        self.overflowed = False
        self._capacity = capacity
        self._pending: collections.deque[WatchResponse] = collections.deque()
        self._wakeup = asyncio.Event()

    def wants_attempt(self, result: int) -> bool:
        return self.every_attempt or (self.unsuccessful_attempts and result != spec_pb.RESULT_SUCCESS)

    def end(self) -> None:
        """No more events: the stream ends with RESYNC at the last revision it delivered, as an overflow does
        (what was buffered is not lost: a watcher resuming from there gets it again)."""
        self.overflowed = True
        self._wakeup.set()

    def offer(self, response: WatchResponse) -> bool:
        if len(self._pending) >= self._capacity:
            self.overflowed = True
            self._pending.clear()  # it will never be sent: free it now, the client may stay stuck for long
            self._wakeup.set()
            return False
        self._pending.append(response)
        self._wakeup.set()
        return True

    async def next(self) -> WatchResponse | None:
        """The next buffered response, or None once overflowed."""
        while not self._pending and not self.overflowed:
            self._wakeup.clear()
            await self._wakeup.wait()
        if self.overflowed:
            return None
        return self._pending.popleft()


# --- the board -----------------------------------------------------------------------------------------------------

# What the board tells its listener (the state writer): a probe's id, the row now (None once removed), and
# whether the change made a revision (an attempt does not).
Listener = Callable[[str, "Probe | None", bool], None]


class StatusBoard:
    def __init__(self, *, history_size: int = 4096, watcher_queue: int = 1024, instance_id: str | None = None,
                 revision: int = 0, resume_point: int | None = None) -> None:
        """instance_id and revision: where an earlier daemon's board left off (shim/state/writer.py keeps them), so that
        watchers resume across a restart. resume_point: the last revision whose state is fully in the store; a
        watcher resuming from it gets the changes from `revision` on (the revisions in between, if any, were
        issued by a daemon that crashed before storing them: a watcher that saw one gets the full state)."""
        if history_size < 0:
            raise ValueError("history_size must be >= 0")
        if watcher_queue < 1:
            raise ValueError("watcher_queue must be >= 1")
        self.instance_id = instance_id or uuid.uuid4().hex
        self._revision = revision
        self._first_revision = revision
        self._ended = False
        self._resume_point = resume_point
        self._listener: Listener | None = None
        self._probes: dict[str, Probe] = {}
        self._history: collections.deque[Change] = collections.deque(maxlen=history_size)
        self._watcher_queue = watcher_queue
        self._watchers: set[_Watcher] = set()

    @property
    def revision(self) -> int:
        return self._revision

    @property
    def watcher_count(self) -> int:
        return len(self._watchers)

    def __len__(self) -> int:
        return len(self._probes)

    # --- reads ---------------------------------------------------------------------------------

    def get(self, probe_id: str) -> Probe | None:
        probe = self._probes.get(probe_id)
        return _copy(probe) if probe is not None else None

    def peek(self, probe_id: str) -> Probe | None:
        """The stored probe itself, not a copy, for the per-attempt path where a copy of every field
        would cost more than the rest of the bookkeeping. Read-only: change it with update()."""
        return self._probes.get(probe_id)

    def count(self, predicate: Callable[[Probe], bool]) -> int:
        """How many probes satisfy predicate (read-only), without copying any."""
        return sum(1 for probe in self._probes.values() if predicate(probe))

    def list(self, filter: ProbeFilter | None = None) -> list[Probe]:
        """Copies of the matching probes, sorted by sandbox, container, type."""
        selected = [p for p in self._probes.values() if filter is None or matches(filter, p)]
        return [_copy(probe) for probe in sorted(selected, key=sort_key)]

    # --- changes -------------------------------------------------------------------------------

    def listen(self, listener: Listener) -> None:
        """One listener, told of every change (after it is made); it must not change the board."""
        self._listener = listener

    def restore(self, probes: Iterable[Probe]) -> None:
        """Puts back the rows an earlier daemon had, each with its own revision: no new revision, no event (the
        watchers that saw them resume from the revision they had)."""
        for probe in probes:
            self._probes[probe.probe_id] = _copy(probe)

    def put(self, probe: Probe) -> int:
        """Adds or replaces a probe (the board keeps a copy); returns the new revision, also set as its revision."""
        return self._commit(_copy(probe))

    def update(self, probe_id: str, mutate: Callable[[Probe], None]) -> int | None:
        """Applies mutate to the probe, then records the change like put(); None if the probe is unknown.

        mutate works on a copy: if it raises, the board is unchanged.
        """
        current = self._probes.get(probe_id)
        if current is None:
            return None
        changed = _copy(current)
        mutate(changed)
        if changed.probe_id != probe_id:
            raise ValueError(f"update of {probe_id!r} must not change its probe_id")
        return self._commit(changed)

    def remove(self, probe_id: str) -> int | None:
        """Forgets a probe; returns the new revision, or None (and changes nothing) if it was unknown."""
        previous = self._probes.pop(probe_id, None)
        if previous is None:
            return None
        self._revision += 1
        self._record(Change(self._revision, self._response(service_pb.REMOVED, identity(previous))))
        if self._listener is not None:
            self._listener(probe_id, None, True)
        return self._revision

    def record_attempt(self, probe_id: str, mutate: Callable[[Probe], None]) -> None:
        """Applies an attempt's effects (in `status`: last attempt, totals, counters), without a new revision.

        Attempts are not state changes: they are neither in the history nor sent to watchers without
        every_attempt (or, for one that did not succeed, unsuccessful_attempts). mutate must only touch status fields
        (not the identity a filter looks at).
        """
        current = self._probes.get(probe_id)
        if current is None:
            return
        # On a fresh copy, not in place: protobuf (upb) frees the memory of a replaced sub-message
        # only with the whole message, so a stored probe changed in place grew by an attempt at every
        # attempt (~0.6 KiB; the daemon grew 115 KiB/s at 300 attempts/s). The copy costs ~1 us.
        probe = _copy(current)
        mutate(probe)
        self._probes[probe_id] = probe
        if self._listener is not None:
            self._listener(probe_id, probe, False)
        result = probe.status.last_attempt.result
        targets = [w for w in self._watchers if w.wants_attempt(result) and matches(w.filter, probe)]
        if targets:
            response = self._response(service_pb.ATTEMPT, probe)
            for watcher in targets:
                self._offer(watcher, response)

    def end_watches(self) -> None:
        """Ends every watch stream (the daemon stops): each gets RESYNC at its last delivered revision, from which
        it resumes with the next daemon. A watch opened later ends at once the same way."""
        self._ended = True
        for watcher in list(self._watchers):
            watcher.end()
        self._watchers.clear()

    # --- watch ---------------------------------------------------------------------------------

    async def watch(self, request: service_pb.WatchProbeStatusRequest) -> AsyncIterator[WatchResponse]:
        """Replay or snapshot, then live changes until the caller stops iterating or the watcher overflows.

        Closing or cancelling the iteration (gRPC cancelling the stream) unregisters the watcher.
        """
        filter = ProbeFilter()
        filter.CopyFrom(request.filter)
        watcher = _Watcher(filter, request.every_attempt, self._watcher_queue,
                           unsuccessful_attempts=request.unsuccessful_attempts)
        # No await between computing the backlog and registering: nothing can happen in between.
        backlog, delivered = self._backlog(request, filter)
        if self._ended:
            watcher.end()
        else:
            self._watchers.add(watcher)
        try:
            for response in backlog:
                if watcher.overflowed:
                    break
                yield response
                if response.type != service_pb.SNAPSHOT:  # a partial snapshot is no resume point
                    delivered = response.revision
            while not watcher.overflowed:
                response = await watcher.next()
                if response is None:
                    break
                yield response
                delivered = response.revision
            yield WatchResponse(instance_id=self.instance_id, revision=delivered, type=service_pb.RESYNC)
        finally:
            self._watchers.discard(watcher)

    # --- internals -----------------------------------------------------------------------------

    def _backlog(self, request: service_pb.WatchProbeStatusRequest,
                 filter: ProbeFilter) -> tuple[list[WatchResponse], int]:
        """What a new watcher gets before live changes, and the resume point it starts from."""
        if request.instance_id == self.instance_id:
            since = request.since_revision
            if since == self._resume_point and self._history_floor() is not None:
                since = self._history_floor()  # a restart's gap: nothing in it was stored, hence nothing missed
            missed = changes_since(self._history, self._revision, since)
            if missed is not None:
                return replay_responses(missed, filter), request.since_revision
        return snapshot_responses(self._probes.values(), filter, self.instance_id, self._revision), 0

    def _commit(self, probe: Probe) -> int:
        if not probe.probe_id:
            raise ValueError("a probe needs a probe_id")
        previous = self._probes.get(probe.probe_id)
        self._revision += 1
        probe.revision = self._revision
        self._probes[probe.probe_id] = probe
        left_view = None
        if previous is not None:
            old = identity(previous)
            if old != identity(probe):
                left_view = self._response(service_pb.REMOVED, old)
        self._record(Change(self._revision, self._response(service_pb.UPDATED, probe), left_view))
        if self._listener is not None:
            self._listener(probe.probe_id, probe, True)
        return self._revision

    def _history_floor(self) -> int | None:
        """The revision the history starts after (this daemon's first), while the history still reaches it."""
        floor = self._history[0].revision - 1 if self._history else self._revision
        return floor if floor == self._first_revision else None

    def _record(self, change: Change) -> None:
        self._history.append(change)
        for watcher in list(self._watchers):
            response = response_for(watcher.filter, change)
            if response is not None:
                self._offer(watcher, response)

    def _offer(self, watcher: _Watcher, response: WatchResponse) -> None:
        if not watcher.offer(response):
            self._watchers.discard(watcher)  # it gets RESYNC from its own iterator; stop feeding it now

    def _response(self, type: int, probe: Probe) -> WatchResponse:
        # The constructor copies probe: later changes to the board's probe do not leak into sent events.
        return WatchResponse(instance_id=self.instance_id, revision=self._revision, type=type, probe=probe)
