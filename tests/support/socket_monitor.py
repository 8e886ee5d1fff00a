"""A well-behaved client of the daemon's socket while a test attacks it: grpcio's, in a process of its own (the
attacker's Python, busy writing millions of frames, never delays it with its GIL), on its own channel (its own
connection, made before the attack), calling grpc.health.v1 Health/Check every 100 ms with a 5 s deadline.

    monitor = SocketMonitor(socket_path).start()   # returns once its first call was answered
    ... the attack ...
    answers = monitor.stop()                        # every call: when, how long, its status

The child writes one JSON line per call to its stdout as the call ends; it stops when its stdin closes.
Run directly: `python -m tests.support.socket_monitor SOCKET_PATH`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from tests.support.netns_env import REPO_ROOT

PERIOD_S = 0.1
DEADLINE_S = 5.0
START_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Answer:
    at: float  # time.monotonic() at the call's start (CLOCK_MONOTONIC: the same clock in every process)
    latency_s: float
    code: str  # grpc.StatusCode's name
    details: str = ""


class SocketMonitor:
    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.answers: list[Answer] = []
        self._new_answer = threading.Condition()
        self._first = threading.Event()
        self._proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        self._stderr = b""

    def start(self) -> SocketMonitor:
        self._proc = subprocess.Popen([sys.executable, "-m", "tests.support.socket_monitor", self.socket_path],
                                      cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._first.wait(START_TIMEOUT_S):
            self.stop()
            raise AssertionError(f"the monitor's first call got no answer in {START_TIMEOUT_S} s: "
                                 f"{self._stderr.decode(errors='replace')}")
        if self.answers[0].code != "OK":
            self.stop()
            raise AssertionError(f"the monitor's first call: {self.answers[0]}")
        return self

    def stop(self) -> list[Answer]:
        """Ends the child after its call in flight (at most its deadline); every answer it had."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=DEADLINE_S + 10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._reader is not None:
            self._reader.join(timeout=10)
        return list(self.answers)

    def wait_answer(self, accept: Callable[[Answer], bool], timeout: float) -> Answer | None:
        """The first answer, from now on or already in, that accept() takes; None after timeout."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self._new_answer:
            while True:
                for answer in self.answers[seen:]:
                    if accept(answer):
                        return answer
                seen = len(self.answers)
                left = deadline - time.monotonic()
                if left <= 0 or self._proc.poll() is not None:
                    return None
                self._new_answer.wait(left)

    def _read(self) -> None:
        for line in self._proc.stdout:
            with self._new_answer:
                self.answers.append(Answer(**json.loads(line)))
                self._new_answer.notify_all()
            self._first.set()
        self._stderr = self._proc.stderr.read()
        self._first.set()


def late_or_failed(answers: list[Answer], limit_s: float = 1.0, codes: frozenset[str] = frozenset({"OK"})
                   ) -> list[Answer]:
    """The answers not within limit_s, or of a status not in `codes`."""
    return [answer for answer in answers if answer.code not in codes or answer.latency_s > limit_s]


def _main(socket_path: str) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    stop = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.buffer.read()  # until the parent closes it
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    # A private subchannel pool: this channel's connection is its own, whatever else the process opens.
    channel = grpc.insecure_channel(f"unix:{socket_path}", options=[("grpc.use_local_subchannel_pool", 1)])
    stub = health_pb2_grpc.HealthStub(channel)
    request = health_pb2.HealthCheckRequest()
    first = True
    while not stop.is_set():
        start = time.monotonic()
        try:
            # Only the first call waits for the socket: later ones must find the connection working.
            stub.Check(request, timeout=DEADLINE_S, wait_for_ready=first)
            code, details = "OK", ""
        except grpc.RpcError as error:
            code, details = error.code().name, error.details() or ""
        latency = time.monotonic() - start
        first = False
        sys.stdout.write(json.dumps({"at": start, "latency_s": latency, "code": code, "details": details}) + "\n")
        sys.stdout.flush()
        stop.wait(max(0.0, PERIOD_S - latency))  # the pacing
    channel.close()


if __name__ == "__main__":
    _main(sys.argv[1])
