#!/usr/bin/env python3
"""Time from RunProbe to the first attempt, for a new sandbox, through the real daemon.

Starts `probe-shim serve --runtime-endpoint none` in a temp dir, makes N network
namespaces (loopback only), and for each: opens a watch with every_attempt, sends
RunProbe for a TCP probe on the pod's loopback, and times until the first ATTEMPT
event of that probe arrives (RunProbe includes resolving the sandbox, the durable
store write, forking the worker from the zygote and its netns entry).

    python3 bench/first_attempt.py --sandboxes 20     # needs root
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.stats import summarize  # noqa: E402
from cri_proto import probe_service_pb2 as service_pb  # noqa: E402
from cri_proto import probe_spec_pb2 as spec_pb  # noqa: E402
from tests.daemon_env import DaemonProcess  # noqa: E402
from tests.netns_env import PodNetns, netns_unavailable_reason  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sandboxes", type=int, default=20)
    args = parser.parse_args()
    reason = netns_unavailable_reason()
    if reason:
        print(f"first_attempt: {reason}", file=sys.stderr)
        return 1
    namespaces = [PodNetns.create(with_addresses=False) for _ in range(args.sandboxes)]
    workdir = tempfile.TemporaryDirectory()
    daemon = DaemonProcess(Path(workdir.name)).start()
    run_probe_ms, first_attempt_ms = [], []
    try:
        spec = spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=9)),
                                 target=spec_pb.LOOPBACK, period_ms=1000, timeout_ms=200)
        for ns in namespaces:
            watch = daemon.stub.WatchProbeStatus(service_pb.WatchProbeStatusRequest(
                filter=service_pb.ProbeFilter(pod_sandbox_id=ns.name), every_attempt=True), timeout=30)
            events = iter(watch)
            assert next(events).type == service_pb.SNAPSHOT_COMPLETE  # empty sandbox: no probe yet
            t0 = time.perf_counter()
            daemon.stub.RunProbe(service_pb.RunProbeRequest(
                pod_sandbox_id=ns.name, container_name="app", type=spec_pb.LIVENESS, spec=spec), timeout=10)
            run_probe_ms.append((time.perf_counter() - t0) * 1000)
            for event in events:
                if event.type == service_pb.ATTEMPT:
                    first_attempt_ms.append((time.perf_counter() - t0) * 1000)
                    break
            watch.cancel()
    finally:
        daemon.stop()
        for ns in namespaces:
            ns.destroy()
        workdir.cleanup()
    for label, values in (("RunProbe answered", run_probe_ms), ("first attempt seen", first_attempt_ms)):
        s = summarize(values)
        print(f"{label:20} median {s['median']:6.1f} ms   p90 {s['p90']:6.1f} ms   max {s['max']:6.1f} ms"
              f"   ({len(values)} new sandboxes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
