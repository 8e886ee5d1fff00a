"""Faults: a worker or the zygote killed under load; nothing acknowledged is lost and probing resumes.

Against the real daemon (`probe-shim serve`), real network namespaces, a real target server and real workers forked
by the real zygote:
- a worker killed with SIGKILL while the daemon runs 750 probes/s (25 sandboxes x 3 TCP probes every 100 ms), in
  both worker modes (pooled: groups of 5 sandboxes; strict: one worker per sandbox): restarted within 1 s, the
  probes of its group resume, the restart is counted, no probe of another group misses a beat;
- the zygote (the netns broker) killed with SIGKILL, in both modes: its workers end with it, come back through a
  new zygote, and their probes resume; the next new sandbox gets a worker.
Helpers: tests/support/fault_harness.py; `make_netns`: tests/hardening/conftest.py.
"""

from __future__ import annotations

import time

import psutil
import pytest

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from tests.support.daemon_env import DaemonProcess, run, status
from tests.support.fault_harness import (
    GAP_MARGIN_MS, PERIOD_MS, RUNNING, EventLog, free_tcp_port, kill_and_wait, loopback_spec, max_gaps_ms, metric,
    report, serve_loopback, zygote_of,
)

pytestmark = pytest.mark.netns


SANDBOXES, PROBES_PER_SANDBOX = 25, 3
POOL_SIZE = 5  # sandboxes per pooled worker here: 5 groups, so that a group's restart has others to disturb
# The daemon's flags per worker mode, and how many sandboxes share a worker in it.
MODES = {
    "pooled": (["--worker-isolation", "pooled", "--sandboxes-per-worker", str(POOL_SIZE)], POOL_SIZE),
    "strict": (["--worker-isolation", "sandbox"], 1),
}
RESTART_BOUND_S = 1.0  # the bound: a killed worker is running again within 1 s
# The rate the workers achieve is reported, not bounded: how many probes/s 2 busy cores keep is the benchmark's claim
# (bench/report.py's row "250 sandboxes x 3 probes at 1 s, pooled workers: late or missed attempts", and the strict
# mode's: 0 at the same 750/s). Here the load only has to be there: every probe at work in the RATE_WINDOW_S before
# the kill.
RATE_WINDOW_S = 4

# --- a worker killed at 750 probes/s --------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", list(MODES))
def test_worker_killed_at_750_probes_per_second_is_back_within_a_second(tmp_path, make_netns, mode):
    flags, group_size = MODES[mode]
    metrics_port = free_tcp_port()
    daemon = DaemonProcess(tmp_path, ["--metrics-listen", f"127.0.0.1:{metrics_port}", *flags]).start()
    events = None
    try:
        namespaces = make_netns(SANDBOXES)
        server = serve_loopback(namespaces)
        events = EventLog(daemon.stub)
        probes: dict[str, str] = {}  # probe id -> sandbox
        for ns in namespaces:
            for c in range(PROBES_PER_SANDBOX):
                probes[run(daemon, ns, loopback_spec(server.port), container=f"c{c}")] = ns.name
        assert len(probes) == SANDBOXES * PROBES_PER_SANDBOX

        # Steady state: every probe has succeeded since all were registered; then the rate the workers
        # achieve, from the attempts' own start times over RATE_WINDOW_S.
        settled = events.mark()
        for probe_id in probes:
            events.wait(lambda e: e.type == service_pb.ATTEMPT and e.probe.probe_id == probe_id
                        and e.probe.status.last_attempt.result == spec_pb.RESULT_SUCCESS, settled)
        window = (time.time_ns(), time.time_ns() + RATE_WINDOW_S * 1_000_000_000)
        for probe_id in probes:  # a probe's attempts arrive in order: past this one, its window is complete
            events.wait(lambda e: e.type == service_pb.ATTEMPT and e.probe.probe_id == probe_id
                        and e.probe.status.last_attempt.started_at_unix_ns >= window[1], settled)
        in_window = [e.probe.probe_id for e in events.attempts(settled)
                     if window[0] <= e.probe.status.last_attempt.started_at_unix_ns < window[1]]
        rate = len(in_window) / RATE_WINDOW_S

        old = status(daemon, pod_sandbox_id=namespaces[0].name).probes[0].status.worker
        # The victim's group: every sandbox its worker serves.
        victims = {p.pod_sandbox_id for p in status(daemon).probes if p.status.worker.pid == old.pid}
        assert len(victims) == group_size
        victim_probes = {p for p, sid in probes.items() if sid in victims}
        kill_mark = events.mark()
        killed_at_ns = time.time_ns()
        dead_at = kill_and_wait(old.pid)
        running = max((events.wait(lambda e: e.type == service_pb.UPDATED and e.probe.pod_sandbox_id == victim
                                   and e.probe.status.worker.state == RUNNING and e.probe.status.worker.restarts == 1, kill_mark)
                       for victim in victims), key=lambda e: e.at)
        resumed = [events.wait(lambda e: e.type == service_pb.ATTEMPT and e.probe.probe_id == probe_id
                               and e.at > running.at, kill_mark) for probe_id in victim_probes]
        # Two seconds of the others' attempts after the kill, to look for a gap.
        after = killed_at_ns + 2_000_000_000
        others = set(probes) - victim_probes
        for probe_id in others:
            events.wait(lambda e: e.type == service_pb.ATTEMPT and e.probe.probe_id == probe_id
                        and e.probe.status.last_attempt.started_at_unix_ns > after, kill_mark)
        attempts = events.attempts()
        around = max_gaps_ms(attempts, others, (killed_at_ns - 1_000_000_000, after))
        before = max_gaps_ms(attempts, others, (killed_at_ns - 4_000_000_000, killed_at_ns - 1_000_000_000))

        restarted = [p for p in status(daemon).probes if p.pod_sandbox_id in victims]
        assert {p.status.worker.restarts for p in restarted} == {1}
        assert len({p.status.worker.pid for p in restarted}) == 1 and restarted[0].status.worker.pid not in (0, old.pid)
        assert restarted[0].status.worker.last_error == "exited with signal 9 (SIGKILL)"
        assert {p.status.worker.restarts for p in status(daemon).probes if p.pod_sandbox_id not in victims} == {0}
        assert metric(metrics_port, "probe_shim_worker_restarts_total") == 1
        assert metric(metrics_port, "probe_shim_workers") == SANDBOXES // group_size

        restart_s = running.at - dead_at
        resume_s = max(e.at for e in resumed) - dead_at
        worst_gap = max(around.values())
        report(f"worker-kill ({mode})", sandboxes=SANDBOXES, group=group_size, probes=len(probes), period_ms=PERIOD_MS,
               rate_per_s=f"{rate:.0f}", restart_s=f"{restart_s:.3f}", first_attempts_after_s=f"{resume_s:.3f}",
               others_max_gap_ms=f"{worst_gap:.0f}", others_max_gap_before_ms=f"{max(before.values()):.0f}")
        # Below the nominal 750/s only when other work starves the 2 cores; every probe still at work.
        idle = set(probes) - set(in_window)
        assert not idle, f"probes without an attempt in the window before the kill: {idle}"
        assert restart_s < RESTART_BOUND_S, f"the worker took {restart_s:.3f}s to be running again"
        late = {p: g for p, g in around.items() if g > PERIOD_MS + GAP_MARGIN_MS}
        assert not late, f"other probes missed a beat across the kill: {late}"
    finally:
        if events is not None:
            events.close()
        daemon.stop()


# --- the zygote killed ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", list(MODES))
def test_zygote_killed_its_workers_come_back_through_a_new_one_and_probing_resumes(tmp_path, make_netns, mode):
    daemon = DaemonProcess(tmp_path, MODES[mode][0]).start()
    namespaces = make_netns(4)
    server = serve_loopback(namespaces)
    events = EventLog(daemon.stub)
    try:
        probes = {run(daemon, ns, loopback_spec(server.port)): ns.name for ns in namespaces[:3]}
        for probe_id in probes:
            events.wait(lambda e: e.type == service_pb.ATTEMPT and e.probe.probe_id == probe_id
                        and e.probe.status.last_attempt.result == spec_pb.RESULT_SUCCESS)
        workers = {p.pod_sandbox_id: p.status.worker.pid for p in status(daemon).probes}
        assert len(set(workers.values())) == (1 if mode == "pooled" else 3)
        zygote = zygote_of(daemon)
        mark = events.mark()
        dead_at = kill_and_wait(zygote.pid)

        # The zygote was the workers' netns broker: they end with it and are started again by a new zygote.
        running = [events.wait(lambda e: e.type == service_pb.UPDATED and e.probe.pod_sandbox_id == sandbox
                               and e.probe.status.worker.state == RUNNING and e.probe.status.worker.restarts == 1, mark)
                   for sandbox in workers]
        resumed = [events.wait(lambda e: e.type == service_pb.ATTEMPT and e.probe.probe_id == probe_id
                               and e.at > max(r.at for r in running)
                               and e.probe.status.last_attempt.result == spec_pb.RESULT_SUCCESS, mark)
                   for probe_id in probes]
        new_zygote = zygote_of(daemon)
        assert new_zygote.pid != zygote.pid
        after = status(daemon).probes
        assert {p.status.worker.last_error for p in after} == {"exited with code 3"}  # probe_worker.main.EXIT_BROKER_GONE
        assert {psutil.Process(p.status.worker.pid).ppid() for p in after} == {new_zygote.pid}
        assert [pid for pid in workers.values() if psutil.pid_exists(pid)] == []  # reaped, no zombie left

        # The next new sandbox gets a worker from the new zygote.
        asked = time.monotonic()
        new_probe = run(daemon, namespaces[3], loopback_spec(server.port))
        answered = time.monotonic()
        first = events.wait(lambda e: e.type == service_pb.ATTEMPT and e.probe.probe_id == new_probe
                            and e.probe.status.last_attempt.result == spec_pb.RESULT_SUCCESS, mark)
        assert psutil.Process(first.probe.status.worker.pid).ppid() == new_zygote.pid
        report(f"zygote-kill ({mode})", workers=len(set(workers.values())),
               probing_again_after_s=f"{max(e.at for e in resumed) - dead_at:.3f}",
               new_sandbox_run_probe_s=f"{answered - asked:.3f}", new_sandbox_first_attempt_s=f"{first.at - asked:.3f}")
        assert "zygote exited with signal 9 (SIGKILL)" in daemon.logs()
    finally:
        events.close()
        assert daemon.stop() == 0
