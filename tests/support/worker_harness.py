"""Drives a real probe worker process over its socketpair, the way the daemon does, with a real netns broker.

The worker is started on its own (`python -m probe_worker --fd N --broker-fd M`) rather than forked by the
zygote; its broker is probe_zygote.netns_broker.NetnsBroker, the zygote's own, served here in a thread (setns moves
only that thread). The harness assigns the worker one sandbox (a netns) and adds it, as the supervisor does
for each sandbox of a group; `add_sandbox` adds more.
"""

from __future__ import annotations

import itertools
import os
import select
import socket
import subprocess
import sys
import threading

from cri_proto import probe_spec_pb2 as spec_pb
from cri_proto import probe_worker_pb2 as worker_pb
from probe_worker.channel import BlockingChannel
from probe_worker.pod_ips import discover_pod_ips
from probe_zygote.netns_broker import BrokerError, NetnsBroker
from tests.support.netns_env import REPO_ROOT

DEFAULT_SANDBOX = "test-sandbox"


class ThreadBroker:
    """A NetnsBroker answering one worker's channel from a thread of this process."""

    def __init__(self) -> None:
        self.broker = NetnsBroker(find_pod_ips=discover_pod_ips)
        self.ours, self.theirs = NetnsBroker.channel_pair()
        self._lock = threading.Lock()
        self._stop_r, self._stop_w = os.pipe()
        self._worker_id = 0
        self._thread: threading.Thread | None = None

    def attach(self, worker_id: int) -> None:
        self._worker_id = worker_id
        self.broker.attach(worker_id, self.ours)
        self._thread = threading.Thread(target=self._serve, name="netns broker", daemon=True)
        self._thread.start()

    def assign(self, sandbox_id: str, netns_path: str, find_pod_ips: bool) -> tuple[int, list[str]]:
        with self._lock:
            return self.broker.assign(self._worker_id, sandbox_id, netns_path, find_pod_ips)

    def unassign(self, sandbox_id: str) -> None:
        with self._lock:
            self.broker.unassign(self._worker_id, sandbox_id)

    def detach(self) -> None:
        """The broker lets the worker go (as when the zygote dies): the worker sees its channel closed."""
        with self._lock:
            self.broker.detach(self._worker_id)

    def _serve(self) -> None:
        poller = select.poll()
        poller.register(self.ours, select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self._stop_r in ready:
                return
            with self._lock:
                if not self.broker.serve_channel(self._worker_id):
                    return

    def close(self) -> None:
        os.write(self._stop_w, b"x")
        if self._thread is not None:
            self._thread.join(5)
        with self._lock:
            self.broker.close()
        self.theirs.close()
        os.close(self._stop_r)
        os.close(self._stop_w)


class WorkerFailed(Exception):
    pass


class Rejected(Exception):
    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors


class WorkerHarness:
    def __init__(self, config: worker_pb.WorkerConfig, netns_path: str | None = None,
                 pod_ips: tuple[str, ...] | list[str] = (), sandbox_id: str = DEFAULT_SANDBOX) -> None:
        """A worker serving `sandbox_id` (the netns at netns_path; its IPs found there when pod_ips is empty)."""
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.broker = ThreadBroker()
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "probe_worker", "--fd", str(child.fileno()),
             "--broker-fd", str(self.broker.theirs.fileno())],
            pass_fds=[child.fileno(), self.broker.theirs.fileno()], cwd=REPO_ROOT, env=env,
        )
        child.close()
        self.broker.attach(self.proc.pid)
        self.channel = BlockingChannel(parent)
        self._seq = itertools.count(1)
        self.backlog: list[worker_pb.WorkerEvent] = []
        self.sandbox_id = sandbox_id
        self.channel.send(worker_pb.WorkerRequest(seq=next(self._seq), config=config))
        first = self._recv(timeout=30)
        if first.WhichOneof("msg") == "fatal":
            self.close()
            raise WorkerFailed(first.fatal.message)
        self.ready = first.ready
        self.pod_ips: list[str] = []
        self.netns_inode = 0
        if netns_path is not None:
            try:
                self.netns_inode, self.pod_ips = self.add_sandbox(sandbox_id, netns_path, pod_ips)
            except BrokerError as exc:
                self.close()
                raise WorkerFailed(str(exc)) from None

    def add_sandbox(self, sandbox_id: str, netns_path: str, pod_ips=()) -> tuple[int, list[str]]:
        """As the supervisor attaches a sandbox: assigned at the broker, then AddSandbox. (inode, pod IPs)."""
        inode, found = self.broker.assign(sandbox_id, netns_path, find_pod_ips=not pod_ips)
        ips = list(pod_ips) or found
        self.request(add_sandbox=worker_pb.AddSandbox(sandbox_id=sandbox_id, pod_ips=ips))
        return inode, ips

    def remove_sandbox(self, sandbox_id: str) -> None:
        self.request(remove_sandbox=worker_pb.RemoveSandbox(sandbox_id=sandbox_id))
        self.broker.unassign(sandbox_id)

    def _recv(self, timeout: float) -> worker_pb.WorkerEvent:
        return worker_pb.WorkerEvent.FromString(self.channel.recv(timeout=timeout))

    def request(self, timeout: float = 10.0, **msg) -> worker_pb.WorkerEvent:
        """Sends one request and returns the event answering it; others are kept in `backlog`."""
        seq = next(self._seq)
        self.channel.send(worker_pb.WorkerRequest(seq=seq, **msg))
        while True:
            event = self._recv(timeout)
            if event.seq == seq:
                if event.WhichOneof("msg") == "rejected":
                    raise Rejected(list(event.rejected.errors))
                return event
            self.backlog.append(event)

    def run_once(
        self,
        spec: spec_pb.ProbeSpec,
        probe_type: int = spec_pb.READINESS,
        container_ports: tuple[spec_pb.ContainerPort, ...] = (),
        timeout: float = 10.0,
        sandbox_id: str | None = None,
    ) -> spec_pb.Attempt:
        reg = worker_pb.ProbeRegistration(
            type=probe_type, spec=spec, container=worker_pb.ContainerRef(ports=container_ports),
            sandbox_id=self.sandbox_id if sandbox_id is None else sandbox_id,
        )
        return self.request(timeout, run_once=worker_pb.RunOnce(probe=reg)).attempt.status.last_attempt

    def run_many(self, runs: list[tuple[spec_pb.ProbeSpec, tuple[spec_pb.ContainerPort, ...]]],
                 timeout: float = 30.0) -> list[spec_pb.Attempt]:
        """One RunOnce per (spec, container ports), all sent at once (the worker runs them concurrently); their
        attempts in the same order."""
        pending: dict[int, int] = {}
        for index, (spec, ports) in enumerate(runs):
            seq = next(self._seq)
            reg = worker_pb.ProbeRegistration(type=spec_pb.READINESS, spec=spec,
                                              container=worker_pb.ContainerRef(ports=ports), sandbox_id=self.sandbox_id)
            self.channel.send(worker_pb.WorkerRequest(seq=seq, run_once=worker_pb.RunOnce(probe=reg)))
            pending[seq] = index
        attempts: list[spec_pb.Attempt | None] = [None] * len(runs)
        while pending:
            event = self._recv(timeout)
            if event.seq not in pending:
                self.backlog.append(event)
                continue
            if event.WhichOneof("msg") == "rejected":
                raise Rejected(list(event.rejected.errors))
            attempts[pending.pop(event.seq)] = event.attempt.status.last_attempt
        return attempts

    def add(self, reg: worker_pb.ProbeRegistration) -> None:
        if not reg.sandbox_id:
            reg.sandbox_id = self.sandbox_id
        self.request(add_probe=worker_pb.AddProbe(probe=reg))

    def remove(self, probe_id: str, sandbox_id: str | None = None) -> None:
        self.request(remove_probe=worker_pb.RemoveProbe(
            probe_id=probe_id, sandbox_id=self.sandbox_id if sandbox_id is None else sandbox_id))

    def next_event(self, timeout: float = 10.0, kinds: tuple[str, ...] = ("attempt", "state_change")) -> worker_pb.WorkerEvent:
        """The next unsolicited event of the given kinds; others stay in `backlog`, in order."""
        for i, event in enumerate(self.backlog):
            if event.WhichOneof("msg") in kinds:
                return self.backlog.pop(i)
        while True:
            event = self._recv(timeout)
            if event.WhichOneof("msg") in kinds:
                return event
            if event.WhichOneof("msg") != "heartbeat" or "heartbeat" in kinds:
                self.backlog.append(event)

    def close(self) -> int:
        if self.proc.poll() is None:
            try:
                self.channel.send(worker_pb.WorkerRequest(seq=next(self._seq), shutdown=worker_pb.Shutdown()))
            except OSError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.channel.close()
        self.broker.close()
        return self.proc.returncode
