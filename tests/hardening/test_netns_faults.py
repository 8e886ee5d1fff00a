"""Faults: a sandbox's netns deleted under its running worker (the worker stops and says why), or replaced under the
same name (a new sandbox). Helpers: tests/support/fault_harness.py; `make_netns`: tests/hardening/conftest.py.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time

import pytest

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from tests.support.daemon_env import DaemonProcess, run, status
from tests.support.fault_harness import NONE, RUNNING, EventLog, Pidfd, loopback_spec, report
from tests.support.netns_env import PodNetns, listen

pytestmark = pytest.mark.netns


# --- a sandbox's netns deleted under its worker -----------------------------------------------------------

@contextlib.contextmanager
def probing_daemon(tmp_path, ns: PodNetns, port: int):
    """A daemon (reconciling every 0.5 s) with one loopback probe in ns, yielded once that probe has succeeded:
    (daemon, its EventLog, the successful attempt). Stops both on exit."""
    daemon = DaemonProcess(tmp_path, ["--reconcile-interval", "0.5"]).start()
    events = EventLog(daemon.stub)
    try:
        probe_id = run(daemon, ns, loopback_spec(port))
        yield daemon, events, events.wait(lambda e: e.type == service_pb.ATTEMPT and e.probe.probe_id == probe_id
                                          and e.probe.status.last_attempt.result == spec_pb.RESULT_SUCCESS)
    finally:
        events.close()
        daemon.stop()


def test_netns_deleted_under_a_running_worker_stops_it_and_says_why(tmp_path, make_netns):
    (ns,) = make_netns(1)
    server = listen(ns, host="127.0.0.1")  # it keeps the namespace alive after its name is deleted
    with probing_daemon(tmp_path, ns, server.port) as (daemon, events, probed):
        probe_id = probed.probe.probe_id
        worker = Pidfd(probed.probe.status.worker.pid)
        mark = events.mark()
        deleted_at = time.monotonic()
        subprocess.run(["ip", "netns", "del", ns.name], check=True)
        why = events.wait(lambda e: e.type == service_pb.UPDATED and e.probe.probe_id == probe_id
                          and e.probe.status.worker.last_error.startswith("sandbox gone"), mark)
        removed = events.wait(lambda e: e.type == service_pb.REMOVED and e.probe.probe_id == probe_id, mark)
        stopped_at = worker.wait()
        in_between = [e for e in events.attempts(mark) if e.probe.probe_id == probe_id and e.at < why.at]
        report("netns-deleted", reconcile_interval_s=0.5, removed_after_s=f"{removed.at - deleted_at:.3f}",
               worker_gone_after_s=f"{stopped_at - deleted_at:.3f}", attempts_in_deleted_netns=len(in_between),
               reason=repr(why.probe.status.worker.last_error))
        assert why.probe.status.worker.last_error == f"sandbox gone: no network namespace at {ns.path} any more"
        assert why.probe.status.worker.state == NONE
        assert status(daemon).probes == []
        assert daemon.proc.poll() is None


def test_netns_replaced_under_the_same_name_is_a_new_sandbox(tmp_path, make_netns):
    (ns,) = make_netns(1)
    server = listen(ns, host="127.0.0.1")
    with probing_daemon(tmp_path, ns, server.port) as (daemon, events, probed):
        probe_id = probed.probe.probe_id
        old_inode = probed.probe.status.worker.netns_inode
        mark = events.mark()
        # Faster than a reconcile pass: the worker would otherwise probe the old namespace for ever.
        subprocess.run(["ip", "netns", "del", ns.name], check=True)
        subprocess.run(["ip", "netns", "add", ns.name], check=True)
        new_inode = os.stat(ns.path).st_ino
        why = events.wait(lambda e: e.type == service_pb.UPDATED and e.probe.probe_id == probe_id
                          and e.probe.status.worker.last_error.startswith("sandbox gone"), mark)
        events.wait(lambda e: e.type == service_pb.REMOVED and e.probe.probe_id == probe_id, mark)
        assert why.probe.status.worker.last_error == (f"sandbox gone: the network namespace at {ns.path} was replaced "
                                               f"(inode {old_inode}, now {new_inode})")
        # Registered again (same id: same sandbox, container and type), it runs in the new namespace.
        removed = events.mark()
        assert run(daemon, ns, loopback_spec(server.port)) == probe_id
        moved = events.wait(lambda e: e.type == service_pb.UPDATED and e.probe.probe_id == probe_id
                            and e.probe.status.worker.state == RUNNING, removed)
        assert moved.probe.status.worker.netns_inode == new_inode
