"""The names and configuration texts of one private containerd session for the end-to-end tests (pure).

Owns: which containerd a session runs (Debian's 1.6, or a 2.x release that hack/build-containerd.sh builds, and
the kubelet releases each supports); where Debian's runc and CNI plugins are; the per-session names (network, bridge, cgroup parent,
subnet: a stale session killed with SIGKILL can neither collide with nor be confused with a live one); the private
containerd config in each runtime's format (every setting ../shared/containerd-notes.md says this machine needs) and the CNI conflist; the
test images' definitions (built by tests/support/oci_images.py); and the pure readings of the host the session needs
(mountinfo, routes). No I/O beyond reading /proc: tests/e2e/test_fixture_logic.py tests all of it without root.
The process is tests/support/containerd_env.py, the cleanup tests/support/containerd_cleanup.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.oci_images import ImageDef

CNI_BIN_DIR = "/usr/lib/cni"
CNI_PLUGINS = ("bridge", "loopback", "host-local")
RUNC = "/usr/sbin/runc"
K8S_NAMESPACE = "k8s.io"
SHIM_SOCKET_DIR = Path("/run/containerd/s")        # containerd 1.6 puts runc-v2 shim sockets here, always
CNI_RESULTS_DIR = Path("/var/lib/cni/results")     # libcni's result cache, always
SESSION_DIR_PREFIX = "probe-shim-e2e-"
SESSION_FILE = "session.json"
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
HTTP_PORT, TCP_PORT = 8080, 9000
DEBIAN_CONTAINERD = "1.6"      # Debian 12's containerd 1.6.20, on PATH
DEFAULT_CONTAINERD = "2.4.2"   # the newest 2.x on the module proxy: what the tests run first
UNSTACKABLE_FS = ("overlay", "aufs")           # overlayfs cannot put its upper dir on these
WORKDIR_ROOTS = (tempfile.gettempdir(), "/var/tmp", "/dev/shm")


def start_ticks(pid: int) -> int:
    """A live process's start time (clock ticks after boot); 0 when it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0
    return 0 if fields[0] in ("Z", "X") else int(fields[19])  # state, ..., starttime (field 22 of stat)


# --- pure: which containerd ------------------------------------------------------------------

@dataclass(frozen=True)
class Runtime:
    """One containerd the tests can run: Debian's 1.6 (on PATH) or a 2.x release from the build cache."""
    version: str          # DEBIAN_CONTAINERD, or a 2.x release such as "2.4.2"

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    @property
    def bin_dir(self) -> Path | None:
        """Where its containerd, containerd-shim-runc-v2 and ctr are; None: Debian's, on PATH."""
        if self.major < 2:
            return None
        cache = os.environ.get("CONTAINERD_CACHE_DIR") or Path(
            os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cri-probe-shim" / "containerd"
        return Path(cache) / f"v{self.version}"

    def binary(self, name: str) -> str:
        return name if self.bin_dir is None else str(self.bin_dir / name)

    def supports_kubelet(self, kubelet_minor: int) -> bool:
        """Kubernetes 1.35 is the last release that supports containerd 1.x."""
        return self.major >= 2 or kubelet_minor <= 35


def runtimes_from(text: str | None, first_2x: str | None = None) -> list[Runtime]:
    """The runtimes the containerd tests run on, in order (CONTAINERD_VERSIONS: space or comma separated,
    e.g. "2.4.2 1.6"); by default a 2.x first (CONTAINERD_VERSION, the one `make containerd` builds, else the newest),
    then Debian's 1.6."""
    names = (text or f"{first_2x or DEFAULT_CONTAINERD} {DEBIAN_CONTAINERD}").replace(",", " ").split()
    runtimes = []
    for name in names:
        if not re.fullmatch(r"1\.6|2\.\d+\.\d+", name):
            raise ValueError(f"CONTAINERD_VERSIONS: {name!r} is neither {DEBIAN_CONTAINERD} (Debian's) "
                             "nor a containerd 2.x release such as 2.4.2")
        runtimes.append(Runtime(name))
    return runtimes


# --- pure: names, config texts -------------------------------------------------------------

@dataclass(frozen=True)
class Session:
    """Everything that names this session's resources; written to SESSION_FILE for the stale sweep."""
    workdir: str
    token: str
    subnet: str
    owner_pid: int = field(default_factory=os.getpid)
    owner_started: int = field(default_factory=lambda: start_ticks(os.getpid()))  # tells a reused pid apart
    # Host directories containerd or libcni will create that did not exist before: removed when empty.
    new_host_dirs: list[str] = field(default_factory=list)
    containerd: str = DEBIAN_CONTAINERD   # Runtime.version

    @property
    def runtime(self) -> Runtime:
        return Runtime(self.containerd)

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
        return self.path("state", "io.containerd.grpc.v1.cri", "netns")  # the CRI plugin's state dir in 2.x too

    @property
    def shim_socket_dir(self) -> Path:
        """Where the runc shims' sockets are: 1.6 always puts them in /run/containerd/s, 2.x where told."""
        return SHIM_SOCKET_DIR if self.runtime.major < 2 else Path(self.path("s"))


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


# Snapshotters and tracing that need what this machine lacks, or that the tests never use.
_DISABLED_PLUGINS = ("io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp",
                     "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                     "io.containerd.snapshotter.v1.devmapper")
_DISABLED_PLUGINS_1 = ("io.containerd.snapshotter.v1.aufs",)
_DISABLED_PLUGINS_2 = ("io.containerd.snapshotter.v1.erofs", "io.containerd.differ.v1.erofs",
                       "io.containerd.snapshotter.v1.blockfile")


def containerd_config(session: Session, sandbox_image: str) -> str:
    """The session's config in its runtime's format: version 2 for 1.6, version 3 for 2.x (which 2.x releases
    with a newer format migrate on load)."""
    if session.runtime.major >= 2:
        return containerd2_config(session, sandbox_image)
    s = session
    return _config_head(s, 2, _DISABLED_PLUGINS + _DISABLED_PLUGINS_1) + f"""
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


def containerd2_config(session: Session, sandbox_image: str) -> str:
    """containerd 2.x: the CRI plugin is split in three (images, runtime, and the gRPC server), the sandbox image is
    a pinned image, CNI takes a list of bin dirs; NRI is on by default, so its socket and plugin dirs are made
    private; the shim manager is told where the shims' sockets go (no /run/containerd/s), and the runc runtime its
    own release's shim (else the first containerd-shim-runc-v2 on PATH, Debian's 1.6 one, which 2.x cannot start);
    no drop-in files are imported (2.x reads /etc/containerd/conf.d by default)."""
    s = session
    return _config_head(s, 3, _DISABLED_PLUGINS + _DISABLED_PLUGINS_2, "imports = []\n") + f"""
[plugins."io.containerd.shim.v1.manager"]
  socket_dir = "{s.shim_socket_dir}"

[plugins."io.containerd.nri.v1.nri"]
  socket_path = "{s.path('nri', 'nri.sock')}"
  plugin_path = "{s.path('nri', 'plugins')}"
  plugin_config_path = "{s.path('nri', 'conf.d')}"

[plugins."io.containerd.image-verifier.v1.bindir"]
  bin_dir = "{s.path('opt', 'image-verifier')}"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "{sandbox_image}"

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  enable_selinux = false
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  cdi_spec_dirs = []

[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "runc"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  runtime_path = "{s.runtime.binary('containerd-shim-runc-v2')}"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = "{RUNC}"
  Root = "{s.path('runc')}"

[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["{CNI_BIN_DIR}"]
  conf_dir = "{s.path('cni', 'net.d')}"
  max_conf_num = 1

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""


def _config_head(s: Session, version: int, disabled: tuple[str, ...], top_level: str = "") -> str:
    """What every containerd release's config says alike: private root, state, sockets and opt dir."""
    plugins = "".join(f'  "{name}",\n' for name in disabled)
    return f"""\
version = {version}
root = "{s.path('root')}"
state = "{s.path('state')}"
oom_score = 0
{top_level}disabled_plugins = [
{plugins}]

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

