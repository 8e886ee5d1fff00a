"""The one-machine cluster of tests/e2e/test_control_plane.py and the benchmark's pod_creation scenario: the control
plane (tests/support/control_plane.py), a shim in front of the suite's containerd, a real kubelet registered as Node
`node1` through the shim with the node label the kubelet drop-in sets, a second Node without it, and the admission
webhook as a host process registered from deploy/.

The second Node, `plain-node`, is a Node object with no kubelet behind it (a second kubelet would need a second
containerd and cgroup root on this one machine). `NodeHeartbeat` keeps it Ready as a kubelet would (its status and
its Lease), with room for 110 pods and more CPU and memory than node1, so the scheduler prefers it for any pod that
may go there: a converted pod's required node affinity is the only thing keeping converted pods off it. Pods that
must run unconverted name node1 in a nodeSelector, since nothing would run them on plain-node.

The webhook is registered from `kubectl kustomize deploy/` with two changes, both in `webhook_manifests`: its
Deployment is left out (the webhook runs here as a host process, `probe-shim webhook serve`), and each webhook's
clientConfig names it by `url: https://127.0.0.1:PORT/mutate` instead of the Service (the API server would call the
Service's cluster IP, which nothing routes here; an EndpointSlice cannot hold 127.0.0.1), with the CA of
`probe-shim webhook certs --ip 127.0.0.1` as caBundle.

Free of pytest (the benchmark imports it).
"""

from __future__ import annotations

import copy
import datetime
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from probe_api.rollout import CONVERT_LABEL, ENABLED, NODE_LABEL, NODE_LABEL_VALUE
from tests.support import kubelet_env
from tests.support.containerd_env import ContainerdEnv
from tests.support.containerd_session import TCP_PORT
from tests.support.control_plane import ApiClient, ApiError, ControlPlane
from tests.support.daemon_env import DaemonProcess
from tests.support.kubelet_env import KubeletProcess
from tests.support.kubelet_node import http_get, probe
from tests.support.netns_env import REPO_ROOT
from tests.support.oci_images import ImageDef, go_arch
from tests.support.webhook_env import Webhook

SHIM_NODE = "node1"
PLAIN_NODE = "plain-node"
HTTP_PORT, LOCAL_PORT, GRPC_PORT = 8080, 8081, 9090
HEARTBEAT_S = 10.0          # a kubelet renews its Lease every 10 s (a quarter of its 40 s duration)
LEASE_DURATION_S = 40
NODE_READY_TIMEOUT_S = 120.0
POLL_S = 0.25


def grpc_image(token: str) -> ImageDef:
    return ImageDef(f"probe-e2e.local/grpc-health:{token}", ("/bin/grpc-health",))


def build_workloads() -> Path:
    """The directory of the Go workloads (hack/build-test-workloads.sh builds them unless built)."""
    done = subprocess.run([str(REPO_ROOT / "hack" / "build-test-workloads.sh")], capture_output=True, text=True,
                          timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"hack/build-test-workloads.sh failed: {done.stderr.strip()}")
    return Path(done.stdout.strip().splitlines()[-1])


def now_micro() -> str:
    """A MicroTime as the API writes it (a Lease's renewTime)."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def now_seconds() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- the second node ---------------------------------------------------------------------------------------------

def plain_node_status() -> dict:
    resources = {"cpu": "64", "memory": "256Gi", "pods": "110", "ephemeral-storage": "1Ti"}
    return {"status": {
        "capacity": resources, "allocatable": resources,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "kept Ready by the test (no kubelet behind this Node)",
                        "lastHeartbeatTime": now_seconds(), "lastTransitionTime": now_seconds()}],
        "nodeInfo": {"kubeletVersion": kubelet_env.KUBELET_VERSION, "operatingSystem": "linux",
                     "architecture": go_arch()}}}


@dataclass
class NodeHeartbeat:
    """Keeps a kubelet-less Node Ready as a kubelet does: its Ready status and its Lease renewed every HEARTBEAT_S
    (the node lifecycle controller marks a Node Unknown and taints it when neither is fresh)."""

    api: ApiClient
    name: str
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    errors: list[str] = field(default_factory=list)

    def start(self) -> "NodeHeartbeat":
        self.api.request("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": self.name, "labels": {"kubernetes.io/hostname": self.name, "kubernetes.io/os": "linux",
                                          "kubernetes.io/arch": go_arch()}}})
        self.api.request("POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": self.name},
            "spec": {"holderIdentity": self.name, "leaseDurationSeconds": LEASE_DURATION_S,
                     "renewTime": now_micro()}})
        self._beat()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{self.name}", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        self.api.request("PATCH", f"/api/v1/nodes/{self.name}/status", plain_node_status(),
                         content_type="application/strategic-merge-patch+json")
        self.api.request("PATCH", f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.name}",
                         {"spec": {"renewTime": now_micro()}}, content_type="application/merge-patch+json")

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self._beat()
            except (OSError, ApiError) as exc:  # said at the end: a test reading the node sees it too
                self.errors.append(str(exc))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)


# --- the webhook, registered from deploy/ ------------------------------------------------------------------------

def webhook_manifests(kustomized: str, ca_bundle: str, url: str) -> list[dict]:
    """deploy/ as `kubectl kustomize` renders it, changed only as this machine needs: no Deployment (the webhook
    runs as a host process) and every webhook's clientConfig by `url` with the test's CA instead of the Service."""
    docs = []
    for doc in yaml.safe_load_all(kustomized):
        if not doc or doc["kind"] == "Deployment":
            continue
        if doc["kind"] == "MutatingWebhookConfiguration":
            doc = copy.deepcopy(doc)
            for webhook in doc["webhooks"]:
                webhook["clientConfig"] = {"url": url, "caBundle": ca_bundle}
        docs.append(doc)
    return docs


# --- the cluster ---------------------------------------------------------------------------------------------------

@dataclass
class Cluster:
    containerd: ContainerdEnv
    workdir: Path
    plane: ControlPlane
    shim: DaemonProcess | None = None
    kubelet: KubeletProcess | None = None
    heartbeat: NodeHeartbeat | None = None
    webhook: Webhook | None = None
    images: dict[str, str] = field(default_factory=dict)

    # --- start ---

    @classmethod
    def start(cls, containerd: ContainerdEnv) -> "Cluster":
        workdir = Path(tempfile.mkdtemp(prefix="cluster-", dir=containerd.session.path()))
        cluster = cls(containerd, workdir, ControlPlane(workdir / "control-plane"))
        try:
            cluster.plane.start()
            cluster._start_node()
            cluster.heartbeat = NodeHeartbeat(cluster.plane.api(), PLAIN_NODE).start()
            cluster._import_images()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _start_node(self) -> None:
        (self.workdir / "shim").mkdir()
        self.start_shim()
        plane = self.plane
        kubeconfig = plane.client_kubeconfig(f"node-{SHIM_NODE}", f"system:node:{SHIM_NODE}", ("system:nodes",))
        self.kubelet = KubeletProcess(self.workdir / "kubelet", f"unix://{self.shim.socket_path}",
                                      node_labels={NODE_LABEL: NODE_LABEL_VALUE}, node_name=SHIM_NODE,
                                      kubeconfig=kubeconfig, client_ca=plane.pki.ca_cert).start()
        # Not found until the kubelet has registered it.
        self.wait_for(f"Node {SHIM_NODE} registered and Ready", lambda: _node_ready(plane.api(), SHIM_NODE),
                      NODE_READY_TIMEOUT_S)

    def start_shim(self) -> DaemonProcess:
        """The shim on its socket and state dir (again: a restart that adopts its running workers)."""
        self.shim = DaemonProcess(self.workdir / "shim", ["--runtime-endpoint", self.containerd.endpoint,
                                                          "--reconcile-interval", "0.5"]).start()
        return self.shim

    def _import_images(self) -> None:
        workloads = build_workloads()
        grpc = grpc_image(self.containerd.images.token)
        grpc = ImageDef(grpc.name, grpc.entrypoint, extra_files={"bin/grpc-health": (workloads / "grpc-health")
                                                                 .read_bytes()}, extra_executables=("bin/grpc-health",))
        self.containerd.import_images([grpc])
        self.images = {"http": self.containerd.images.http, "tcp": self.containerd.images.tcp, "grpc": grpc.name}

    # --- the webhook ---

    def start_webhook(self) -> Webhook:
        self.webhook = Webhook(self.workdir / "webhook", cert_args=("--ip", "127.0.0.1"))
        return self.webhook

    def register_webhook(self) -> None:
        kustomized = self.plane.kubectl("kustomize", str(REPO_ROOT / "deploy")).stdout
        bundle = (self.webhook.dir / "ca-bundle.txt").read_text().strip()
        docs = webhook_manifests(kustomized, bundle, f"https://127.0.0.1:{self.webhook.port}/mutate")
        self.plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))

    def stop_webhook(self) -> None:
        if self.webhook is not None:
            self.webhook.stop()
            self.webhook = None

    # --- readings ---

    def wait_for(self, what: str, condition: Callable[[], object], timeout_s: float = 120.0):
        deadline = time.monotonic() + timeout_s
        while True:
            value = condition()
            if value:
                return value
            if self.kubelet is not None and self.kubelet.proc.poll() is not None:
                raise AssertionError(f"the kubelet exited waiting for {what}:\n{self.kubelet.log_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} within {timeout_s:g}s\n{self.diagnostics()}")
            time.sleep(POLL_S)  # the API has watches, but a poll of its state is what a test asserts on

    def running_sandboxes(self) -> list[str]:
        """The pod sandboxes containerd runs (the kubelet stops a deleted pod's at once, and removes it only at its
        next garbage collection, a minute later)."""
        return [s.metadata.name for s in self.containerd.cri.list_sandboxes() if s.state == cri_pb.SANDBOX_READY]

    def pods(self, namespace: str, selector: str | None = None) -> list[dict]:
        args = ["pods", "-n", namespace] + (["-l", selector] if selector else [])
        return self.plane.get_json(*args)["items"]

    def diagnostics(self) -> str:
        pods = self.plane.kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout
        nodes = self.plane.kubectl("get", "nodes", "-o", "wide", "--show-labels", check=False).stdout
        kubelet = self.kubelet.log_tail(30) if self.kubelet is not None else ""
        return f"{nodes}\n{pods}\n--- kubelet ---\n{kubelet}\n{self.plane.log_tails(10)}"

    # --- stop ---

    def stop(self) -> list[str]:
        """Removes every pod through the API first (the kubelet stops them), then stops each process; returns
        what did not stop cleanly."""
        problems: list[str] = []
        if self.heartbeat is not None:
            self.heartbeat.stop()
            problems += [f"plain-node heartbeat: {e}" for e in self.heartbeat.errors]
        if self.kubelet is not None and self.kubelet.proc is not None and self.kubelet.proc.poll() is None:
            # The workloads first (their controllers would make new pods), then every pod.
            for kind in ("deployments", "replicasets", "pods"):
                self.plane.kubectl("delete", kind, "--all", "--all-namespaces", "--grace-period=1", "--wait=false",
                                   check=False)
            try:
                self.wait_for("every pod sandbox stopped", lambda: not self.running_sandboxes(), 120)
            except AssertionError as exc:
                problems.append(str(exc)[:2000])
            code = self.kubelet.stop()
            if code not in (0, None):
                problems.append(f"kubelet exited {code}")
        self.stop_webhook()
        if self.shim is not None and self.shim.proc is not None:
            code = self.shim.stop()
            if code != 0:
                problems.append(f"shim exited {code}")
        problems += self.plane.stop()
        self.containerd.remove_all_sandboxes()
        return problems


def _node_ready(api: ApiClient, name: str) -> bool:
    try:
        return node_ready(api.get(f"/api/v1/nodes/{name}"))
    except ApiError as exc:
        if exc.status == 404:
            return False
        raise


def node_ready(node: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node.get("status", {}).get("conditions", []))


def pod_ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


# --- manifests ---------------------------------------------------------------------------------------------------

def opted_in_namespace(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {CONVERT_LABEL: ENABLED}}}


def web_pod_spec(images: dict[str, str], www: Path, *, grace_s: int = 5) -> dict:
    """Every kind of network probe and hook a pod has: HTTP readiness on the pod IP (web) and on the pod's own
    127.0.0.1 (local), TCP (tcp) and gRPC (grpc) readiness, a startup and a liveness probe (web), and postStart and
    preStop httpGet hooks (app, started once the web sidecar's startup probe passed)."""
    httpd = ["/bin/busybox", "httpd", "-f", "-h", "/www", "-p"]
    mount = [{"name": "www", "mountPath": "/www"}]
    return {
        "terminationGracePeriodSeconds": grace_s,
        # A sidecar: the kubelet starts the main containers (and so app's postStart hook) once its startup probe
        # passed, so the hook finds the server listening.
        "initContainers": [{
            "name": "web", "image": images["http"], "imagePullPolicy": "Never", "restartPolicy": "Always",
            "command": httpd + [str(HTTP_PORT)], "volumeMounts": mount,
            "startupProbe": probe(http_get(HTTP_PORT), failureThreshold=30),
            "readinessProbe": probe(http_get(HTTP_PORT)),
            "livenessProbe": probe(http_get(HTTP_PORT), periodSeconds=2, failureThreshold=3)}],
        "containers": [
            {"name": "app", "image": images["http"], "imagePullPolicy": "Never",
             "command": ["/bin/busybox", "sleep", "2147483647"],
             "lifecycle": {"postStart": http_get(HTTP_PORT, "/cgi-bin/record?hook=postStart"),
                           "preStop": http_get(HTTP_PORT, "/cgi-bin/record?hook=preStop")}},
            {"name": "local", "image": images["http"], "imagePullPolicy": "Never",
             "command": httpd + [f"127.0.0.1:{LOCAL_PORT}"], "volumeMounts": mount,
             "readinessProbe": probe(http_get(LOCAL_PORT, host="127.0.0.1"))},
            {"name": "tcp", "image": images["tcp"], "imagePullPolicy": "Never",
             "readinessProbe": probe({"tcpSocket": {"port": TCP_PORT}})},
            {"name": "grpc", "image": images["grpc"], "imagePullPolicy": "Never",
             "command": ["/bin/grpc-health", f"-listen=:{GRPC_PORT}"],
             "readinessProbe": probe({"grpc": {"port": GRPC_PORT}})},
        ],
        "volumes": [{"name": "www", "hostPath": {"path": str(www), "type": "Directory"}}],
    }


def deployment(name: str, namespace: str, replicas: int, pod_spec: dict, labels: dict | None = None) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name, **(labels or {})}}, "spec": pod_spec}}}
