"""The node of the real-kubelet tests (tests/e2e/test_real_kubelet.py): the suite's containerd, a shim in front of it
and a real kubelet whose CRI endpoint is the shim; and the static pods they run.

Owns: `Node` (restarting the shim on the same socket and state dir, the directory each pod's httpd serves with its
hook-recording CGI script, writing a static pod through the real `probectl convert`, a pod's netns and running
sandboxes as containerd reports them, waiting until pods are Ready, removing them all); and the manifest builders
(busybox httpd containers serving that directory, static pods, httpGet handlers, probes at PERIOD_S).
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from tests.support import kubelet_env
from tests.support.containerd_env import ContainerdEnv
from tests.support.cri_client import sandbox_network
from tests.support.daemon_env import DaemonProcess
from tests.support.kubelet_env import NODE_NAME, KubeletProcess
from tests.support.netns_env import REPO_ROOT

HTTP_PORT = 8080
GRPC_PORT = 9090
PERIOD_S = 1
READY_TIMEOUT_S = 90     # a pod's sandbox, containers and first probes on a busy machine

# A CGI script in the served directory: records each hook's query, User-Agent, time and pod (its hostname is the
# pod's name) with the pod's busybox.
RECORD_CGI = """#!/bin/sh
echo "$QUERY_STRING $HTTP_USER_AGENT $(/bin/busybox date +%s) $(/bin/busybox hostname)" >> /www/hooks.log
printf 'Content-Type: text/plain\\r\\n\\r\\nrecorded\\n'
"""


# --- the node: containerd, the shim, the kubelet ----------------------------------------------------------------

@dataclass
class Node:
    containerd: ContainerdEnv
    shim: DaemonProcess
    kubelet: KubeletProcess
    workdir: Path

    def start_shim(self) -> DaemonProcess:
        """A new daemon on the same socket and state dir (a restart: it adopts the running workers)."""
        self.shim = DaemonProcess(self.workdir / "shim", ["--runtime-endpoint", self.containerd.endpoint,
                                                          "--reconcile-interval", "0.5"]).start()
        return self.shim

    def www(self, pod: str) -> Path:
        return www_dir(self.workdir, pod)

    def apply(self, pod: dict, *, convert: bool = True) -> str:
        """Writes the static pod, through the real `probectl convert` unless convert=False; returns its name as the
        kubelet shows it (NAME-node1)."""
        text = yaml.safe_dump(pod, sort_keys=False)
        if convert:
            done = subprocess.run([sys.executable, "-m", "probectl.cli", "convert", "-f", "-"], input=text,
                                  cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            text = done.stdout
        self.kubelet.write_manifest(pod["metadata"]["name"], text)
        return f"{pod['metadata']['name']}-{NODE_NAME}"

    def netns_of(self, pod_name: str, timeout_s: float = READY_TIMEOUT_S) -> str:
        """The pod's netns path, once its sandbox runs (asked of containerd directly)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for sandbox in self.containerd.cri.list_sandboxes():
                if sandbox.metadata.name == pod_name and sandbox.state == cri_pb.SANDBOX_READY:
                    return sandbox_network(self.containerd.cri.sandbox_status(sandbox.id)).netns_path
            time.sleep(kubelet_env.POLL_S)
        raise AssertionError(f"no running sandbox for {pod_name} within {timeout_s:g}s")

    def running_sandboxes(self) -> list[str]:
        return [s.metadata.name for s in self.containerd.cri.list_sandboxes() if s.state == cri_pb.SANDBOX_READY]

    def wait_ready(self, *names: str) -> dict:
        return self.kubelet.wait_for(f"{', '.join(names)} Ready",
                                     lambda pods: all(n in pods and pods[n].ready for n in names), READY_TIMEOUT_S)

    def remove_pods(self) -> None:
        self.kubelet.remove_all_pods(pods_gone=lambda: not self.running_sandboxes(), timeout_s=READY_TIMEOUT_S)


@contextlib.contextmanager
def running_node(containerd: ContainerdEnv, prefix: str, **kubelet_options) -> Iterator[Node]:
    """A node of its own: every sandbox removed first (the kubelet kills those it does not know), a shim, then a
    kubelet whose CRI endpoint is the shim (kubelet_options: KubeletProcess's); its pods removed, the kubelet and the
    shim stopped and every sandbox removed after.

    Under containerd's session dir, not pytest's: the suite's reaper of orphaned zygotes (tests/conftest.py) must not
    take the workers a node's daemons hand over to each other; the session's teardown kills all. A directory per node
    (prefix): several modules run a node in the same session."""
    containerd.remove_all_sandboxes()
    workdir = Path(tempfile.mkdtemp(prefix=prefix, dir=containerd.session.path()))
    (workdir / "shim").mkdir()
    node = Node(containerd, None, None, workdir)  # type: ignore[arg-type]
    node.start_shim()
    try:
        node.kubelet = KubeletProcess(workdir / "kubelet", f"unix://{node.shim.socket_path}",
                                      **kubelet_options).start()
        yield node
    finally:
        try:
            if node.kubelet is not None:
                node.remove_pods()
        finally:
            if node.kubelet is not None:
                node.kubelet.stop()
            node.shim.stop()
            containerd.remove_all_sandboxes()


# --- the fault scenario (a shim killed or absent, containerd restarted: nothing may flip) ----------------------------

def fault_pods(node: Node, *, convert: bool) -> list[str]:
    """Readiness and liveness on the pod IP, readiness on the pod's own 127.0.0.1, TCP readiness: one pod each."""
    image = node.containerd.images.http
    return [
        node.apply(static_pod("f-http", node.www("f-http"), [
            httpd("web", image, readinessProbe=probe(http_get()), livenessProbe=probe(http_get()))]), convert=convert),
        node.apply(static_pod("f-loopback", node.www("f-loopback"), [
            httpd("web", image, listen=f"127.0.0.1:{HTTP_PORT}", readinessProbe=probe(http_get(host="127.0.0.1")))]),
            convert=convert),
        node.apply(static_pod("f-tcp", node.www("f-tcp"), [
            httpd("web", image, readinessProbe=probe({"tcpSocket": {"port": HTTP_PORT}}))]), convert=convert),
    ]


def probe_count(counts: dict, pod: str, container: str, probe_type: str, result: str) -> float:
    """One series of the kubelet's prober_probe_total (KubeletProcess.probe_counts)."""
    return counts.get((pod, container, probe_type, result), 0.0)


def wait_probes_answered(node: Node, names: list[str], what: str) -> None:
    """Every pod's readiness probe (container `web`) succeeds twice more, as the kubelet counts it."""
    before = node.kubelet.probe_counts()
    node.kubelet.wait_for_counts(f"probes answered after {what}", lambda c: all(
        probe_count(c, n, "web", "Readiness", "successful") >=
        probe_count(before, n, "web", "Readiness", "successful") + 2 for n in names), timeout_s=60)


def kill_and_stop_the_shim(node: Node, names: list[str], gap_s: float) -> None:
    """A kill -9 of the shim and a new one; then systemd's stop (SIGTERM: the workers are handed over), gap_s without
    any shim (the fault itself), and a new one: each time until the pods' probes are answered again."""
    node.shim.crash()
    node.start_shim()
    wait_probes_answered(node, names, "a kill -9 of the shim")
    node.shim.stop(signal.SIGTERM)
    time.sleep(gap_s)
    node.start_shim()
    wait_probes_answered(node, names, f"a SIGTERM and {gap_s:g} s without a shim")


def restart_containerd(node: Node, names: list[str]) -> None:
    node.containerd.stop_containerd()
    node.containerd.start_containerd()
    wait_probes_answered(node, names, "a containerd restart")


def www_dir(root: Path, name: str) -> Path:
    """The directory a pod's httpd serves (a hostPath) under root/www: healthz and the hook-recording CGI script are
    there from the start (written once: a test removes healthz to make the endpoint fail)."""
    path = root / "www" / name
    if not path.exists():
        (path / "cgi-bin").mkdir(parents=True)
        (path / "healthz").write_text("ok\n")
        (path / "cgi-bin" / "record").write_text(RECORD_CGI)
        (path / "cgi-bin" / "record").chmod(0o755)
    return path


# --- manifests ---------------------------------------------------------------------------------------------------

def httpd(name: str, image: str, *, listen: str = str(HTTP_PORT), **fields) -> dict:
    """A container serving /www (the test's directory) with busybox httpd on `listen` ([IP:]PORT)."""
    return {"name": name, "image": image, "imagePullPolicy": "Never",
            "command": ["/bin/busybox", "httpd", "-f", "-p", listen, "-h", "/www"],
            "volumeMounts": [{"name": "www", "mountPath": "/www"}], **fields}


def static_pod(name: str, www: Path, containers: list[dict], *, grace_s: int = 1, **spec) -> dict:
    # busybox as PID 1 ignores SIGTERM: a short grace period keeps every kill (liveness, removal) short.
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"terminationGracePeriodSeconds": grace_s, "containers": containers,
                     "volumes": [{"name": "www", "hostPath": {"path": str(www), "type": "Directory"}}], **spec}}


def http_get(port: int = HTTP_PORT, path: str = "/healthz", **fields) -> dict:
    return {"httpGet": {"path": path, "port": port, **fields}}


def probe(handler: dict, **timing) -> dict:
    return {**handler, "periodSeconds": PERIOD_S, **timing}


def free_node_port() -> int:
    """A port nothing on the node's own loopback listens on (the kubelet's native probe of 127.0.0.1 lands there)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_refuses(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0
