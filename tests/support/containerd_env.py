"""A private, real containerd for end-to-end tests: the process, its readiness, its pods' configs, its teardown.

Owns: whether this machine can run one (Debian's containerd 1.6 or a containerd 2.x that hack/build-containerd.sh
built, Debian's runc, CNI plugins and busybox-static; it installs nothing); creating a session (tests/support/containerd_session.py names it) and starting containerd on its private
config, waiting (bounded) until its CRI reports RuntimeReady and NetworkReady; importing the test images
(tests/support/oci_images.py); the sandbox and container configs the kubelet would send; restarting containerd
alone (tests/hardening/test_containerd_restart.py); and a teardown that runs every step even when one fails: pod
sandboxes stopped and removed over CRI before containerd stops, then containerd, and the host cleanup
(tests/support/containerd_cleanup.py). The CRI client is tests/support/cri_client.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NoReturn

import grpc

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from tests.support.containerd_cleanup import clean_host, recorded_sessions, session_alive, sessions_lock, \
    sweep_stale_sessions
from tests.support.containerd_session import (
    CNI_BIN_DIR, CNI_PLUGINS, CNI_RESULTS_DIR, HTTP_PORT, K8S_NAMESPACE, RUNC, SESSION_DIR_PREFIX, SESSION_FILE,
    SHIM_SOCKET_DIR, WORKDIR_ROOTS, Runtime, Session, TestImages, cni_conflist, containerd_config, free_subnet,
    image_defs, runtimes_from, workdir_root,
)
from tests.support.cri_client import CriClient, Kubelet, cri_channel
from tests.support.oci_images import is_static_elf, write_layout

# Imported from here by bench/ (bench/proxy_latency.py, bench/suite.py, bench/node.py).
__all__ = ["HTTP_PORT", "ContainerdEnv", "CriClient", "Kubelet", "Runtime", "cri_channel", "default_runtime",
           "running_containerd", "runtimes", "sweep_stale_sessions", "unavailable_reason"]

BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")
START_TIMEOUT_S = 60.0       # containerd up and its CRI ready; ~1 s when the machine is busy
STOP_TIMEOUT_S = 20.0
RECONCILE_INTERVAL_S = 0.5  # the shim's --reconcile-interval in the end-to-end tests


def runtimes() -> list[Runtime]:
    """The containerd releases the containerd tests run on (CONTAINERD_VERSIONS; else CONTAINERD_VERSION or the
    newest 2.x, then 1.6)."""
    return runtimes_from(os.environ.get("CONTAINERD_VERSIONS"), os.environ.get("CONTAINERD_VERSION"))


def default_runtime() -> Runtime:
    """The first of them: the runtime of the benchmark and of tests that need only one."""
    return runtimes()[0]


def unavailable_reason(runtime: Runtime | None = None) -> str | None:
    """Why the containerd end-to-end tests cannot run here on runtime (default_runtime()), or None."""
    runtime = runtime or default_runtime()
    if os.geteuid() != 0:
        return "needs root to run containerd"
    if runtime.bin_dir is not None:
        built = [runtime.bin_dir / name for name in ("containerd", "containerd-shim-runc-v2", "ctr")]
        if not all(os.access(path, os.X_OK) for path in built):
            return (f"needs containerd {runtime.version}: none in {runtime.bin_dir}; `make containerd` builds it "
                    "(Go and the Go module proxy)")
    tools = ("nsenter", "ip") if runtime.bin_dir else ("containerd", "ctr", "containerd-shim-runc-v2", "nsenter", "ip")
    missing = [tool for tool in tools if not shutil.which(tool)]
    if not os.access(RUNC, os.X_OK):
        missing.append(RUNC)
    missing += [f"{CNI_BIN_DIR}/{p}" for p in CNI_PLUGINS if not os.access(f"{CNI_BIN_DIR}/{p}", os.X_OK)]
    if missing:
        return ("needs Debian's containerd, runc and containernetworking-plugins "
                f"(`make test` installs them as root); missing: {', '.join(missing)}")
    if find_static_busybox() is None:
        return "needs a statically linked busybox for the test images (Debian package busybox-static)"
    return None


def find_static_busybox() -> str | None:
    for path in BUSYBOX_CANDIDATES:
        if os.path.isfile(path) and is_static_elf(path):
            return path
    return None



# --- the environment -------------------------------------------------------------------------

@dataclass
class ContainerdEnv:
    session: Session
    busybox: str
    images: TestImages | None = None
    proc: subprocess.Popen | None = None
    cri: CriClient | None = None
    _channel: grpc.Channel | None = None
    _shim_ids: set[str] = field(default_factory=set)

    @classmethod
    def create(cls, runtime: Runtime) -> "ContainerdEnv":
        root = workdir_root(WORKDIR_ROOTS, Path("/proc/self/mountinfo").read_text())
        host_dirs = (CNI_RESULTS_DIR, CNI_RESULTS_DIR.parent)
        if runtime.major < 2:  # 2.x is told to keep its shims' sockets in the session's directory
            host_dirs += (SHIM_SOCKET_DIR, SHIM_SOCKET_DIR.parent)
        new_dirs = [str(d) for d in host_dirs if not d.exists()]
        with sessions_lock():
            routes = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True,
                                    check=True, timeout=30).stdout
            claimed = [s.subnet for s in recorded_sessions(WORKDIR_ROOTS) if session_alive(s)]
            workdir = tempfile.mkdtemp(prefix=SESSION_DIR_PREFIX, dir=root)
            session = Session(workdir=workdir, token=secrets.token_hex(3), subnet=free_subnet(routes, claimed),
                              new_host_dirs=new_dirs, containerd=runtime.version)
            Path(session.path(SESSION_FILE)).write_text(json.dumps(asdict(session)))
        return cls(session=session, busybox=find_static_busybox() or BUSYBOX_CANDIDATES[0])

    @property
    def runtime(self) -> Runtime:
        return self.session.runtime

    @property
    def endpoint(self) -> str:
        return f"unix://{self.session.address}"

    def log_tail(self, lines: int = 60) -> str:
        with contextlib.suppress(OSError):
            text = Path(self.session.path("containerd.log")).read_text(errors="replace")
            return "\n".join(text.splitlines()[-lines:])
        return ""

    # --- start ---

    def start(self) -> "ContainerdEnv":
        s = self.session
        token = s.token
        defs = image_defs(token)
        self.images = TestImages(pause=defs[0].name, http=defs[1].name, tcp=defs[2].name, token=token)
        for d in ("root", "state", "opt", "runc", "logs", "cni/net.d", "cni/ipam"):
            os.makedirs(s.path(d), exist_ok=True)
        Path(s.path("config.toml")).write_text(containerd_config(s, self.images.pause))
        Path(s.path("cni", "net.d", "10-probe-e2e.conflist")).write_text(json.dumps(cni_conflist(s), indent=2))
        layout = write_layout(Path(s.path("images.tar")), defs, self.busybox)

        self._spawn()
        self._wait_ready()
        self._ctr("images", "import", str(layout))
        for image in (self.images.pause, self.images.http, self.images.tcp):
            self._wait_image(image)
        return self

    def import_images(self, defs: list) -> None:
        """More images (tests/support/oci_images.py ImageDefs) into the k8s.io namespace, as the session's own."""
        layout = write_layout(Path(self.session.path(f"images-{secrets.token_hex(3)}.tar")), defs, self.busybox)
        self._ctr("images", "import", str(layout))
        for image in defs:
            self._wait_image(image.name)

    def _spawn(self) -> None:
        with open(self.session.path("containerd.log"), "ab") as log:
            self.proc = subprocess.Popen([self.runtime.binary("containerd"), "--config", self.session.path("config.toml")],
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if self._channel is not None:
            self._channel.close()  # a fresh connection: the old one may be in reconnect backoff
        self._channel = cri_channel(self.endpoint)
        self.cri = CriClient(self._channel)

    # --- restart (tests/hardening/test_containerd_restart.py) ---

    def stop_containerd(self) -> None:
        """Stops the containerd process alone (SIGTERM), as `systemctl restart containerd` does (KillMode=process):
        its shims and the pods they run keep running."""
        self.proc.terminate()
        self.proc.wait(timeout=STOP_TIMEOUT_S)

    def start_containerd(self) -> None:
        """containerd again on the same config, root and state (after stop_containerd), ready when this returns."""
        self._spawn()
        self._wait_ready()

    def _ctr(self, *args: str) -> str:
        done = subprocess.run([self.runtime.binary("ctr"), "-a", self.session.address, "-n", K8S_NAMESPACE, *args],
                              capture_output=True, text=True, timeout=START_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)} failed: {done.stderr.strip()}\n{self.log_tail()}")
        return done.stdout

    def _until(self, what: str, check: Callable[[], bool]) -> None:
        """Polls a readiness check (each try bounded by its own timeout) until it holds or time runs out."""
        deadline = time.monotonic() + START_TIMEOUT_S
        last = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"containerd exited ({self.proc.returncode}) before {what}:\n{self.log_tail()}")
            try:
                if check():
                    return
            except grpc.RpcError as exc:
                last = f"{exc.code().name}: {exc.details()}"
            # A short pause between tries that also notices containerd exiting.
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=0.05)
        raise RuntimeError(f"containerd: no {what} within {START_TIMEOUT_S:g}s ({last})\n{self.log_tail()}")

    def _wait_ready(self) -> None:
        def ready() -> bool:
            status = self.cri.call("Status", cri_pb.StatusRequest(), timeout_s=2)
            conditions = {c.type: c.status for c in status.status.conditions}
            return conditions.get("RuntimeReady", False) and conditions.get("NetworkReady", False)
        self._until("CRI RuntimeReady and NetworkReady", ready)

    def _wait_image(self, image: str) -> None:
        # `ctr import` writes containerd's image store; the CRI plugin learns of it from an event.
        def known() -> bool:
            response = self.cri.call("ImageStatus", cri_pb.ImageStatusRequest(image=cri_pb.ImageSpec(image=image)),
                                     timeout_s=2)
            return response.HasField("image")
        self._until(f"image {image} in the CRI image store", known)

    # --- pods, as the kubelet asks for them ---

    def sandbox_config(self, name: str, namespace: str = "e2e", attempt: int = 0,
                       host_network: bool = False) -> cri_pb.PodSandboxConfig:
        """As the kubelet asks for a pod; `host_network`: a `hostNetwork: true` pod (network namespace NODE)."""
        uid = str(uuid.uuid4())
        log_dir = self.session.path("logs", f"{namespace}_{name}_{uid}")
        os.makedirs(log_dir, exist_ok=True)
        labels = {"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": namespace,
                  "io.kubernetes.pod.uid": uid, "probe-e2e": self.session.token}
        return cri_pb.PodSandboxConfig(
            metadata=cri_pb.PodSandboxMetadata(name=name, uid=uid, namespace=namespace, attempt=attempt),
            # A hostNetwork pod shares the node's UTS namespace too: runc refuses to set a hostname there.
            hostname="" if host_network else name, log_directory=log_dir, labels=labels,
            annotations={"kubernetes.io/config.source": "probe-e2e"},
            linux=cri_pb.LinuxPodSandboxConfig(
                cgroup_parent=self.session.cgroup_parent,
                security_context=cri_pb.LinuxSandboxSecurityContext(namespace_options=cri_pb.NamespaceOption(
                    network=cri_pb.NODE if host_network else cri_pb.POD, pid=cri_pb.CONTAINER, ipc=cri_pb.POD)),
            ),
        )

    def container_config(self, name: str, image: str, attempt: int = 0, *,
                         pod_config: cri_pb.PodSandboxConfig | None = None,
                         ports: Sequence[dict] = ()) -> cri_pb.ContainerConfig:
        """The labels and annotations the kubelet gives a container (pkg/kubelet/kuberuntime/labels.go,
        newContainerLabels and newContainerAnnotations): the pod's identity, the container's name, its restart
        count and, when it has any, its ports as the JSON of core/v1 ContainerPort (what the kubelet bridge
        resolves named ports from). `ports` are such dicts, e.g. {"name": "http", "containerPort": 8080,
        "protocol": "TCP"}."""
        labels = {"io.kubernetes.container.name": name}
        if pod_config is not None:
            meta = pod_config.metadata
            labels.update({"io.kubernetes.pod.name": meta.name, "io.kubernetes.pod.namespace": meta.namespace,
                           "io.kubernetes.pod.uid": meta.uid})
        annotations = {"io.kubernetes.container.restartCount": str(attempt)}
        if ports:
            annotations["io.kubernetes.container.ports"] = json.dumps(list(ports), separators=(",", ":"))
        return cri_pb.ContainerConfig(
            metadata=cri_pb.ContainerMetadata(name=name, attempt=attempt),
            image=cri_pb.ImageSpec(image=image),
            labels=labels,
            annotations=annotations,
            log_path=f"{name}/{attempt}.log",
        )

    def note_sandbox(self, sandbox_id: str) -> None:
        """Remembers a sandbox id so its shim socket can be removed if the shim leaves it behind."""
        self._shim_ids.add(sandbox_id)
        with contextlib.suppress(OSError):
            Path(self.session.path("shim-ids.json")).write_text(json.dumps(sorted(self._shim_ids)))

    def remove_all_sandboxes(self) -> list[str]:
        """Stops and removes every pod sandbox (directly at containerd); returns their ids."""
        ids = [s.id for s in self.cri.list_sandboxes()]
        for sandbox_id in ids:
            self.note_sandbox(sandbox_id)
            self.cri.stop_and_remove_sandbox(sandbox_id)
        return ids

    # --- teardown ---

    def stop(self) -> list[str]:
        """Tears everything down; returns what could not be cleaned (empty when all went well)."""
        errors: list[str] = []
        if self.proc is not None and self.proc.poll() is None and self.cri is not None:
            try:
                self.remove_all_sandboxes()  # before containerd stops: it would leave shims and pods running
            except Exception as exc:
                errors.append(f"removing pod sandboxes: {exc!r}")
        if self._channel is not None:
            self._channel.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                errors.append("containerd ignored SIGTERM; killed")
                self.proc.kill()
                self.proc.wait()
        clean_host(self.session, errors)
        return errors


@contextlib.contextmanager
def running_containerd(unavailable: Callable[[str], NoReturn], runtime: Runtime | None = None
                       ) -> Iterator[ContainerdEnv]:
    """A started private containerd, stopped on exit; fails the caller (an assertion) if the teardown left
    anything behind. Sweeps the leftovers of killed sessions first: their bridges and subnets would collide.
    Calls unavailable(reason) when this machine cannot run one (tests pass pytest.skip: this module stays free
    of pytest, the benchmarks import it)."""
    runtime = runtime or default_runtime()
    reason = unavailable_reason(runtime)
    if reason is not None:
        unavailable(reason)
    sweep_stale_sessions()
    env = ContainerdEnv.create(runtime)
    try:
        env.start()
    except BaseException:
        env.stop()  # a half-started containerd still has a bridge, mounts and processes to remove
        raise
    try:
        yield env
    except BaseException:
        env.stop()  # the caller failed (a benchmark's scenario): still nothing may be left running
        raise
    errors = env.stop()
    assert not errors, f"containerd teardown left things behind: {errors}"
