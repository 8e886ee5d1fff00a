"""The whole rollout on a one-machine cluster: the API server calls the webhook registered from deploy/, the scheduler
honours the converted pods' node affinity, the kubelet goes through the shim and reports to the API server.

The cluster (tests/support/cluster.py): etcd, kube-apiserver, kube-controller-manager and kube-scheduler of the
build of `make k8s` (1.37.2) and `hack/build-etcd.sh`, all on 127.0.0.1; the kubelet registered as Node node1
through a shim in front of the suite's containerd, labelled as the kubelet drop-in labels a shim node; a second
Node, plain-node, without the label and with no kubelet behind it (kept Ready by the test, and preferred by the
scheduler: more room); the webhook as a host process, registered from `kubectl kustomize deploy/` with its
Deployment left out and its clientConfig by url (tests/support/cluster.py says why). Everything is done with
kubectl, as a user would, and asserted from the API.

What each test proves:
- the cluster: node1 Ready with the shim label, its runtime containerd seen through the shim; plain-node Ready
  without it, and a live candidate (an unconverted Deployment's pods are bound there);
- a Deployment of 3 replicas in an opted-in namespace, with HTTP (pod IP and the pod's 127.0.0.1), TCP and gRPC
  readiness, a startup and a liveness probe and postStart/preStop httpGet hooks: every pod converted (the
  annotation, the affinity), bound to node1 and none to plain-node, Ready as the kubelet wrote it, its probes
  answered by the shim (a bridged row each), its postStart hook recorded with the kubelet's User-Agent, the
  scheduler's and the kubelet's events; a pod whose probe aims at another pod keeps it, and kubectl prints the
  webhook's warning; an opted-out pod is unconverted and Ready through the kubelet's own probes;
- scale 3 -> 6 -> 0 (each pod's preStop hook ran; no row left in the shim), `kubectl rollout restart`;
- a failing liveness probe restarts the container (restartCount in the API, the kubelet's Unhealthy and Killing
  events with its own texts);
- the webhook stopped: new pods are created unconverted (failurePolicy Ignore) and Ready through the kubelet's own
  probes;
- the webhook's certificate rotated (a new CA added to caBundle, the pair swapped, the old CA removed) while pods
  are created: every one of them converted;
- `probectl doctor` ok on the node; `probectl convert --reverse` of a live pod's YAML gives back its probes.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import threading

import pytest
import yaml

from cri_proto import probe_service_pb2 as service_pb
from probe_api.defaults import KUBELET_VERSION as ENGINE_KUBELET_VERSION  # the kubelet the engine follows: 1.37
from probe_api.rollout import (
    CONVERT_LABEL, DISABLED, NODE_LABEL, NODE_LABEL_VALUE, ORIGINAL_HANDLERS_ANNOTATION, node_selector_requirement,
)
from tests.support import control_plane, kubelet_env
from tests.support.cluster import (
    HTTP_PORT, PLAIN_NODE, SHIM_NODE, Cluster, deployment, node_ready, opted_in_namespace, pod_ready, web_pod_spec,
)
from tests.support.containerd_env import ContainerdEnv
from tests.support.kubelet_exec_model import ProbeVerdict, probe_event
from tests.support.kubelet_node import http_get, probe, www_dir
from tests.support.netns_env import REPO_ROOT
from tests.support.webhook_env import certs

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

NS = "shop"
READY_TIMEOUT_S = 180.0        # pods scheduled, sandboxes and 5 containers each started, first probes passed
HANDLER_FIELDS = ("readinessProbe", "livenessProbe", "startupProbe", "lifecycle")


@pytest.fixture(scope="module")
def cluster(containerd: ContainerdEnv):
    for reason in (kubelet_env.unavailable_reason(), control_plane.unavailable_reason()):
        if reason is not None:
            pytest.skip(reason)
    if shutil.which("go") is None and not os.environ.get("WORKLOADS_CACHE_DIR"):
        pytest.skip("needs Go to build the gRPC workload (tests/workloads) of the pods")
    if not containerd.runtime.supports_kubelet(kubelet_env.kubelet_minor()):
        pytest.skip(f"kubelet {kubelet_env.KUBELET_VERSION} does not support containerd "
                    f"{containerd.runtime.version} (1.35 is the last Kubernetes release that supports containerd 1.x)")
    containerd.remove_all_sandboxes()  # the kubelet kills every sandbox it does not know
    cluster = Cluster.start(containerd)
    try:
        cluster.start_webhook()
        cluster.register_webhook()
        cluster.plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(opted_in_namespace(NS)))
        cluster.wait_for(f"the default service account in {NS}", lambda: cluster.plane.kubectl(
            "get", "serviceaccount", "default", "-n", NS, check=False).returncode == 0, 60)
        yield cluster
    finally:
        problems = cluster.stop()
    assert not problems, problems


# --- readings ------------------------------------------------------------------------------------------------------

def converted(pod: dict) -> bool:
    return ORIGINAL_HANDLERS_ANNOTATION in pod["metadata"].get("annotations", {})


def affinity_terms(pod: dict) -> list[dict]:
    required = (pod["spec"].get("affinity", {}).get("nodeAffinity", {})
                .get("requiredDuringSchedulingIgnoredDuringExecution", {}))
    return required.get("nodeSelectorTerms", [])


def wait_pods(cluster: Cluster, what: str, selector: str, condition, namespace: str = NS,
              timeout_s: float = READY_TIMEOUT_S) -> list[dict]:
    def check():
        pods = [p for p in cluster.pods(namespace, selector) if not p["metadata"].get("deletionTimestamp")]
        return pods if condition(pods) else None
    return cluster.wait_for(what, check, timeout_s)


def all_ready(count: int):
    return lambda pods: len(pods) == count and all(pod_ready(p) for p in pods)


def events_of(cluster: Cluster, pod: dict) -> list[dict]:
    return cluster.plane.get_json("events", "-n", pod["metadata"]["namespace"], "--field-selector",
                                  f"involvedObject.name={pod['metadata']['name']}")["items"]


def bridged_pods(cluster: Cluster, namespace: str = NS) -> set[str]:
    rows = cluster.shim.stub.ProbeStatus(service_pb.ProbeStatusRequest(), timeout=10).probes
    return {r.labels["io.kubernetes.pod.name"] for r in rows
            if r.labels.get("io.kubernetes.pod.namespace") == namespace}


def hook_records(www) -> list[list[str]]:
    log = www / "hooks.log"
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []


def apply(cluster: Cluster, obj: dict) -> subprocess.CompletedProcess:
    return cluster.plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(obj))


def pinned(spec: dict) -> dict:
    """A pod spec that must run unconverted: on node1, the only Node with a kubelet (see cluster.py)."""
    return {**spec, "nodeSelector": {"kubernetes.io/hostname": SHIM_NODE}}


def simple_spec(cluster: Cluster, www, **extra) -> dict:
    return {"terminationGracePeriodSeconds": 1, "containers": [{
        "name": "web", "image": cluster.images["http"], "imagePullPolicy": "Never",
        "command": ["/bin/busybox", "httpd", "-f", "-h", "/www", "-p", str(HTTP_PORT)],
        "volumeMounts": [{"name": "www", "mountPath": "/www"}],
        "readinessProbe": probe(http_get(HTTP_PORT))}],
        "volumes": [{"name": "www", "hostPath": {"path": str(www), "type": "Directory"}}], **extra}


def bare_pod(name: str, spec: dict, labels: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": labels or {}},
            "spec": spec}


# --- the cluster ---------------------------------------------------------------------------------------------------

def test_the_shim_node_is_labelled_and_runs_through_the_shim_and_the_plain_node_is_a_live_candidate(cluster):
    node = cluster.plane.get_json("node", SHIM_NODE)
    assert node_ready(node) and node["metadata"]["labels"][NODE_LABEL] == NODE_LABEL_VALUE
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == kubelet_env.KUBELET_VERSION
    # The kubelet's runtime, as it learnt it through the shim's CRI proxy.
    assert info["containerRuntimeVersion"] == f"containerd://{cluster.containerd.runtime.version}"
    plain = cluster.plane.get_json("node", PLAIN_NODE)
    assert node_ready(plain) and NODE_LABEL not in plain["metadata"]["labels"]
    assert not plain["spec"].get("taints")

    # Unconverted pods may go anywhere, and the scheduler prefers plain-node (more room): some land there. No
    # kubelet runs them; they are removed with --force, as for a node that is gone.
    cluster.plane.kubectl("create", "namespace", "elsewhere")
    apply(cluster, {**deployment("anywhere", "elsewhere", 4, {"containers": [{
        "name": "app", "image": cluster.images["tcp"], "imagePullPolicy": "Never"}]})})
    pods = wait_pods(cluster, "4 unconverted pods bound", "app=anywhere",
                     lambda ps: len(ps) == 4 and all(p["spec"].get("nodeName") for p in ps), namespace="elsewhere")
    assert PLAIN_NODE in {p["spec"]["nodeName"] for p in pods}
    assert not any(converted(p) for p in pods)
    cluster.plane.kubectl("delete", "namespace", "elsewhere", "--wait=false")
    cluster.plane.kubectl("delete", "pods", "--all", "-n", "elsewhere", "--force", "--grace-period=0")


# --- a Deployment through the webhook, the scheduler and the kubelet ------------------------------------------------

@pytest.fixture(scope="module")
def web(cluster):
    """The Deployment `web` (3 replicas of web_pod_spec) in the opted-in namespace, and the directory its pods serve."""
    www = www_dir(cluster.workdir, "web")
    apply(cluster, deployment("web", NS, 3, web_pod_spec(cluster.images, www)))
    return www


def test_a_deployment_is_converted_bound_to_the_shim_node_and_ready_through_it(cluster, web):
    pods = wait_pods(cluster, "3 web pods Ready", "app=web", all_ready(3))
    template = cluster.plane.get_json("deployment", "web", "-n", NS)["spec"]["template"]["spec"]  # defaulted
    for pod in pods:
        name = pod["metadata"]["name"]
        assert converted(pod), name
        assert node_selector_requirement() in affinity_terms(pod)[0]["matchExpressions"], name
        assert pod["spec"]["nodeName"] == SHIM_NODE, name
        originals = json.loads(pod["metadata"]["annotations"][ORIGINAL_HANDLERS_ANNOTATION])
        assert originals["initContainers[web].readinessProbe"] == {
            "httpGet": template["initContainers"][0]["readinessProbe"]["httpGet"]}
        # What the kubelet now runs is the bridge's exec command, with the original timing.
        readiness = pod["spec"]["containers"][3]["readinessProbe"]
        assert "exec" in readiness and readiness["periodSeconds"] == 1
        # The kubelet wrote the pod's status: Ready, and every container started once.
        assert all(s["ready"] and s["restartCount"] == 0 for s in pod["status"]["containerStatuses"]), name
        reasons = {(e["reason"], e["source"].get("component") or e.get("reportingComponent")) for e in
                   events_of(cluster, pod)}
        assert ("Scheduled", "default-scheduler") in reasons and ("Started", "kubelet") in reasons, reasons
    # Each pod's probes are the shim's, and each postStart hook reached its pod with the kubelet's User-Agent.
    names = {p["metadata"]["name"] for p in pods}
    assert names <= bridged_pods(cluster)
    post_starts = {r[3]: r for r in hook_records(web) if r[0] == "hook=postStart"}
    assert names <= set(post_starts)
    assert {r[1] for r in post_starts.values()} == {f"kube-lifecycle/{ENGINE_KUBELET_VERSION}"}


def test_kubectl_shows_the_webhooks_warning_for_a_probe_of_another_pod(cluster, web):
    target = wait_pods(cluster, "3 web pods Ready", "app=web", all_ready(3))[0]
    www = www_dir(cluster.workdir, "watcher")
    spec = simple_spec(cluster, www)
    spec["containers"].append({"name": "watcher", "image": cluster.images["tcp"], "imagePullPolicy": "Never",
                               "readinessProbe": probe(http_get(HTTP_PORT, host=target["status"]["podIP"]))})
    done = apply(cluster, bare_pod("watcher", spec))
    assert "Warning: probe-shim: spec.containers[1].readinessProbe.httpGet.host: Forbidden: " in done.stderr, \
        done.stderr
    (pod,) = wait_pods(cluster, "the watcher Ready", "!app", lambda ps: len(ps) == 1 and pod_ready(ps[0]))
    # Converted (its own probe), bound to node1; the other pod's probe left to the kubelet.
    assert converted(pod) and pod["spec"]["nodeName"] == SHIM_NODE
    assert pod["spec"]["containers"][1]["readinessProbe"]["httpGet"]["host"] == target["status"]["podIP"]
    cluster.plane.kubectl("delete", "pod", "watcher", "-n", NS, "--wait=true")


def test_an_opted_out_pod_is_unconverted_and_ready_through_the_kubelets_own_probes(cluster):
    www = www_dir(cluster.workdir, "opted-out")
    apply(cluster, bare_pod("opted-out", pinned(simple_spec(cluster, www)), labels={CONVERT_LABEL: DISABLED}))
    (pod,) = wait_pods(cluster, "the opted-out pod Ready", f"{CONVERT_LABEL}={DISABLED}",
                       lambda ps: len(ps) == 1 and pod_ready(ps[0]))
    assert not converted(pod) and not affinity_terms(pod)
    assert "httpGet" in pod["spec"]["containers"][0]["readinessProbe"]
    assert "opted-out" not in bridged_pods(cluster)
    cluster.plane.kubectl("delete", "pod", "opted-out", "-n", NS, "--wait=true")


def test_scale_up_and_down_to_zero(cluster, web):
    cluster.plane.kubectl("scale", "deployment/web", "-n", NS, "--replicas=6")
    pods = wait_pods(cluster, "6 web pods Ready", "app=web", all_ready(6))
    assert {p["spec"]["nodeName"] for p in pods} == {SHIM_NODE} and all(converted(p) for p in pods)
    names = {p["metadata"]["name"] for p in pods}

    cluster.plane.kubectl("scale", "deployment/web", "-n", NS, "--replicas=0")
    cluster.wait_for("no web pod left", lambda: not cluster.pods(NS, "app=web"), READY_TIMEOUT_S)
    # Each pod's preStop hook ran before it went, and the shim let go of every probe of theirs.
    pre_stops = {r[3] for r in hook_records(web) if r[0] == "hook=preStop"}
    assert names <= pre_stops, names - pre_stops
    cluster.wait_for("the shim's rows of the web pods gone", lambda: not (bridged_pods(cluster) & names), 60)


def test_rollout_restart_replaces_every_pod_with_a_converted_ready_one(cluster, web):
    cluster.plane.kubectl("scale", "deployment/web", "-n", NS, "--replicas=3")
    before = {p["metadata"]["name"] for p in wait_pods(cluster, "3 web pods Ready", "app=web", all_ready(3))}
    cluster.plane.kubectl("rollout", "restart", "deployment/web", "-n", NS)
    cluster.plane.kubectl("rollout", "status", "deployment/web", "-n", NS, f"--timeout={int(READY_TIMEOUT_S)}s",
                          timeout_s=READY_TIMEOUT_S + 30)
    pods = wait_pods(cluster, "3 new web pods Ready", "app=web",
                     lambda ps: all_ready(3)(ps) and not ({p["metadata"]["name"] for p in ps} & before))
    assert all(converted(p) and p["spec"]["nodeName"] == SHIM_NODE for p in pods)
    assert {p["metadata"]["name"] for p in pods} <= bridged_pods(cluster)


def test_a_failing_liveness_probe_restarts_the_container(cluster):
    www = www_dir(cluster.workdir, "flaky")
    spec = simple_spec(cluster, www)
    # /alive is never there: after 3 failures a period apart, the kubelet restarts the container.
    spec["containers"][0]["livenessProbe"] = probe(http_get(HTTP_PORT, "/alive"), failureThreshold=3)
    apply(cluster, bare_pod("flaky", spec))
    (pod,) = wait_pods(cluster, "the flaky pod's container restarted", "!app", lambda ps: len(ps) == 1 and any(
        s["restartCount"] >= 1 for s in ps[0]["status"].get("containerStatuses", [])))
    assert converted(pod)
    messages = {(e["reason"], e["message"]) for e in events_of(cluster, pod)
                if e["source"].get("component") == "kubelet"}
    # The kubelet's own texts: prober.go's event with pkg/probe/http's failure, kuberuntime's kill message.
    assert ("Unhealthy", probe_event("Liveness", ProbeVerdict("failure", "HTTP probe failed with statuscode: 404"))
            ) in messages, messages
    assert ("Killing", "Container web failed liveness probe, will be restarted") in messages, messages
    cluster.plane.kubectl("delete", "pod", "flaky", "-n", NS, "--wait=true")


def test_with_the_webhook_stopped_pods_are_created_unconverted_and_ready(cluster):
    cluster.stop_webhook()
    try:
        www = www_dir(cluster.workdir, "fallback")
        apply(cluster, deployment("fallback", NS, 2, pinned(simple_spec(cluster, www))))
        pods = wait_pods(cluster, "2 unconverted fallback pods Ready", "app=fallback", all_ready(2))
        assert not any(converted(p) or affinity_terms(p) for p in pods)
        assert all("httpGet" in p["spec"]["containers"][0]["readinessProbe"] for p in pods)
        # The API server tried the webhook and went on (failurePolicy: Ignore), as its log says.
        log = cluster.plane.component("kube-apiserver").log_path.read_text(errors="replace")
        assert "failed calling webhook" in log and "namespaces.convert.probe-shim.io" in log
    finally:
        cluster.plane.kubectl("delete", "deployment", "fallback", "-n", NS, "--wait=true")
        cluster.start_webhook()
        cluster.register_webhook()


def test_the_webhooks_certificate_rotated_while_pods_are_created(cluster):
    webhook = cluster.webhook
    old_bundle = (webhook.dir / "ca-bundle.txt").read_text().strip()
    fresh = certs(cluster.workdir / "rotated", "--ip", "127.0.0.1")
    created: list[str] = []
    failures: list[str] = []
    stop = threading.Event()
    www = www_dir(cluster.workdir, "rotation")

    def create_pods():
        while not stop.is_set():
            name = f"during-{len(created)}"
            done = cluster.plane.kubectl("apply", "-f", "-", check=False, input=yaml.safe_dump(
                bare_pod(name, simple_spec(cluster, www), labels={"rotation": "yes"})))
            (created if done.returncode == 0 else failures).append(name if done.returncode == 0 else done.stderr)

    def set_bundle(bundle: str) -> None:
        patch = [{"op": "replace", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": bundle} for i in (0, 1)]
        cluster.plane.kubectl("patch", "mutatingwebhookconfiguration", "probe-shim", "--type=json",
                              "-p", json.dumps(patch))

    creator = threading.Thread(target=create_pods)
    creator.start()
    try:
        cluster.wait_for("pods created before the rotation", lambda: len(created) >= 2, 60)
        # 1. the API server trusts both CAs; 2. the webhook's pair is swapped (key, then certificate: it reloads once
        # both changed); 3. the old CA goes.
        both = base64_join(old_bundle, (fresh / "ca-bundle.txt").read_text().strip())
        set_bundle(both)
        mark = len(created)
        cluster.wait_for("pods created with both CAs", lambda: len(created) >= mark + 2, 60)
        os.replace(fresh / "tls.key", webhook.dir / "tls.key.new")
        shutil.copy(fresh / "tls.crt", webhook.dir / "tls.crt.new")
        os.replace(webhook.dir / "tls.key.new", webhook.dir / "tls.key")
        os.replace(webhook.dir / "tls.crt.new", webhook.dir / "tls.crt")
        mark = len(created)
        cluster.wait_for("pods created on the new certificate", lambda: len(created) >= mark + 2, 60)
        set_bundle((fresh / "ca-bundle.txt").read_text().strip())
        mark = len(created)
        cluster.wait_for("pods created with the new CA alone", lambda: len(created) >= mark + 2, 60)
    finally:
        stop.set()
        creator.join(timeout=120)
    assert not failures, failures
    pods = cluster.pods(NS, "rotation=yes")
    assert sorted(p["metadata"]["name"] for p in pods) == sorted(created)
    assert [p["metadata"]["name"] for p in pods if not converted(p)] == []
    wait_pods(cluster, "every pod created during the rotation Ready", "rotation=yes", all_ready(len(created)))
    # The webhook loaded the new pair once, without a restart (read over TLS verified by the new CA).
    assert webhook_metric(webhook, fresh / "ca.crt", "probe_shim_webhook_certificate_reloads_total") == 1.0
    cluster.plane.kubectl("delete", "pods", "-n", NS, "-l", "rotation=yes", "--wait=true", timeout_s=180)


def test_probectl_doctor_is_ok_on_the_node(cluster):
    done = subprocess.run([sys.executable, "-m", "probectl.cli", "-r", f"unix://{cluster.shim.socket_path}",
                           "doctor", "--kubelet-pid", str(cluster.kubelet.proc.pid)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines and all(line.startswith("ok ") for line in lines if not line.startswith(" ")), done.stdout
    assert f"{NODE_LABEL}={NODE_LABEL_VALUE}" in done.stdout


def test_probectl_convert_reverse_of_a_live_pod_gives_back_its_probes(cluster, web):
    (pod, *_) = wait_pods(cluster, "web pods Ready", "app=web", lambda ps: len(ps) >= 1 and all(map(pod_ready, ps)))
    live = cluster.plane.kubectl("get", "pod", pod["metadata"]["name"], "-n", NS, "-o", "yaml").stdout
    done = subprocess.run([sys.executable, "-m", "probectl.cli", "convert", "--reverse", "-f", "-"], input=live,
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    reversed_pod = yaml.safe_load(done.stdout)
    # The Deployment's template as the API keeps it: never converted (the webhook sees Pods), defaulted as the pod.
    template = cluster.plane.get_json("deployment", "web", "-n", NS)["spec"]["template"]["spec"]
    for kind in ("initContainers", "containers"):
        for mine, theirs in zip(template[kind], reversed_pod["spec"][kind], strict=True):
            assert {h: theirs.get(h) for h in HANDLER_FIELDS} == {h: mine.get(h) for h in HANDLER_FIELDS}, mine["name"]
    assert ORIGINAL_HANDLERS_ANNOTATION not in reversed_pod["metadata"].get("annotations", {})
    assert not affinity_terms(reversed_pod)


def test_no_pod_of_the_opted_in_namespace_was_ever_bound_to_the_plain_node(cluster):
    """Over the whole module: the scheduler's Scheduled event of every pod ever created in the namespace."""
    scheduled = [e["message"] for e in cluster.plane.get_json("events", "-n", NS)["items"]
                 if e["reason"] == "Scheduled"]
    assert len(scheduled) >= 20
    assert [m for m in scheduled if not m.endswith(f" to {SHIM_NODE}")] == []


# --- helpers of the tests above ------------------------------------------------------------------------------------

def base64_join(*bundles: str) -> str:
    return base64.b64encode(b"".join(base64.b64decode(b) for b in bundles)).decode()


def webhook_metric(webhook, ca, name: str) -> float:
    status, body = webhook.get("/metrics", ca)
    assert status == 200
    for line in body.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name} in the webhook's metrics")
