"""What the supervisor keeps per worker group and per sandbox (shim/workers/supervisor.py and worker_lives.py use it).

A group is one worker's life story: its status, its connection while it runs, the zygote whose broker holds its
sandboxes' netns, and, for a worker an earlier daemon left running, the adoption its first life takes over. A
member is one sandbox in a group: its registrations (replayed into every new worker of the group), whether the
running worker serves it, and why not.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_worker_pb2 as worker_pb
from shim.workers.backoff import Backoff
from shim.workers.connection import WorkerConnection
from shim.workers.zygote_handle import Zygote
from shim.workers.zygote_pool import Adoption


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


@dataclass
class Group:
    name: str
    tenancy: str
    status: service_pb.WorkerStatus  # the worker's: state, pid, restarts, last error, start
    stopping: asyncio.Future[None]
    members: dict[str, "Member"] = field(default_factory=dict)
    conn: WorkerConnection | None = None  # set while RUNNING
    zygote: Zygote | None = None  # the one that forked the running worker: its broker holds the netns
    task: asyncio.Task[None] | None = None
    adoption: Adoption | None = None  # an earlier daemon's worker, taken over by this group's first life
    taken_over: asyncio.Future[None] | None = None  # done once that first life took it over, or ended
    # Adopted from a zygote of another version (an upgrade): it keeps its sandboxes, takes no new one (those get
    # workers of the new code), and its next life, if any, is a worker of the new code.
    closed: bool = False


@dataclass
class Member:
    target: SandboxTarget
    group: Group
    backoff: Backoff
    status: service_pb.WorkerStatus = field(default_factory=service_pb.WorkerStatus)  # as last reported
    changed: asyncio.Future[None] | None = None  # resolved (and replaced) at every status change
    regs: dict[str, worker_pb.ProbeRegistration] = field(default_factory=dict)
    attached: bool = False  # the running worker serves it (assigned at the broker, AddSandbox answered)
    netns_inode: int = 0
    error: str = ""  # why it could not be attached; retried with its backoff
    attaching: asyncio.Task[None] | None = None
    inflight: int = 0  # run_once calls: the worker must outlive them even with no probe
    pinned: bool = False  # ensure()d: kept with no probe until its last probe is removed
    kept_warm: bool = False  # the kubelet bridge probes here: kept until the sandbox stops
    # In an adopted worker whose probes are not reconciled yet: registrations are kept, not sent (the adoption
    # sends only what differs from what the worker runs).
    reconciling: bool = False
