"""The worker supervisor with real workers forked by a real zygote into real netns.

Crashes (kill -9), hangs (SIGSTOP), a dead zygote and a missing netns are caused for
real; the tests wait for the supervisor's own reports (on_worker / on_event), each
wait bounded, never a sleep.

Helpers: tests/support/supervisor_harness.py; pooled and strict groups: test_supervisor_groups.py.
"""

from __future__ import annotations

import asyncio
import os
import signal

import psutil
import pytest

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from cri_proto import probe_worker_pb2 as worker_pb
from probe_api.zygote_protocol import WorkerExit
from shim.workers.backoff import Backoff, BackoffPolicy
from shim.workers.supervisor import WorkerRejected, WorkerSupervisor, WorkerUnavailable
from shim.workers.zygote_handle import Zygote
from tests.support.netns_env import listen
from tests.support.supervisor_harness import BACKOFF, NONE, RUNNING, WAIT_S, alive, serve, supervised, target, tcp_reg

# --- pure -------------------------------------------------------------------------------

def test_backoff_doubles_up_to_the_max_and_resets_after_a_long_life():
    backoff = Backoff(BackoffPolicy(initial_s=0.2, max_s=1.0, reset_after_s=60))
    assert [backoff.next_delay(lived_s=0.1) for _ in range(5)] == [0.2, 0.4, 0.8, 1.0, 1.0]
    assert backoff.next_delay(lived_s=60) == 0.2
    assert backoff.next_delay(lived_s=1) == 0.4


def test_a_probe_of_a_sandbox_nobody_ensured_is_refused_before_any_worker():
    async def main():
        supervisor = WorkerSupervisor(Zygote.start, lambda *_: None, lambda *_: None)
        reg = worker_pb.ProbeRegistration(probe_id="p", type=spec_pb.READINESS, spec=spec_pb.ProbeSpec(
            tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=80))))
        with pytest.raises(WorkerUnavailable, match="ensure"):
            await supervisor.add_probe("nowhere", reg)
        assert supervisor.zygote is None  # nothing was started for it
        await supervisor.close()

    asyncio.run(main())


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
            assert report.status.last_attempt.result == spec_pb.RESULT_SUCCESS
            assert report.status.last_attempt.address == f"{pod_netns.ipv4}:{server.port}"
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
            bad = tcp_reg("", 80)  # the worker's own rule (the spec is the API edge's): a kept probe needs an id
            with pytest.raises(WorkerRejected, match="probe_id: Required value"):
                await supervisor.add_probe("sb1", bad)

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
            assert report.status.last_attempt.address == f"{pod_netns.ipv4}:{server.port}"

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
