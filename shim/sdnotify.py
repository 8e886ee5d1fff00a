"""systemd's service notification protocol (sd_notify(3)), for `Type=notify` units.

The whole protocol: one AF_UNIX datagram per notification, newline-separated
`KEY=value` fields ("READY=1", "STOPPING=1", "STATUS=...", "WATCHDOG=1"), sent to
the socket named by $NOTIFY_SOCKET (a path, or an abstract name written with a
leading '@'). systemd learns the sender's pid from the kernel-attached
SCM_CREDENTIALS (it sets SO_PASSCRED on its socket), so nothing else is sent.
Hand-written rather than a dependency: it is twenty lines, the maintained bindings
(systemd-python, cysystemd) are C extensions needing libsystemd headers and a
compiler, and the pure-Python `sdnotify` package has had no release since 2017.

Nothing here raises into the daemon: without $NOTIFY_SOCKET (not under systemd)
every call is a no-op, and a failed send is logged once and reported as False.
`from_environment()` also removes the variables, like sd_notify's
unset_environment, so the zygote and the pod-facing workers never inherit them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import MutableMapping
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

SEND_TIMEOUT_S = 2.0  # systemd drains its socket at once; bound the send all the same


def socket_address(value: str | None) -> str | None:
    """$NOTIFY_SOCKET as a Python AF_UNIX address; None when unset or not a unix socket (e.g. vsock:)."""
    if not value:
        return None
    if value.startswith("@"):
        return "\0" + value[1:]  # abstract namespace
    if value.startswith("/"):
        return value
    return None


def watchdog_interval_s(usec: str | None, pid: str | None, own_pid: int) -> float | None:
    """How often to send WATCHDOG=1: half the timeout, as sd_watchdog_enabled(3) advises; None when off."""
    try:
        timeout_us = int(usec or 0)
        if pid and int(pid) != own_pid:
            return None  # the watchdog is meant for another process (e.g. our parent)
    except ValueError:
        return None
    return timeout_us / 2e6 if timeout_us > 0 else None


def message(*fields: str) -> bytes:
    """One datagram; a newline inside a field would start a bogus field, so it becomes a space."""
    return "\n".join(field.replace("\n", " ") for field in fields).encode()


@dataclass
class Notifier:
    address: str | None = None
    watchdog_s: float | None = None
    _warned: bool = field(default=False, init=False, repr=False)

    @classmethod
    def from_environment(cls, environ: MutableMapping[str, str] = os.environ) -> "Notifier":
        address = socket_address(environ.pop("NOTIFY_SOCKET", None))
        watchdog = watchdog_interval_s(environ.pop("WATCHDOG_USEC", None), environ.pop("WATCHDOG_PID", None), os.getpid())
        return cls(address, watchdog if address else None)

    def notify(self, *fields: str) -> bool:
        """Sends one notification; True if it was sent, False if there is nobody to tell or the send failed."""
        if self.address is None:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.settimeout(SEND_TIMEOUT_S)
                sock.sendto(message(*fields), self.address)
        except OSError as exc:
            if not self._warned:  # a broken notify socket must not flood the log every watchdog tick
                log.warning("cannot notify systemd at %r: %s", self.address, exc)
                self._warned = True
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.notify("READY=1", f"STATUS={status}")

    def stopping(self, status: str = "stopping") -> bool:
        return self.notify("STOPPING=1", f"STATUS={status}")

    async def keep_alive(self) -> None:
        """Pings the watchdog while the event loop runs; returns at once when the unit has no WatchdogSec."""
        if self.watchdog_s is None:
            return
        while True:
            self.notify("WATCHDOG=1")
            await asyncio.sleep(self.watchdog_s)
