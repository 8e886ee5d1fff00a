"""The shipped systemd files and a notify socket, as the systemd tests read them: shared by the unit tests
(the files, shim/sdnotify.py) and the system tests (a real daemon under the unit's privileges and notify socket)."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.support.netns_env import REPO_ROOT

SYSTEMD_DIR = REPO_ROOT / "systemd"
UNIT = SYSTEMD_DIR / "probe-shim.service"
CONFIG_EXAMPLE = SYSTEMD_DIR / "config.toml"
KUBELET_DROP_IN = SYSTEMD_DIR / "kubelet-probe-shim.conf"
RECV_TIMEOUT_S = 20  # the daemon's start-up bound (DaemonProcess waits as long)


def directives(path: Path) -> dict[str, list[str]]:
    """Key -> every value it is given, in order (systemd keys may repeat)."""
    found: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")) and "=" in line:
            key, value = line.split("=", 1)
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def datagram_socket(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(RECV_TIMEOUT_S)
    return sock
