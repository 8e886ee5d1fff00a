"""The sandboxes one worker serves: per sandbox a prober (its pod IPs, its sockets) and a probe manager.

A pooled worker serves a group of sandboxes of one Kubernetes namespace; a strict one (`worker_isolation =
sandbox`) a group of one. Either way this is the only place that routes a request to its sandbox; what a probe
does is the prober's and the manager's, exactly as in a worker of one sandbox.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from cri_proto import probe_worker_pb2 as worker_pb
from probe_worker.manager import Emit, ProbeManager
from probe_worker.prober import Prober
from probe_worker.scheduling import PhaseGrid


class UnknownSandbox(Exception):
    """A request names a sandbox this worker does not serve; str() is the field error."""


@dataclass
class _Sandbox:
    prober: Prober
    manager: ProbeManager


class SandboxRouter:
    def __init__(self, sockets, user_agent_version: str, emit: Emit) -> None:
        self._sockets = sockets  # probe_worker.socket_source: BrokerSockets, or LocalSockets
        self._user_agent_version = user_agent_version
        self._emit = emit
        self._sandboxes: dict[str, _Sandbox] = {}
        # One set of tick grids for all the sandboxes: their probes of one period start in one wake-up
        # (scheduling.py says why; at 250 sandboxes it took the workers from 38% of a core to 23%).
        self._grid = PhaseGrid(random.random)

    def __len__(self) -> int:
        return len(self._sandboxes)

    @property
    def probes(self) -> int:
        return sum(len(sb.manager) for sb in self._sandboxes.values())

    def add_sandbox(self, sandbox_id: str, pod_ips: Sequence[str]) -> None:
        """Serves a sandbox from now on; again for one it serves, its pod IPs are updated (new plans from then)."""
        current = self._sandboxes.get(sandbox_id)
        if current is not None:
            if current.prober.pod_ips != list(pod_ips):
                current.prober.set_pod_ips(pod_ips)
            return
        prober = Prober(pod_ips, self._user_agent_version, self._sockets.opener(sandbox_id))
        self._sandboxes[sandbox_id] = _Sandbox(prober, ProbeManager(prober, self._emit, sandbox_id=sandbox_id,
                                                                    grid=self._grid))

    async def remove_sandbox(self, sandbox_id: str) -> None:
        sandbox = self._sandboxes.pop(sandbox_id, None)
        if sandbox is not None:
            await sandbox.manager.close()
        self._sockets.forget(sandbox_id)

    async def add_probe(self, reg: worker_pb.ProbeRegistration) -> None:
        await self._sandbox(reg.sandbox_id).manager.add(reg)

    def remove_probe(self, sandbox_id: str, probe_id: str) -> None:
        sandbox = self._sandboxes.get(sandbox_id)
        if sandbox is not None:
            sandbox.manager.remove(probe_id)

    def prober(self, sandbox_id: str) -> Prober:
        return self._sandbox(sandbox_id).prober

    def check(self, reg: worker_pb.ProbeRegistration, path: str = "probe", *, needs_id: bool = False) -> list[str]:
        """The routing rules, as field errors: a probe runs in one of this worker's sandboxes, and one that is kept
        (not a RunOnce's) has an id to be found by. The spec itself is the daemon's to validate."""
        errors = [f"{path}.probe_id: Required value"] if needs_id and not reg.probe_id else []
        if reg.sandbox_id not in self._sandboxes:
            errors.append(f"{path}.sandbox_id: Not found: {reg.sandbox_id!r}: not a sandbox this worker serves")
        return errors

    def snapshot(self) -> worker_pb.Snapshot:
        """Everything this worker serves, and where each probe stands: the answer to a daemon that adopted it."""
        out = worker_pb.Snapshot()
        for sandbox_id, sandbox in self._sandboxes.items():
            out.sandboxes.add(sandbox_id=sandbox_id, pod_ips=sandbox.prober.pod_ips)
            out.probes.extend(sandbox.manager.snapshot())
        return out

    async def close(self) -> None:
        for sandbox_id in list(self._sandboxes):
            await self.remove_sandbox(sandbox_id)

    def _sandbox(self, sandbox_id: str) -> _Sandbox:
        sandbox = self._sandboxes.get(sandbox_id)
        if sandbox is None:
            raise UnknownSandbox(f"sandbox_id: Not found: {sandbox_id!r}")
        return sandbox

