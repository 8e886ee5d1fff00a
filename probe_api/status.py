"""A probe's observed status (cri_proto ProbeStatus): the one way it is copied, and which fields a worker owns.

Kubernetes splits an object into spec and status; so does `Probe` (registration fields, then `status`). A status
moves between the daemon's board, its store, a worker (as the progress a probe goes on from, and back in a
Snapshot) and the watch; every move is `copy_status`, which walks the message's own descriptor, so a field added
to ProbeStatus later moves everywhere without anyone listing it (tests/unit/test_status_reflection.py holds that).

Ownership is the one list kept by hand, because it is a decision and not a copy: the worker computes its threshold
bookkeeping, last attempt and totals (it runs on while no daemon listens, so its word on them is right after a
handover); every other field is the daemon's (the span ids it recorded, the worker status it shows), and a worker
hands those back exactly as it was given them.
"""

from __future__ import annotations

from collections.abc import Collection

from cri_proto import probe_service_pb2 as service_pb

ProbeStatus = service_pb.ProbeStatus

WORKER_OWNED = frozenset({
    "state", "state_changed_at", "consecutive_successes", "consecutive_failures", "on_hold", "last_attempt", "totals",
})

_NAMES = frozenset(field.name for field in ProbeStatus.DESCRIPTOR.fields)
if not WORKER_OWNED <= _NAMES:  # a renamed field must not silently leave the worker's hands
    raise ImportError(f"WORKER_OWNED names fields ProbeStatus lacks: {sorted(WORKER_OWNED - _NAMES)}")
# Everything else, a field added later included: what a worker keeps as given and hands back.
DAEMON_OWNED = _NAMES - WORKER_OWNED
# What an attempt report moves onto the daemon's board: the worker's fields but the state, which reaches the board
# only with the StateChange that follows the attempt (a revision, which watchers get; an attempt makes none).
ATTEMPT_FIELDS = WORKER_OWNED - {"state", "state_changed_at"}


def copy_status(src: ProbeStatus, dst: ProbeStatus, only: Collection[str] | None = None) -> None:
    """Makes `dst` hold what `src` holds: every field, or only the fields named in `only` (a field `src` does not
    set is cleared in `dst`, so that "unset" moves too). Fields outside `only` are left as they are."""
    if only is None:
        dst.CopyFrom(src)
        return
    scalars, messages = _plan(only if isinstance(only, frozenset) else frozenset(only))
    for name in scalars:
        setattr(dst, name, getattr(src, name))
    for name in messages:
        if src.HasField(name):
            getattr(dst, name).CopyFrom(getattr(src, name))
        else:
            dst.ClearField(name)


_PLANS: dict[frozenset[str], tuple[tuple[str, ...], tuple[str, ...]]] = {}


def _plan(only: frozenset[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The scalar and the message fields named in `only`, from the descriptor, worked out once per set: a copy is
    made per attempt, and walking the descriptor each time cost more than the copy."""
    plan = _PLANS.get(only)
    if plan is None:
        unknown = only - _NAMES
        if unknown:
            raise ValueError(f"ProbeStatus has no field {sorted(unknown)}")
        fields = [f for f in ProbeStatus.DESCRIPTOR.fields if f.name in only]
        plan = (tuple(f.name for f in fields if f.message_type is None),
                tuple(f.name for f in fields if f.message_type is not None))
        if len(_PLANS) < 64:  # the sets are the module constants and a few literals: never grows past that
            _PLANS[only] = plan
    return plan


def status_copy(src: ProbeStatus, only: Collection[str] | None = None) -> ProbeStatus:
    """A new ProbeStatus holding `src` (or only the fields named in `only`)."""
    out = ProbeStatus()
    copy_status(src, out, only)
    return out
