"""Drives a real probe worker process over its socketpair, the way the daemon will."""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys

from cri_proto import probe_spec_pb2 as spec_pb
from cri_proto import probe_worker_pb2 as worker_pb
from probe_worker.channel import BlockingChannel
from tests.netns_env import REPO_ROOT


class WorkerFailed(Exception):
    pass


class Rejected(Exception):
    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors


class WorkerHarness:
    def __init__(self, config: worker_pb.WorkerConfig) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "probe_worker", "--fd", str(child.fileno())],
            pass_fds=[child.fileno()], cwd=REPO_ROOT, env=env,
        )
        child.close()
        self.channel = BlockingChannel(parent)
        self._seq = itertools.count(1)
        self.backlog: list[worker_pb.WorkerEvent] = []
        self.channel.send(worker_pb.WorkerRequest(seq=next(self._seq), config=config))
        first = self._recv(timeout=30)
        if first.WhichOneof("msg") == "fatal":
            self.close()
            raise WorkerFailed(first.fatal.message)
        self.ready = first.ready

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
    ) -> spec_pb.Attempt:
        reg = worker_pb.ProbeRegistration(
            type=probe_type, spec=spec, container=worker_pb.ContainerRef(ports=container_ports)
        )
        return self.request(timeout, run_once=worker_pb.RunOnce(probe=reg)).attempt.attempt

    def add(self, reg: worker_pb.ProbeRegistration) -> None:
        self.request(add_probe=worker_pb.AddProbe(probe=reg))

    def remove(self, probe_id: str) -> None:
        self.request(remove_probe=worker_pb.RemoveProbe(probe_id=probe_id))

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
        return self.proc.returncode
