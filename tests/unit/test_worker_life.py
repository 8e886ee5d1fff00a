"""WorkerLife driven through its lives with a fake host, a fake zygote and the test playing the worker.

No process is forked: the zygote hands out socketpairs, the test speaks the worker's end of the protocol (Ready,
answers, EOF) and says when the "process" exits (the zygote's word, as for a worker without a pidfd). What is
checked is the life's own contract: the host's six calls in their order, the worker's status at each step, the
door (`running`) open exactly while the worker runs, a backoff between lives, adoption through the broker, and a
stop that asks the worker to shut down.
"""

from __future__ import annotations

import asyncio
import socket

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_worker_pb2 as worker_pb
from probe_api.worker_protocol import WORKER_PROTOCOL_VERSION, FrameDecoder, encode
from probe_api.zygote_protocol import WorkerExit
from shim.workers.backoff import BackoffPolicy
from shim.workers.life import WorkerLife
from shim.workers.running_worker import RunningWorker
from shim.workers.settings import WorkerSettings
from shim.workers.zygote_channel import AdoptableWorker, SpawnedWorker
from shim.workers.zygote_pool import Adoption

WAIT_S = 10.0
SETTINGS = WorkerSettings(backoff=BackoffPolicy(initial_s=0.01, max_s=0.01), start_timeout_s=WAIT_S,
                          stop_timeout_s=WAIT_S)


class PlayedWorker:
    """The worker's end of its socket, and its process's exit as the zygote would report it."""

    def __init__(self, pid: int, sock: socket.socket, exited: asyncio.Future[WorkerExit]) -> None:
        self.pid, self._sock, self.exited = pid, sock, exited
        self._decoder = FrameDecoder()
        self._frames: list[bytes] = []
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _open(self) -> None:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_unix_connection(sock=self._sock)

    async def say(self, **event) -> None:
        await self._open()
        self._writer.write(encode(worker_pb.WorkerEvent(**event)))
        await self._writer.drain()

    async def ready(self, *, adopted: bool = False, protocol_version: int = WORKER_PROTOCOL_VERSION) -> None:
        await self.say(ready=worker_pb.Ready(pid=self.pid, protocol_version=protocol_version, adopted=adopted))

    async def next_request(self) -> worker_pb.WorkerRequest:
        await self._open()
        while not self._frames:
            data = await asyncio.wait_for(self._reader.read(65536), WAIT_S)
            assert data, "the daemon closed the worker's socket"
            self._frames += self._decoder.feed(data)
        return worker_pb.WorkerRequest.FromString(self._frames.pop(0))

    async def answer(self, kind: str, **reply) -> worker_pb.WorkerRequest:
        """Reads requests until one of `kind` (heartbeats pass by) and answers it."""
        while True:
            request = await self.next_request()
            if request.WhichOneof("msg") == kind:
                await self.say(seq=request.seq, **reply)
                return request

    async def cut_off(self) -> None:
        """Until the daemon closes the worker's socket (it gave up on the worker)."""
        await self._open()
        while await asyncio.wait_for(self._reader.read(65536), WAIT_S):
            pass

    def exit(self, code: int) -> None:
        """The process ends: its socket closes and the zygote reports its status."""
        if self._writer is not None:
            self._writer.close()
        else:
            self._sock.close()
        if not self.exited.done():
            self.exited.set_result(WorkerExit(pid=self.pid, exit_code=code))


class KillableWorker(SpawnedWorker):
    """A spawned worker without a pidfd: a kill is the zygote's report that it died of SIGKILL."""

    def kill(self, sig: int = 9) -> None:
        if not self.exited.done():
            self.exited.set_result(WorkerExit(pid=self.pid, signal=sig))


class FakeZygote:
    def __init__(self) -> None:
        self.spawned: asyncio.Queue[PlayedWorker] = asyncio.Queue()
        self.reattached: asyncio.Queue[PlayedWorker] = asyncio.Queue()
        self.adopted_exits: dict[int, asyncio.Future[WorkerExit]] = {}
        self._pid = 100

    async def spawn(self, config: worker_pb.WorkerConfig, timeout_s: float) -> SpawnedWorker:
        self._pid += 1
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        exited = asyncio.get_running_loop().create_future()
        self.spawned.put_nowait(PlayedWorker(self._pid, theirs, exited))
        return KillableWorker(pid=self._pid, sock=ours, pidfd=None, exited=exited)

    async def reattach(self, worker_pid: int, sock: socket.socket, timeout_s: float = WAIT_S) -> None:
        theirs = socket.fromfd(sock.fileno(), socket.AF_UNIX, socket.SOCK_STREAM)  # the caller closes its copy
        self.reattached.put_nowait(PlayedWorker(worker_pid, theirs, self.adopted_exits[worker_pid]))


class FakePool:
    def __init__(self, zygote: FakeZygote) -> None:
        self.zygote = zygote
        self.released: list[FakeZygote] = []

    async def get(self) -> FakeZygote:
        return self.zygote

    def release(self, zygote: FakeZygote) -> None:
        self.released.append(zygote)


class RecordingHost:
    """LifeHost: each call recorded with the worker's state at that moment; take_over asks through the door."""

    def __init__(self) -> None:
        self.life: WorkerLife | None = None
        self.calls: list[tuple[str, int]] = []
        self.events: list[worker_pb.WorkerEvent] = []
        self.changed = asyncio.Event()
        self.took_over: list[RunningWorker] = []

    def _note(self, name: str) -> None:
        self.calls.append((name, self.life.status.state))
        self.changed.set()

    async def until(self, name: str, count: int = 1) -> None:
        while sum(1 for called, _ in self.calls if called == name) < count:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), WAIT_S)

    def names(self) -> list[str]:
        return [name for name, _ in self.calls if name != "worker_changed"]

    def states(self) -> list[int]:
        return [state for name, state in self.calls if name == "worker_changed"]

    def worker_changed(self) -> None:
        self._note("worker_changed")

    def worker_event(self, event: worker_pb.WorkerEvent) -> None:
        self.events.append(event)
        self._note("worker_event")

    def worker_reattached(self, sandboxes: dict[str, int]) -> None:
        self._note("worker_reattached")

    async def take_over(self, worker: RunningWorker) -> None:
        assert self.life.running is None, "the door opens only once it is taken over"
        self.took_over.append(worker)
        self._note("take_over")
        await worker.request(WAIT_S, resume=worker_pb.Resume())

    def worker_running(self) -> None:
        self._note("worker_running")

    def worker_ended(self) -> None:
        self._note("worker_ended")


def run(scenario) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_life_spawns_serves_crashes_backs_off_restarts_and_stops():
    async def scenario():
        zygote, host = FakeZygote(), RecordingHost()
        pool = FakePool(zygote)
        life = host.life = WorkerLife("g1", "shop", SETTINGS, pool, host)
        assert life.running is None and life.status.state == service_pb.WORKER_STARTING
        life.start()

        first = await asyncio.wait_for(zygote.spawned.get(), WAIT_S)
        await first.ready()
        await host.until("worker_running")
        assert life.status.state == service_pb.WORKER_RUNNING and life.status.pid == first.pid
        assert life.running is not None and life.running.pid == first.pid
        # The door: a request reaches the worker and its answer comes back; an event goes to the host.
        asking = asyncio.create_task(life.running.request(WAIT_S, heartbeat=worker_pb.Heartbeat(unix_ns=1)))
        await first.answer("heartbeat", ack=worker_pb.Ack())
        assert (await asyncio.wait_for(asking, WAIT_S)).WhichOneof("msg") == "ack"
        await first.say(attempt=worker_pb.AttemptReport(probe_id="p1", sandbox_id="sb1"))
        await host.until("worker_event")
        assert host.events[-1].attempt.probe_id == "p1"

        first.exit(3)  # a crash
        await host.until("worker_ended")
        assert life.running is None
        second = await asyncio.wait_for(zygote.spawned.get(), WAIT_S)  # after the backoff
        crashed = [s for s in host.states() if s == service_pb.WORKER_BACKOFF]
        assert crashed, "no BACKOFF between the two lives"
        assert life.status.restarts == 1 and life.status.last_error == "exited with code 3"
        await second.ready()
        await host.until("worker_running", 2)
        assert life.running.pid == second.pid and life.status.restarts == 1
        assert life.status.last_error == "exited with code 3", "why the last life ended stays for the operator"

        stopping = asyncio.create_task(life.stop())
        await second.answer("shutdown", ack=worker_pb.Ack())
        second.exit(0)
        await asyncio.wait_for(stopping, WAIT_S)
        assert life.running is None and life.stopping
        assert host.names() == ["worker_running", "worker_event", "worker_ended", "worker_running", "worker_ended"]
        assert zygote.spawned.empty(), "a stopped life spawns no other worker"
        assert pool.released == [], "nothing adopted, nothing to release"

    run(scenario)


def test_a_worker_that_cannot_start_is_failed_with_its_message():
    async def scenario():
        zygote, host = FakeZygote(), RecordingHost()
        life = host.life = WorkerLife("g1", "shop", SETTINGS, FakePool(zygote), host)
        life.start()
        worker = await asyncio.wait_for(zygote.spawned.get(), WAIT_S)
        await worker.say(fatal=worker_pb.Fatal(message="cannot drop privileges"))
        worker.exit(1)
        await host.until("worker_ended")
        while life.status.state != service_pb.WORKER_FAILED:
            await host.until("worker_changed", len(host.states()) + 1)
        assert life.status.last_error == "cannot drop privileges" and life.running is None
        assert "worker_running" not in host.names()
        await life.stop()

    run(scenario)


def adoption_of(zygote: FakeZygote, pid: int) -> Adoption:
    exited = asyncio.get_running_loop().create_future()
    zygote.adopted_exits[pid] = exited
    return Adoption(zygote=zygote, worker=AdoptableWorker(
        pid=pid, config=worker_pb.WorkerConfig(group="g1", restarts=4), sandboxes={"sb1": 77}, pidfd=None,
        exited=exited, started_at_ns=123))


def test_an_adopted_worker_is_shown_running_taken_over_through_the_door_then_served():
    async def scenario():
        zygote, host = FakeZygote(), RecordingHost()
        pool = FakePool(zygote)
        life = host.life = WorkerLife("g1", "shop", SETTINGS, pool, host, adoption_of(zygote, 202))
        # As the last daemon showed it: taking it over changes nothing a watcher sees.
        assert (life.status.state, life.status.pid, life.status.restarts) == (service_pb.WORKER_RUNNING, 202, 4)
        life.start()
        worker = await asyncio.wait_for(zygote.reattached.get(), WAIT_S)
        await worker.ready(adopted=True)
        await worker.answer("resume", snapshot=worker_pb.Snapshot())
        await asyncio.wait_for(life.taken_over, WAIT_S)
        await host.until("worker_running")
        assert host.names() == ["worker_reattached", "take_over", "worker_running"]
        assert host.took_over[0] is life.running and life.running.pid == 202
        assert life.status.started_at == 123 and life.status.restarts == 4

        stopping = asyncio.create_task(life.stop())
        await worker.answer("shutdown", ack=worker_pb.Ack())
        worker.exit(0)
        await asyncio.wait_for(stopping, WAIT_S)
        assert pool.released == [zygote], "its broker is released with the adopted worker"

    run(scenario)


def test_an_adopted_worker_of_another_protocol_is_replaced_by_a_new_one():
    async def scenario():
        zygote, host = FakeZygote(), RecordingHost()
        pool = FakePool(zygote)
        life = host.life = WorkerLife("g1", "shop", SETTINGS, pool, host, adoption_of(zygote, 202))
        life.start()
        old = await asyncio.wait_for(zygote.reattached.get(), WAIT_S)
        await old.ready(adopted=True, protocol_version=WORKER_PROTOCOL_VERSION - 1)
        await old.cut_off()
        old.exit(137)  # killed (through its pidfd, which a played worker has not: it dies when cut off)
        await asyncio.wait_for(life.taken_over, WAIT_S)  # done: it ended instead
        await host.until("worker_ended")
        assert "take_over" not in host.names() and life.running is None
        assert life.status.last_error == (f"the running worker speaks worker protocol {WORKER_PROTOCOL_VERSION - 1}, "
                                          f"not {WORKER_PROTOCOL_VERSION}")
        assert pool.released == [zygote]
        new = await asyncio.wait_for(zygote.spawned.get(), WAIT_S)
        await new.ready()
        await host.until("worker_running")
        assert life.running.pid == new.pid and life.status.restarts == 5
        stopping = asyncio.create_task(life.stop())
        await new.answer("shutdown", ack=worker_pb.Ack())
        new.exit(0)
        await asyncio.wait_for(stopping, WAIT_S)

    run(scenario)
