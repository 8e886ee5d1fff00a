"""Which worker serves which sandbox: the grouping rules, pure (the supervisor applies them).

A pooled worker serves up to `sandboxes_per_worker` sandboxes of one tenancy, and never two tenancies: the
tenancy is the pod's Kubernetes namespace (CRI mode), or one for every bare netns of the embedded mode unless
its names carry one (`embedded_namespace_separator`). Groups fill in order, so that a node runs as few workers
as the rule allows. In the strict mode (`worker_isolation = sandbox`) every sandbox is a group of its own:
the one-process-per-sandbox design, for operators who want it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from probe_api.defaults import WORKER_OPEN_FILES

POOLED = "pooled"
STRICT = "sandbox"
ISOLATION_MODES = (POOLED, STRICT)
DEFAULT_SANDBOXES_PER_WORKER = 16
MAX_SANDBOXES_PER_WORKER = 256
DEFAULT_TENANCY_NAME = "default"  # how a group of the embedded mode's one tenancy is named
# Descriptors a worker may need per sandbox: its ready sockets (probe_worker/socket_source.py keeps up to a batch
# and a low-water mark per address family) and its probes' connections in flight, with room to spare.
OPEN_FILES_PER_SANDBOX = 64


@dataclass(frozen=True)
class GroupView:
    """What the choice needs to know of a group."""

    name: str
    tenancy: str
    size: int
    open: bool = True  # False once the group is stopping: it takes no one new


def choose_group(groups: Iterable[GroupView], *, tenancy: str, isolation: str, capacity: int) -> str | None:
    """The existing group a new sandbox joins, or None when it needs a new one."""
    if isolation == STRICT:
        return None
    for group in groups:
        if group.open and group.tenancy == tenancy and group.size < capacity:
            return group.name
    return None


def new_group_name(*, sandbox_id: str, tenancy: str, isolation: str, taken: Iterable[str]) -> str:
    """"NAMESPACE#N", the smallest N free; a strict group is named after its sandbox."""
    if isolation == STRICT:
        return sandbox_id
    used = set(taken)
    prefix = tenancy or DEFAULT_TENANCY_NAME
    n = 1
    while f"{prefix}#{n}" in used:
        n += 1
    return f"{prefix}#{n}"


def embedded_tenancy(netns_name: str, separator: str) -> str:
    """The namespace a bare netns's name carries ("team-a.web-1" with "." gives "team-a"); "" without one."""
    if not separator or separator not in netns_name:
        return ""
    return netns_name.split(separator, 1)[0]


def worker_open_files(capacity: int) -> int:
    """RLIMIT_NOFILE for a worker serving up to `capacity` sandboxes: the workers' usual 1024, more for big groups."""
    return max(WORKER_OPEN_FILES, OPEN_FILES_PER_SANDBOX * capacity)
