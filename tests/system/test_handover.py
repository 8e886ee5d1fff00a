"""Restarts without a flap: the daemon goes (kill -9, SIGTERM, an upgrade), its workers go on probing, the next
daemon adopts them, and no probe changes state without an attempt; watchers resume where they were.

Real daemons (`probe-shim serve`, embedded mode) on a state directory the restarts share, real workers in real
netns, real TCP servers there. Every wait is on an event (a watch event, a process exit) with a bound.
"""

from __future__ import annotations

import signal
import time

import grpc
import psutil
import pytest

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_service_pb2_grpc as service_grpc
from cri_proto import probe_spec_pb2 as spec_pb
from tests.support.daemon_env import DaemonProcess, code_copy, run, status, tcp_spec, wait_for
from tests.support.netns_env import PodNetns, listen

PERIOD_MS = 200


def worker_of(daemon: DaemonProcess, probe_id: str) -> int:
    """The pid of the worker running the probe, once it runs."""
    probe = wait_for(daemon, lambda p: p.status.worker.state == service_pb.WORKER_RUNNING, probe_id)
    return probe.status.worker.pid


def ready_probe(daemon: DaemonProcess, ns, port: int) -> str:
    """A readiness probe at SUCCESS in steady state: two more attempts came after the one that made it ready (the
    daemon writes a state change to its store some milliseconds after it shows it; a crash in between loses the
    write, not the state: the adopted worker has it, but the watchers' resume point is older)."""
    probe_id = run(daemon, ns, tcp_spec(port, period_ms=PERIOD_MS))
    wait_for(daemon, lambda p: p.status.state == spec_pb.STATE_SUCCESS and p.status.consecutive_successes >= 3, probe_id)
    return probe_id


def watch_after_restart(daemon: DaemonProcess, instance_id: str, revision: int, probe_id: str, attempts: int):
    """Resumes a watch from (instance_id, revision); returns its events up to `attempts` ATTEMPTs of the probe."""
    stream = daemon.stub.WatchProbeStatus(service_pb.WatchProbeStatusRequest(
        instance_id=instance_id, since_revision=revision, every_attempt=True,
        filter=service_pb.ProbeFilter(probe_id=probe_id)), timeout=15)
    events = []
    try:
        for event in stream:
            events.append(event)
            if sum(e.type == service_pb.ATTEMPT for e in events) >= attempts:
                break
    finally:
        stream.cancel()
    return events


@pytest.mark.parametrize("how", ["kill -9", "SIGTERM"])
def test_the_next_daemon_adopts_the_running_worker_and_nothing_flaps(tmp_path, pod_netns, how):
    server = listen(pod_netns)
    first = DaemonProcess(tmp_path).start()
    probe_id = ready_probe(first, pod_netns, server.port)
    before = status(first, probe_id=probe_id)
    worker_pid = before.probes[0].status.worker.pid
    if how == "kill -9":
        first.crash()
    else:
        assert first.stop(signal.SIGTERM) == 0
    assert psutil.pid_exists(worker_pid), "the worker went with the daemon"

    # While no daemon serves, a call fails at once (not after a timeout): the kubelet or probectl retries.
    channel = grpc.insecure_channel(f"unix://{first.socket_path}")
    began = time.monotonic()
    with pytest.raises(grpc.RpcError) as refused:
        service_grpc.ProbeServiceStub(channel).RunProbe(service_pb.RunProbeRequest(pod_sandbox_id=pod_netns.name), timeout=5)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() - began < 2
    channel.close()

    second = DaemonProcess(tmp_path).start()
    try:
        after = status(second, probe_id=probe_id)
        (probe,) = after.probes
        assert probe.status.worker.pid == worker_pid, "the running worker was replaced, not adopted"
        assert probe.status.state == spec_pb.STATE_SUCCESS
        assert probe.status.state_changed_at == before.probes[0].status.state_changed_at
        assert after.instance_id == before.instance_id
        # Attempts went on while no daemon listened, and their totals reached the new one.
        assert probe.status.totals.success >= before.probes[0].status.totals.success
        events = watch_after_restart(second, before.instance_id, before.revision, probe_id, attempts=3)
        # Resumed, and nothing changed: not the state, not even the worker's status (the same worker runs on).
        assert [e.type for e in events] == [service_pb.ATTEMPT] * 3, [(e.type, e.revision) for e in events]
        assert probe.status.worker == before.probes[0].status.worker
        assert {e.probe.status.state for e in events if e.probe.probe_id} == {spec_pb.STATE_SUCCESS}
        assert all(e.probe.status.last_attempt.result == spec_pb.RESULT_SUCCESS for e in events
                   if e.type == service_pb.ATTEMPT)
        # No tick was missed while no daemon listened: the ticker counts the dropped ones.
        assert all(e.probe.status.last_attempt.ticks_missed == 0 for e in events if e.type == service_pb.ATTEMPT)
        # And RunProbe works again at once.
        assert run(second, pod_netns, tcp_spec(server.port, period_ms=PERIOD_MS), container="other")
    finally:
        second.stop()
    assert not psutil.pid_exists(worker_pid) or psutil.Process(worker_pid).status() == psutil.STATUS_ZOMBIE


def test_a_worker_no_registration_needs_is_stopped_by_the_next_daemon(tmp_path, pod_netns):
    """systemctl stop, the pod goes meanwhile, systemctl start: no stray worker is left."""
    server = listen(pod_netns)
    first = DaemonProcess(tmp_path).start()
    probe_id = ready_probe(first, pod_netns, server.port)
    worker_pid = status(first, probe_id=probe_id).probes[0].status.worker.pid
    assert first.stop(signal.SIGTERM) == 0
    server.stop()
    pod_netns.destroy()  # gone while no daemon ran
    second = DaemonProcess(tmp_path).start()
    try:
        assert status(second).probes == []
        psutil.Process(worker_pid).wait(timeout=10)
    except psutil.NoSuchProcess:
        pass
    finally:
        second.stop()


def zygote_of(pid: int) -> int:
    return psutil.Process(pid).ppid()


def test_after_an_upgrade_old_workers_are_adopted_and_new_ones_run_the_new_code(tmp_path, pod_netns):
    server = listen(pod_netns)
    first = DaemonProcess(tmp_path).start()
    probe_id = ready_probe(first, pod_netns, server.port)
    old_worker = status(first, probe_id=probe_id).probes[0].status.worker.pid
    old_zygote = zygote_of(old_worker)
    assert first.stop(signal.SIGTERM) == 0
    upgrade = code_copy(tmp_path / "next", {"probe_api/defaults.py": ('SHIM_VERSION = "', 'SHIM_VERSION = "next-')})
    second = DaemonProcess(tmp_path, code_root=upgrade).start()
    try:
        assert second.stub.ShimVersion(service_pb.ShimVersionRequest(), timeout=5).version.startswith("next-")
        (probe,) = status(second, probe_id=probe_id).probes
        assert (probe.status.worker.pid, probe.status.state) == (old_worker, spec_pb.STATE_SUCCESS)  # adopted, as it was
        # A new sandbox's worker comes from a zygote of the new code, not from the old one.
        other = PodNetns.create()
        try:
            other_server = listen(other)
            new_probe = run(second, other, tcp_spec(other_server.port, period_ms=PERIOD_MS))
            new_zygote = zygote_of(worker_of(second, new_probe))
            assert new_zygote != old_zygote
            assert str(upgrade) in psutil.Process(new_zygote).environ().get("PYTHONPATH", "")
            assert psutil.pid_exists(old_zygote)  # still the broker of the adopted worker
        finally:
            other.destroy()
    finally:
        second.stop()
    psutil.Process(old_zygote).wait(timeout=10) if psutil.pid_exists(old_zygote) else None


def test_a_worker_of_another_protocol_is_replaced_and_its_probe_goes_on_from_the_stored_state(tmp_path, pod_netns):
    server = listen(pod_netns)
    first = DaemonProcess(tmp_path).start()
    probe_id = ready_probe(first, pod_netns, server.port)
    before = status(first, probe_id=probe_id)
    old_worker = before.probes[0].status.worker.pid
    assert first.stop(signal.SIGTERM) == 0
    newer = code_copy(tmp_path / "next", {"probe_api/worker_protocol.py": (
        "WORKER_PROTOCOL_VERSION = ", "WORKER_PROTOCOL_VERSION = 1 + ")})
    second = DaemonProcess(tmp_path, code_root=newer).start()
    try:
        psutil.Process(old_worker).wait(timeout=10) if psutil.pid_exists(old_worker) else None
        (probe,) = status(second, probe_id=probe_id).probes
        # Not adopted: a new worker, yet the probe is as it was (no "not ready" in between) ...
        assert probe.status.state == spec_pb.STATE_SUCCESS
        assert probe.status.state_changed_at == before.probes[0].status.state_changed_at
        assert probe.status.totals.success >= before.probes[0].status.totals.success
        events = watch_after_restart(second, before.instance_id, before.revision, probe_id, attempts=2)
        assert not [e for e in events if e.type in (service_pb.SNAPSHOT, service_pb.RESYNC)]
        attempts = [e.probe for e in events if e.type == service_pb.ATTEMPT]
        assert {p.status.state for p in attempts} == {spec_pb.STATE_SUCCESS}
        # ... its worker is a new one, and the count of successes goes on from the stored one.
        assert attempts[-1].status.worker.pid not in (0, old_worker)
        assert attempts[-1].status.consecutive_successes > 3
    finally:
        second.stop()


def test_a_crashed_worker_comes_back_with_its_probes_where_they_stood(tmp_path, pod_netns):
    """Not a daemon restart, but the same promise: the supervisor restarts a killed worker and its readiness
    probe stays ready (a new worker used to start it over from "not ready")."""
    server = listen(pod_netns)
    daemon = DaemonProcess(tmp_path).start()
    try:
        probe_id = ready_probe(daemon, pod_netns, server.port)
        before = status(daemon, probe_id=probe_id)
        old_worker = before.probes[0].status.worker.pid
        psutil.Process(old_worker).kill()
        events = watch_after_restart(daemon, before.instance_id, before.revision, probe_id, attempts=2)
        attempts = [e.probe for e in events if e.type == service_pb.ATTEMPT]
        assert attempts[-1].status.worker.pid not in (0, old_worker) and attempts[-1].status.worker.restarts == 1
        assert {e.probe.status.state for e in events if e.probe.probe_id} == {spec_pb.STATE_SUCCESS}
        assert status(daemon, probe_id=probe_id).probes[0].status.state_changed_at == before.probes[0].status.state_changed_at
    finally:
        daemon.stop()
