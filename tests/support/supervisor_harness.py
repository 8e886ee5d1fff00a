"""A WorkerSupervisor with real workers, as the supervisor's system tests drive it (tests/system/test_supervisor.py,
test_supervisor_groups.py).

Owns: a TCP probe's registration, the `Recorder` of the supervisor's callbacks (on_event, on_worker, the zygote's
exits) that tests await with a deadline (WAIT_S), a supervisor that restarts and beats faster than the defaults, the
sandbox target of a netns, serving sandboxes with one probe each, and whether a pid still runs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import psutil

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from cri_proto import probe_worker_pb2 as worker_pb
from probe_api.zygote_protocol import WorkerExit
from shim.workers.backoff import BackoffPolicy
from shim.workers.settings import WorkerSettings
from shim.workers.supervisor import SandboxTarget, WorkerSupervisor
from shim.workers.zygote_handle import Zygote

WAIT_S = 15
RUNNING, BACKOFF, FAILED, NONE = (service_pb.WORKER_RUNNING, service_pb.WORKER_BACKOFF,
                                  service_pb.WORKER_FAILED, service_pb.WORKER_NONE)


# --- helpers ----------------------------------------------------------------------------------

def tcp_reg(probe_id: str, port: int, period_ms: int = 50) -> worker_pb.ProbeRegistration:
    return worker_pb.ProbeRegistration(
        probe_id=probe_id, type=spec_pb.READINESS, start_now=True,
        container=worker_pb.ContainerRef(id="c1", name="app"),
        spec=spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=port)),
                               period_ms=period_ms, timeout_ms=500),
    )


class Recorder:
    """Collects the supervisor's callbacks; tests await the ones they expect."""

    def __init__(self) -> None:
        self.events: dict[str, asyncio.Queue[worker_pb.WorkerEvent]] = {}
        self.history: list[tuple[str, service_pb.WorkerStatus]] = []
        self.exits: list[WorkerExit] = []
        self._changed = asyncio.Event()

    def on_event(self, sandbox_id: str, event: worker_pb.WorkerEvent) -> None:
        self.events.setdefault(sandbox_id, asyncio.Queue()).put_nowait(event)

    def on_worker(self, sandbox_id: str, status: service_pb.WorkerStatus) -> None:
        self.history.append((sandbox_id, status))
        self._changed.set()

    def mark(self) -> int:
        return len(self.history)

    async def status(self, sandbox_id: str, pred: Callable[[service_pb.WorkerStatus], bool],
                     since: int = 0) -> service_pb.WorkerStatus:
        """The first status of the sandbox reported at or after `since` that satisfies pred."""
        async def wait():
            seen = since
            while True:
                for sid, status in self.history[seen:]:
                    if sid == sandbox_id and pred(status):
                        return status
                seen = len(self.history)
                self._changed.clear()
                await self._changed.wait()
        return await asyncio.wait_for(wait(), WAIT_S)

    async def attempt(self, sandbox_id: str, probe_id: str, result: int | None = None) -> worker_pb.AttemptReport:
        queue = self.events.setdefault(sandbox_id, asyncio.Queue())

        async def wait():
            while True:
                event = await queue.get()
                if event.WhichOneof("msg") == "attempt" and event.attempt.probe_id == probe_id \
                        and (result is None or event.attempt.status.last_attempt.result == result):
                    return event.attempt
        return await asyncio.wait_for(wait(), WAIT_S)

    def drain_events(self) -> None:
        for queue in self.events.values():
            while not queue.empty():
                queue.get_nowait()


def make_supervisor(rec: Recorder, backoff_initial_s: float = 0.05, **options) -> WorkerSupervisor:
    """options: WorkerSettings' fields; restarts and heartbeats faster than the defaults."""
    options.setdefault("heartbeat_interval_ms", 100)
    settings = WorkerSettings(backoff=BackoffPolicy(initial_s=backoff_initial_s), **options)

    async def factory() -> Zygote:
        return await Zygote.start(on_exit=rec.exits.append)

    return WorkerSupervisor(factory, rec.on_event, rec.on_worker, settings)


@contextlib.asynccontextmanager
async def supervised(**options):
    """A supervisor recording into a fresh Recorder, closed whatever the test does."""
    rec = Recorder()
    supervisor = make_supervisor(rec, **options)
    try:
        yield rec, supervisor
    finally:
        await supervisor.close()


def target(ns, sandbox_id: str = "sb1") -> SandboxTarget:
    return SandboxTarget(sandbox_id=sandbox_id, netns_path=ns.path, pod_ips=ns.pod_ips)


async def serve(supervisor: WorkerSupervisor, ns, port: int, *sandbox_ids: str) -> None:
    """Each sandbox served, with one TCP probe "p-<sandbox>" to port."""
    for sid in sandbox_ids:
        await supervisor.ensure(target(ns, sid))
        await supervisor.add_probe(sid, tcp_reg(f"p-{sid}", port))


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
