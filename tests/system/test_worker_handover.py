"""A worker outliving its daemon: probes resumed from their progress, events queued while no daemon listens, the
next daemon's socket taken over, a Snapshot of everything the worker serves (probe_worker/main.py, outbox.py).

The worker's request loop runs in-process over socketpairs with LocalSockets (no netns, no root); the probe
target is a real TCP server on loopback. The handover itself (a socket arriving from the broker) is
`Handover.put`, which is what the broker channel's `control` message calls.
"""

from __future__ import annotations

import asyncio
import socket

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from cri_proto import probe_worker_pb2 as worker_pb
from probe_api.worker_protocol import WORKER_PROTOCOL_VERSION
from probe_worker.channel import AsyncChannel
from probe_worker.main import Handover, serve
from probe_worker.manager import ProbeManager
from probe_worker.outbox import Outbox
from probe_worker.socket_source import LocalSockets

DEADLINE_S = 10.0
PERIOD_MS = 50


def registration(port: int, probe_id: str = "p", **fields) -> worker_pb.ProbeRegistration:
    return worker_pb.ProbeRegistration(
        probe_id=probe_id, sandbox_id="sb", type=spec_pb.READINESS, start_now=True,
        spec=spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=port)),
                               period_ms=PERIOD_MS),
        container=worker_pb.ContainerRef(id="c1", name="app"), **fields)


class Daemon:
    """The daemon's end of one worker socket: requests out, every event in, kept in order."""

    def __init__(self, sock: socket.socket) -> None:
        self.channel = AsyncChannel(sock)
        self.seq = 0
        self.events: asyncio.Queue[worker_pb.WorkerEvent] = asyncio.Queue()
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            while True:
                self.events.put_nowait(worker_pb.WorkerEvent.FromString(await self.channel.recv()))
        except Exception:  # noqa: BLE001  EOF ends the reader
            return

    async def request(self, **msg) -> worker_pb.WorkerEvent:
        self.seq += 1
        await self.channel.send(worker_pb.WorkerRequest(seq=self.seq, **msg))
        while True:
            event = await self.next()
            if event.seq == self.seq:
                return event

    async def next(self, kind: str | None = None) -> worker_pb.WorkerEvent:
        async with asyncio.timeout(DEADLINE_S):
            while True:
                event = await self.events.get()
                if kind is None or event.WhichOneof("msg") == kind:
                    return event

    def close(self) -> None:
        self.reader.cancel()
        self.channel.close()


class Target:
    """A TCP server on loopback that counts the probes' connections."""

    def __init__(self) -> None:
        self.connections = 0
        self._counted = asyncio.Condition()

    async def _accept(self, reader, writer) -> None:
        writer.close()
        async with self._counted:
            self.connections += 1
            self._counted.notify_all()

    async def probed(self, times: int) -> None:
        """Returns once `times` more connections came in."""
        async with self._counted:
            goal = self.connections + times
            async with asyncio.timeout(DEADLINE_S):
                await self._counted.wait_for(lambda: self.connections >= goal)


def in_loop(test):
    """Runs an async test on a fresh event loop, with a Target as its probe target."""
    def run() -> None:
        async def with_target() -> None:
            target = Target()
            server = await asyncio.start_server(target._accept, "127.0.0.1", 0)
            target.port = server.sockets[0].getsockname()[1]
            try:
                await test(target)
            finally:
                server.close()

        asyncio.run(with_target())

    run.__name__ = test.__name__
    return run


async def start_worker(handover: Handover | None):
    ours, theirs = socket.socketpair()
    stop = asyncio.get_running_loop().create_future()
    ready = worker_pb.Ready(pid=4242, protocol_version=WORKER_PROTOCOL_VERSION, group="ns#1")
    task = asyncio.ensure_future(serve(AsyncChannel(theirs), LocalSockets(), "1.37", 60_000, stop=stop,
                                       handover=handover, ready=ready))
    daemon = Daemon(ours)
    assert (await daemon.request(add_sandbox=worker_pb.AddSandbox(sandbox_id="sb", pod_ips=["127.0.0.1"]))).ack
    return daemon, task, stop


async def probing_worker(target):
    """A worker that outlives its daemon, probing the target: (handover, its daemon, its task, its stop)."""
    handover = Handover()
    daemon, task, stop = await start_worker(handover)
    assert (await daemon.request(add_probe=worker_pb.AddProbe(probe=registration(target.port)))).ack
    await daemon.next("attempt")
    return handover, daemon, task, stop


def new_daemon(handover: Handover) -> Daemon:
    ours, theirs = socket.socketpair()
    handover.put(theirs)
    return Daemon(ours)


# --- the probe manager: progress in, snapshot out ----------------------------------------------------------------

class SucceedingProber:
    async def run(self, spec, ports, **kwargs) -> spec_pb.Attempt:
        return spec_pb.Attempt(result=spec_pb.RESULT_SUCCESS, output="ok")


@in_loop
async def test_a_probe_with_progress_resumes_without_a_state_change(target):
    events: list[worker_pb.WorkerEvent] = []
    attempted = asyncio.Event()

    async def emit(event: worker_pb.WorkerEvent) -> None:
        events.append(event)
        if event.WhichOneof("msg") == "attempt":
            attempted.set()

    manager = ProbeManager(SucceedingProber(), emit, sandbox_id="sb")
    reg = registration(1)
    reg.status.CopyFrom(service_pb.ProbeStatus(
        state=spec_pb.STATE_SUCCESS, consecutive_successes=1, totals=service_pb.AttemptTotals(success=41, failure=2)))
    await manager.add(reg)
    async with asyncio.timeout(DEADLINE_S):
        await attempted.wait()
    await manager.close()
    # Readiness starts "not ready" when new; resumed, it was ready, is ready, and nothing says it changed.
    assert [e.WhichOneof("msg") for e in events] == ["attempt"]
    assert events[0].attempt.status.state == spec_pb.STATE_SUCCESS
    assert events[0].attempt.status.consecutive_successes == 2


@in_loop
async def test_a_new_probe_still_announces_its_initial_state(target):
    events: list[worker_pb.WorkerEvent] = []

    async def emit(event: worker_pb.WorkerEvent) -> None:
        events.append(event)

    manager = ProbeManager(SucceedingProber(), emit, sandbox_id="sb")
    await manager.add(registration(1))
    await manager.close()
    assert events[0].state_change.state == spec_pb.STATE_FAILURE
    assert events[0].state_change.output == "registered"


@in_loop
async def test_snapshot_counts_totals_from_the_progress_on(target):
    attempts = 0
    enough = asyncio.Event()

    async def emit(event: worker_pb.WorkerEvent) -> None:
        nonlocal attempts
        if event.WhichOneof("msg") == "attempt":
            attempts += 1
            if attempts == 3:
                enough.set()

    manager = ProbeManager(SucceedingProber(), emit, sandbox_id="sb")
    reg = registration(1)
    reg.status.totals.success = 10
    reg.status.state = spec_pb.STATE_SUCCESS
    await manager.add(reg)
    async with asyncio.timeout(DEADLINE_S):
        await enough.wait()
    (snap,) = manager.snapshot()
    await manager.close()
    assert snap.status.totals.success >= 13
    assert snap.status.last_attempt.output == "ok"
    assert not snap.registration.HasField("status")  # the registration as it runs, not as it came
    assert snap.registration.probe_id == "p"


# --- the outbox ----------------------------------------------------------------------------------------------------

def attempt_event(n: int) -> worker_pb.WorkerEvent:
    return worker_pb.WorkerEvent(attempt=worker_pb.AttemptReport(probe_id=f"p{n}"))


@in_loop
async def test_the_outbox_queues_while_detached_and_writes_in_order_on_attach(target):
    ours, theirs = socket.socketpair()
    outbox = Outbox(None)
    for n in range(3):
        await outbox.send(attempt_event(n))
    assert outbox.queued == 3
    await outbox.attach(AsyncChannel(theirs))
    await outbox.send(attempt_event(3))
    reader = AsyncChannel(ours)
    got = [worker_pb.WorkerEvent.FromString(await reader.recv()).attempt.probe_id for _ in range(4)]
    assert got == ["p0", "p1", "p2", "p3"]
    ours.close()
    theirs.close()


@in_loop
async def test_the_outbox_drops_the_oldest_past_its_bound_and_counts_them(target):
    size = attempt_event(0).ByteSize()
    outbox = Outbox(None, max_queued_bytes=size * 5)
    for n in range(8):
        await outbox.send(attempt_event(n))
    assert outbox.queued == 5
    assert outbox.take_dropped() == 3 and outbox.take_dropped() == 0


@in_loop
async def test_an_event_the_daemon_can_no_longer_take_waits_for_the_next_one(target):
    ours, theirs = socket.socketpair()
    outbox = Outbox(AsyncChannel(theirs))
    ours.close()  # the daemon died
    await outbox.send(attempt_event(0))
    await outbox.flush()  # the batch's write (the window's end) finds the daemon gone
    assert outbox.channel is None and outbox.queued == 1
    theirs.close()


# --- the request loop across daemons ----------------------------------------------------------------------------

@in_loop
async def test_without_handover_eof_ends_the_worker(target):
    daemon, task, _ = await start_worker(handover=None)
    daemon.close()
    async with asyncio.timeout(DEADLINE_S):
        await task


@in_loop
async def test_a_worker_outlives_a_daemon_that_died_and_serves_the_next(target):
    handover, first, task, stop = await probing_worker(target)
    first.close()  # kill -9: no goodbye
    await target.probed(3)  # the worker probes on with no daemon
    assert not task.done()

    second = new_daemon(handover)
    hello = (await second.next()).ready
    assert (hello.adopted, hello.pid, hello.protocol_version, hello.group) == (True, 4242, WORKER_PROTOCOL_VERSION,
                                                                              "ns#1")
    queued = []
    snapshot = None
    second.seq += 1
    await second.channel.send(worker_pb.WorkerRequest(seq=second.seq, resume=worker_pb.Resume()))
    while snapshot is None:
        event = await second.next()
        if event.WhichOneof("msg") == "snapshot":
            snapshot = event.snapshot
        elif event.WhichOneof("msg") == "attempt":
            queued.append(event.attempt)
    # Attempts made while no daemon listened reach the new one, before the snapshot.
    assert len(queued) >= 2, "the attempts made during the gap were lost"
    assert [s.sandbox_id for s in snapshot.sandboxes] == ["sb"]
    assert list(snapshot.sandboxes[0].pod_ips) == ["127.0.0.1"]
    (probe,) = snapshot.probes
    assert probe.registration.probe_id == "p"
    assert probe.status.state == spec_pb.STATE_SUCCESS
    assert probe.status.totals.success >= len(queued) + 1
    assert snapshot.dropped_events == 0
    # And it serves the new daemon as it served the old one.
    assert (await second.request(remove_probe=worker_pb.RemoveProbe(probe_id="p", sandbox_id="sb"))).ack
    assert (await second.request(shutdown=worker_pb.Shutdown())).ack
    async with asyncio.timeout(DEADLINE_S):
        await task
    second.close()


@in_loop
async def test_after_detach_nothing_more_is_written_to_the_old_daemon(target):
    handover, first, task, stop = await probing_worker(target)
    assert (await first.request(detach=worker_pb.Detach())).ack
    # Detached: the old daemon hears nothing more, though the worker probes on.
    await target.probed(2)
    assert first.events.empty()
    first.close()
    second = new_daemon(handover)
    assert (await second.next()).ready.adopted
    assert (await second.next()).WhichOneof("msg") == "attempt"  # queued after the detach
    stop.set_result("test over")
    async with asyncio.timeout(DEADLINE_S):
        await task
    second.close()


@in_loop
async def test_a_worker_without_handover_refuses_detach(target):
    daemon, task, _ = await start_worker(handover=None)
    reply = await daemon.request(detach=worker_pb.Detach())
    assert reply.rejected.errors and "detach" in reply.rejected.errors[0]
    daemon.close()
    async with asyncio.timeout(DEADLINE_S):
        await task
