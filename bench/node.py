"""Scenario "node": what one readiness probe costs the node under a real kubelet (node cost targets).

One private containerd, one shim in front of it, one real kubelet (tests/support/kubelet_env.py) whose CRI endpoint is the
shim, and N static pods (busybox httpd serving /healthz on 0.0.0.0:8080) with one readiness probe each at 1 s
(timeoutSeconds 1), in five phases on the same kubelet build, containerd and shim:

  none       no probe: the baseline (the kubelet's relists and syncs, containerd, the shim's proxy)
  native     the kubelet's own httpGet to the pod IP, from the node's netns (the problem this project solves)
  exec       a classic exec probe: `busybox wget` to the pod's 127.0.0.1 (ExecSync: containerd, its shim, runc)
  bridged    the native httpGet converted by `probectl convert`: a marker ExecSync the shim answers in the pod's netns
  delegated  the native httpGet unconverted, under CRIProbeDelegation: the shim probes on its own schedule and the
             kubelet hears state changes and unsuccessful attempts on one watch stream

The kubelet is the project's patched build (kubelet/, hack/build-kubelet-delegating.sh) for every phase: with the
gate on for none, exec, bridged and delegated (the gate changes nothing for exec probes, so the baseline is the
delegating kubelet's own idle cost: its discovery and its watch), then restarted with the gate off (upstream's code
paths) for native, which runs after `restart_settle_s` more (a kubelet's first seconds are busier). Without that
build the four other phases run on the released kubelet, in the table's order, and "delegated" is skipped, saying
why. Probes/s come from the kubelet's prober_probe_total, but for delegated: from the shim's attempt totals, which
the kubelet's counter follows every 10 s (it would lag the window's edges).

Per phase: every pod Ready, `warmup_s`, then a window of `window_s` in which the bench itself only waits. CPU is
read at both ends: the node's (all of /proc/stat), and apart the kubelet, containerd with its runc shims (their
reaped children too: runc and the exec'd wget), the shim daemon, and its zygote and workers; probes/s from the
kubelet's own prober_probe_total. CPU milliseconds per probe = (the phase's CPU per second - the "none" phase's) /
probes per second. Readiness flips are read from the kubelet's log (polling /pods would cost the kubelet CPU),
restarts and readiness from one /pods at the window's end.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import psutil
import yaml

from bench import env
from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.rollout import NODE_LABEL, NODE_LABEL_VALUE
from probectl.convert import convert
from tests.support import kubelet_env
from tests.support.containerd_env import running_containerd
from tests.support.daemon_env import DaemonProcess

PHASES = ("none", "native", "exec", "bridged", "delegated")
PROBED = PHASES[1:]
DELEGATION_GATE = {"CRIProbeDelegation": True}
HTTP_PORT = 8080
ROLES = ("node", "kubelet", "containerd", "shim_daemon", "shim_workers")


@dataclass(frozen=True)
class NodeParams:
    pods: int
    warmup_s: float
    window_s: float
    ready_timeout_s: float = 180.0
    restart_settle_s: float = 15.0


# --- pure: manifests and arithmetic --------------------------------------------------------------------------------

def pod_name(phase: str, index: int) -> str:
    # A name per phase: a static pod of a name still terminating holds back a new pod of that name.
    return f"{phase}-{index:03d}"


def pod_manifest(index: int, image: str, phase: str) -> str:
    """The static pod of `phase` (YAML); "bridged" is "native" as `probectl convert` rewrites it, "delegated" is
    "native" as it is."""
    container = {"name": "web", "image": image, "imagePullPolicy": "Never",
                 "command": ["/bin/busybox", "httpd", "-f", "-p", str(HTTP_PORT), "-h", "/www"]}
    if phase in ("native", "bridged", "delegated"):
        container["readinessProbe"] = {"httpGet": {"path": "/healthz", "port": HTTP_PORT}, "periodSeconds": 1}
    elif phase == "exec":
        container["readinessProbe"] = {"exec": {"command": [
            "/bin/busybox", "wget", "-q", "-O", "/dev/null", f"http://127.0.0.1:{HTTP_PORT}/healthz"]},
            "periodSeconds": 1}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod_name(phase, index), "namespace": "bench"},
           "spec": {"terminationGracePeriodSeconds": 1, "containers": [container]}}
    text = yaml.safe_dump(pod, sort_keys=False)
    if phase != "bridged":
        return text
    result = convert(text)
    if result.errors:
        raise ValueError(f"convert: {result.errors}")
    return result.text


def node_busy_s(proc_stat: str) -> float:
    """CPU seconds the node spent busy since boot, all CPUs (/proc/stat's `cpu` line less idle and iowait)."""
    fields = [int(x) for x in proc_stat.splitlines()[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def per_probe_ms(phase: dict, baseline: dict) -> dict[str, float | None]:
    """CPU ms per probe above the baseline phase, for each role."""
    rate = phase["probes_per_s"]
    return {role: round((phase["cpu_ms_per_s"][role] - baseline["cpu_ms_per_s"][role]) / rate, 3) if rate else None
            for role in ROLES}


def attempt_counts(probes) -> dict[tuple[str, str, str, str], float]:
    """The shim's attempt totals of its probes (ProbeStatus), keyed as prober_probe_total's series: (pod, container,
    type, result), a warning counted as the kubelet counts it (successful)."""
    counts: dict[tuple[str, str, str, str], float] = {}
    for p in probes:
        key = (p.labels.get("io.kubernetes.pod.name", ""), p.container_name, spec_pb.ProbeType.Name(p.type).title())
        totals = p.status.totals
        for result, n in (("successful", totals.success + totals.warning), ("failed", totals.failure),
                          ("unknown", totals.unknown)):
            if n:
                counts[(*key, result)] = float(n)
    return counts


def probe_rate(before: dict, after: dict, window_s: float) -> tuple[float, dict[str, int]]:
    """Probes per second over the window from the kubelet's prober_probe_total (tests/kubelet_env.probe_counts
    before and after), and how many of each result."""
    results: dict[str, float] = {}
    for key in set(before) | set(after):
        result = key[3]
        results[result] = results.get(result, 0.0) + after.get(key, 0.0) - before.get(key, 0.0)
    return round(sum(results.values()) / window_s, 2), {k: int(v) for k, v in sorted(results.items())}


# --- I/O: processes and phases -------------------------------------------------------------------------------------

def _seconds(pid: int, children: bool) -> float:
    """A process's CPU seconds; with children, also those of its children it reaped (runc, an exec'd wget)."""
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return t.user + t.system + ((t.children_user + t.children_system) if children else 0.0)


@dataclass
class Roles:
    """The pids behind each role, found when a window starts (they do not change within one)."""
    kubelet: int
    containerd: list[int]
    shim_daemon: int
    shim_workers: list[int]

    @classmethod
    def find(cls, kubelet_pid: int, containerd_pid: int, containerd_address: str, daemon_pid: int) -> "Roles":
        runc_shims = [p.pid for p in psutil.process_iter(["cmdline"])
                      if "containerd-shim-runc-v2" in " ".join(p.info["cmdline"] or [])
                      and containerd_address in (p.info["cmdline"] or [])]
        workers = [p.pid for p in psutil.Process(daemon_pid).children(recursive=True)]
        return cls(kubelet_pid, [containerd_pid, *runc_shims], daemon_pid, workers)

    def cpu_s(self) -> dict[str, float]:
        with open("/proc/stat") as f:
            node = node_busy_s(f.read())
        return {"node": node, "kubelet": _seconds(self.kubelet, True),
                "containerd": sum(_seconds(pid, True) for pid in self.containerd),
                "shim_daemon": _seconds(self.shim_daemon, False),
                "shim_workers": sum(_seconds(pid, True) for pid in self.shim_workers)}


@dataclass
class Rig:
    containerd: object
    shim: DaemonProcess
    kubelet: kubelet_env.KubeletProcess

    def restart_kubelet(self, feature_gates: dict, settle_s: float) -> None:
        """The same kubelet build, on the same directories, with these feature gates (its pods cleared first), and
        settle_s for its start-up work to pass."""
        old = self.kubelet
        old.stop()
        self.kubelet = kubelet_env.KubeletProcess(old.workdir, old.endpoint, node_labels=old.node_labels,
                                                  binary=old.binary, feature_gates=feature_gates).start()
        time.sleep(settle_s)  # nothing to wait for but time

    def shim_attempts(self) -> dict[tuple[str, str, str, str], float]:
        return attempt_counts(self.shim.stub.ProbeStatus(service_pb.ProbeStatusRequest(), timeout=10).probes)

    def running_pods(self) -> int:
        from cri_proto import cri_runtime_v1_pb2 as cri_pb
        return sum(s.state == cri_pb.SANDBOX_READY for s in self.containerd.cri.list_sandboxes())

    def clear(self, timeout_s: float) -> None:
        """Every pod gone, and their dead sandboxes too: the next phase's relists see only its own pods. The
        kubelet's own garbage collection may be removing the same containers meanwhile ("already in removing
        state"): what it removes first is gone all the same, so a refused removal is tried again until none is
        left."""
        self.kubelet.remove_all_pods(pods_gone=lambda: self.running_pods() == 0, timeout_s=timeout_s)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.containerd.remove_all_sandboxes()
                return
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(kubelet_env.POLL_S)  # the kubelet's removal in progress: nothing to wait on


def run_phase(rig: Rig, phase: str, params: NodeParams) -> dict:
    rig.clear(params.ready_timeout_s)
    image = rig.containerd.images.http
    begin = time.monotonic()
    for index in range(params.pods):
        rig.kubelet.write_manifest(pod_name(phase, index), pod_manifest(index, image, phase))
    rig.kubelet.wait_for(f"{params.pods} pods Ready ({phase})",
                         lambda pods: len(pods) == params.pods and all(p.ready for p in pods.values()),
                         params.ready_timeout_s)
    ready_s = time.monotonic() - begin
    time.sleep(params.warmup_s)  # the phase's steady state: nothing to wait for but time

    roles = Roles.find(rig.kubelet.proc.pid, rig.containerd.proc.pid, rig.containerd.session.address,
                       rig.shim.proc.pid)
    log_start = len(rig.kubelet.log_text())
    probe_counts = rig.shim_attempts if phase == "delegated" else rig.kubelet.probe_counts
    counts_before, cpu_before, start = probe_counts(), roles.cpu_s(), time.monotonic()
    time.sleep(params.window_s)  # the window: the bench only waits, so that it costs the node nothing
    cpu_after, wall = roles.cpu_s(), time.monotonic() - start
    counts_after = probe_counts()
    pods = rig.kubelet.pods()

    rate, results = probe_rate(counts_before, counts_after, wall)
    return {
        "pods": params.pods, "ready_s": round(ready_s, 1), "window_s": round(wall, 1),
        "probes_per_s": rate, "probe_results": results,
        "cpu_ms_per_s": {role: round((cpu_after[role] - cpu_before[role]) / wall * 1000, 1) for role in ROLES},
        "readiness_changes": len(kubelet_env.readiness_changes(rig.kubelet.log_text()[log_start:])),
        "not_ready_at_end": sum(not p.ready for p in pods.values()) + params.pods - len(pods),
        "restarts": sum(p.restarts for p in pods.values()),
        "processes": {"containerd_and_runc_shims": len(roles.containerd), "shim_workers": len(roles.shim_workers)},
    }


def run(params: NodeParams) -> dict:
    reason = kubelet_env.unavailable_reason()
    if reason is not None:
        return {"skipped": reason}
    try:
        with contextlib.ExitStack() as stack:
            containerd = stack.enter_context(running_containerd(unavailable=env.unavailable))
            workdir = Path(containerd.session.path("node-bench"))
            (workdir / "shim").mkdir(parents=True)
            shim = DaemonProcess(workdir / "shim", ["--runtime-endpoint", containerd.endpoint,
                                                    "--trace-exporter", "none"]).start()
            stack.callback(shim.stop)
            delegating = kubelet_env.delegating_kubelet_binary()
            # A shim node, as the kubelet drop-in labels it: converted pods require the label (their affinity).
            kubelet = kubelet_env.KubeletProcess(workdir / "kubelet", f"unix://{shim.socket_path}",
                                                 node_labels={NODE_LABEL: NODE_LABEL_VALUE}, binary=delegating,
                                                 feature_gates=DELEGATION_GATE if delegating else {})
            rig = Rig(containerd, shim, kubelet.start())
            stack.callback(lambda: rig.kubelet.stop())
            stack.callback(rig.clear, params.ready_timeout_s)
            if delegating is None:
                phases = {phase: run_phase(rig, phase, params) for phase in PHASES if phase != "delegated"}
                phases["delegated"] = {"skipped": "needs the delegating kubelet (hack/build-kubelet-delegating.sh, "
                                                  "`make go-binaries`): not built"}
            else:
                phases = {phase: run_phase(rig, phase, params) for phase in PHASES if phase != "native"}
                rig.clear(params.ready_timeout_s)
                rig.restart_kubelet({}, params.restart_settle_s)
                phases["native"] = run_phase(rig, "native", params)
    except env.Unavailable as exc:
        return {"skipped": str(exc)}
    for phase in PROBED:
        if "skipped" not in phases[phase]:
            phases[phase]["per_probe_ms"] = per_probe_ms(phases[phase], phases["none"])
    return {"pods": params.pods, "period_s": 1, "kubelet": kubelet_env.KUBELET_VERSION,
            "kubelet_build": "the delegating build, kubelet/" if delegating else "released",
            "containerd": containerd.runtime.version, "phases": phases}
