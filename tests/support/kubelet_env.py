"""A real kubelet in front of any CRI endpoint, for end-to-end tests and the benchmark's "node" scenario.

Owns: finding the kubelet and crictl (`KUBELET_BIN` / `CRICTL_BIN`, else the build of `make k8s`, which
hack/build-kubernetes.sh keeps in its cache by version: `K8S_VERSION`, 1.37.2 by default); the kubelet's standalone
configuration (no API server: static pods from a folder, the read-only port
for `/pods` and `/metrics/probes`, ports of its own so that it never meets another kubelet); starting it in a
private mount namespace, so that it changes no host sysctl and writes nothing under /var/lib or /var/log; static
pod manifests written atomically (the kubelet's file source reads a half-written file and logs an error); asking
it for its pods and probe counters (read by tests/support/kubelet_views.py); and a stop that removes the pods
before the kubelet (a stopped kubelet leaves its containers running, as on a real node).

The kubelet kills every pod sandbox of the runtime it does not know (orphans), so a test that runs one must be
alone with its runtime: the e2e fixtures remove every sandbox before and after.
Free of pytest (the benchmark imports it): `unavailable_reason()` says why it cannot run here.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.kubelet_views import POLL_S, PodView, ReadinessRecorder, pod_views, probe_counts, readiness_changes
from tests.support.netns_env import REPO_ROOT

# Imported from here by bench/node.py and tests/unit/test_kubelet_env.py: the readings live in kubelet_views.
__all__ = ["KUBELET_VERSION", "NODE_NAME", "POLL_S", "KubeletPorts", "KubeletProcess", "ReadinessRecorder",
           "crictl_binary", "free_ports", "kubelet_config", "pod_views", "probe_counts", "readiness_changes",
           "kubelet_minor", "running_kubelet", "unavailable_reason"]

DEFAULT_KUBERNETES_VERSION = "1.37.2"  # what `make k8s` builds and the tests run by default (the newest release)
NODE_NAME = "node1"              # --hostname-override: static pods are named NAME-node1
KUBELET_VERSION = f"v{os.environ.get('K8S_VERSION') or DEFAULT_KUBERNETES_VERSION}"  # of the build found by default
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
HTTP_TIMEOUT_S = 5.0

# The host sysctls the kubelet's container manager sets (setupKernelTunables) and the values it wants: where the
# host's differ, the kubelet gets a private read-only file with its value, bound over the real one.
KERNEL_TUNABLES = {"vm/overcommit_memory": "1", "vm/panic_on_oom": "0", "kernel/panic": "10",
                   "kernel/panic_on_oops": "1", "kernel/keys/root_maxkeys": "1000000",
                   "kernel/keys/root_maxbytes": "25000000"}

# Runs in `unshare --mount --propagation private`: $1 the work dir, $2 the kubelet, the rest its flags.
_PRIVATE_MOUNTS = """\
set -e
dir=$1; kubelet=$2; shift 2
while read -r key value; do
  if [ "$(cat /proc/sys/$key)" != "$value" ]; then
    copy="$dir/sysctl/$(echo "$key" | tr / .)"
    echo "$value" > "$copy"
    mount --bind "$copy" "/proc/sys/$key" && mount -o remount,bind,ro "/proc/sys/$key"
  fi
done < "$dir/sysctl/wanted"
mount --bind "$dir/private/var-lib" /var/lib
mount --bind "$dir/private/var-log" /var/log
exec "$kubelet" "$@"
"""


def kubelet_minor() -> int:
    """The minor version of the kubelet the tests run (KUBELET_VERSION): 37 for v1.37.2."""
    return int(KUBELET_VERSION.split(".")[1])


def kubernetes_build_dir() -> Path:
    """Where hack/build-kubernetes.sh puts the binaries of K8S_VERSION (its cache, outside the work tree)."""
    cache = os.environ.get("K8S_CACHE_DIR") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cri-probe-shim" / "kubernetes"
    return Path(cache) / KUBELET_VERSION


def kubelet_binary() -> Path:
    return Path(os.environ.get("KUBELET_BIN") or kubernetes_build_dir() / "kubelet")


@functools.cache
def delegating_kubelet_binary() -> Path | None:
    """The kubelet with the project's patch series (kubelet/, gate CRIProbeDelegation), as
    hack/build-kubelet-delegating.sh built it into its cache (`make go-binaries`, before the tests run); None when it
    has not. Asked of the script once per process (it hashes the series to find the cache entry)."""
    done = subprocess.run([str(REPO_ROOT / "hack" / "build-kubelet-delegating.sh"), "--path"], capture_output=True,
                          text=True, timeout=120)
    path = Path(done.stdout.strip())
    return path if done.returncode == 0 and os.access(path, os.X_OK) else None


def delegation_unavailable_reason(runtime) -> str | None:
    """Why the delegating kubelet cannot run here on this containerd (a Runtime), or None."""
    reason = unavailable_reason()
    if reason is not None:
        return reason
    if delegating_kubelet_binary() is None:
        return "needs the delegating kubelet (hack/build-kubelet-delegating.sh, `make go-binaries`): not built"
    if not runtime.supports_kubelet(kubelet_minor()):
        return f"kubelet {KUBELET_VERSION} does not support containerd {runtime.version}"
    return None


def crictl_binary() -> Path:
    return Path(os.environ.get("CRICTL_BIN") or kubernetes_build_dir() / "crictl")


def unavailable_reason() -> str | None:
    """Why a real kubelet cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root to run a kubelet"
    binary = kubelet_binary()
    if not os.access(binary, os.X_OK):
        return (f"needs a kubelet binary ({KUBELET_VERSION}): none at {binary}; `make k8s` builds it (Go and "
                "the Go module proxy), or set KUBELET_BIN to one")
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return "needs util-linux's unshare and mount (a private mount namespace for the kubelet)"
    return None


def free_ports(count: int) -> list[int]:
    """Ports nothing on 127.0.0.1 listens on now, all different (held open together while chosen)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def kubelet_config(workdir: Path, endpoint: str, ports: "KubeletPorts", client_ca: Path | None = None,
                   feature_gates: Mapping[str, bool] | None = None) -> dict:
    """A KubeletConfiguration for a kubelet on a test machine: no cgroup hierarchy of its own, no iptables, nothing
    bound beyond 127.0.0.1. Standalone (no client_ca): anonymous read access (the tests read /pods and
    /metrics/probes). Registered with an API server (client_ca, the cluster's CA): its HTTPS port as a cluster's
    kubelet serves it, x509 and token authentication and the API server's authorization; the read-only port stays."""
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "staticPodPath": str(workdir / "manifests"),
        "fileCheckFrequency": "1s",   # a manifest written or removed is picked up within a second
        "syncFrequency": "5s",
        "containerRuntimeEndpoint": endpoint,
        "imageServiceEndpoint": endpoint,
        "failSwapOn": False,
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "localStorageCapacityIsolation": False,
        "makeIPTablesUtilChains": False,
        "protectKernelDefaults": False,
        "podLogsDir": str(workdir / "pod-logs"),
        "volumePluginDir": str(workdir / "volume-plugins"),
        "resolvConf": "/etc/resolv.conf",
        "address": "127.0.0.1",
        "port": ports.https,
        "readOnlyPort": ports.read_only,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": ports.healthz,
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        # From 1.35 a kubelet refuses cgroup v1 unless told (KEP-5573): these machines mount v1 (a node on cgroup v2,
        # most of them, needs nothing). 1.31-1.34 know the field with false as its default.
        "failCgroupV1": False,
        # Image garbage collection would delete the locally imported test images (there is no registry).
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
    }
    if feature_gates:
        config["featureGates"] = dict(feature_gates)
    if client_ca is not None:
        config["authentication"] = {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                                    "x509": {"clientCAFile": str(client_ca)}}
        config["authorization"] = {"mode": "Webhook"}
    return config


@dataclass(frozen=True)
class KubeletPorts:
    read_only: int
    https: int
    healthz: int

    @classmethod
    def free(cls) -> "KubeletPorts":
        return cls(*free_ports(3))


# --- the process --------------------------------------------------------------------------------------------------

@dataclass
class KubeletProcess:
    """One kubelet in `workdir`, talking CRI to `endpoint`; static pods go into workdir/manifests. Standalone unless
    given a kubeconfig (and the cluster's CA): then it registers as Node `node_name` and runs the API's pods too."""

    workdir: Path
    endpoint: str
    node_labels: Mapping[str, str] = field(default_factory=dict)
    ports: KubeletPorts = field(default_factory=KubeletPorts.free)
    proc: subprocess.Popen | None = None
    node_name: str = NODE_NAME
    kubeconfig: Path | None = None
    client_ca: Path | None = None
    binary: Path | None = None          # another build (the delegating kubelet), else kubelet_binary()
    feature_gates: Mapping[str, bool] = field(default_factory=dict)

    @property
    def manifests(self) -> Path:
        return self.workdir / "manifests"

    @property
    def log_path(self) -> Path:
        return self.workdir / "kubelet.log"

    def start(self) -> "KubeletProcess":
        for sub in ("manifests", "pod-logs", "volume-plugins", "root", "sysctl", "private/var-lib",
                    "private/var-log"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        (self.workdir / "kubelet.json").write_text(json.dumps(kubelet_config(self.workdir, self.endpoint,
                                                                             self.ports, self.client_ca,
                                                                             self.feature_gates), indent=2))
        (self.workdir / "sysctl" / "wanted").write_text("".join(f"{k} {v}\n" for k, v in KERNEL_TUNABLES.items()))
        flags = [f"--config={self.workdir / 'kubelet.json'}", f"--root-dir={self.workdir / 'root'}",
                 f"--cert-dir={self.workdir / 'root' / 'pki'}", f"--hostname-override={self.node_name}", "-v=2",
                 # Its events too (client-go record/event.go logs each at V(3)): a standalone kubelet has no API
                 # server to send them to, and the tests read them in its log.
                 "--vmodule=event=3"]
        if self.kubeconfig is not None:
            flags.append(f"--kubeconfig={self.kubeconfig}")
        if self.node_labels:
            flags.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in self.node_labels.items()))
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", _PRIVATE_MOUNTS, "kubelet",
                 str(self.workdir), str(self.binary or kubelet_binary()), *flags],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"the kubelet did not come up (exit {self.proc.returncode}):\n{self.log_tail()}")
            time.sleep(POLL_S)  # its healthz port has no event to wait on
        return self

    def _healthy(self) -> bool:
        with contextlib.suppress(OSError, urllib.error.URLError):
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports.healthz}/healthz", timeout=1) as answer:
                return answer.status == 200
        return False

    def log_tail(self, lines: int = 80) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    # --- static pods ---

    def write_manifest(self, name: str, text: str) -> None:
        """Atomically (a dot file renamed into place: the kubelet skips dot files)."""
        staging = self.manifests / f".{name}.staging"
        staging.write_text(text)
        staging.rename(self.manifests / f"{name}.yaml")

    def remove_manifest(self, name: str) -> None:
        (self.manifests / f"{name}.yaml").unlink(missing_ok=True)

    def manifest_names(self) -> list[str]:
        return sorted(p.stem for p in self.manifests.glob("*.yaml"))

    # --- what it says ---

    def _get(self, path: str, port: int | None = None) -> bytes:
        url = f"http://127.0.0.1:{port or self.ports.read_only}{path}"
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as answer:
            return answer.read()

    def pods(self) -> dict[str, PodView]:
        return pod_views(json.loads(self._get("/pods")))

    def probe_counts(self) -> dict[tuple[str, str, str, str], float]:
        return probe_counts(self._get("/metrics/probes").decode())

    def wait_for(self, what: str, condition: Callable[[dict[str, PodView]], bool],
                 timeout_s: float = 60.0) -> dict[str, PodView]:
        """Polls /pods until condition(pods) holds; returns those pods. The read-only port has no watch."""
        deadline = time.monotonic() + timeout_s
        pods: dict[str, PodView] = {}
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the kubelet exited ({self.proc.returncode}) waiting for {what}:\n"
                                     f"{self.log_tail()}")
            pods = self.pods()
            if condition(pods):
                return pods
            time.sleep(POLL_S)
        raise AssertionError(f"no {what} within {timeout_s:g}s; the kubelet's pods: {pods}\n{self.log_tail(40)}")

    def wait_for_counts(self, what: str, condition: Callable[[dict], bool], timeout_s: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout_s
        counts: dict = {}
        while time.monotonic() < deadline:
            counts = self.probe_counts()
            if condition(counts):
                return counts
            time.sleep(POLL_S)
        raise AssertionError(f"no {what} within {timeout_s:g}s; prober_probe_total: {counts}")

    # --- stop ---

    def remove_all_pods(self, pods_gone: Callable[[], bool], timeout_s: float = 60.0) -> None:
        """Removes every manifest and waits until pods_gone() (the caller asks the runtime: the kubelet drops a
        pod from /pods as soon as its file is gone, before its containers are stopped)."""
        for name in self.manifest_names():
            self.remove_manifest(name)
        deadline = time.monotonic() + timeout_s
        while not pods_gone():
            if time.monotonic() > deadline:
                raise AssertionError(f"the kubelet did not stop its pods within {timeout_s:g}s:\n{self.log_tail()}")
            time.sleep(POLL_S)

    def stop(self) -> int:
        """SIGTERM, as systemd stops it; its containers keep running (remove the pods first)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@contextlib.contextmanager
def running_kubelet(workdir: Path, endpoint: str, **options) -> Iterator[KubeletProcess]:
    kubelet = KubeletProcess(workdir, endpoint, **options).start()
    try:
        yield kubelet
    finally:
        kubelet.stop()
