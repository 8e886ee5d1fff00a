"""Faults: containerd stopped and started again under the shim: proxied CRI calls fail with UNAVAILABLE while it is
down and work again after, without restarting the shim; probes go on and reconciliation drops nothing meanwhile.
Against a private real containerd (tests/support/containerd_env.py). Helpers: tests/support/fault_harness.py.
"""

from __future__ import annotations

import select
import subprocess
import sys
import threading
import time

import grpc
import pytest

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from tests.support.containerd_env import running_containerd, runtimes
from tests.support.cri_client import CriClient, Kubelet
from tests.support.daemon_env import DaemonProcess, status, tcp_spec
from tests.support.fault_harness import GAP_MARGIN_MS, NONE, PERIOD_MS, WAIT_S, EventLog, max_gaps_ms, report
from tests.support.netns_env import LISTENER

pytestmark = pytest.mark.netns


# --- containerd restarted under the shim --------------------------------------------------------------------

@pytest.fixture(scope="module", params=runtimes(), ids=lambda runtime: f"containerd{runtime.version}")
def containerd(request):
    """A private real containerd (tests/support/containerd_env.py) of each release, as the e2e suite starts it."""
    with running_containerd(unavailable=pytest.skip, runtime=request.param) as env:
        yield env
        if env.proc.poll() is not None:  # a test failed while it was down: the teardown removes pods through it
            env.start_containerd()


def in_netns(netns_path: str, argv: list[str]) -> tuple[subprocess.Popen, int]:
    """Runs argv in a network namespace (nsenter) and waits for its `READY <port>` line."""
    proc = subprocess.Popen(["nsenter", f"--net={netns_path}", *argv], stdout=subprocess.PIPE, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], WAIT_S)
    line = proc.stdout.readline() if ready else ""
    if not line.startswith("READY "):
        proc.kill()
        proc.wait()
        raise AssertionError(f"{argv} printed {line!r}, not READY")
    return proc, int(line.split()[1])


def cri_error(cri, method: str, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        cri.call(method, request, timeout_s=10)
    return caught.value


RECONCILE_S = 0.5
RECOVERY_POLL_S = 0.05  # the shim's upstream channel reconnects by itself; nothing signals it: ask this often


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_containerd_restarted_under_the_shim_unavailable_then_back_without_restarting_it(tmp_path, containerd):
    shim = DaemonProcess(tmp_path, ["--runtime-endpoint", containerd.endpoint,
                                    "--reconcile-interval", str(RECONCILE_S)]).start()
    cri = CriClient(shim.channel)
    listener = events = None
    try:
        pod = Kubelet(cri, containerd).run_pod("faults")
        listener, port = in_netns(pod.netns_path, [sys.executable, "-c", LISTENER, "0.0.0.0", "0"])
        events = EventLog(shim.stub)

        def register(container: str) -> str:
            return shim.stub.RunProbe(service_pb.RunProbeRequest(
                pod_sandbox_id=pod.id, container_name=container, type=spec_pb.READINESS,
                spec=tcp_spec(port, period_ms=PERIOD_MS)), timeout=10).probe_id

        probe_id = register("app")
        probed = events.wait(lambda e: e.type == service_pb.ATTEMPT and e.probe.probe_id == probe_id
                             and e.probe.status.last_attempt.result == spec_pb.RESULT_SUCCESS)
        assert probed.probe.status.last_attempt.address == f"{pod.ip}:{port}"
        worker_pid, shim_pid = probed.probe.status.worker.pid, shim.proc.pid

        # containerd down.
        mark = events.mark()
        down_at_ns = time.time_ns()
        containerd.stop_containerd()
        asked = time.monotonic()
        version_error = cri_error(cri, "Version", cri_pb.VersionRequest(version="v1"))
        failed_in_s = time.monotonic() - asked
        list_error = cri_error(cri, "ListPodSandbox", cri_pb.ListPodSandboxRequest())
        with pytest.raises(grpc.RpcError) as run_error:  # the sandbox cannot be resolved: nothing is stored
            register("other")
        with pytest.raises(grpc.RpcError) as exec_error:
            shim.stub.ExecProbe(service_pb.ExecProbeRequest(pod_sandbox_id=pod.id, spec=tcp_spec(port)), timeout=10)
        # Probing goes on, and four reconcile passes later nothing was dropped.
        down_for = down_at_ns + int(4 * RECONCILE_S * 1e9)
        events.wait(lambda e: e.type == service_pb.ATTEMPT and e.probe.probe_id == probe_id
                    and e.probe.status.last_attempt.started_at_unix_ns > down_for
                    and e.probe.status.last_attempt.result == spec_pb.RESULT_SUCCESS, mark)
        during = [p.probe_id for p in status(shim).probes]
        skipped = shim.logs().count("reconcile skipped")

        # containerd back: the same shim serves the CRI again, on its own (its channel reconnects).
        containerd.start_containerd()
        up_at = time.monotonic()
        while True:
            try:
                cri.call("Version", cri_pb.VersionRequest(version="v1"), timeout_s=10)
                break
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() - up_at < WAIT_S, exc
                threading.Event().wait(RECOVERY_POLL_S)
        recovered_s = time.monotonic() - up_at
        listed = {s.id: s.state for s in cri.list_sandboxes()}
        second = register("other")
        back_at_ns = time.time_ns()
        events.wait(lambda e: e.type == service_pb.ATTEMPT and e.probe.probe_id == second
                    and e.probe.status.last_attempt.result == spec_pb.RESULT_SUCCESS, mark)
        # Two reconcile passes with containerd back drop nothing either.
        settled = back_at_ns + int(2 * RECONCILE_S * 1e9)
        events.wait(lambda e: e.type == service_pb.ATTEMPT and e.probe.probe_id == probe_id
                    and e.probe.status.last_attempt.started_at_unix_ns > settled, mark)
        after = status(shim).probes
        gaps = max_gaps_ms(events.attempts(mark), {probe_id}, (down_at_ns, settled))

        report("containerd-restart", cri_code_while_down=version_error.code().name,
               cri_failed_in_s=f"{failed_in_s:.3f}", run_probe_while_down=run_error.value.code().name,
               exec_probe_while_down=exec_error.value.code().name, reconcile_passes_skipped=skipped,
               probe_max_gap_ms=f"{max(gaps.values()):.0f}", cri_back_after_s=f"{recovered_s:.2f}",
               shim_restarted=shim.proc.pid != shim_pid, worker_restarted=after[0].status.worker.pid != worker_pid)
        for error in (version_error, list_error, run_error.value, exec_error.value):
            assert error.code() == grpc.StatusCode.UNAVAILABLE, (error.code(), error.details())
        assert during == [probe_id] and skipped >= 1
        assert listed.get(pod.id) == cri_pb.SANDBOX_READY
        assert sorted(p.probe_id for p in after) == sorted([probe_id, second])
        assert {(p.status.worker.pid, p.status.worker.restarts) for p in after} == {(worker_pid, 0)}
        assert shim.proc.poll() is None and shim.proc.pid == shim_pid
        assert not [e for e in events.events[mark:] if e.type == service_pb.REMOVED]
        assert max(gaps.values()) <= PERIOD_MS + GAP_MARGIN_MS

        # The shim restarted while containerd is down: every probe is restored and waits (saying why), and
        # probing resumes by itself once containerd is back (a reconcile pass starts the worker).
        events.close()
        containerd.stop_containerd()
        assert shim.stop() == 0
        shim = DaemonProcess(tmp_path, shim.extra_args).start()
        events = EventLog(shim.stub)
        waiting = status(shim).probes
        assert sorted(p.probe_id for p in waiting) == sorted([probe_id, second])
        assert {p.status.worker.state for p in waiting} == {NONE}
        assert all(p.status.worker.last_error.startswith("waiting for the runtime: PodSandboxStatus") for p in waiting)
        back_at = time.monotonic()
        containerd.start_containerd()
        resumed = [events.wait(lambda e: e.type == service_pb.ATTEMPT and e.probe.probe_id == p
                               and e.probe.status.last_attempt.result == spec_pb.RESULT_SUCCESS) for p in (probe_id, second)]
        report("containerd-down-at-shim-start", probes_restored=len(waiting),
               probing_again_after_containerd_started_s=f"{max(e.at for e in resumed) - back_at:.2f}")
    finally:
        if events is not None:
            events.close()
        if listener is not None:
            listener.kill()
            listener.wait()
            listener.stdout.close()
        shim.stop()
        if containerd.proc.poll() is None:
            containerd.remove_all_sandboxes()
