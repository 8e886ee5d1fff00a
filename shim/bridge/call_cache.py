"""What the kubelet bridge derives from one handler's ExecSync, kept between its calls. Pure: no I/O.

The kubelet sends the same ExecSync(container_id, cmd, timeout) at every period of a probe (and at every run of a
hook). What follows from those alone, with the container's and the sandbox's resolution, is the same at every call:
the parsed and validated call (or its refusal), the worker's checked RunOnce, the worker target, and the status
board row's id and fixed fields. Deriving them again per call (a JSON parse, RunProbe's validation twice, a sha256,
a protobuf row) cost more of the daemon's CPU than the rest of the bridge's own work, so each is derived once and
kept here, keyed by what the kubelet sent.

A kept handler names the container resolution (containers.py) and the sandbox resolution (the sandbox cache) it
was derived from, both remembered objects themselves: when the bridge is handed another one, what came from it is
derived again, so nothing kept here outlives the resolution it came from. Everything of a sandbox goes with it
(`forget_sandbox`, when the CRI proxy sees it stop or go), and the number kept is bounded, the oldest going first.
"""

from __future__ import annotations

from dataclasses import dataclass

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_worker_pb2 as worker_pb
from probe_api.bridge_command import BridgedCall
from shim.bridge.containers import ContainerInfo
from shim.sandboxes.resolver import SandboxInfo
from shim.workers.records import SandboxTarget

MAX_KEPT = 8192  # handlers: a few per container (3 probes, 2 hooks), a node runs at most a few hundred containers

# What the kubelet sent: the container id as given, the command, the timeout in seconds.
HandlerKey = tuple[str, tuple[str, ...], int]


@dataclass(slots=True)
class Handler:
    container: ContainerInfo       # the resolution `call` and `registration` were derived from
    call: BridgedCall | None       # None when the command is refused
    refusal: str = ""              # why it is refused (bad arguments), bounded for one answer
    registration: worker_pb.ProbeRegistration | None = None
    run: worker_pb.RunOnce | None = None  # checked by the supervisor; kept only once it passed
    # Derived from the sandbox's resolution (`for_sandbox`):
    sandbox: SandboxInfo | None = None
    target: SandboxTarget | None = None
    row: service_pb.Probe | None = None  # the board row's fixed fields; created_at and last_exec_at set per call

    def for_sandbox(self, sandbox: SandboxInfo) -> bool:
        """Whether `target` and `row` are this sandbox's (equal resolutions give equal ones)."""
        if self.sandbox is sandbox:
            return True
        if self.sandbox is not None and self.sandbox == sandbox:
            self.sandbox = sandbox  # a fresh resolution of the same: the next call is an identity check again
            return True
        return False


def handler_key(container_id: str, cmd, timeout: int) -> HandlerKey:
    return container_id, tuple(cmd), timeout


class CallCache:
    """Kept handlers by what the kubelet sent (see the module)."""

    def __init__(self, max_kept: int = MAX_KEPT) -> None:
        self._max = max_kept
        self._kept: dict[HandlerKey, Handler] = {}

    def get(self, key: HandlerKey, container: ContainerInfo) -> Handler | None:
        """The handler kept for `key`, if it was derived from this very container resolution."""
        handler = self._kept.get(key)
        return handler if handler is not None and handler.container is container else None

    def keep(self, key: HandlerKey, handler: Handler) -> None:
        self._kept.pop(key, None)  # a replaced one goes to the end: the oldest is the first in the dict
        if len(self._kept) >= self._max:
            del self._kept[next(iter(self._kept))]
        self._kept[key] = handler

    def forget_sandbox(self, sandbox_id: str) -> None:
        for key in [k for k, h in self._kept.items() if h.container.sandbox_id == sandbox_id]:
            del self._kept[key]

    def __len__(self) -> int:
        return len(self._kept)
