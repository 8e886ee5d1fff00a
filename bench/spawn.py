"""Scenario 4: from RunProbe on a new sandbox to that probe's first attempt.

One daemon; for each of `count` new sandboxes in turn (a loopback-only netns): open a
watch of that sandbox with every_attempt, send RunProbe for a TCP probe on the pod's
loopback (a closed port: the attempt's outcome does not matter, its start does), and
time until the first ATTEMPT event arrives. That span holds resolving the sandbox, the
durable store write, forking the worker from the zygote, its netns entry and privilege
drop, and the attempt. The sandboxes registered before keep probing meanwhile (period
1 s), as on a node that fills up.
"""

from __future__ import annotations

import contextlib
import time

from bench.env import BenchDaemon
from bench.stats import summarize
from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from tests.support.netns_env import PodNetns

CLOSED_PORT = 9
WATCH_TIMEOUT_S = 30


def run(count: int) -> dict:
    spec = spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=CLOSED_PORT)),
                             target=spec_pb.LOOPBACK, period_ms=1000, timeout_ms=200)
    run_probe_ms, first_attempt_ms = [], []
    with contextlib.ExitStack() as stack:
        namespaces: list[PodNetns] = []
        stack.callback(lambda: [ns.destroy() for ns in namespaces])
        for _ in range(count):
            namespaces.append(PodNetns.create(with_addresses=False))
        daemon = BenchDaemon()
        stack.callback(daemon.close)
        for ns in namespaces:
            watch = daemon.stub.WatchProbeStatus(service_pb.WatchProbeStatusRequest(
                filter=service_pb.ProbeFilter(pod_sandbox_id=ns.name), every_attempt=True), timeout=WATCH_TIMEOUT_S)
            try:
                events = iter(watch)
                if next(events).type != service_pb.SNAPSHOT_COMPLETE:  # a new sandbox: nothing to snapshot
                    raise RuntimeError(f"sandbox {ns.name} is not new")
                begin = time.perf_counter()
                daemon.run_probe(ns.name, "app", spec, spec_pb.LIVENESS)
                run_probe_ms.append((time.perf_counter() - begin) * 1000)
                for event in events:
                    if event.type == service_pb.ATTEMPT:
                        first_attempt_ms.append((time.perf_counter() - begin) * 1000)
                        break
            finally:
                watch.cancel()
    return {"sandboxes": count, "run_probe_answered_ms": summarize(run_probe_ms),
            "first_attempt_ms": summarize(first_attempt_ms)}
