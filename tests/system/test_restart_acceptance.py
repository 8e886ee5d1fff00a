"""Restarts and upgrades, as an operator would do them, under a loaded node.

50 sandboxes (in 5 Kubernetes-like namespaces) x 3 probes (HTTP readiness, TCP liveness, gRPC readiness) with
periods from 1 to 10 s against healthy targets, and one every_attempt watcher. Once every probe is in its steady
state, the daemon goes three times: kill -9, SIGTERM, and SIGTERM into another version (a copy of the code with
another SHIM_VERSION: an upgrade). After each restart:
- no registration is lost (the same 150 probes);
- no probe changed state (healthy targets: any transition would not have been caused by an attempt's result);
- the watcher resumed from its last revision and got no full state (no SNAPSHOT, no RESYNC);
- a RunProbe while no daemon served failed at once with UNAVAILABLE (kill -9 case) and works right after.
At the end, no tick was missed across all of it: for each probe, the attempts its worker made (its totals) equal
the ticks of its grid between two of its attempts, one before the first restart and one after the last, and no
attempt reported a dropped tick.

Real daemons, real netns, one real target process serving every sandbox (bench/targets.py).
"""

from __future__ import annotations

import signal
import threading
import time

import grpc
import pytest

from bench.env import grpc_spec, http_spec, tcp_spec
from bench.targets import TargetProcess
from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_service_pb2_grpc as service_grpc
from cri_proto import probe_spec_pb2 as spec_pb
from tests.support.daemon_env import DaemonProcess, code_copy, status
from tests.support.netns_env import PodNetns

SANDBOXES = 50
NAMESPACES = 5
PROBES = (("http", http_spec, spec_pb.READINESS), ("tcp", tcp_spec, spec_pb.LIVENESS),
          ("grpc", grpc_spec, spec_pb.READINESS))
STEADY_TIMEOUT_S = 60
ARGS = ["--embedded-namespace-separator", ".", "--config", "{config}"]

pytestmark = [pytest.mark.netns, pytest.mark.slow]


def period_ms(sandbox: int, kind: int) -> int:
    return 1000 * (1 + (sandbox + 3 * kind) % 10)


class Watcher:
    """One every_attempt watch at a time, resumed across daemons from the last revision it received."""

    def __init__(self) -> None:
        self.instance_id = ""
        self.revision = 0
        self.states: dict[str, int] = {}
        self.transitions: list[tuple[str, int, int]] = []  # (probe, before, after) seen after steady
        self.resyncs = 0
        self.ticks_missed = 0
        self.attempts = 0
        self.steady = False
        self._stream = None
        self._thread: threading.Thread | None = None
        self._attempted = threading.Event()

    def follow(self, daemon: DaemonProcess) -> None:
        request = service_pb.WatchProbeStatusRequest(every_attempt=True, instance_id=self.instance_id,
                                                     since_revision=self.revision)
        self._stream = daemon.stub.WatchProbeStatus(request)
        self._attempted.clear()
        self._thread = threading.Thread(target=self._read, args=(self._stream, bool(self.instance_id)), daemon=True)
        self._thread.start()

    def wait_for_an_attempt(self, timeout_s: float = 15) -> None:
        assert self._attempted.wait(timeout_s), "the resumed watch delivered no attempt"

    def end(self) -> None:
        """The daemon is gone (or going): the stream ends, the thread with it."""
        if self._thread is not None:
            self._thread.join(timeout=15)
            assert not self._thread.is_alive(), "the watch did not end with its daemon"

    def cancel(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
        self.end()

    def _read(self, stream, resumed: bool) -> None:
        try:
            for event in stream:
                self._take(event, resumed)
        except grpc.RpcError:
            pass  # the daemon went away, or the test cancelled

    def _take(self, event, resumed: bool) -> None:
        if event.type in (service_pb.SNAPSHOT, service_pb.RESYNC) and resumed:
            self.resyncs += 1
        self.instance_id = event.instance_id
        if event.type != service_pb.SNAPSHOT:  # a snapshot's revision is a resume point only once complete
            self.revision = max(self.revision, event.revision)
        probe = event.probe
        if not probe.probe_id or event.type == service_pb.REMOVED:
            return
        before = self.states.get(probe.probe_id)
        if self.steady and before is not None and before != probe.status.state:
            self.transitions.append((probe.probe_id, before, probe.status.state))
        self.states[probe.probe_id] = probe.status.state
        if event.type == service_pb.ATTEMPT:
            self.attempts += 1
            self.ticks_missed += probe.status.last_attempt.ticks_missed
            self._attempted.set()


def steady(probes) -> bool:
    """Every probe ready (or alive) on two attempts in a row since it got there."""
    return len(probes) == SANDBOXES * len(PROBES) and all(
        p.status.state == spec_pb.STATE_SUCCESS and p.status.consecutive_successes >= 3 for p in probes)


def wait_until(daemon: DaemonProcess, predicate, timeout_s: float) -> list:
    """Polls ProbeStatus on each attempt a watch reports, until predicate(probes) holds."""
    stream = daemon.stub.WatchProbeStatus(service_pb.WatchProbeStatusRequest(every_attempt=True),
                                          timeout=timeout_s)
    try:
        for event in stream:
            if event.type == service_pb.ATTEMPT:
                probes = list(status(daemon).probes)
                if predicate(probes):
                    return probes
    except grpc.RpcError as exc:
        raise AssertionError(f"not reached within {timeout_s}s: {exc.code()}") from None
    finally:
        stream.cancel()
    raise AssertionError("the watch ended")


def fails_fast_while_no_daemon_serves(daemon: DaemonProcess, sandbox: str) -> None:
    channel = grpc.insecure_channel(f"unix://{daemon.socket_path}")
    try:
        began = time.monotonic()
        with pytest.raises(grpc.RpcError) as refused:
            service_grpc.ProbeServiceStub(channel).RunProbe(service_pb.RunProbeRequest(
                pod_sandbox_id=sandbox, container_name="late", type=spec_pb.READINESS,
                spec=tcp_spec(1000)), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - began < 2, "a call while no daemon serves must fail at once"
    finally:
        channel.close()


def test_restarts_and_an_upgrade_under_load_change_nothing(tmp_path):
    config = tmp_path / "shim.toml"
    config.write_text("max_probes_per_sandbox = 16\n")
    args = [a.format(config=config) for a in ARGS]
    upgrade = code_copy(tmp_path / "next", {"probe_api/defaults.py": ('SHIM_VERSION = "', 'SHIM_VERSION = "next-')})
    sandboxes: list[PodNetns] = []
    targets = TargetProcess()
    watcher = Watcher()
    daemon = DaemonProcess(tmp_path, args)
    try:
        for i in range(SANDBOXES):
            ns = PodNetns.create(tenancy=f"ns-{i % NAMESPACES}")
            sandboxes.append(ns)
            targets.add(ns.name)
        daemon.start()
        for i, ns in enumerate(sandboxes):
            for k, (name, make_spec, probe_type) in enumerate(PROBES):
                daemon.stub.RunProbe(service_pb.RunProbeRequest(
                    pod_sandbox_id=ns.name, container_name=name, type=probe_type,
                    spec=make_spec(period_ms(i, k))), timeout=30)
        watcher.follow(daemon)
        before = wait_until(daemon, steady, STEADY_TIMEOUT_S)
        watcher.steady = True
        registered = sorted(p.probe_id for p in before)
        workers = {p.pod_sandbox_id: p.status.worker.pid for p in before}

        for how in ("kill -9", "SIGTERM", "upgrade"):
            if how == "kill -9":
                daemon.crash()
                watcher.end()
                fails_fast_while_no_daemon_serves(daemon, sandboxes[0].name)
            else:
                assert daemon.stop(signal.SIGTERM) == 0
                watcher.end()
            daemon = DaemonProcess(tmp_path, args, code_root=upgrade if how == "upgrade" else daemon.code_root)
            daemon.start()
            watcher.follow(daemon)
            watcher.wait_for_an_attempt()
            after = list(status(daemon).probes)
            assert sorted(p.probe_id for p in after) == registered, f"registrations lost after {how}"
            assert {p.pod_sandbox_id: p.status.worker.pid for p in after} == workers, f"workers not adopted after {how}"
            assert all(p.status.state == spec_pb.STATE_SUCCESS for p in after), f"a state changed after {how}"
            assert watcher.resyncs == 0, f"the watcher got the full state again after {how}"
            assert watcher.transitions == [], f"transitions after {how}: {watcher.transitions[:5]}"

        # Every probe's ticks from its last attempt before the first restart to one after the last restart.
        restarted_ns = time.time_ns()
        end = wait_until(daemon, lambda probes: all(
            p.status.last_attempt.scheduled_at_unix_ns > restarted_ns for p in probes), 30)
        first = {p.probe_id: p for p in before}
        missed = {}
        for probe in end:
            was = first[probe.probe_id]
            now_s, was_s = probe.status, was.status
            ticks = round((now_s.last_attempt.scheduled_at_unix_ns - was_s.last_attempt.scheduled_at_unix_ns)
                          / (probe.spec.period_ms * 1_000_000))
            attempts = sum((now_s.totals.success, now_s.totals.warning, now_s.totals.failure, now_s.totals.unknown)) \
                - sum((was_s.totals.success, was_s.totals.warning, was_s.totals.failure, was_s.totals.unknown))
            if attempts != ticks:
                missed[probe.probe_id] = (ticks, attempts)
        assert missed == {}, f"(ticks, attempts) of probes that missed ticks: {missed}"
        assert watcher.ticks_missed == 0 and watcher.attempts > 0
        # And a RunProbe works on the upgraded daemon right away.
        daemon.stub.RunProbe(service_pb.RunProbeRequest(
            pod_sandbox_id=sandboxes[0].name, container_name="late", type=spec_pb.READINESS,
            spec=tcp_spec(1000)), timeout=10)
    finally:
        watcher.cancel()
        daemon.stop()
        targets.stop()
        for ns in sandboxes:
            ns.destroy()
