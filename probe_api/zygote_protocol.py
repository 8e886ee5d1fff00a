"""The daemon <-> zygote protocol's rules (cri_proto/zygote.proto), for both ends: the daemon's handle
(shim/workers/zygote_handle.py) and the zygote itself (probe_zygote/main.py), which imports nothing of the daemon.

Also how a worker's end reads (WorkerExit, from waitid) and where a zygote's handover socket lives: both sides name
it, the daemon finds it again after a restart."""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass

MAX_PACKET = 1 << 16  # a Spawn is a WorkerConfig: a few hundred bytes
# Bumped whenever a daemon and a zygote of different values could misunderstand each other: a daemon adopts a
# running zygote's workers only if the zygote speaks its version. 2: handover (Hello versions, Adopt, Reattach).
ZYGOTE_PROTOCOL_VERSION = 2


# --- exit statuses (pure) ------------------------------------------------------------

@dataclass(frozen=True)
class WorkerExit:
    """How a worker ended: an exit code, a signal, or only a reason when nobody saw it."""

    pid: int
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""  # when the status is unknown, e.g. "zygote died"

    def describe(self) -> str:
        if self.signal:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = f"signal {self.signal}"
            return f"exited with signal {self.signal} ({name})"
        if self.exit_code is not None:
            return f"exited with code {self.exit_code}"
        return self.reason or "exited"


def exit_from_waitid(pid: int, code: int, status: int) -> WorkerExit:
    """From a waitid() si_code/si_status pair (CLD_EXITED gives a code, the others a signal)."""
    if code == os.CLD_EXITED:
        return WorkerExit(pid=pid, exit_code=status)
    return WorkerExit(pid=pid, signal=status)


# --- the handover sockets (both sides) ------------------------------------------------------

def handover_socket_name(pid: int) -> str:
    return f"zygote-{pid}.sock"


def handover_sockets(directory: str) -> list[str]:
    """The handover sockets in a directory, oldest zygote first (pids are not an age: sorted by mtime)."""
    try:
        names = [n for n in os.listdir(directory) if n.startswith("zygote-") and n.endswith(".sock")]
    except FileNotFoundError:
        return []
    paths = [os.path.join(directory, n) for n in names]
    return sorted(paths, key=lambda p: (os.stat(p).st_mtime_ns if os.path.exists(p) else 0, p))


@contextlib.contextmanager
def unix_address(path: str):
    """An address for bind/connect even when `path` is longer than sun_path's 107 bytes (a deep state_dir):
    then it is reached through /proc/self/fd/N of its directory, which the kernel resolves like the path."""
    if len(os.fsencode(path)) < 100:
        yield path
        return
    dirfd = os.open(os.path.dirname(path) or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{dirfd}/{os.path.basename(path)}"
    finally:
        os.close(dirfd)
