"""The worker supervisor's groups with real workers: pooled workers never mix namespaces and fill up to their
capacity, a sandbox leaves a shared worker while the others probe on, and strict isolation gives each sandbox a
worker of its own. Helpers: tests/support/supervisor_harness.py.
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.zygote_protocol import WorkerExit
from shim.workers.grouping import STRICT
from shim.workers.supervisor import SandboxTarget
from tests.support.netns_env import listen
from tests.support.supervisor_harness import NONE, RUNNING, serve, supervised, tcp_reg

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
                assert (await rec.attempt(sid, f"p-{sid}")).status.last_attempt.result == spec_pb.RESULT_SUCCESS

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
