"""The worker supervisor with real workers forked by a real zygote into real netns.

Crashes (kill -9), hangs (SIGSTOP), a dead zygote and a missing netns are caused for
real; the tests wait for the supervisor's own reports (on_worker / on_event), each
wait bounded, never a sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable

import psutil
import pytest

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from cri_proto import probe_worker_pb2 as worker_pb
from shim.workers.backoff import Backoff, BackoffPolicy
from shim.workers.settings import WorkerSettings
from shim.workers.supervisor import SandboxTarget, WorkerRejected, WorkerSupervisor, WorkerUnavailable
from shim.workers.groups import STRICT
from shim.workers.zygote_handle import Zygote
from probe_api.zygote_protocol import WorkerExit
from tests.support.netns_env import listen

WAIT_S = 15
RUNNING, BACKOFF, FAILED, NONE = (service_pb.WORKER_RUNNING, service_pb.WORKER_BACKOFF,
                                  service_pb.WORKER_FAILED, service_pb.WORKER_NONE)


# --- pure -------------------------------------------------------------------------------

def test_backoff_doubles_up_to_the_max_and_resets_after_a_long_life():
    backoff = Backoff(BackoffPolicy(initial_s=0.2, max_s=1.0, reset_after_s=60))
    assert [backoff.next_delay(lived_s=0.1) for _ in range(5)] == [0.2, 0.4, 0.8, 1.0, 1.0]
    assert backoff.next_delay(lived_s=60) == 0.2
    assert backoff.next_delay(lived_s=1) == 0.4


def test_invalid_probe_is_rejected_before_any_worker():
    async def main():
        supervisor = WorkerSupervisor(Zygote.start, lambda *_: None, lambda *_: None)
        reg = worker_pb.ProbeRegistration(probe_id="p", type=spec_pb.READINESS, spec=spec_pb.ProbeSpec(
            tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=0))))
        with pytest.raises(WorkerRejected) as err:
            await supervisor.add_probe("nowhere", reg)
        assert err.value.errors[0].startswith("spec.tcp_socket.port: Invalid value: 0")
        assert supervisor.zygote is None  # nothing was started for it
        await supervisor.close()

    asyncio.run(main())


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
                        and (result is None or event.attempt.attempt.result == result):
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


# --- lifecycle ------------------------------------------------------------------------------------

@pytest.mark.netns
def test_worker_spawned_through_the_zygote_probes_inside_the_netns(pod_netns):
    server = listen(pod_netns)

    async def main():
        async with supervised() as (rec, supervisor):
            await supervisor.start()
            status = await supervisor.ensure(target(pod_netns))
            assert status.state == RUNNING and status.restarts == 0
            assert status.netns_path == pod_netns.path
            assert status.netns_inode == os.stat(pod_netns.path).st_ino
            assert psutil.Process(status.pid).ppid() == supervisor.zygote.pid
            assert supervisor.sandbox_ids() == ["sb1"]
            await supervisor.add_probe("sb1", tcp_reg("p1", server.port))
            report = await rec.attempt("sb1", "p1")
            assert report.attempt.result == spec_pb.RESULT_SUCCESS
            assert report.attempt.address == f"{pod_netns.ipv4}:{server.port}"
            # STARTING (perhaps twice: the worker runs before the sandbox is attached to it), then RUNNING.
            states = [s.state for _, s in rec.history]
            assert [s for i, s in enumerate(states) if i == 0 or states[i - 1] != s] == [service_pb.WORKER_STARTING,
                                                                                          RUNNING]

    asyncio.run(main())


@pytest.mark.netns
def test_rejected_probe_is_not_kept(pod_netns):
    async def main():
        async with supervised() as (rec, supervisor):
            await supervisor.ensure(target(pod_netns))
            bad = tcp_reg("p1", 80)
            bad.spec.period_ms = -1
            with pytest.raises(WorkerRejected, match="period"):
                await supervisor.add_probe("sb1", bad)
            with pytest.raises(WorkerRejected):
                await supervisor.run_once(target(pod_netns), bad, timeout_s=5)

    asyncio.run(main())


@pytest.mark.netns
def test_killed_worker_is_restarted_with_its_probes(pod_netns):
    server = listen(pod_netns)

    async def main():
        async with supervised(backoff_initial_s=1.0) as (rec, supervisor):
            await supervisor.ensure(target(pod_netns))
            await supervisor.add_probe("sb1", tcp_reg("p1", server.port))
            await rec.attempt("sb1", "p1")
            old_pid = supervisor.status("sb1").pid
            mark = rec.mark()
            os.kill(old_pid, signal.SIGKILL)
            backoff = await rec.status("sb1", lambda s: s.state == BACKOFF, mark)
            assert backoff.last_error == "exited with signal 9 (SIGKILL)"
            assert backoff.restarts == 1 and backoff.pid == 0
            # Registered during the backoff (1 s): the new worker gets it with the old one.
            assert supervisor.status("sb1").state == BACKOFF
            await supervisor.add_probe("sb1", tcp_reg("p2", server.port))
            running = await rec.status("sb1", lambda s: s.state == RUNNING, mark)
            assert running.pid not in (0, old_pid) and running.restarts == 1
            assert supervisor.status("sb1").restarts == 1
            rec.drain_events()
            await rec.attempt("sb1", "p1", spec_pb.RESULT_SUCCESS)
            await rec.attempt("sb1", "p2", spec_pb.RESULT_SUCCESS)
            assert WorkerExit(pid=old_pid, signal=signal.SIGKILL) in rec.exits

    asyncio.run(main())


@pytest.mark.netns
def test_hung_worker_is_detected_by_missed_heartbeats_and_replaced(pod_netns):
    server = listen(pod_netns)

    async def main():
        async with supervised(heartbeat_timeout_s=0.5) as (rec, supervisor):
            await supervisor.ensure(target(pod_netns))
            await supervisor.add_probe("sb1", tcp_reg("p1", server.port, period_ms=1000))
            old_pid = supervisor.status("sb1").pid
            mark = rec.mark()
            os.kill(old_pid, signal.SIGSTOP)
            backoff = await rec.status("sb1", lambda s: s.state == BACKOFF, mark)
            assert backoff.last_error == "missed heartbeats for 0.5s"
            assert not alive(old_pid)  # killed, even though stopped
            running = await rec.status("sb1", lambda s: s.state == RUNNING, mark)
            assert running.restarts == 1 and running.pid != old_pid
            await rec.attempt("sb1", "p1", spec_pb.RESULT_SUCCESS)

    asyncio.run(main())


@pytest.mark.netns
def test_a_dead_zygote_takes_its_workers_along_and_they_come_back_through_a_new_one(pod_netns):
    server = listen(pod_netns)

    async def main():
        async with supervised() as (rec, supervisor):
            await serve(supervisor, pod_netns, server.port, "sb1")
            await rec.attempt("sb1", "p-sb1", spec_pb.RESULT_SUCCESS)
            old_zygote = supervisor.zygote
            pid = supervisor.status("sb1").pid
            mark = rec.mark()
            os.kill(old_zygote.pid, signal.SIGKILL)
            assert await asyncio.wait_for(old_zygote.died, WAIT_S) == "zygote exited with signal 9 (SIGKILL)"
            # The zygote was the worker's netns broker: the worker (adopted here, a child subreaper) ends.
            backoff = await rec.status("sb1", lambda s: s.state == BACKOFF, mark)
            assert backoff.last_error == "exited with code 3"
            assert not psutil.pid_exists(pid)  # reaped here, no zombie left
            running = await rec.status("sb1", lambda s: s.state == RUNNING, mark)
            assert running.restarts == 1 and running.pid != pid
            assert supervisor.zygote.pid != old_zygote.pid
            assert psutil.Process(running.pid).ppid() == supervisor.zygote.pid
            rec.drain_events()
            report = await rec.attempt("sb1", "p-sb1", spec_pb.RESULT_SUCCESS)  # the probe came back with it
            assert report.attempt.address == f"{pod_netns.ipv4}:{server.port}"

    asyncio.run(main())


@pytest.mark.netns
def test_stop_sandbox_shuts_the_worker_down_gracefully(pod_netns):
    server = listen(pod_netns)

    async def main():
        async with supervised() as (rec, supervisor):
            await supervisor.ensure(target(pod_netns))
            await supervisor.add_probe("sb1", tcp_reg("p1", server.port))
            pid = supervisor.status("sb1").pid
            await supervisor.stop_sandbox("sb1")
            assert WorkerExit(pid=pid, exit_code=0) in rec.exits  # Shutdown obeyed, no kill needed
            sid, last = rec.history[-1]
            assert (sid, last.state, last.pid) == ("sb1", NONE, 0)
            assert supervisor.status("sb1").state == NONE and supervisor.sandbox_ids() == []
            await supervisor.stop_sandbox("sb1")  # idempotent

    asyncio.run(main())


@pytest.mark.netns
def test_removing_the_last_probe_stops_the_worker(pod_netns):
    server = listen(pod_netns)

    async def main():
        async with supervised() as (rec, supervisor):
            await supervisor.ensure(target(pod_netns))
            await supervisor.add_probe("sb1", tcp_reg("p1", server.port))
            await supervisor.add_probe("sb1", tcp_reg("p2", server.port))
            pid = supervisor.status("sb1").pid
            await supervisor.remove_probe("sb1", "p1")
            assert supervisor.status("sb1").state == RUNNING
            await supervisor.remove_probe("sb1", "p2")
            assert supervisor.status("sb1").state == NONE
            assert WorkerExit(pid=pid, exit_code=0) in rec.exits

    asyncio.run(main())


@pytest.mark.netns
def test_run_once_spawns_a_worker_for_the_attempt_only(pod_netns):
    server = listen(pod_netns)

    async def main():
        async with supervised() as (rec, supervisor):
            reg = tcp_reg("", server.port)
            attempt = await supervisor.run_once(target(pod_netns), reg, timeout_s=5)
            assert attempt.result == spec_pb.RESULT_SUCCESS
            assert attempt.address == f"{pod_netns.ipv4}:{server.port}"
            assert supervisor.sandbox_ids() == []
            assert [e.exit_code for e in rec.exits] == [0]
            # With probes registered the worker stays.
            await supervisor.ensure(target(pod_netns))
            await supervisor.add_probe("sb1", tcp_reg("p1", server.port))
            pid = supervisor.status("sb1").pid
            assert (await supervisor.run_once(target(pod_netns), reg, timeout_s=5)).result == spec_pb.RESULT_SUCCESS
            assert supervisor.status("sb1").pid == pid

    asyncio.run(main())


@pytest.mark.netns
def test_close_leaves_no_process_behind(pod_netns):
    server = listen(pod_netns)

    async def main():
        pids = []
        async with supervised(sandboxes_per_worker=2) as (rec, supervisor):
            for sid in ("sb1", "sb2", "sb3"):
                await supervisor.ensure(target(pod_netns, sid))
                await supervisor.add_probe(sid, tcp_reg("p", server.port))
                pids.append(supervisor.status(sid).pid)
            pids = sorted(set(pids))
            assert len(pids) == 2  # two sandboxes per worker here: a full group and one more
            zygote = supervisor.zygote
            pids.append(zygote.pid)
            assert psutil.Process(zygote.pid).status() != psutil.STATUS_ZOMBIE
        assert [pid for pid in pids if psutil.pid_exists(pid)] == []
        assert await zygote.died == "zygote exited with code 0"
        assert psutil.Process().children(recursive=True) == [p for p in psutil.Process().children(recursive=True)
                                                            if p.pid not in pids]
        assert sorted(e.exit_code for e in rec.exits) == [0, 0]
        with pytest.raises(WorkerUnavailable, match="closing"):
            await supervisor.ensure(target(pod_netns, "late"))

    asyncio.run(main())


# --- groups ---------------------------------------------------------------------------------------------

@pytest.mark.netns
def test_pooled_workers_never_mix_namespaces_and_fill_up_to_their_capacity(pod_netns):
    server = listen(pod_netns)
    placed = {"a1": "team-a", "a2": "team-a", "a3": "team-a", "b1": "team-b"}

    async def main():
        async with supervised(sandboxes_per_worker=2) as (rec, supervisor):
            for sid, tenancy in placed.items():
                await supervisor.ensure(SandboxTarget(sid, pod_netns.path, pod_netns.pod_ips, tenancy=tenancy))
                await supervisor.add_probe(sid, tcp_reg(f"p-{sid}", server.port))
            statuses = {sid: supervisor.status(sid) for sid in placed}
            assert {sid: s.group for sid, s in statuses.items()} == {
                "a1": "team-a#1", "a2": "team-a#1", "a3": "team-a#2", "b1": "team-b#1"}
            assert {sid: s.group_sandboxes for sid, s in statuses.items()} == {"a1": 2, "a2": 2, "a3": 1, "b1": 1}
            pids = {sid: s.pid for sid, s in statuses.items()}
            assert pids["a1"] == pids["a2"] and len({pids["a1"], pids["a3"], pids["b1"]}) == 3
            for sid in placed:  # each sandbox probes in its own netns, whatever worker serves it
                assert statuses[sid].netns_inode == os.stat(pod_netns.path).st_ino
                assert (await rec.attempt(sid, f"p-{sid}")).attempt.result == spec_pb.RESULT_SUCCESS

    asyncio.run(main())


@pytest.mark.netns
def test_a_sandbox_leaves_a_shared_worker_and_the_others_probe_on(pod_netns):
    server = listen(pod_netns)

    async def main():
        async with supervised() as (rec, supervisor):
            await serve(supervisor, pod_netns, server.port, "sb1", "sb2")
            pid = supervisor.status("sb1").pid
            assert supervisor.status("sb2").pid == pid
            await supervisor.stop_sandbox("sb1")
            assert supervisor.status("sb1").state == NONE and supervisor.sandbox_ids() == ["sb2"]
            assert (supervisor.status("sb2").state, supervisor.status("sb2").pid) == (RUNNING, pid)
            assert supervisor.status("sb2").group_sandboxes == 1 and rec.exits == []
            rec.drain_events()
            await rec.attempt("sb2", "p-sb2", spec_pb.RESULT_SUCCESS)
            # The last one out stops the worker.
            await supervisor.stop_sandbox("sb2")
            assert rec.exits == [WorkerExit(pid=pid, exit_code=0)]

    asyncio.run(main())


@pytest.mark.netns
def test_strict_isolation_gives_each_sandbox_a_worker_of_its_own(pod_netns):
    server = listen(pod_netns)

    async def main():
        async with supervised(isolation=STRICT) as (rec, supervisor):
            await serve(supervisor, pod_netns, server.port, "sb1", "sb2")
            first, second = supervisor.status("sb1"), supervisor.status("sb2")
            assert first.pid != second.pid
            assert (first.group, second.group, first.group_sandboxes) == ("sb1", "sb2", 1)
            os.kill(first.pid, signal.SIGKILL)
            mark = rec.mark()
            await rec.status("sb1", lambda s: s.state == RUNNING and s.restarts == 1, mark)
            assert supervisor.status("sb2").pid == second.pid and supervisor.status("sb2").restarts == 0

    asyncio.run(main())
