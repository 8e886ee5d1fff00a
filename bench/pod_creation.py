"""Scenario "pod_creation": how long a pod takes to be created and become Ready on a one-machine cluster, through the
admission webhook and without it.

The cluster is the control-plane tests' (tests/support/cluster.py): etcd, kube-apiserver, controller-manager and
scheduler, the kubelet registered through the shim in front of the default containerd, the webhook as a host process
registered from deploy/. Two phases on the same cluster, one after the other:
- "webhook": the webhook registered, the namespace opted in: every pod converted (its probe bridged by the shim);
- "no_webhook": the MutatingWebhookConfiguration deleted: the same pods unconverted, their probe the kubelet's own
  (pinned to node1 by a nodeSelector, the only Node with a kubelet, as a converted pod is by its affinity).
In each, `pods` pods of one container (busybox nc) with a TCP readiness probe at 1 s are created one after the other
every `interval_s` by POST, as a client does; per pod:
- create: the create request's latency as the client saw it (ms): the whole admission chain, webhook call included;
- ready (API): metadata.creationTimestamp to the Ready condition's lastTransitionTime, the API's own timestamps
  (whole seconds, as it keeps them);
- ready (seen): from sending the create to the client seeing Ready (polled every POLL_S), finer than the API's.
Beside them, the API server's own apiserver_admission_webhook_admission_duration_seconds over the phase.
"""

from __future__ import annotations

import contextlib
import datetime
import time
from dataclasses import dataclass

from bench import env
from bench.stats import summarize
from tests.support import control_plane, kubelet_env
from tests.support.cluster import SHIM_NODE, Cluster, opted_in_namespace, pod_ready
from tests.support.containerd_env import running_containerd
from tests.support.containerd_session import TCP_PORT

NAMESPACE = "bench"
POLL_S = 0.1
PHASES = ("webhook", "no_webhook")
WEBHOOK_METRIC = "apiserver_admission_webhook_admission_duration_seconds"


@dataclass(frozen=True)
class PodCreationParams:
    pods: int
    interval_s: float = 0.5
    ready_timeout_s: float = 180.0


def pod(name: str, image: str, pinned: bool) -> dict:
    spec = {"terminationGracePeriodSeconds": 1, "containers": [{
        "name": "app", "image": image, "imagePullPolicy": "Never",
        "readinessProbe": {"tcpSocket": {"port": TCP_PORT}, "periodSeconds": 1}}]}
    if pinned:
        spec["nodeSelector"] = {"kubernetes.io/hostname": SHIM_NODE}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}


def _timestamp(text: str) -> float:
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc).timestamp()


def api_ready_s(item: dict) -> float | None:
    """creationTimestamp to the Ready condition's last transition, in the API's whole seconds."""
    for condition in item["status"].get("conditions", []):
        if condition["type"] == "Ready" and condition["status"] == "True":
            return _timestamp(condition["lastTransitionTime"]) - _timestamp(item["metadata"]["creationTimestamp"])
    return None


def webhook_histogram(api) -> tuple[float, float]:
    """(sum in seconds, count) of the API server's webhook admission histogram, over every webhook."""
    total = count = 0.0
    for line in api.text("/metrics").splitlines():
        if line.startswith(WEBHOOK_METRIC + "_sum"):
            total += float(line.split()[-1])
        elif line.startswith(WEBHOOK_METRIC + "_count"):
            count += float(line.split()[-1])
    return total, count


def run_phase(cluster: Cluster, phase: str, params: PodCreationParams) -> dict:
    api = cluster.plane.api()
    image = cluster.images["tcp"]
    hist_before = webhook_histogram(api)
    sent: dict[str, float] = {}
    create_ms: list[float] = []
    seen_ready: dict[str, float] = {}
    names = [f"{phase.replace('_', '-')}-{i}" for i in range(params.pods)]
    due = time.monotonic()
    for name in names:
        time.sleep(max(0.0, due - time.monotonic()))  # paced: one create every interval_s
        begin = time.monotonic()
        api.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod(name, image, pinned=phase == "no_webhook"))
        create_ms.append((time.monotonic() - begin) * 1000)
        sent[name] = begin
        due += params.interval_s
        _note_ready(api, sent, seen_ready)
    deadline = time.monotonic() + params.ready_timeout_s
    while len(seen_ready) < len(names) and time.monotonic() < deadline:
        time.sleep(POLL_S)
        _note_ready(api, sent, seen_ready)
    items = api.get(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
    hist_after = webhook_histogram(api)
    converted = sum(1 for i in items if "probe-shim.io/original-handlers" in i["metadata"].get("annotations", {}))
    api_ready = [s for s in (api_ready_s(i) for i in items) if s is not None]
    calls = hist_after[1] - hist_before[1]
    result = {
        "pods": len(names), "ready": len(seen_ready), "converted": converted,
        "create_ms": summarize(create_ms),
        "ready_seen_s": summarize([(seen_ready[n] - sent[n]) for n in seen_ready]) if seen_ready else None,
        "ready_api_s": summarize(api_ready) if api_ready else None,
        "apiserver_webhook_calls": calls,
        "apiserver_webhook_mean_ms": round((hist_after[0] - hist_before[0]) / calls * 1000, 2) if calls else None,
    }
    cluster.plane.kubectl("delete", "pods", "--all", "-n", NAMESPACE, "--grace-period=1", "--wait=true",
                          timeout_s=params.ready_timeout_s)
    cluster.wait_for("every bench pod's sandbox stopped", lambda: not cluster.running_sandboxes(),
                     params.ready_timeout_s)
    return result


def _note_ready(api, sent: dict[str, float], seen_ready: dict[str, float]) -> None:
    now = time.monotonic()
    for item in api.get(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]:
        name = item["metadata"]["name"]
        if name in sent and name not in seen_ready and pod_ready(item):
            seen_ready[name] = now


def run(params: PodCreationParams) -> dict:
    for reason in (kubelet_env.unavailable_reason(), control_plane.unavailable_reason()):
        if reason is not None:
            return {"skipped": reason}
    try:
        with contextlib.ExitStack() as stack:
            containerd = stack.enter_context(running_containerd(unavailable=env.unavailable))
            cluster = Cluster.start(containerd)
            stack.callback(cluster.stop)
            cluster.start_webhook()
            cluster.register_webhook()
            cluster.plane.api().request("POST", "/api/v1/namespaces", opted_in_namespace(NAMESPACE))
            cluster.wait_for("the bench namespace's service account", lambda: _has_default_account(cluster), 60)
            phases = {"webhook": run_phase(cluster, "webhook", params)}
            cluster.plane.kubectl("delete", "mutatingwebhookconfiguration", "probe-shim")
            phases["no_webhook"] = run_phase(cluster, "no_webhook", params)
    except env.Unavailable as exc:
        return {"skipped": str(exc)}
    return {"pods": params.pods, "interval_s": params.interval_s, "kubernetes": kubelet_env.KUBELET_VERSION,
            "containerd": containerd.runtime.version, "phases": phases}


def _has_default_account(cluster: Cluster) -> bool:
    with contextlib.suppress(control_plane.ApiError):
        cluster.plane.api().get(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default")
        return True
    return False


# --- its rows in the suite's tables (pure) ---------------------------------------------------------------------------

def rows(scenario: dict | None) -> list:
    from bench.report import measured_row

    def create(s: dict):
        w, n = s["phases"]["webhook"], s["phases"]["no_webhook"]
        return (f"p50 {w['create_ms']['median']:.1f} / p99 {w['create_ms']['p99']:.1f} ms vs "
                f"{n['create_ms']['median']:.1f} / {n['create_ms']['p99']:.1f} ms without", None,
                f"{w['converted']}/{w['pods']} converted; the API server's webhook call "
                f"{w['apiserver_webhook_mean_ms']} ms on average")

    def ready(s: dict):
        w, n = s["phases"]["webhook"], s["phases"]["no_webhook"]
        ok = w["ready"] == w["pods"] and n["ready"] == n["pods"]
        return (f"p50 {w['ready_seen_s']['median']:.2f} / p99 {w['ready_seen_s']['p99']:.2f} s vs "
                f"{n['ready_seen_s']['median']:.2f} / {n['ready_seen_s']['p99']:.2f} s without", ok,
                f"API timestamps (whole s): p50 {w['ready_api_s']['median']:g} / p99 {w['ready_api_s']['p99']:g} s "
                f"vs {n['ready_api_s']['median']:g} / {n['ready_api_s']['p99']:g} s; {w['ready']}+{n['ready']} of "
                f"{w['pods'] + n['pods']} Ready")
    return [measured_row("pod creation through the webhook: create request", "(none)", scenario, create),
            measured_row("pod creation through the webhook: created to Ready", "every pod Ready", scenario, ready)]


def details(scenario: dict | None) -> str:
    if not scenario or "phases" not in scenario:
        return ""
    lines = [f"pod_creation: {scenario['pods']} pods per phase, one every {scenario['interval_s']} s, kubelet "
             f"{scenario['kubernetes']} on containerd {scenario['containerd']}"]
    for phase in PHASES:
        p = scenario["phases"][phase]
        lines.append(
            f"  {phase:10} create p50 {p['create_ms']['median']:.1f} ms, p99 {p['create_ms']['p99']:.1f} ms; "
            f"to Ready (seen) p50 {p['ready_seen_s']['median']:.2f} s, p99 {p['ready_seen_s']['p99']:.2f} s; "
            f"(API) p50 {p['ready_api_s']['median']:g} s, p99 {p['ready_api_s']['p99']:g} s; "
            f"{p['converted']} converted; webhook calls {p['apiserver_webhook_calls']:g}, mean "
            f"{p['apiserver_webhook_mean_ms']} ms")
    return "\n".join(lines)
