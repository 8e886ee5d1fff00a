"""probectl workers: the probe worker processes and what they cost, measured with psutil on this node."""

from __future__ import annotations

import time

import psutil

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probectl_pb2 as probectl_pb
from probectl import render
from probectl.commands.base import EXIT_OK, connect, print_line


def _measure_workers(sandboxes: list[service_pb.ProbeSandbox], interval_s: float) -> list[probectl_pb.WorkerUsage]:
    """One row per worker (a group of sandboxes), with psutil's view of its process. CPU% over one shared
    interval: every process is sampled, the interval passes once, every process is sampled again (psutil's
    cpu_percent(None) protocol), so N workers take one interval, not N."""
    groups: dict[str, list[service_pb.ProbeSandbox]] = {}
    for sandbox in sandboxes:  # a sandbox of no group yet (an older daemon, say) is a group of its own
        groups.setdefault(sandbox.worker.group or f"sandbox {sandbox.id}", []).append(sandbox)
    processes: dict[int, psutil.Process] = {}
    for members in groups.values():
        pid = members[0].worker.pid
        try:
            if pid:
                process = psutil.Process(pid)
                process.cpu_percent(None)
                processes[pid] = process
        except psutil.Error:
            pass  # gone since the listing: shown without numbers
    if processes:
        time.sleep(interval_s)  # the measurement window, not a synchronization
    now = time.time()
    usage = []
    for members in groups.values():
        worker = members[0].worker  # the group's worker: the same for every member
        process = processes.get(worker.pid)
        cpu = pss = uptime = None
        if process is not None:
            try:
                cpu = process.cpu_percent(None)
                uptime = now - process.create_time()
                pss = process.memory_full_info().pss
            except psutil.Error:
                pass
        if worker.started_at:
            uptime = now - worker.started_at / 1e9
        usage.append(probectl_pb.WorkerUsage(
            pid=worker.pid, group=worker.group, pod_sandbox_ids=[s.id for s in members], state=worker.state,
            uptime_seconds=uptime, pss_bytes=pss, cpu_percent=cpu, probes=sum(s.probes for s in members),
            restarts=max(s.worker.restarts for s in members)))
    return usage


def cmd_workers(args) -> int:
    with connect(args) as client:
        sandboxes = [s for s in client.sandboxes() if s.worker.state != service_pb.WORKER_NONE]
    usage = _measure_workers(sandboxes, args.interval / 1000)
    if args.output == "table":
        print_line(render.workers_table(usage, args.no_trunc))
    else:
        print_line(render.structured(render.message_dict(probectl_pb.WorkersResult(workers=usage)), args.output))
    return EXIT_OK
