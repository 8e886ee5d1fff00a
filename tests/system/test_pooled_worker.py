"""One unprivileged worker serving several sandboxes, through sockets the netns broker makes in each one's netns.

Real network namespaces (two "pods" with the same pod IP, as overlapping pod networks have), a real worker process
(`python -m probe_worker`) and the real broker (probe_zygote/netns_broker.py, served in a thread by tests/support/worker_harness.py,
or called directly). Which netns a socket lives in is read from the kernel (ioctl SIOCGSKNS), not inferred.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
import struct

import pytest

from cri_proto import probe_spec_pb2 as spec_pb
from cri_proto import probe_worker_pb2 as worker_pb
from probe_worker.socket_source import BATCH, BrokerSockets, BrokerUnavailable
from probe_zygote.netns_broker import BrokerError, NetnsBroker
from tests.support.netns_env import PodNetns, listen
from tests.support.worker_harness import Rejected, ThreadBroker

pytestmark = pytest.mark.netns

SIOCGSKNS = 0x894C  # linux/sockios.h: an fd of the network namespace a socket belongs to


def netns_inode_of(sock: socket.socket) -> int:
    fd = fcntl.ioctl(sock.fileno(), SIOCGSKNS)
    try:
        return os.fstat(fd).st_ino
    finally:
        os.close(fd)


def tcp_spec(port: int, target: int = spec_pb.POD_IP, period_ms: int = 50) -> spec_pb.ProbeSpec:
    return spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=port)), target=target,
                             period_ms=period_ms, timeout_ms=500)


@pytest.fixture
def second_netns():
    ns = PodNetns.create()  # the same pod IPs as pod_netns: two pods of overlapping networks
    try:
        yield ns
    finally:
        ns.destroy()


def listen_elsewhere(ns: PodNetns, host: str, taken: int):
    """A listener in ns on a port other than `taken` (ports are per netns: the same number may come up)."""
    while True:
        server = listen(ns, host=host)
        if server.port != taken:
            return server
        server.stop()


# --- the worker -------------------------------------------------------------------------------------------

def test_one_worker_reaches_each_sandboxs_own_loopback_and_nothing_of_the_other(pod_netns, second_netns, worker):
    worker.add_sandbox("second", second_netns.path, second_netns.pod_ips)
    first_server = listen(pod_netns, host="127.0.0.1")
    second_server = listen_elsewhere(second_netns, "127.0.0.1", first_server.port)
    for port, serving, other in ((first_server.port, worker.sandbox_id, "second"),
                                 (second_server.port, "second", worker.sandbox_id)):
        reached = worker.run_once(tcp_spec(port, spec_pb.LOOPBACK), sandbox_id=serving)
        assert (reached.result, reached.address) == (spec_pb.RESULT_SUCCESS, f"127.0.0.1:{port}")
        refused = worker.run_once(tcp_spec(port, spec_pb.LOOPBACK), sandbox_id=other)
        assert refused.result == spec_pb.RESULT_FAILURE
        assert refused.output == f"dial tcp 127.0.0.1:{port}: connect: connection refused"


def test_the_same_pod_ip_in_two_sandboxes_is_two_pods(pod_netns, second_netns, worker):
    assert pod_netns.ipv4 == second_netns.ipv4
    worker.add_sandbox("second", second_netns.path, second_netns.pod_ips)
    server = listen(pod_netns)  # every address of the first pod only
    worker.add(worker_pb.ProbeRegistration(probe_id="first", type=spec_pb.READINESS, spec=tcp_spec(server.port),
                                           start_now=True, container=worker_pb.ContainerRef(id="c1", name="app")))
    worker.add(worker_pb.ProbeRegistration(probe_id="second", sandbox_id="second", type=spec_pb.READINESS,
                                           spec=tcp_spec(server.port), start_now=True,
                                           container=worker_pb.ContainerRef(id="c2", name="app")))
    seen: dict[str, worker_pb.AttemptReport] = {}
    while len(seen) < 2:
        event = worker.next_event(kinds=("attempt",))
        seen.setdefault(event.attempt.probe_id, event.attempt)
    # Every event names its sandbox: the daemon routes a group's events by it.
    assert (seen["first"].sandbox_id, seen["second"].sandbox_id) == (worker.sandbox_id, "second")
    assert seen["first"].status.last_attempt.result == spec_pb.RESULT_SUCCESS
    assert seen["second"].status.last_attempt.result == spec_pb.RESULT_FAILURE
    address = f"{pod_netns.ipv4}:{server.port}"
    assert seen["first"].status.last_attempt.address == address
    assert seen["second"].status.last_attempt.output == f"dial tcp {address}: connect: connection refused"


def test_a_removed_sandbox_takes_its_probes_along_and_is_then_unknown(pod_netns, second_netns, worker):
    worker.add_sandbox("second", second_netns.path, second_netns.pod_ips)
    for probe_id, sandbox_id in (("first", worker.sandbox_id), ("second", "second")):
        worker.add(worker_pb.ProbeRegistration(probe_id=probe_id, sandbox_id=sandbox_id, type=spec_pb.READINESS,
                                               spec=tcp_spec(1, period_ms=60_000), start_now=True,
                                               container=worker_pb.ContainerRef(id="c", name="app")))
    assert worker.request(heartbeat=worker_pb.Heartbeat()).heartbeat.probes == 2
    worker.remove_sandbox("second")
    assert worker.request(heartbeat=worker_pb.Heartbeat()).heartbeat.probes == 1
    with pytest.raises(Rejected, match="probe.sandbox_id: Not found: 'second'"):
        worker.run_once(tcp_spec(1), sandbox_id="second")


def test_a_sandbox_the_broker_did_not_assign_gets_no_socket(pod_netns, worker):
    # Added at the worker, never assigned at the broker: what a worker asking for another's sandbox would get.
    worker.request(add_sandbox=worker_pb.AddSandbox(sandbox_id="rogue", pod_ips=[pod_netns.ipv4]))
    attempt = worker.run_once(tcp_spec(80), sandbox_id="rogue")
    assert attempt.result == spec_pb.RESULT_FAILURE
    assert attempt.output == f"dial tcp {pod_netns.ipv4}:80: sandbox 'rogue' is not assigned to this worker"
    assert worker.run_once(tcp_spec(1)).output.endswith("connect: connection refused")  # its own still work


# --- the broker ----------------------------------------------------------------------------------------------

class BrokerUnderTest:
    """NetnsBroker called directly: worker ids stand for pids, each with its channel's worker end."""

    def __init__(self) -> None:
        self.broker = NetnsBroker()
        self.ends: dict[int, socket.socket] = {}

    def attach(self, worker_id: int) -> None:
        ours, theirs = self.broker.channel_pair()
        self.broker.attach(worker_id, ours)
        self.ends[worker_id] = theirs

    def ask(self, worker_id: int, sandbox_id: str, family: int = socket.AF_INET,
            count: int = 2) -> tuple[worker_pb.SocketReply, list[socket.socket]]:
        end = self.ends[worker_id]
        end.send(worker_pb.SocketRequest(seq=7, sandbox_id=sandbox_id, family=family, count=count).SerializeToString())
        assert self.broker.serve_channel(worker_id)
        data, fds, _, _ = socket.recv_fds(end, 4096, 32)
        return worker_pb.SocketReply.FromString(data), [socket.socket(fileno=fd) for fd in fds]

    def close(self) -> None:
        self.broker.close()
        for end in self.ends.values():
            end.close()


@pytest.fixture
def broker():
    b = BrokerUnderTest()
    try:
        yield b
    finally:
        b.close()


def test_the_broker_makes_probe_sockets_inside_the_assigned_netns(pod_netns, broker):
    home = os.stat("/proc/thread-self/ns/net").st_ino
    broker.attach(1)
    inode, _ = broker.broker.assign(1, "a", pod_netns.path)
    assert inode == os.stat(pod_netns.path).st_ino
    for family in (socket.AF_INET, socket.AF_INET6):
        reply, sockets = broker.ask(1, "a", family, count=4)
        assert (reply.seq, reply.count, reply.error, len(sockets)) == (7, 4, "", 4)
        for sock in sockets:
            with sock:
                assert netns_inode_of(sock) == inode
                assert (sock.family, sock.type) == (family, socket.SOCK_STREAM)
                assert fcntl.fcntl(sock.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK
                # RST on close, no TIME_WAIT (connect.py's options, the kubelet's reason)
                assert struct.unpack("ii", sock.getsockopt(socket.SOL_SOCKET, socket.SO_LINGER, 8)) == (1, 0)
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    assert os.stat("/proc/thread-self/ns/net").st_ino == home  # the broker's thread came back home


def test_the_broker_refuses_a_sandbox_assigned_to_another_worker_or_to_none(pod_netns, second_netns, broker):
    broker.attach(1)
    broker.attach(2)
    broker.broker.assign(1, "a", pod_netns.path)
    broker.broker.assign(2, "b", second_netns.path)
    for worker_id, sandbox_id in ((1, "b"), (2, "a"), (1, "nowhere")):
        reply, sockets = broker.ask(worker_id, sandbox_id)
        assert (reply.error, reply.count, sockets) == (f"sandbox {sandbox_id!r} is not assigned to this worker", 0, [])
    broker.broker.unassign(1, "a")
    assert broker.ask(1, "a")[0].error == "sandbox 'a' is not assigned to this worker"
    reply, sockets = broker.ask(2, "b")
    assert reply.error == "" and len(sockets) == 2 and netns_inode_of(sockets[0]) == os.stat(second_netns.path).st_ino
    for sock in sockets:
        sock.close()


def test_the_broker_never_makes_a_socket_in_the_nodes_own_netns_whatever_it_is_asked(pod_netns, broker, tmp_path):
    # Defence in depth: the daemon refuses hostNetwork sandboxes first; the broker, which holds the privilege,
    # refuses the node's namespace however it is named (its own, through /proc, through a bind mount or link).
    broker.attach(1)
    node_paths = ["/proc/self/ns/net", "/proc/thread-self/ns/net", f"/proc/{os.getpid()}/ns/net"]
    (tmp_path / "host").symlink_to("/proc/self/ns/net")
    node_paths.append(str(tmp_path / "host"))
    for path in node_paths:
        with pytest.raises(BrokerError, match=f"^{path} is the node's own network namespace: no probe socket"):
            broker.broker.assign(1, "node", path)
    assert broker.broker.assigned(1) == []
    assert broker.ask(1, "node")[0].error == "sandbox 'node' is not assigned to this worker"
    broker.broker.assign(1, "pod", pod_netns.path)  # a pod's namespace still is
    reply, sockets = broker.ask(1, "pod")
    assert reply.error == "" and len(sockets) == 2
    for sock in sockets:
        sock.close()


@pytest.mark.parametrize(("family", "count", "error"), [
    (socket.AF_UNIX, 1, "family: Unsupported value: 1: supported values: 2, 10"),
    (socket.AF_INET, 0, "count: Invalid value: 0: must be between 1 and 16, inclusive"),
    (socket.AF_INET, 17, "count: Invalid value: 17: must be between 1 and 16, inclusive"),
])
def test_the_broker_answers_a_malformed_request_with_the_field(pod_netns, broker, family, count, error):
    broker.attach(1)
    broker.broker.assign(1, "a", pod_netns.path)
    assert broker.ask(1, "a", family, count) == (worker_pb.SocketReply(seq=7, error=error), [])


def test_a_worker_that_speaks_nonsense_loses_its_broker(pod_netns, broker):
    broker.attach(1)
    broker.broker.assign(1, "a", pod_netns.path)
    broker.ends[1].send(b"\xff\xff\xff")
    assert broker.broker.serve_channel(1) is False
    assert broker.ends[1].recv(16) == b""  # closed: the worker ends and is started again
    assert broker.broker.assigned(1) == []


def test_an_assignment_names_what_is_wrong_and_keeps_nothing(tmp_path, broker):
    broker.attach(1)
    with pytest.raises(BrokerError, match="cannot open network namespace /nonexistent/ns: No such file"):
        broker.broker.assign(1, "a", "/nonexistent/ns")
    regular = tmp_path / "not-a-netns"
    regular.write_text("")
    with pytest.raises(BrokerError, match=r"setns\(.*not-a-netns\) failed: Invalid argument \(not a network "):
        broker.broker.assign(1, "a", str(regular))
    with pytest.raises(BrokerError, match="no worker 2 here"):
        broker.broker.assign(2, "a", str(regular))
    assert broker.broker.assigned(1) == []


# --- the worker's side of the broker channel ------------------------------------------------------------------

def test_concurrent_takes_beyond_a_batch_are_all_served_in_the_sandboxs_netns(pod_netns):
    # More takes at once than a batch holds: the pool is refilled again and again, each waiter gets its own socket
    # (a finished refill once made take() spin without yielding to the loop: this would hang).
    broker = ThreadBroker()
    broker.attach(1)
    broker.assign("a", pod_netns.path, find_pod_ips=False)
    lost: list[str] = []

    async def main() -> None:
        sockets = BrokerSockets(broker.theirs, lost.append)
        try:
            taken = await asyncio.wait_for(
                asyncio.gather(*(sockets.take("a", socket.AF_INET) for _ in range(3 * BATCH + 1))), 10)
            assert len({s.fileno() for s in taken}) == 3 * BATCH + 1
            assert {netns_inode_of(s) for s in taken} == {os.stat(pod_netns.path).st_ino}
            for sock in taken:
                sock.close()
            with pytest.raises(BrokerUnavailable, match="^sandbox 'b' is not assigned to this worker$"):
                await sockets.take("b", socket.AF_INET)
            assert sockets.lost == "" and lost == []  # a refusal is not a lost broker
            broker.detach()  # the broker goes away: the next refill finds the channel closed
            with pytest.raises(BrokerUnavailable, match="the netns broker is gone"):
                while True:
                    (await sockets.take("a", socket.AF_INET)).close()
            # EOF, or a reset when a request of ours was left unread in the closed end
            assert lost in (["the broker closed its end"], ["broker channel: Connection reset by peer"])
        finally:
            sockets.close()

    try:
        asyncio.run(main())
    finally:
        broker.close()


def test_a_pooled_socket_is_what_the_broker_made_in_pythons_view_too(pod_netns):
    # The worker wraps the passed descriptors without asking the kernel: its view must be the kernel's.
    broker = ThreadBroker()
    broker.attach(1)
    broker.assign("a", pod_netns.path, find_pod_ips=False)

    async def main() -> None:
        sockets = BrokerSockets(broker.theirs)
        try:
            for family in (socket.AF_INET, socket.AF_INET6):
                sock = await asyncio.wait_for(sockets.take("a", family), 10)
                with sock:
                    assert (sock.family, sock.type, sock.gettimeout()) == (family, socket.SOCK_STREAM, 0.0)
                    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_DOMAIN) == family
                    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_PROTOCOL) == sock.proto
                    assert os.get_blocking(sock.fileno()) is False
        finally:
            sockets.close()

    try:
        asyncio.run(main())
    finally:
        broker.close()


def test_a_host_name_is_read_from_the_nodes_hosts_file_and_dns_is_out_of_reach(pod_netns, worker):
    # The (gated) host field: a worker has no network of its own, so only /etc/hosts can answer a lookup.
    server = listen(pod_netns, host="127.0.0.1")
    spec = tcp_spec(server.port)
    spec.tcp_socket.host = "localhost"
    spec.ip_family = spec_pb.IPV4
    attempt = worker.run_once(spec)
    assert (attempt.result, attempt.address) == (spec_pb.RESULT_SUCCESS, f"127.0.0.1:{server.port}")
    spec.tcp_socket.host = "probe-target.invalid"
    attempt = worker.run_once(spec)
    assert attempt.result == spec_pb.RESULT_FAILURE
    assert attempt.output.startswith("dial tcp: lookup probe-target.invalid: ")


def test_a_workers_sandboxes_tick_together_each_probe_once_a_period(pod_netns, second_netns, worker):
    # One wake-up for all of a worker's probes of a period (probe_worker/scheduling.py): their ticks share a grid.
    worker.add_sandbox("second", second_netns.path, second_netns.pod_ips)
    period_ms = 200
    for probe_id, sandbox_id in (("first", worker.sandbox_id), ("second", "second")):
        worker.add(worker_pb.ProbeRegistration(probe_id=probe_id, sandbox_id=sandbox_id, type=spec_pb.READINESS,
                                               spec=tcp_spec(1, period_ms=period_ms),
                                               container=worker_pb.ContainerRef(id="c", name="app")))
    due: dict[str, list[int]] = {"first": [], "second": []}
    while min(len(v) for v in due.values()) < 3:
        report = worker.next_event(kinds=("attempt",)).attempt
        due[report.probe_id].append(report.status.last_attempt.scheduled_at_unix_ns)
    # Due times are reported on the wall clock, converted from the loop's clock once per tick by two clock reads back
    # to back: a preemption between them moves one by as long as the worker was off the CPU (seen in a full run: 201
    # and 199 ms). skew_ms is five times that, for a loaded CI run; two separate grids would be 0 to 200 ms apart.
    skew_ms = 10
    for ticks in due.values():  # each probe once a period, on its grid
        assert all(abs((b - a) / 1e6 - period_ms) <= skew_ms for a, b in zip(ticks, ticks[1:])), ticks
    offset_ms = (due["second"][0] - due["first"][0]) / 1e6
    assert abs(offset_ms - period_ms * round(offset_ms / period_ms)) <= skew_ms  # the same grid: whole periods apart

