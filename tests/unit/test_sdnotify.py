"""shim/sdnotify.py against real AF_UNIX datagram sockets (a path and an abstract name): the messages, the watchdog
interval, a dead socket (a real daemon's notifications: tests/system/test_systemd_daemon.py)."""

from __future__ import annotations

import asyncio
import socket
import uuid

from shim import sdnotify
from shim.sdnotify import Notifier
from tests.support.systemd_env import RECV_TIMEOUT_S, datagram_socket


def test_notify_socket_addresses():
    assert sdnotify.socket_address("/run/systemd/notify") == "/run/systemd/notify"
    assert sdnotify.socket_address("@/org/freedesktop/systemd1/notify/1") == "\0/org/freedesktop/systemd1/notify/1"
    assert sdnotify.socket_address(None) is None and sdnotify.socket_address("") is None
    assert sdnotify.socket_address("vsock:2:1234") is None  # a VM's host manager: not supported, no-op
    assert sdnotify.socket_address("relative/path") is None


def test_watchdog_interval_is_half_the_timeout_and_only_for_this_process():
    assert sdnotify.watchdog_interval_s("30000000", None, own_pid=42) == 15.0
    assert sdnotify.watchdog_interval_s("30000000", "42", own_pid=42) == 15.0
    assert sdnotify.watchdog_interval_s("30000000", "41", own_pid=42) is None
    assert sdnotify.watchdog_interval_s(None, None, own_pid=42) is None
    assert sdnotify.watchdog_interval_s("0", None, own_pid=42) is None
    assert sdnotify.watchdog_interval_s("soon", None, own_pid=42) is None


def test_message_fields_cannot_smuggle_a_field():
    assert sdnotify.message("READY=1", "STATUS=a\nMAINPID=1") == b"READY=1\nSTATUS=a MAINPID=1"


def test_notifications_reach_a_socket_path(tmp_path):
    path = str(tmp_path / "notify.sock")
    with datagram_socket(path) as receiver:
        environ = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "4000000", "OTHER": "kept"}
        notifier = Notifier.from_environment(environ)
        assert environ == {"OTHER": "kept"}  # like sd_notify's unset_environment: children never see it
        assert notifier.watchdog_s == 2.0
        assert notifier.ready("serving on unix:///run/probe-shim/probe-shim.sock")
        assert receiver.recv(4096) == b"READY=1\nSTATUS=serving on unix:///run/probe-shim/probe-shim.sock"
        assert notifier.stopping()
        assert receiver.recv(4096) == b"STOPPING=1\nSTATUS=stopping"


def test_notifications_reach_an_abstract_socket():
    name = f"probe-shim-test-{uuid.uuid4().hex}"
    with datagram_socket("\0" + name) as receiver:
        notifier = Notifier.from_environment({"NOTIFY_SOCKET": "@" + name})
        assert notifier.notify("STATUS=abstract")
        assert receiver.recv(4096) == b"STATUS=abstract"


def test_without_notify_socket_everything_is_a_no_op():
    notifier = Notifier.from_environment({"WATCHDOG_USEC": "1000000"})
    assert notifier.address is None and notifier.watchdog_s is None
    assert notifier.ready("serving") is False and notifier.stopping() is False
    asyncio.run(asyncio.wait_for(notifier.keep_alive(), timeout=5))  # returns at once: no watchdog


def test_a_dead_notify_socket_never_raises_and_warns_once(tmp_path, caplog):
    notifier = Notifier.from_environment({"NOTIFY_SOCKET": str(tmp_path / "nobody-listens.sock")})
    assert notifier.ready("serving") is False
    assert notifier.notify("WATCHDOG=1") is False
    assert len([r for r in caplog.records if "cannot notify systemd" in r.getMessage()]) == 1


def test_keep_alive_pings_the_watchdog(tmp_path):
    path = str(tmp_path / "notify.sock")

    async def two_pings(receiver: socket.socket) -> list[bytes]:
        loop = asyncio.get_running_loop()
        pinger = asyncio.create_task(Notifier(address=path, watchdog_s=0.01).keep_alive())
        try:
            return [await asyncio.wait_for(loop.sock_recv(receiver, 4096), RECV_TIMEOUT_S) for _ in range(2)]
        finally:
            pinger.cancel()

    with datagram_socket(path) as receiver:
        receiver.setblocking(False)
        assert asyncio.run(two_pings(receiver)) == [b"WATCHDOG=1", b"WATCHDOG=1"]
