"""What the supervisor keeps per sandbox: its target, its registrations, and its attachment to its group's worker.

A member is one sandbox in a group (shim/workers/sandbox_group.py): its registrations (replayed into every new worker of
the group), whether the running worker serves it (`Attachment`), and why not. The attachment changes in one place,
`Member.move`, together with the task that drives it.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_worker_pb2 as worker_pb
from shim.workers.backoff import Backoff

if TYPE_CHECKING:
    from shim.workers.sandbox_group import SandboxGroup


@dataclass
class SandboxTarget:
    sandbox_id: str
    netns_path: str
    pod_ips: list[str] = field(default_factory=list)
    tenancy: str = ""  # the pod's Kubernetes namespace: workers never mix two

    @classmethod
    def of(cls, sandbox) -> "SandboxTarget":
        """From a shim.sandboxes.resolver.SandboxInfo."""
        return cls(sandbox_id=sandbox.id, netns_path=sandbox.netns_path, pod_ips=list(sandbox.pod_ips),
                   tenancy=sandbox.namespace)


class WorkerRejected(Exception):
    """The worker (or the same validation, run here first) refused a probe."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = list(errors)


class Attachment(enum.Enum):
    """A sandbox's place in its group's running worker."""

    DETACHED = "detached"  # not in the running worker (or none runs); nothing under way
    ATTACHING = "attaching"  # its task assigns its netns at the broker, then sends AddSandbox and its probes
    FAILED = "failed"  # its netns could not be assigned (`error` says why); its task tries again after a backoff
    ATTACHED = "attached"  # the running worker serves it; its task may still be replaying its probes
    # An adopted worker serves it, whose probes are not reconciled yet: registrations are kept, not sent (the
    # adoption sends only what differs from what the worker runs).
    RECONCILING = "reconciling"


# The states in which a task drives the attachment on; it is kept into ATTACHED (its replays), dropped otherwise.
_DRIVEN = (Attachment.ATTACHING, Attachment.FAILED)


@dataclass
class Member:
    target: SandboxTarget
    group: "SandboxGroup"
    backoff: Backoff
    status: service_pb.WorkerStatus = field(default_factory=service_pb.WorkerStatus)  # as last reported
    changed: asyncio.Future[None] | None = None  # resolved (and replaced) at every status change
    regs: dict[str, worker_pb.ProbeRegistration] = field(default_factory=dict)
    inflight: int = 0  # run_once calls: the worker must outlive them even with no probe
    pinned: bool = False  # ensure()d: kept with no probe until its last probe is removed
    kept_warm: bool = False  # the kubelet bridge probes here: kept until the sandbox stops
    # Changed by move() only:
    attachment: Attachment = Attachment.DETACHED
    netns_inode: int = 0  # the netns the broker holds for it, while attached
    error: str = ""  # FAILED: why
    task: asyncio.Task[None] | None = None

    @property
    def attached(self) -> bool:
        """The running worker serves it (events of its sandbox are its own)."""
        return self.attachment in (Attachment.ATTACHED, Attachment.RECONCILING)

    def move(self, to: Attachment, *, task: asyncio.Task[None] | None = None, netns_inode: int = 0,
             error: str = "") -> None:
        """The one place the attachment changes. ATTACHING and FAILED come with the task that drives them on; a
        task left behind is cancelled, unless it is the one moving the member (it is ending by itself)."""
        if (to in _DRIVEN) != (task is not None):
            raise ValueError(f"{to.name}: a task drives ATTACHING and FAILED, and nothing else")
        if to is Attachment.ATTACHED and task is None:
            task = self.task  # still replaying the probes, or None (an adoption reconciled)
        elif self.task is not None and self.task is not task and self.task is not asyncio.current_task():
            self.task.cancel()
        self.attachment, self.task, self.netns_inode, self.error = to, task, netns_inode, error
