"""Who can reach the daemon, and how much a probed server can make it keep.

- The API socket is mode 0660 with a configurable group: an unprivileged user cannot even connect,
  a member of the group can call the API (both shown with real processes under other uids).
- The daemon listens on no TCP port but the metrics endpoint, 127.0.0.1 by default.
- Whatever a server in the pod sends (10 MiB bodies, huge headers, a huge gRPC status message, long
  redirect URLs), the attempt the daemon keeps, the status it serves and stores, and its log stay bounded.
"""

from __future__ import annotations

import grp
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from shim.config import Config, metrics_exposure_warning
from shim.observe import logs
from tests.support.daemon_env import DaemonProcess, run, wait_for
from tests.support.netns_env import REPO_ROOT, PodNetns

pytestmark = pytest.mark.netns

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"

# --- the API socket ------------------------------------------------------------------------------------

# Runs as root, imports everything it needs, then becomes UID:GID with GROUPS (as the worker does: the
# interpreter's own files live under /root, out of an unprivileged user's reach), then tries the socket
# three ways: a bare connect, a gRPC call, and probectl.
CLIENT_AS = r"""
import json, os, socket, sys
import grpc
from cri_proto import probe_service_pb2 as service_pb, probe_service_pb2_grpc as service_grpc
from probectl import cli, client, unary_h2  # the command's lazy imports, read before the drop
from probectl.commands import base, version
import argparse, shutil  # argparse reads the terminal's width through shutil, lazily

path, uid, gid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
groups = [int(g) for g in sys.argv[4].split(",") if g]
channel = grpc.insecure_channel("unix:" + path)  # grpc imports its parts lazily: before the drop
stub = service_grpc.ProbeServiceStub(channel)
os.setgroups(groups)
os.setresgid(gid, gid, gid)
os.setresuid(uid, uid, uid)
result = {"ids": [os.getuid(), os.getgid(), os.getgroups()]}
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(path)
    result["connect"] = "connected"
except OSError as exc:
    result["connect"] = type(exc).__name__
s.close()
try:
    answer = stub.ShimVersion(service_pb.ShimVersionRequest(), timeout=10)
    result["grpc"] = "OK " + answer.api_version
except grpc.RpcError as exc:
    result["grpc"] = exc.code().name + ": " + (exc.details() or "")
channel.close()
sys.stdout.write(json.dumps(result) + "\n")
sys.stdout.flush()
sys.exit(cli.main(["-r", "unix://" + path, "version"]))
"""


def call_as(socket_path: str, uid: int, gid: int, groups: list[int]) -> tuple[dict, subprocess.CompletedProcess]:
    done = subprocess.run([sys.executable, "-c", CLIENT_AS, socket_path, str(uid), str(gid),
                           ",".join(map(str, groups))], capture_output=True, text=True, timeout=60,
                          cwd=REPO_ROOT, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
    first_line = done.stdout.splitlines()[0] if done.stdout else ""
    assert first_line.startswith("{"), done
    return json.loads(first_line), done


@pytest.fixture
def shared_dir():
    """A directory everybody may traverse (pytest's tmp_path is root's alone): only the socket's mode decides."""
    path = Path(tempfile.mkdtemp(prefix="cps-access-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def socket_group():
    name = f"cps-sock-{os.getpid()}"
    subprocess.run(["groupadd", name], check=True, capture_output=True)
    try:
        yield grp.getgrnam(name)
    finally:
        subprocess.run(["groupdel", name], capture_output=True)


def test_the_socket_is_0660_and_owned_by_root_by_default(daemon):
    st = os.stat(daemon.socket_path)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660
    assert (st.st_uid, st.st_gid) == (0, 0)


def test_only_the_socket_group_can_call_the_api(shared_dir, socket_group):
    d = DaemonProcess(shared_dir, ["--socket-group", socket_group.gr_name]).start()
    try:
        st = os.stat(d.socket_path)
        assert stat.S_IMODE(st.st_mode) == 0o660 and (st.st_uid, st.st_gid) == (0, socket_group.gr_gid)
        assert stat.S_IMODE(os.stat(shared_dir).st_mode) & 0o005 == 0o005  # the directory is no obstacle

        outsider, done = call_as(d.socket_path, NOBODY, NOBODY, [])
        assert outsider["ids"] == [NOBODY, NOBODY, []]
        assert outsider["connect"] == "PermissionError"
        assert outsider["grpc"].startswith("UNAVAILABLE") and "Permission denied" in outsider["grpc"]
        assert done.returncode == 2
        assert "permission denied on its socket" in done.stderr and len(done.stderr.splitlines()) == 1

        member, done = call_as(d.socket_path, NOBODY, NOBODY, [socket_group.gr_gid])
        assert member["ids"] == [NOBODY, NOBODY, [socket_group.gr_gid]]
        assert member == {**member, "connect": "connected", "grpc": "OK v1alpha1"}
        assert done.returncode == 0 and "v1alpha1" in done.stdout
    finally:
        d.stop()


@pytest.mark.skipif(not os.path.exists(SYSTEM_PYTHON), reason=f"needs {SYSTEM_PYTHON} for runuser")
def test_runuser_nobody_cannot_connect(shared_dir):
    d = DaemonProcess(shared_dir).start()
    try:
        script = "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect(sys.argv[1])\n" \
                 "except OSError as exc:\n    print(type(exc).__name__)\nelse:\n    print('connected')\n"
        done = subprocess.run(["runuser", "-u", "nobody", "--", SYSTEM_PYTHON, "-c", script, d.socket_path],
                              capture_output=True, text=True, timeout=30)
        assert done.stdout.strip() == "PermissionError", done
    finally:
        d.stop()


def test_a_socket_group_that_does_not_exist_stops_the_daemon_with_a_clear_error(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "shim.cli", "serve", "--runtime-endpoint", "none", "--metrics-listen", "",
         "--listen", f"unix://{tmp_path}/shim.sock", "--state-dir", str(tmp_path / "state"),
         "--socket-group", "cps-no-such-group"],
        capture_output=True, text=True, timeout=60, cwd=REPO_ROOT, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
    assert done.returncode == 1
    assert "socket_group: no group named 'cps-no-such-group'" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not os.path.exists(tmp_path / "shim.sock")


# --- listening sockets ------------------------------------------------------------------------------------

def inet_sockets(pid: int) -> list:
    """Every IPv4/IPv6 socket of the daemon and its descendants in the host's netns (the zygote)."""
    daemon = psutil.Process(pid)
    host_netns = os.stat("/proc/self/ns/net").st_ino
    found = []
    for proc in [daemon, *daemon.children(recursive=True)]:
        if os.stat(f"/proc/{proc.pid}/ns/net").st_ino == host_netns:  # workers sit in pod netns
            found += proc.net_connections(kind="inet")
    return found


def test_no_tcp_port_without_metrics(daemon, pod_netns):
    run(daemon, pod_netns, spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=1)),
                                             period_ms=1000))
    wait_for(daemon, lambda p: p.status.worker.state == service_pb.WORKER_RUNNING)
    assert inet_sockets(daemon.proc.pid) == []


def test_metrics_is_the_only_port_and_binds_loopback_by_default(tmp_path):
    assert Config().metrics_listen.startswith("127.0.0.1:")
    assert metrics_exposure_warning(Config().metrics_listen) is None
    d = DaemonProcess(tmp_path, ["--metrics-listen", "127.0.0.1:0"]).start()
    try:
        sockets = inet_sockets(d.proc.pid)
        assert [(s.status, s.laddr.ip) for s in sockets] == [(psutil.CONN_LISTEN, "127.0.0.1")]
    finally:
        d.stop()
    assert "beyond loopback" not in d.logs()


def test_metrics_beyond_loopback_is_served_with_a_warning(tmp_path):
    d = DaemonProcess(tmp_path, ["--metrics-listen", "0.0.0.0:0"]).start()
    try:
        assert [(s.status, s.laddr.ip) for s in inet_sockets(d.proc.pid)] == [(psutil.CONN_LISTEN, "0.0.0.0")]
    finally:
        d.stop()
    warnings = [line for line in d.logs().splitlines() if "beyond loopback" in line]
    assert len(warnings) == 1 and warnings[0].split()[2] == "warning"


# --- what a probed server can make the daemon keep -------------------------------------------------------------

# HTTP and gRPC servers that answer with as much as they can: argv MODE; prints READY <port>.
OVERSIZE_SERVER = r"""
import asyncio, socket, sys
import h2.config, h2.connection, h2.events

MODE = sys.argv[1]
MIB = 1 << 20
BODY = b"b" * (10 * MIB)

def http_answer(target):
    if MODE == "body":
        return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY
    if MODE == "error-body":
        return b"HTTP/1.1 500 Oops\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY
    if MODE == "redirect-body":   # to another host: not followed, a warning with the body in the output
        return (b"HTTP/1.1 302 Found\r\nLocation: http://other.invalid/\r\nContent-Length: %d\r\n\r\n"
                % len(BODY) + BODY)
    if MODE == "headers":         # just under the worker's 64 KiB head limit, then a big one
        lines = b"".join(b"X-Filler-%d: %s\r\n" % (i, b"h" * 900) for i in range(60))
        return b"HTTP/1.1 200 OK\r\n" + lines + b"Content-Length: 2\r\n\r\nok"
    if MODE == "huge-header":
        return b"HTTP/1.1 200 OK\r\nX-Huge: " + b"h" * MIB + b"\r\nContent-Length: 2\r\n\r\nok"
    if MODE == "long-redirects":  # the same host, ever longer URLs: 10 hops of ~30 KiB Locations
        return b"HTTP/1.1 302 Found\r\nLocation: /" + b"r" * 60000 + b"\r\nContent-Length: 0\r\n\r\n"
    raise SystemExit(f"unknown mode {MODE}")

async def http(reader, writer):
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        writer.write(http_answer(head.split(b" ")[1]))
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        pass
    writer.transport.abort()

async def grpc(reader, writer):
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    conn.initiate_connection()
    writer.write(conn.data_to_send())
    size = 12 * 1024 if MODE == "grpc-status-message" else MIB
    try:
        while data := await reader.read(65536):
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.StreamEnded):
                    conn.send_headers(event.stream_id, [
                        (":status", "200"), ("content-type", "application/grpc"),
                        ("grpc-status", "14"), ("grpc-message", "m" * size)], end_stream=True)
            writer.write(conn.data_to_send())
            await writer.drain()
    except ConnectionError:
        pass
    writer.transport.abort()

async def main():
    sock = socket.socket(socket.AF_INET6)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind(("::", 0))
    handler = grpc if MODE.startswith("grpc") else http
    server = await asyncio.start_server(handler, sock=sock, limit=1 << 20)
    print("READY", sock.getsockname()[1], flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""
# The worker cuts an attempt's output to 10 KiB + 256 characters (probe_worker.attempt.MAX_OUTPUT_CHARS);
# what the daemon serves and keeps per probe must stay within a small multiple of that.
MAX_OUTPUT_CHARS = 10240 + 256
MAX_PROBE_STATUS_BYTES = 64 << 10
MAX_LOG_GROWTH_BYTES = 8 << 10
MAX_STORE_BYTES = 256 << 10


def http_spec(port: int, **kw) -> spec_pb.ProbeSpec:
    return spec_pb.ProbeSpec(http_get=spec_pb.HTTPGetAction(path="/", port=spec_pb.PortRef(number=port)),
                             period_ms=200, timeout_ms=2000, **kw)


def grpc_spec(port: int, timeout_ms: int = 2000) -> spec_pb.ProbeSpec:
    return spec_pb.ProbeSpec(grpc=spec_pb.GRPCAction(port=port), period_ms=200, timeout_ms=timeout_ms)


def store_bytes(daemon) -> int:
    return sum(p.stat().st_size for p in Path(daemon.state_dir).glob("probes.db*"))


@pytest.fixture(scope="module")
def oversize_env(tmp_path_factory):
    """One daemon and one pod for every oversize case: each case brings its own server."""
    ns = PodNetns.create()
    d = DaemonProcess(tmp_path_factory.mktemp("oversize")).start()
    try:
        yield d, ns
    finally:
        d.stop()
        ns.destroy()


OVERSIZE_CASES = {
    "body": (http_spec, "b" * 100),
    "error-body": (http_spec, "HTTP probe failed with statuscode: 500"),
    "redirect-body": (http_spec, "Probe terminated redirects, Response body: bbbb"),
    "headers": (http_spec, "ok"),
    "huge-header": (http_spec, "net/http: server response headers exceeded 65536 bytes; aborted"),
    "long-redirects": (http_spec, 'Get "/rrrr'),
    "grpc-status-message": (grpc_spec, "rpc error: code = Unavailable desc = mmmm"),
    # Over the worker's 16 KiB header list limit: how the call fails is the gRPC probe's business; here
    # only that nothing of the message gets through.
    "grpc-huge-status-message": (lambda port: grpc_spec(port, timeout_ms=500), ""),
}


@pytest.mark.parametrize("mode", OVERSIZE_CASES)
def test_a_probed_server_cannot_make_the_daemon_keep_or_log_much(oversize_env, mode):
    daemon, ns = oversize_env
    spec, expected_output = OVERSIZE_CASES[mode]
    server = ns.spawn([sys.executable, "-c", OVERSIZE_SERVER, mode])
    log_before, store_before = len(daemon.logs()), store_bytes(daemon)

    one_shot = daemon.stub.ExecProbe(service_pb.ExecProbeRequest(pod_sandbox_id=ns.name,
                                                                 spec=spec(server.port)), timeout=30)
    assert expected_output in one_shot.attempt.output, one_shot.attempt.output[:300]
    assert len(one_shot.attempt.output) <= MAX_OUTPUT_CHARS
    assert one_shot.ByteSize() <= MAX_PROBE_STATUS_BYTES, one_shot.ByteSize()

    probe_id = run(daemon, ns, spec(server.port))
    try:
        probed = wait_for(daemon, lambda p: p.status.totals.success + p.status.totals.warning + p.status.totals.failure >= 3, probe_id)
        print(f"{mode}: output {len(probed.status.last_attempt.output)} chars, status {probed.ByteSize()} bytes, "
              f"phases {probed.status.last_attempt.ByteSize() - len(probed.status.last_attempt.output)} bytes")
        assert len(probed.status.last_attempt.output) <= MAX_OUTPUT_CHARS
        assert probed.ByteSize() <= MAX_PROBE_STATUS_BYTES
        (listed,) = daemon.stub.ProbeStatus(service_pb.ProbeStatusRequest(
            filter=service_pb.ProbeFilter(probe_id=probe_id)), timeout=10).probes
        assert listed.ByteSize() <= MAX_PROBE_STATUS_BYTES
        assert listed.status.worker.restarts == 0, listed.status.worker.last_error
    finally:
        daemon.stub.StopProbe(service_pb.StopProbeRequest(probe_id=probe_id), timeout=10)
        server.stop()
    assert len(daemon.logs()) - log_before <= MAX_LOG_GROWTH_BYTES
    assert store_bytes(daemon) - store_before <= MAX_STORE_BYTES


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_every_log_line_is_bounded(log_format, capsys):
    """The daemon's own lines may quote what pods chose (sandbox ids, worker errors): each one is cut."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        logs.setup(log_format)
        try:
            raise ValueError("v" * 100_000)
        except ValueError:
            logging.getLogger("probe_shim.test").exception("m" * 100_000, extra={"sandbox": "s" * 100_000,
                                                                                "pids": list(range(10_000))})
    finally:
        root.handlers[:], root.level = saved[0], saved[1]
    line = capsys.readouterr().err
    bound = logs.MAX_MESSAGE_CHARS + 2 * logs.MAX_FIELD_CHARS + logs.MAX_TRACEBACK_CHARS + 1024
    assert len(line) <= bound, len(line)
    assert "more characters]" in line and "mmmm" in line and "ssss" in line
    if log_format == "json":
        entry = json.loads(line)
        assert entry["level"] == "error" and entry["msg"].startswith("m" * 100)
