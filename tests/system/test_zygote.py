"""The worker zygote: lean and single-threaded, forks workers that keep nothing of it,
reports their exits, and takes them down with it.

Real processes throughout; every wait is on an event (a frame, a future, a process
exit), bounded by a timeout, never a sleep.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import types

import psutil
import pytest

from cri_proto import probe_worker_pb2 as worker_pb
from cri_proto import zygote_pb2 as zygote_pb
from probe_api.zygote_protocol import WorkerExit, exit_from_waitid
from probe_worker.channel import AsyncChannel
from probe_worker.main import EXIT_BROKER_GONE
from probe_zygote.prefork import executed_code, relocate_code
from shim.workers.process import set_child_subreaper
from shim.workers.zygote_handle import Zygote, ZygoteError
from tests.support.import_report import import_report
from tests.support.netns_env import REPO_ROOT

WAIT_S = 10
FORBIDDEN = ("grpc", "grpc_tools", "grpc_health", "grpc_reflection", "opentelemetry", "psutil", "prometheus_client")


# --- pure -------------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def spawned_workers_released(monkeypatch):
    """A test that spawns workers owns them, as the daemon's WorkerProcess does: their pidfds are released at its
    end, so that no later test in this process finds them open."""
    spawned = []
    spawn = Zygote.spawn

    async def tracked(self, *args, **kwargs):
        worker = await spawn(self, *args, **kwargs)
        spawned.append(worker)
        return worker

    monkeypatch.setattr(Zygote, "spawn", tracked)
    yield
    for worker in spawned:
        worker.close()


def test_exit_descriptions():
    assert WorkerExit(pid=1, signal=9).describe() == "exited with signal 9 (SIGKILL)"
    assert WorkerExit(pid=1, exit_code=2).describe() == "exited with code 2"
    assert WorkerExit(pid=1, exit_code=0).describe() == "exited with code 0"
    assert WorkerExit(pid=1, reason="zygote died").describe() == "zygote died"
    assert exit_from_waitid(7, os.CLD_EXITED, 3) == WorkerExit(pid=7, exit_code=3)
    assert exit_from_waitid(7, os.CLD_KILLED, 15) == WorkerExit(pid=7, signal=15)
    assert exit_from_waitid(7, os.CLD_DUMPED, 11) == WorkerExit(pid=7, signal=11)


# --- the zygote process ---------------------------------------------------------------------

def test_zygote_module_imports_no_grpc_and_starts_no_thread():
    modules, threads = import_report("probe_zygote.main")
    assert modules & set(FORBIDDEN) == set()
    assert threads == 1
    assert {"probe_worker", "h11", "h2", "asyncio", "ssl"} <= modules


def test_the_daemons_side_of_the_zygote_imports_nothing_of_the_worker():
    modules, _ = import_report("shim.workers.zygote_handle")
    assert "probe_worker" not in modules and modules & set(FORBIDDEN) == set()


def _mapped_files(pid: int) -> set[str]:
    with open(f"/proc/{pid}/maps") as f:
        return {line.split()[-1] for line in f if len(line.split()) >= 6}


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def _blocked_or_ignored(mask_hex: str, sig: int) -> bool:
    return bool(int(mask_hex, 16) & (1 << (sig - 1)))


def test_running_zygote_is_single_threaded_preloaded_and_has_no_grpc():
    async def main():
        zygote = await Zygote.start()
        try:
            hello = zygote.hello.result()
            assert hello.pid == zygote.pid and hello.gc_frozen
            assert hello.preloaded_modules > 200  # probe_worker, h11, h2, ssl, protobuf...
            assert _status(zygote.pid)["Threads"] == "1"
            assert [f for f in _mapped_files(zygote.pid) if "grpc" in f] == []
            # Its own session: a terminal's Ctrl-C reaches the daemon, not the zygote.
            assert os.getsid(zygote.pid) == zygote.pid
            # The warm-up's servers and sockets are gone: only the control socket is left (and, once the loop
            # runs, its epoll instance; no pidfd, since no worker was forked).
            held = _socket_inodes(zygote.pid)
            sockets = {t for t in held if t.startswith("socket:")}
            assert len(sockets) == 1 and held - sockets <= {"anon_inode:[eventpoll]"}
            assert zygote.alive
        finally:
            await zygote.close()
        assert await zygote.died == "zygote exited with code 0"
        assert not zygote.alive

    asyncio.run(main())


# --- spawning -------------------------------------------------------------------------------------

async def _first_frame(worker) -> worker_pb.WorkerEvent:
    channel = AsyncChannel(worker.sock)
    return worker_pb.WorkerEvent.FromString(await asyncio.wait_for(channel.recv(), WAIT_S))


def _socket_inodes(pid: int) -> set[str]:
    """Sockets and anonymous inodes (pidfds) held beyond stdin/stdout/stderr."""
    targets = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue
        if int(fd) > 2 and target.startswith(("socket:", "anon_inode:")):
            targets.add(target)
    return targets


@pytest.mark.netns
def test_spawned_worker_sits_in_its_own_netns_and_keeps_nothing_of_the_zygote(pod_netns):
    async def main():
        exits: list[WorkerExit] = []
        zygote = await Zygote.start(on_exit=exits.append)
        try:
            first = await zygote.spawn(worker_pb.WorkerConfig(group="a"))
            second = await zygote.spawn(worker_pb.WorkerConfig(group="b"))
            ready = (await _first_frame(first)).ready
            await _first_frame(second)
            assert ready.pid == first.pid
            assert ready.netns_inode == os.stat(f"/proc/{first.pid}/ns/net").st_ino
            assert ready.netns_inode not in (os.stat(pod_netns.path).st_ino, os.stat("/proc/self/ns/net").st_ino)
            assigned = await zygote.assign(first.pid, "pod", pod_netns.path, find_pod_ips=True)
            assert assigned.netns_inode == os.stat(pod_netns.path).st_ino
            assert list(assigned.pod_ips) == [pod_netns.ipv4, pod_netns.ipv6]
            assert psutil.Process(first.pid).ppid() == zygote.pid
            status = _status(first.pid)
            assert status["Threads"] == "1"
            assert status["Uid"].split() == ["65534"] * 4
            # The zygote ignores SIGINT; a worker has the interpreter's defaults back: as this process has them (a
            # process started in the background by a shell, or under nohup, starts with SIGINT ignored).
            assert _blocked_or_ignored(_status(zygote.pid)["SigIgn"], signal.SIGINT)
            assert _blocked_or_ignored(status["SigIgn"], signal.SIGINT) == \
                _blocked_or_ignored(_status(os.getpid())["SigIgn"], signal.SIGINT)
            assert int(status["SigBlk"], 16) == 0
            # Neither the zygote's control socket, nor its pidfds, nor a sibling's socket, nor a netns.
            assert not [fd for fd in os.listdir(f"/proc/{first.pid}/fd")
                        if os.readlink(f"/proc/{first.pid}/fd/{fd}").startswith("net:")]
            zygote_fds = _socket_inodes(zygote.pid)
            assert [t for t in zygote_fds if t.startswith("socket:")], "the zygote holds its control socket"
            worker_fds = _socket_inodes(first.pid)
            sockets = {t for t in worker_fds if t.startswith("socket:")}
            assert sockets & zygote_fds == set()
            assert sockets & _socket_inodes(second.pid) == set()
            assert [t for t in worker_fds if "pidfd" in t] == []
            first.kill()
            assert await asyncio.wait_for(first.exited, WAIT_S) == WorkerExit(pid=first.pid, signal=signal.SIGKILL)
            assert exits == [WorkerExit(pid=first.pid, signal=signal.SIGKILL)]
        finally:
            await zygote.close()
        # Closing the daemon's end makes the zygote kill and reap its workers, then exit.
        assert await zygote.died == "zygote exited with code 0"
        assert not psutil.pid_exists(second.pid)
        assert (await second.exited).reason == "zygote closed"

    asyncio.run(main())


@pytest.mark.netns
def test_a_worker_that_shuts_down_is_reported_with_its_exit_code(pod_netns):
    async def main():
        zygote = await Zygote.start()
        try:
            worker = await zygote.spawn(worker_pb.WorkerConfig())
            channel = AsyncChannel(worker.sock)
            assert worker_pb.WorkerEvent.FromString(await channel.recv()).WhichOneof("msg") == "ready"
            await channel.send(worker_pb.WorkerRequest(seq=1, shutdown=worker_pb.Shutdown()))
            assert await asyncio.wait_for(worker.exited, WAIT_S) == WorkerExit(pid=worker.pid, exit_code=0)
        finally:
            await zygote.close()

    asyncio.run(main())


def test_assigning_a_missing_netns_is_a_clear_error_and_creates_nothing():
    missing = "/var/run/netns/cps-zygote-does-not-exist"

    async def main():
        zygote = await Zygote.start()
        try:
            worker = await zygote.spawn(worker_pb.WorkerConfig())
            assert (await _first_frame(worker)).WhichOneof("msg") == "ready"
            with pytest.raises(ZygoteError, match=f"^cannot open network namespace {missing}: No such file or directory$"):
                await zygote.assign(worker.pid, "gone", missing)
            with pytest.raises(ZygoteError, match="^no worker 1 here$"):
                await zygote.assign(1, "gone", "/proc/self/ns/net")
            assert not worker.exited.done(), "a sandbox that cannot be assigned leaves its worker alone"
        finally:
            await zygote.close()
        assert not os.path.exists(missing)

    asyncio.run(main())


def test_a_request_without_its_descriptor_is_refused_and_the_zygote_serves_on():
    async def main():
        zygote = await Zygote.start(warm_up=False)
        try:
            channel = zygote._channel  # a request no Zygote method would send
            for request in (zygote_pb.ZygoteRequest(spawn=zygote_pb.Spawn(config=worker_pb.WorkerConfig())),
                            zygote_pb.ZygoteRequest()):
                with channel.pending() as (seq, reply):
                    request.seq = seq
                    await channel.send(request)
                    kind = request.WhichOneof("msg")
                    with pytest.raises(ZygoteError, match=f"^a spawn request with exactly one descriptor was "
                                                          f"expected, got {kind} with 0$"):
                        await asyncio.wait_for(reply, WAIT_S)
            worker = await zygote.spawn(worker_pb.WorkerConfig())
            assert (await _first_frame(worker)).WhichOneof("msg") == "ready"
            worker.sock.close()
            worker.close()
        finally:
            await zygote.close()

    asyncio.run(main())


async def _until_eof(sock) -> None:
    while await asyncio.get_running_loop().sock_recv(sock, 65536):
        pass  # heartbeats sent before it died


@pytest.mark.netns
def test_a_worker_ends_with_its_broker_and_is_adopted_meanwhile(pod_netns):
    """The zygote is the netns broker: a worker whose zygote died can make no probe socket, so it ends (and
    the daemon, a subreaper, reaps it and starts another through the next zygote)."""
    async def main():
        previous = set_child_subreaper(1)  # as the daemon is: the orphan becomes this process's child
        zygote = await Zygote.start()
        try:
            worker = await zygote.spawn(worker_pb.WorkerConfig())
            await _first_frame(worker)
            await zygote.assign(worker.pid, "pod", pod_netns.path)
            os.kill(zygote.pid, signal.SIGKILL)
            assert await asyncio.wait_for(zygote.died, WAIT_S) == "zygote exited with signal 9 (SIGKILL)"
            assert (await worker.exited).reason == "zygote died"  # its status is no longer the zygote's to tell
            with pytest.raises(ZygoteError, match="not running"):
                await zygote.spawn(worker_pb.WorkerConfig())
            gone = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().add_reader(worker.pidfd, gone.set_result, None)
            await asyncio.wait_for(gone, WAIT_S)
            asyncio.get_running_loop().remove_reader(worker.pidfd)
            ended = os.waitid(os.P_PIDFD, worker.pidfd, os.WEXITED)
            assert ended.si_pid == worker.pid, "reaped here: the worker was adopted when its zygote died"
            assert exit_from_waitid(ended.si_pid, ended.si_code, ended.si_status) == \
                WorkerExit(worker.pid, exit_code=EXIT_BROKER_GONE)
            worker.sock.close()
            worker.close()
        finally:
            await zygote.close()
            set_child_subreaper(previous)

    asyncio.run(main())


def test_filling_memory_holes_takes_the_free_blocks_and_chunks():
    code = (
        "import gc, json\n"
        "gc.disable()\n"
        "from probe_zygote import prefork as w\n"
        "before = w.pymalloc_free_blocks(); malloc_before = w.malloc_free_bytes()\n"
        "filled = w.fill_pool_holes(); taken = w.fill_malloc_holes()\n"
        "after = w.pymalloc_free_blocks()\n"
        "print(json.dumps({'before': before, 'after': after, 'filled': filled, 'malloc_before': malloc_before,"
        " 'malloc_after': w.malloc_free_bytes(), 'taken': taken}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, capture_output=True, text=True)
    report = json.loads(out.stdout)
    sizes = sorted(int(size) for size in report["before"])
    assert sizes == list(range(16, 513, 16))  # the statistics were parsed: all 32 size classes
    fillable = [str(size) for size in sizes if size >= 48]
    assert report["filled"] >= sum(report["before"][k] for k in fillable) > 0
    # What is left free sits in pools opened by the filling itself (at most one per class).
    assert sum(report["after"][k] for k in fillable) < sum(report["before"][k] for k in fillable)
    assert report["malloc_after"] < report["malloc_before"] and report["taken"] > 0


def test_relocation_gives_the_functions_that_ran_fresh_equal_copies_of_their_code():
    def make_counter():
        count = 0

        def bump(step=1):
            nonlocal count
            count += step
            return count
        return bump

    def doubled(values):
        return [v * 2 for v in values]  # a comprehension: its own code object, in doubled's constants

    def never_called():
        return "cold"

    bump = make_counter()
    before = {f: f.__code__ for f in (make_counter, bump, doubled, never_called)}
    comprehension = next(c for c in doubled.__code__.co_consts if isinstance(c, types.CodeType))
    hot = executed_code(lambda: (bump(), doubled([1, 2])))
    assert {id(bump.__code__), id(doubled.__code__), id(comprehension)} <= {id(c) for c in hot}

    copies = relocate_code(hot)
    assert {id(bump.__code__), id(doubled.__code__)} <= {id(c) for c in copies}
    for f in (bump, doubled):
        assert f.__code__ is not before[f] and f.__code__ == before[f]
    assert next(c for c in doubled.__code__.co_consts if isinstance(c, types.CodeType)) is not comprehension
    assert make_counter.__code__ is before[make_counter]  # it ran before the profiled run: not hot
    assert never_called.__code__ is before[never_called]
    # Same behaviour, same closure.
    assert (bump(), bump(5), doubled([3])) == (2, 7, [6])


def _ksm_merge_any(pid: int) -> bool:
    with open(f"/proc/{pid}/ksm_stat") as f:
        return "ksm_merge_any: yes" in f.read()


@pytest.mark.netns
def test_merge_pages_opts_the_zygote_and_its_workers_into_ksm_and_is_off_by_default(pod_netns):
    # What the check reads: the ksm_merge_any line of ksm_stat, newer than the file itself and than the prctl
    # that sets it (6.4); a kernel without the line cannot show the opt-in.
    try:
        with open("/proc/self/ksm_stat") as f:
            shown = "ksm_merge_any:" in f.read()
    except FileNotFoundError:
        shown = False
    if not shown:
        pytest.skip("the kernel shows no per-process KSM merging (/proc/<pid>/ksm_stat without ksm_merge_any)")

    async def main():
        plain = await Zygote.start(warm_up=False)
        merging = await Zygote.start(warm_up=False, merge_pages=True)
        try:
            assert not _ksm_merge_any(plain.pid)
            assert _ksm_merge_any(merging.pid)
            worker = await merging.spawn(worker_pb.WorkerConfig())
            assert (await _first_frame(worker)).WhichOneof("msg") == "ready"
            assert _ksm_merge_any(worker.pid)  # inherited through the fork
        finally:
            await plain.close()
            await merging.close()

    asyncio.run(main())


def test_zygote_that_cannot_start_is_an_error():
    async def main():
        with pytest.raises(ZygoteError, match="did not start"):
            await Zygote.start(python="/bin/false", start_timeout_s=WAIT_S)

    asyncio.run(main())
