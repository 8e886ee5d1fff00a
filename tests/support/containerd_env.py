"""A private, real containerd for end-to-end tests, and a kubelet-like CRI client for it.

Owns: finding Debian's containerd, runc, CNI plugins and busybox-static (it installs nothing); the private
config (every setting ../shared/containerd-notes.md says this machine needs); starting containerd and waiting
(bounded) until its CRI reports RuntimeReady and NetworkReady; building and importing the test images
(tests/support/oci_images.py); and a teardown that runs every step even when one fails: pod sandboxes stopped and
removed over CRI before containerd stops, then containerd, its shims and pod processes, mounts under the
temp dir, the CNI bridge, and the leftovers containerd 1.6 puts outside its own directories
(/run/containerd/s sockets, /var/lib/cni/results entries, pod cgroups).

Every name is per session (network, bridge, cgroup parent, subnet): a stale session killed with SIGKILL
can neither collide with nor be confused with a live one; `sweep_stale_sessions` cleans such leftovers.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NoReturn

import grpc

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from tests.support.oci_images import ImageDef, is_static_elf, write_layout

CNI_BIN_DIR = "/usr/lib/cni"
CNI_PLUGINS = ("bridge", "loopback", "host-local")
RUNC = "/usr/sbin/runc"
BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")
K8S_NAMESPACE = "k8s.io"
SHIM_SOCKET_DIR = Path("/run/containerd/s")        # containerd 1.6 puts runc-v2 shim sockets here, always
CNI_RESULTS_DIR = Path("/var/lib/cni/results")     # libcni's result cache, always
CGROUP_ROOT = Path("/sys/fs/cgroup")
SESSION_DIR_PREFIX = "probe-shim-e2e-"
SESSION_FILE = "session.json"
START_TIMEOUT_S = 60.0       # containerd up and its CRI ready; ~1 s when the machine is busy
CRI_TIMEOUT_S = 60.0         # one CRI call; RunPodSandbox took 0.66 s on a busy machine
STOP_TIMEOUT_S = 20.0
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
HTTP_PORT, TCP_PORT = 8080, 9000
KUBELET_CRI_TIMEOUT_S = 120  # the kubelet's --runtime-request-timeout default (2m)
RECONCILE_INTERVAL_S = 0.5  # the shim's --reconcile-interval in the end-to-end tests
MNT_DETACH = 2
UNSTACKABLE_FS = ("overlay", "aufs")           # overlayfs cannot put its upper dir on these
WORKDIR_ROOTS = (tempfile.gettempdir(), "/var/tmp", "/dev/shm")


def unavailable_reason() -> str | None:
    """Why the containerd end-to-end tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root to run containerd"
    tools = ("containerd", "ctr", "containerd-shim-runc-v2", "nsenter", "ip")
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


def _start_ticks(pid: int) -> int:
    """A live process's start time (clock ticks after boot); 0 when it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0
    return 0 if fields[0] in ("Z", "X") else int(fields[19])  # state, ..., starttime (field 22 of stat)


# --- pure: names, config texts -------------------------------------------------------------

@dataclass(frozen=True)
class Session:
    """Everything that names this session's resources; written to SESSION_FILE for the stale sweep."""
    workdir: str
    token: str
    subnet: str
    owner_pid: int = field(default_factory=os.getpid)
    owner_started: int = field(default_factory=lambda: _start_ticks(os.getpid()))  # tells a reused pid apart
    # Host directories containerd or libcni will create that did not exist before: removed when empty.
    new_host_dirs: list[str] = field(default_factory=list)

    @property
    def network(self) -> str:
        return f"probe-e2e-{self.token}"

    @property
    def bridge(self) -> str:
        return f"pse2e{self.token}"   # at most 15 characters (IFNAMSIZ)

    @property
    def cgroup_parent(self) -> str:
        return f"/probe-e2e-{self.token}"

    def path(self, *parts: str) -> str:
        return os.path.join(self.workdir, *parts)

    @property
    def address(self) -> str:
        return self.path("containerd.sock")

    @property
    def netns_dir(self) -> str:
        return self.path("state", "io.containerd.grpc.v1.cri", "netns")


@dataclass(frozen=True)
class TestImages:
    pause: str
    http: str
    tcp: str
    token: str   # in /www/healthz: proves an answer came from this session's workload


def image_defs(token: str) -> list[ImageDef]:
    registry = "probe-e2e.local"
    return [
        ImageDef(f"{registry}/pause:1", ("/bin/busybox", "sleep", "2147483647")),
        # Bound to the pod's loopback only: reachable by a LOOPBACK probe, never from the node.
        ImageDef(f"{registry}/http:1", ("/bin/busybox", "httpd", "-f", "-p", f"127.0.0.1:{HTTP_PORT}", "-h", "/www"),
                 extra_files={"www/healthz": f"ok {token}\n".encode()}),
        # -ll: keep listening after each connection (busybox nc's persistent server with -e).
        ImageDef(f"{registry}/tcp:1", ("/bin/busybox", "nc", "-ll", "-p", str(TCP_PORT), "-e", "/bin/true")),
    ]


def containerd_config(session: Session, sandbox_image: str) -> str:
    s = session
    return f"""\
version = 2
root = "{s.path('root')}"
state = "{s.path('state')}"
oom_score = 0
disabled_plugins = [
  "io.containerd.internal.v1.tracing",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.aufs",
]

[grpc]
  address = "{s.address}"
  max_recv_message_size = {MAX_MESSAGE_BYTES}
  max_send_message_size = {MAX_MESSAGE_BYTES}

[ttrpc]
  address = "{s.path('containerd.sock.ttrpc')}"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{s.path('opt')}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  restrict_oom_score_adj = true
  enable_selinux = false
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = "{RUNC}"
  Root = "{s.path('runc')}"

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{s.path('cni', 'net.d')}"
  max_conf_num = 1
"""


def cni_conflist(session: Session) -> dict:
    subnet = ipaddress.ip_network(session.subnet)
    return {
        "cniVersion": "1.0.0",
        "name": session.network,
        "plugins": [
            {
                "type": "bridge",
                "bridge": session.bridge,
                "isGateway": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": session.path("cni", "ipam"),
                    "ranges": [[{"subnet": str(subnet), "gateway": str(subnet.network_address + 1)}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "loopback"},
        ],
    }


def shim_socket_name(address: str, namespace: str, shim_id: str) -> str:
    """containerd 1.6's runc-v2 shim socket name under /run/containerd/s (shim.SocketAddress)."""
    return hashlib.sha256(os.path.join(address, namespace, shim_id).encode()).hexdigest()


def unescape_mount_path(text: str) -> str:
    """/proc/self/mountinfo escapes space, tab, newline and backslash as 3-digit octal."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def mount_of(path: str, mountinfo: str) -> tuple[str, str]:
    """(mount point, filesystem type) of the mount holding path: the longest matching mount point."""
    best = ("", "")
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        point = unescape_mount_path(fields[4])
        fstype = line.split(" - ", 1)[1].split()[0]
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):
            best = (point, fstype)
    return best


def workdir_root(candidates: Iterable[str], mountinfo: str) -> str:
    """The first candidate directory whose filesystem can hold overlayfs upper dirs (not overlay itself,
    as in a container's root)."""
    candidates = list(candidates)
    for candidate in candidates:
        if os.path.isdir(candidate) and mount_of(os.path.realpath(candidate), mountinfo)[1] not in UNSTACKABLE_FS:
            return candidate
    return candidates[0]


def mounts_under(prefix: str, mountinfo: str | None = None) -> list[str]:
    """Mount points at or below prefix, deepest first (the order to unmount them)."""
    if mountinfo is None:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    prefix = prefix.rstrip("/")
    points = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 4:
            point = unescape_mount_path(fields[4])
            if point == prefix or point.startswith(prefix + "/"):
                points.append(point)
    return sorted(points, key=lambda p: (-p.count("/"), p))


def free_subnet(routes_text: str, claimed: Iterable[str] = (), first: int = 77, last: int = 126) -> str:
    """The first 10.244.N.0/24 that neither a route of the node (a stale session's bridge) nor a live
    session that has not made its bridge yet (claimed) overlaps."""
    taken = [ipaddress.ip_network(c) for c in claimed]
    for line in routes_text.splitlines():
        dst = line.split()[0] if line.strip() else ""
        with contextlib.suppress(ValueError):
            if dst != "default":
                taken.append(ipaddress.ip_network(dst, strict=False))
    for n in range(first, last + 1):
        candidate = ipaddress.ip_network(f"10.244.{n}.0/24")
        if not any(candidate.overlaps(t) for t in taken):
            return str(candidate)
    raise RuntimeError("no free 10.244.N.0/24 subnet for the test CNI network")


# --- a CRI client, as the kubelet calls it ---------------------------------------------------

def cri_channel(endpoint: str) -> grpc.Channel:
    # A private subchannel pool: a channel to a process a test stops must not lend its dead connection.
    return grpc.insecure_channel(endpoint, options=[
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ])


class CriClient:
    """runtime.v1 unary calls on any channel: containerd's own socket, or the shim's (the proxy)."""

    def __init__(self, channel: grpc.Channel, timeout_s: float = CRI_TIMEOUT_S) -> None:
        self.channel = channel
        self.timeout_s = timeout_s

    @staticmethod
    def _path(method: str) -> str:
        service = "ImageService" if method in ("ImageStatus", "ListImages", "PullImage", "RemoveImage",
                                                "ImageFsInfo") else "RuntimeService"
        return f"/runtime.v1.{service}/{method}"

    def raw(self, method: str, request, timeout_s: float | None = None) -> bytes:
        """The response's bytes as they came over the wire, undecoded."""
        call = self.channel.unary_unary(self._path(method), request_serializer=type(request).SerializeToString,
                                        response_deserializer=lambda data: data)
        return call(request, timeout=timeout_s or self.timeout_s, wait_for_ready=True)

    def call(self, method: str, request, timeout_s: float | None = None):
        response_type = getattr(cri_pb, f"{method}Response")
        return response_type.FromString(self.raw(method, request, timeout_s))

    # The calls the tests and the teardown make often.
    def list_sandboxes(self) -> list[cri_pb.PodSandbox]:
        return list(self.call("ListPodSandbox", cri_pb.ListPodSandboxRequest()).items)

    def sandbox_status(self, sandbox_id: str, verbose: bool = True) -> cri_pb.PodSandboxStatusResponse:
        return self.call("PodSandboxStatus", cri_pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=verbose))

    def container_status(self, container_id: str) -> cri_pb.ContainerStatus:
        return self.call("ContainerStatus", cri_pb.ContainerStatusRequest(container_id=container_id)).status

    def stop_and_remove_sandbox(self, sandbox_id: str) -> None:
        for method, request_type in (("StopPodSandbox", cri_pb.StopPodSandboxRequest),
                                     ("RemovePodSandbox", cri_pb.RemovePodSandboxRequest)):
            try:
                self.call(method, request_type(pod_sandbox_id=sandbox_id))
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:
                    raise


@dataclass(frozen=True)
class SandboxNetwork:
    """Where a pod's network namespace is, read from PodSandboxStatus(verbose) like the kubelet's tools do."""
    ip: str
    netns_path: str
    pid: int


def sandbox_network(response: cri_pb.PodSandboxStatusResponse) -> SandboxNetwork:
    info = json.loads(response.info["info"])
    path = next((ns.get("path", "") for ns in info.get("runtimeSpec", {}).get("linux", {}).get("namespaces", [])
                 if ns.get("type") == "network"), "")
    return SandboxNetwork(ip=response.status.network.ip, netns_path=path, pid=int(info.get("pid") or 0))


# --- the host: processes, cgroups, links --------------------------------------------------------

def _pids_matching(predicate: Callable[[int], bool]) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            with contextlib.suppress(OSError):
                if predicate(int(entry)):
                    pids.append(int(entry))
    return pids


def _cmdline_mentions(pid: int, text: str) -> bool:
    return text.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()


def _cgroup_dirs(parent: str) -> list[Path]:
    """This session's pod cgroup directories in every hierarchy (v1 controllers, v2 or hybrid), deepest first."""
    tops = [CGROUP_ROOT / parent.lstrip("/")]
    with contextlib.suppress(OSError):
        tops += [hierarchy / parent.lstrip("/") for hierarchy in CGROUP_ROOT.iterdir()]
    found = [Path(root) for top in tops if top.is_dir() for root, _, _ in os.walk(top)]
    return sorted(set(found), key=lambda p: (-len(p.parts), str(p)))


def _kill(pids: Iterable[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _unmount(point: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(point.encode(), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (22, 2):  # EINVAL: not a mount point (any more); ENOENT: gone
            raise OSError(err, os.strerror(err), point)


def clean_host(session: Session, errors: list[str]) -> None:
    """Everything outside containerd's API that a session may leave; each step runs even if one fails."""
    def step(name: str, action: Callable[[], None]) -> None:
        try:
            action()
        except Exception as exc:  # keep cleaning: a later step may still succeed
            errors.append(f"{name}: {exc!r}")

    # Processes started for this session (in a stale one, containerd itself: `--config <workdir>/...`; its
    # shims: `-address <workdir>/...`; a shim daemon pointed at it), then whatever runs in its pod cgroups.
    mine = session.workdir.rstrip("/") + "/"
    step("kill session processes", lambda: _kill(_pids_matching(lambda pid: _cmdline_mentions(pid, mine))))

    def kill_pods() -> None:
        pids = set()
        for d in _cgroup_dirs(session.cgroup_parent):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in (d / "cgroup.procs").read_text().split())
        _kill(pids)
    step("kill pod processes", kill_pods)

    def unmount_all() -> None:
        for point in mounts_under(session.workdir):
            _unmount(point)
    step("unmount", unmount_all)

    def delete_bridge() -> None:
        if Path(f"/sys/class/net/{session.bridge}").exists():
            subprocess.run(["ip", "link", "del", session.bridge], check=True, capture_output=True, timeout=30)
    step("delete bridge", delete_bridge)

    def remove_cni_results() -> None:
        if CNI_RESULTS_DIR.is_dir():
            for entry in CNI_RESULTS_DIR.glob(f"{session.network}-*"):
                entry.unlink(missing_ok=True)
    step("remove CNI results", remove_cni_results)

    def remove_cgroups() -> None:
        deadline = time.monotonic() + 10
        for d in _cgroup_dirs(session.cgroup_parent):
            while True:  # a killed process leaves its cgroup a moment after SIGKILL
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    _wait_a_moment()
    step("remove cgroups", remove_cgroups)

    def remove_shim_sockets() -> None:
        if not SHIM_SOCKET_DIR.is_dir():
            return
        ids_file = Path(session.path("shim-ids.json"))
        ids = json.loads(ids_file.read_text()) if ids_file.exists() else []
        for shim_id in ids:
            (SHIM_SOCKET_DIR / shim_socket_name(session.address, K8S_NAMESPACE, shim_id)).unlink(missing_ok=True)
    step("remove shim sockets", remove_shim_sockets)

    def remove_new_host_dirs() -> None:
        for d in sorted(session.new_host_dirs, key=lambda p: -p.count("/")):
            with contextlib.suppress(FileNotFoundError, OSError):
                os.rmdir(d)  # only when empty: anything else there is not ours
    step("remove host dirs", remove_new_host_dirs)

    step("remove workdir", lambda: shutil.rmtree(session.workdir) if os.path.exists(session.workdir) else None)


def _wait_a_moment() -> None:
    # Polling interval while the kernel finishes tearing a killed process down (no event to wait on).
    time.sleep(0.05)


def _sessions(roots: Iterable[str]) -> list[Session]:
    found = []
    for root in dict.fromkeys(roots):
        for workdir in Path(root).glob(f"{SESSION_DIR_PREFIX}*"):
            try:
                found.append(Session(**json.loads((workdir / SESSION_FILE).read_text())))
            except (OSError, ValueError, TypeError):
                continue  # being created, or not one of ours
    return found


def _alive(session: Session) -> bool:
    """The session's test process still runs (not exited, not a zombie, not a new process with its pid)."""
    return _start_ticks(session.owner_pid) == session.owner_started




@contextlib.contextmanager
def sessions_lock():
    """Serializes session creation and sweeping between concurrent test runs (e.g. `make e2e` beside
    `make test`): two sessions must not pick the same subnet before either has made its bridge."""
    with open(os.path.join(tempfile.gettempdir(), f".{SESSION_DIR_PREFIX}lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def sweep_stale_sessions(roots: Iterable[str] = WORKDIR_ROOTS) -> list[str]:
    """Cleans what sessions killed before their teardown left (their owner process is gone)."""
    swept = []
    with sessions_lock():
        for session in _sessions(roots):
            if not _alive(session):
                clean_host(session, [])
                swept.append(session.workdir)
    return swept


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
    def create(cls) -> "ContainerdEnv":
        root = workdir_root(WORKDIR_ROOTS, Path("/proc/self/mountinfo").read_text())
        new_dirs = [str(d) for d in (SHIM_SOCKET_DIR, SHIM_SOCKET_DIR.parent, CNI_RESULTS_DIR, CNI_RESULTS_DIR.parent)
                    if not d.exists()]
        with sessions_lock():
            routes = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True,
                                    check=True, timeout=30).stdout
            claimed = [s.subnet for s in _sessions(WORKDIR_ROOTS) if _alive(s)]
            workdir = tempfile.mkdtemp(prefix=SESSION_DIR_PREFIX, dir=root)
            session = Session(workdir=workdir, token=secrets.token_hex(3), subnet=free_subnet(routes, claimed),
                              new_host_dirs=new_dirs)
            Path(session.path(SESSION_FILE)).write_text(json.dumps(asdict(session)))
        return cls(session=session, busybox=find_static_busybox() or BUSYBOX_CANDIDATES[0])

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

    def _spawn(self) -> None:
        with open(self.session.path("containerd.log"), "ab") as log:
            self.proc = subprocess.Popen(["containerd", "--config", self.session.path("config.toml")],
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if self._channel is not None:
            self._channel.close()  # a fresh connection: the old one may be in reconnect backoff
        self._channel = cri_channel(self.endpoint)
        self.cri = CriClient(self._channel)

    # --- restart (tests/hardening/test_faults.py) ---

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
        done = subprocess.run(["ctr", "-a", self.session.address, "-n", K8S_NAMESPACE, *args],
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

    def sandbox_config(self, name: str, namespace: str = "e2e", attempt: int = 0) -> cri_pb.PodSandboxConfig:
        uid = str(uuid.uuid4())
        log_dir = self.session.path("logs", f"{namespace}_{name}_{uid}")
        os.makedirs(log_dir, exist_ok=True)
        labels = {"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": namespace,
                  "io.kubernetes.pod.uid": uid, "probe-e2e": self.session.token}
        return cri_pb.PodSandboxConfig(
            metadata=cri_pb.PodSandboxMetadata(name=name, uid=uid, namespace=namespace, attempt=attempt),
            hostname=name, log_directory=log_dir, labels=labels,
            annotations={"kubernetes.io/config.source": "probe-e2e"},
            linux=cri_pb.LinuxPodSandboxConfig(
                cgroup_parent=self.session.cgroup_parent,
                security_context=cri_pb.LinuxSandboxSecurityContext(namespace_options=cri_pb.NamespaceOption(
                    network=cri_pb.POD, pid=cri_pb.CONTAINER, ipc=cri_pb.POD)),
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
def running_containerd(unavailable: Callable[[str], NoReturn]) -> Iterator[ContainerdEnv]:
    """A started private containerd, stopped on exit; fails the caller (an assertion) if the teardown left
    anything behind. Sweeps the leftovers of killed sessions first: their bridges and subnets would collide.
    Calls unavailable(reason) when this machine cannot run one (tests pass pytest.skip: this module stays free
    of pytest, the benchmarks import it)."""
    reason = unavailable_reason()
    if reason is not None:
        unavailable(reason)
    sweep_stale_sessions()
    env = ContainerdEnv.create()
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


# --- a kubelet-like client ---------------------------------------------------------------------

@dataclass
class Pod:
    id: str
    config: cri_pb.PodSandboxConfig
    ip: str
    netns_path: str
    pid: int
    containers: dict[str, str] = field(default_factory=dict)   # name -> id of its current container


class Kubelet:
    """The CRI calls the kubelet makes to run a pod, on any CriClient (through the shim, or direct)."""

    def __init__(self, cri: CriClient, env: ContainerdEnv) -> None:
        self.cri = cri
        self.env = env

    def run_pod(self, name: str) -> Pod:
        config = self.env.sandbox_config(name)
        sandbox_id = self.cri.call("RunPodSandbox", cri_pb.RunPodSandboxRequest(config=config)).pod_sandbox_id
        self.env.note_sandbox(sandbox_id)
        network = sandbox_network(self.cri.sandbox_status(sandbox_id))
        return Pod(sandbox_id, config, network.ip, network.netns_path, network.pid)

    def start_container(self, pod: Pod, name: str, image: str, attempt: int = 0, ports: Sequence[dict] = ()) -> str:
        config = self.env.container_config(name, image, attempt, pod_config=pod.config, ports=ports)
        container_id = self.cri.call("CreateContainer", cri_pb.CreateContainerRequest(
            pod_sandbox_id=pod.id, config=config, sandbox_config=pod.config)).container_id
        self.cri.call("StartContainer", cri_pb.StartContainerRequest(container_id=container_id))
        pod.containers[name] = container_id
        return container_id

    def stop_container(self, container_id: str, timeout_s: int = 0) -> None:
        self.cri.call("StopContainer", cri_pb.StopContainerRequest(container_id=container_id, timeout=timeout_s))

    def remove_container(self, container_id: str) -> None:
        self.cri.call("RemoveContainer", cri_pb.RemoveContainerRequest(container_id=container_id))

    def exec_sync(self, container_id: str, cmd: Sequence[str], timeout_s: int) -> cri_pb.ExecSyncResponse:
        """ExecSync as the kubelet sends it for an exec probe (timeout = the probe's timeoutSeconds) or an exec
        hook (timeout 0): cri-client remote_runtime.go ExecSync sets the call's deadline to its 2-minute default
        plus the timeout, and none at all for a timeout of 0. Raises grpc.RpcError for an error status."""
        return cri_pb.ExecSyncResponse.FromString(self.exec_sync_raw(container_id, cmd, timeout_s))

    def exec_sync_raw(self, container_id: str, cmd: Sequence[str], timeout_s: int) -> bytes:
        request = cri_pb.ExecSyncRequest(container_id=container_id, cmd=list(cmd), timeout=timeout_s)
        deadline_s = KUBELET_CRI_TIMEOUT_S + timeout_s if timeout_s else None
        return self.cri.raw("ExecSync", request, timeout_s=deadline_s)

    def stop_pod(self, pod: Pod) -> None:
        self.cri.call("StopPodSandbox", cri_pb.StopPodSandboxRequest(pod_sandbox_id=pod.id))

    def remove_pod(self, pod: Pod) -> None:
        self.cri.call("RemovePodSandbox", cri_pb.RemovePodSandboxRequest(pod_sandbox_id=pod.id))
