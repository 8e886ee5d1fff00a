"""Faults: the daemon killed with SIGKILL while 1000 RunProbe calls are in flight from 4 clients: every call answered
OK is registered after the restart, and an open watch resyncs through the new instance id.
Helpers: tests/support/fault_harness.py; `make_netns`: tests/hardening/conftest.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import grpc
import pytest

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_service_pb2_grpc as service_grpc
from cri_proto import probe_spec_pb2 as spec_pb
from probectl.client import ProbeShimClient
from tests.support.daemon_env import DaemonProcess, status
from tests.support.fault_harness import WAIT_S, loopback_spec, report, serve_loopback

pytestmark = pytest.mark.netns


# --- the daemon killed with RunProbe calls in flight --------------------------------------------------------

class WatchLog:
    """probectl's resumable watch (what probectl watch uses), followed by a thread."""

    def __init__(self, endpoint: str) -> None:
        self.client = ProbeShimClient(endpoint)
        self.events: list[tuple[float, service_pb.WatchProbeStatusResponse]] = []
        self.reconnects: list[str] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, name="watch log", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        watch = self.client.watch(on_reconnect=lambda error, delay: self.reconnects.append(str(error)))
        for event in watch:
            with self._cond:
                self.events.append((time.monotonic(), event))
                self._cond.notify_all()

    def wait(self, predicate: Callable[[service_pb.WatchProbeStatusResponse], bool], timeout: float = WAIT_S):
        deadline = time.monotonic() + timeout
        with self._cond:
            index = 0
            while True:
                while index < len(self.events):
                    if predicate(self.events[index][1]):
                        return index, self.events[index][0]
                    index += 1
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"no such watch event within {timeout}s"
                self._cond.wait(remaining)

    def wait_for_view(self, wanted: set[str], after: float, timeout: float = WAIT_S) -> tuple[float, bool]:
        """Waits until the probes the watcher sees (snapshots and changes applied in order, as a client keeps its
        view) are `wanted`, on events received after `after`; returns when, and whether a full state came."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                view: set[str] = set()
                pending: set[str] | None = None
                resynced = False
                for at, event in self.events:
                    if event.type == service_pb.SNAPSHOT:
                        pending = (pending or set()) | {event.probe.probe_id}
                        resynced = resynced or at > after
                    elif event.type == service_pb.SNAPSHOT_COMPLETE:
                        view, pending = pending or set(), None
                        resynced = resynced or at > after
                    elif event.type == service_pb.UPDATED:
                        view.add(event.probe.probe_id)
                    elif event.type == service_pb.REMOVED:
                        view.discard(event.probe.probe_id)
                if self.events and self.events[-1][0] > after and view == wanted and pending is None:
                    return self.events[-1][0], resynced
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"the watcher's view is not the stored probes within {timeout}s"
                self._cond.wait(remaining)

    def close(self) -> None:
        self.client.close()
        self._thread.join(timeout=10)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_daemon_killed_with_1000_run_probe_calls_in_flight_keeps_every_acknowledged_probe(tmp_path, make_netns):
    clients, calls, sandboxes = 4, 1000, 20  # 50 probes per sandbox (max_probes_per_sandbox is 64)
    kill_after_ok = 300
    namespaces = make_netns(sandboxes)
    server = serve_loopback(namespaces)
    daemon = DaemonProcess(tmp_path).start()
    watch = WatchLog(f"unix://{daemon.socket_path}")
    channels = [grpc.insecure_channel(f"unix://{daemon.socket_path}", options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(clients)]
    restarted = None
    try:
        _, _ = watch.wait(lambda e: e.type == service_pb.SNAPSHOT_COMPLETE)
        old_instance = daemon.stub.ShimVersion(service_pb.ShimVersionRequest(), timeout=10).instance_id
        ok: dict[str, str] = {}  # container -> probe id, for every call answered OK
        failed: dict[str, grpc.StatusCode] = {}
        lock, enough = threading.Lock(), threading.Event()

        def done(container: str, future: grpc.Future) -> None:
            with lock:
                error = future.exception()
                if error is None:
                    ok[container] = future.result().probe_id
                    if len(ok) >= kill_after_ok:
                        enough.set()
                else:
                    failed[container] = error.code()

        futures = []
        for i in range(calls):
            ns = namespaces[i % sandboxes]
            request = service_pb.RunProbeRequest(
                pod_sandbox_id=ns.name, container_name=f"c{i}", type=spec_pb.READINESS,
                spec=loopback_spec(server.port, period_ms=60_000))
            future = service_grpc.ProbeServiceStub(channels[i % clients]).RunProbe.future(request, timeout=120)
            future.add_done_callback(lambda f, c=f"c{i}": done(c, f))
            futures.append(future)
        assert enough.wait(WAIT_S * 4), f"only {len(ok)} RunProbe calls answered OK"
        daemon.proc.kill()
        killed_at = time.monotonic()
        daemon.proc.wait()
        for future in futures:
            try:
                future.result(timeout=WAIT_S)
            except grpc.RpcError:
                pass
        with lock:
            acknowledged = dict(ok)
            codes = sorted({code.name for code in failed.values()})
        assert len(acknowledged) + len(failed) == calls
        daemon.stop()

        restarted = DaemonProcess(tmp_path).start()
        up_at = time.monotonic()  # start() returns once the new daemon answers its health check
        stored = {p.probe_id for p in status(restarted).probes}
        listed = sum(s.probes for s in restarted.stub.ListProbeSandboxes(
            service_pb.ListProbeSandboxesRequest(), timeout=10).sandboxes)
        missing = set(acknowledged.values()) - stored
        new_instance = restarted.stub.ShimVersion(service_pb.ShimVersionRequest(), timeout=10).instance_id

        # The open watch comes back by itself, on the same board (its instance id survives): it resumes from its
        # last revision if the store had it, else (a registration the kill caught before its revision was stored)
        # it gets the full state. Either way its view ends up being exactly the stored probes.
        resynced_at, resynced = watch.wait_for_view(stored, after=killed_at)
        report("daemon-kill", clients=clients, calls=calls, ok_before_kill=len(acknowledged),
               failed=len(failed), failure_codes="/".join(codes), stored_after_restart=len(stored),
               acknowledged_missing=len(missing), stored_not_acknowledged=len(stored - set(acknowledged.values())),
               new_daemon_answering_after_kill_s=f"{up_at - killed_at:.2f}",
               watch_caught_up_after_kill_s=f"{resynced_at - killed_at:.2f}", watch_full_state=resynced,
               watch_reopens=len(watch.reconnects))
        assert not missing, f"{len(missing)} acknowledged probes lost: {sorted(missing)[:5]}"
        assert listed == len(stored)
        assert new_instance == old_instance
    finally:
        watch.close()
        for channel in channels:
            channel.close()
        if restarted is not None:
            restarted.stop()
        daemon.stop()
