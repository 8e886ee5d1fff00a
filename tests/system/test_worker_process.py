"""A real worker process in a real netns: start-up, least privilege and the probe lifecycle.

TCP probes against a listener inside the netns drive the lifecycle; every wait is
on an event from the worker, never a sleep.
"""

from __future__ import annotations

import os
import socket
import tempfile

import pytest

from cri_proto import probe_spec_pb2 as spec_pb
from cri_proto import probe_worker_pb2 as worker_pb
from tests.support.netns_env import listen
from tests.support.worker_harness import Rejected, WorkerFailed

pytestmark = pytest.mark.netns

def tcp_spec(port, **timing):
    timing.setdefault("period_ms", 50)
    timing.setdefault("timeout_ms", 500)
    return spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=port)), **timing)


def registration(probe_id, spec, probe_type=spec_pb.READINESS, container="c1"):
    return worker_pb.ProbeRegistration(
        probe_id=probe_id, type=probe_type, spec=spec, start_now=True,
        container=worker_pb.ContainerRef(id=container, name="app"),
    )


def proc_status(pid):
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def wait_state(worker, probe_id, state, limit=200):
    """Consumes events until probe_id's thresholded state becomes `state`; returns the events seen."""
    seen = []
    for _ in range(limit):
        event = worker.next_event()
        seen.append(event)
        if event.WhichOneof("msg") == "state_change" and event.state_change.probe_id == probe_id \
                and event.state_change.state == state:
            return seen
    raise AssertionError(f"{probe_id} never reached {spec_pb.ProbeState.Name(state)}")


# --- start-up and least privilege -------------------------------------------------

def test_worker_sits_in_an_empty_netns_of_its_own_and_drops_everything(pod_netns, worker):
    pid = worker.proc.pid
    assert worker.ready.pid == pid
    own = os.stat(f"/proc/{pid}/ns/net").st_ino
    assert worker.ready.netns_inode == own
    assert own not in (os.stat(pod_netns.path).st_ino, os.stat("/proc/self/ns/net").st_ino)
    assert worker.netns_inode == os.stat(pod_netns.path).st_ino, "the broker holds the pod's netns for it"
    with open(f"/proc/{pid}/net/dev") as f:  # the interfaces of the worker's own netns
        assert [line.split(":")[0].strip() for line in f.readlines()[2:]] == ["lo"]
    status = proc_status(pid)
    assert status["Uid"].split() == ["65534"] * 4
    assert status["Gid"].split() == ["65534"] * 4
    assert status["Groups"].strip() == ""
    assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0
    assert status["NoNewPrivs"].strip() == "1"
    assert status["Threads"].strip() == "1"
    with open(f"/proc/{pid}/limits") as f:
        limits = {line[:26].strip(): line[26:].split() for line in f}
    assert limits["Max address space"][0] == str(256 << 20)
    assert limits["Max open files"][0] == "1024"


def test_worker_uses_the_configured_ids(pod_netns, make_worker):
    worker = make_worker(pod_netns.path, run_as_uid=4242, run_as_gid=4343)
    assert (worker.ready.uid, worker.ready.gid) == (4242, 4343)


def test_pod_ips_are_discovered_in_the_netns_when_not_given(pod_netns, make_worker):
    worker = make_worker(pod_netns.path)
    assert worker.pod_ips == [pod_netns.ipv4, pod_netns.ipv6]  # the broker's rtnetlink dump, in the pod's netns


def test_missing_netns_is_a_clear_error_and_is_not_created(make_worker):
    missing = "/var/run/netns/cps-does-not-exist"
    with pytest.raises(WorkerFailed, match=f"cannot open network namespace {missing}: No such file"):
        make_worker(missing)
    assert not os.path.exists(missing)


def test_a_file_that_is_not_a_netns_is_refused(make_worker):
    with tempfile.NamedTemporaryFile() as f:
        with pytest.raises(WorkerFailed, match="not a network namespace"):
            make_worker(f.name)


def test_proc_pid_ns_net_path_is_accepted(pod_netns, make_worker):
    holder = listen(pod_netns)  # a process living in the netns
    worker = make_worker(f"/proc/{holder.proc.pid}/ns/net")
    # `ip netns exec` execs the command, so the pid is the listener's own.
    assert worker.netns_inode == os.stat(pod_netns.path).st_ino


def test_worker_exits_when_the_daemon_goes_away(pod_netns, make_worker):
    worker = make_worker(pod_netns.path)
    worker.channel.close()
    assert worker.proc.wait(timeout=10) == 0


def test_heartbeats_are_sent_unasked(pod_netns, make_worker):
    worker = make_worker(pod_netns.path, heartbeat_interval_ms=20)
    beats = [worker.next_event(kinds=("heartbeat",)) for _ in range(3)]
    assert all(b.heartbeat.unix_ns > 0 and b.seq == 0 for b in beats)
    answer = worker.request(heartbeat=worker_pb.Heartbeat())
    assert answer.WhichOneof("msg") == "heartbeat"


# --- requests ---------------------------------------------------------------------

def test_what_the_worker_cannot_route_is_rejected_with_the_field_path(worker):
    # Its own rules, the only ones it applies: the spec was validated at the daemon's API edge (worker_protocol.py).
    with pytest.raises(Rejected) as err:
        worker.run_once(tcp_spec(80), sandbox_id="elsewhere")
    assert err.value.errors == ["probe.sandbox_id: Not found: 'elsewhere': not a sandbox this worker serves"]
    with pytest.raises(Rejected, match="probe.probe_id: Required value"):
        worker.add(registration("", tcp_spec(80)))


def test_named_port_resolution_and_unknown_result(pod_netns, worker):
    server = listen(pod_netns)
    ports = (spec_pb.ContainerPort(name="probe", container_port=server.port),)
    named = spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(name="probe")))
    assert worker.run_once(named, container_ports=ports).result == spec_pb.RESULT_SUCCESS
    missing = spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(name="nope")))
    attempt = worker.run_once(missing, container_ports=ports)
    assert attempt.result == spec_pb.RESULT_UNKNOWN and "nope" in attempt.output


def test_loopback_in_the_pod_is_the_pods_not_the_nodes(pod_netns, worker):
    server = listen(pod_netns, host="127.0.0.1")
    spec = tcp_spec(server.port, target=spec_pb.LOOPBACK)
    attempt = worker.run_once(spec)
    assert attempt.result == spec_pb.RESULT_SUCCESS
    assert attempt.address == f"127.0.0.1:{server.port}"
    # The same port on the host's loopback is not that server.
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", server.port)) != 0
    # And the pod IP does not reach a server bound to the pod's loopback.
    attempt = worker.run_once(tcp_spec(server.port))
    assert attempt.result == spec_pb.RESULT_FAILURE
    assert attempt.output == f"dial tcp {pod_netns.ipv4}:{server.port}: connect: connection refused"


def test_any_family_races_past_an_unreachable_primary(pod_netns, make_worker):
    # 198.18.0.77 is on the veth's subnet but nobody answers ARP for it: a connect
    # there hangs, so only the Happy Eyeballs race reaches the IPv6 address in time.
    server = listen(pod_netns, host="::")
    worker = make_worker(pod_netns.path, pod_ips=["198.18.0.77", pod_netns.ipv6])
    attempt = worker.run_once(tcp_spec(server.port, timeout_ms=2000, ip_family=spec_pb.ANY))
    assert attempt.result == spec_pb.RESULT_SUCCESS
    assert attempt.address == f"[{pod_netns.ipv6}]:{server.port}"
    primary_only = worker.run_once(tcp_spec(server.port, timeout_ms=300))
    assert primary_only.result == spec_pb.RESULT_FAILURE
    assert primary_only.output == f"dial tcp 198.18.0.77:{server.port}: i/o timeout"


# --- the probe lifecycle ----------------------------------------------------------

def test_readiness_follows_thresholds_up_and_down(pod_netns, worker):
    server = listen(pod_netns, port=0)
    worker.add(registration("ready", tcp_spec(server.port, success_threshold=2, failure_threshold=2)))
    first = worker.next_event()
    assert first.state_change.state == spec_pb.STATE_FAILURE  # readiness starts not ready
    seen = wait_state(worker, "ready", spec_pb.STATE_SUCCESS)
    attempts = [e.attempt for e in seen if e.WhichOneof("msg") == "attempt"]
    assert [a.status.consecutive_successes for a in attempts[:2]] == [1, 2]
    port = server.port
    server.stop()
    seen = wait_state(worker, "ready", spec_pb.STATE_FAILURE)
    failures = [e.attempt for e in seen if e.WhichOneof("msg") == "attempt"]
    assert failures[-1].status.consecutive_failures == 2
    assert failures[-1].status.last_attempt.output.endswith(f"{port}: connect: connection refused")


def test_removed_probe_stops_reporting(pod_netns, worker):
    server = listen(pod_netns)
    worker.add(registration("gone", tcp_spec(server.port)))
    worker.next_event(kinds=("attempt",))
    worker.remove("gone")
    marker = worker.request(heartbeat=worker_pb.Heartbeat())  # everything before this is flushed
    assert marker.WhichOneof("msg") == "heartbeat"
    worker.backlog.clear()
    worker.add(registration("other", tcp_spec(server.port)))
    for _ in range(5):
        event = worker.next_event()
        probe_id = event.attempt.probe_id or event.state_change.probe_id
        assert probe_id == "other"


def test_startup_gates_liveness_until_it_succeeds(pod_netns, worker):
    port_holder = listen(pod_netns)
    port = port_holder.port
    port_holder.stop()  # startup fails until something listens again
    worker.add(registration("startup", tcp_spec(port, failure_threshold=1000), spec_pb.STARTUP))
    worker.add(registration("live", tcp_spec(port), spec_pb.LIVENESS))
    # The liveness probe must not run while startup has not succeeded.
    for _ in range(5):
        event = worker.next_event()
        assert (event.attempt.probe_id or event.state_change.probe_id) in ("startup", "live")
        if event.WhichOneof("msg") == "attempt":
            assert event.attempt.probe_id == "startup"
    listen(pod_netns, port=port)
    wait_state(worker, "startup", spec_pb.STATE_SUCCESS)
    live = worker.next_event(kinds=("attempt",))
    while live.attempt.probe_id != "live":
        live = worker.next_event(kinds=("attempt",))
    assert live.attempt.status.last_attempt.result == spec_pb.RESULT_SUCCESS


def test_liveness_holds_after_failure_until_a_new_container(pod_netns, worker):
    holder = listen(pod_netns)
    port = holder.port
    holder.stop()
    worker.add(registration("live", tcp_spec(port, failure_threshold=1), spec_pb.LIVENESS, container="c1"))
    seen = wait_state(worker, "live", spec_pb.STATE_FAILURE)
    assert [e.attempt.status.on_hold for e in seen if e.WhichOneof("msg") == "attempt"][-1]
    # On hold: no further attempts. Two unsolicited heartbeats (1 s apart, 20 periods)
    # bound the time waited by events, not by a sleep.
    worker.backlog.clear()
    for _ in range(2):
        worker.next_event(kinds=("heartbeat",))
    assert [e for e in worker.backlog if e.WhichOneof("msg") == "attempt"] == []
    listen(pod_netns, port=port)
    worker.add(registration("live", tcp_spec(port, failure_threshold=1), spec_pb.LIVENESS, container="c2"))
    # A new container resets liveness to its initial state at once, and probing resumes.
    reset = worker.next_event()
    assert (reset.state_change.previous, reset.state_change.state) == (spec_pb.STATE_FAILURE, spec_pb.STATE_SUCCESS)
    assert reset.state_change.output == "registered"
    resumed = worker.next_event(kinds=("attempt",))
    assert resumed.attempt.status.last_attempt.result == spec_pb.RESULT_SUCCESS and not resumed.attempt.status.on_hold
