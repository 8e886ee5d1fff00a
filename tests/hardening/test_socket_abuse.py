"""The daemon's socket under attack: a hostile HTTP/2 client (tests/support/h2_attacker.py) against the real daemon
over its real socket, while a well-behaved grpcio client in another process (tests/support/socket_monitor.py)
calls Health/Check every 100 ms.

Each case checks four things, all of them even when one fails (so a failure says everything the server did):
- what the server does to the attacker: the numbers of shim/rpc/limits.py (a GOAWAY ENHANCE_YOUR_CALM, a refused
  stream, a status), and where in the flood it happened;
- the daemon's RSS (VmRSS and VmHWM of the daemon process itself, from /proc/PID/status; the peak is reset when the
  attack starts): growth bounded as the docstring of each case says;
- the monitor: every answer OK within 1 s, during the whole attack;
- afterwards, a new connection is served normally: Health/Check and ProbeService/ShimVersion.

At the end the same attacks against grpcio's own server (grpc.aio.server(), tests/support/servers/
grpcio_unix_server.py), as the reference: what it does is recorded (`pytest -rP` shows MEASURED lines) and only what
it really does is asserted.

Synchronization is by the socket: the server's answers, its GOAWAY, its EOF, a round trip on a new connection. The
one exception is an attacker that never reads, which can see nothing of the server: there the test waits for the
daemon's CPU time to stop moving (`settle`), with a deadline.
"""

from __future__ import annotations

import os
import random
import socket
import string
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2
from h2.errors import ErrorCodes

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_service_pb2_grpc as service_grpc
from shim.rpc import limits
from tests.support.h2_attacker import (
    HEALTH_CHECK, REFLECTION, WATCH_PROBE_STATUS, Attacker, GoAway, continuation_frame, data_frame, grpc_message,
    headers_frame, message_prefix, ping_frame, pump_all, raise_fd_limit, repeated, request_headers, settings_frame,
    window_update_frame,
)
from tests.support.netns_env import REPO_ROOT
from tests.support.process_memory import memory_kib, reset_peak
from tests.support.socket_monitor import DEADLINE_S, Answer, SocketMonitor, late_or_failed

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the daemon (probe-shim serve) runs as root: its zygote "
                                "forks workers into network namespaces")

MIB = 1024 * 1024
ENHANCE_YOUR_CALM = ErrorCodes.ENHANCE_YOUR_CALM
OK, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED = 0, 4, 8
MONITOR_LATENCY_S = 1.0
STALL_S = 3.0  # no byte written for this long: the server stopped reading (what a bounded server does)
ANSWER_TIMEOUT_S = 30.0  # for answers the server owes: today's daemon, wedged, must not hang the suite
CLOSE_WITHIN_S = limits.CLOSE_GRACE_S + 5  # after its GOAWAY, the server closes the socket within CLOSE_GRACE_S
ABOUT = 2  # "after about N": the server stops within twice its budget (chunked reads, the refill while it runs)
SMALL_SNDBUF = 4096  # doubled by the kernel: what the server has not read yet is at most ~900 empty frames

PAIRS = 120_000  # rapid reset
FLOOD = 3_000_000  # SETTINGS and PINGs at a client that does not read: 27 and 51 MB
READ_FLOOD = 100_000  # at a client that reads: any number far past the budget shows whether the server stops
MADE_RESETS = 20_000
INBOUND_CALLS, INBOUND_MESSAGE = 48, 4 * MIB
WINDOW_TIMEOUT_S = 5.0  # a server that stops opening its window for a message: one stalled call ends the attack


# --- what is measured --------------------------------------------------------------------------------------------

def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def settle(pid: int, timeout: float = 20.0) -> bool:
    """Until the process used under 5% of a core over 200 ms (it has done what it was given), or timeout. Only for
    an attacker that never reads: nothing on its socket can say when the server is done with what it sent."""
    hz = os.sysconf("SC_CLK_TCK")
    deadline = time.monotonic() + timeout
    last = cpu_ticks(pid)
    while time.monotonic() < deadline:
        time.sleep(0.2)  # the sampling period, not a wait for an event
        now = cpu_ticks(pid)
        if (now - last) / hz < 0.01:
            return True
        last = now
    return False


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def wait_fds_at_most(pid: int, most: int, timeout: float = 15.0) -> int:
    """Until the process holds at most `most` fds (closed connections gone), or timeout; the count."""
    deadline = time.monotonic() + timeout
    while (count := fd_count(pid)) > most and time.monotonic() < deadline:
        time.sleep(0.05)  # the polling period of a condition read from /proc
    return count


def describe(goaway: GoAway | None) -> str:
    if goaway is None:
        return "no GOAWAY"
    return (f"GOAWAY {goaway.code_name} last stream {goaway.last_stream_id} debug {goaway.debug[:60]!r} "
            f"(after {goaway.settings_acks} SETTINGS ACKs, {goaway.ping_acks} PING ACKs)")


def cut_bound(burst: int, per_second: float, seconds: float) -> int:
    """How far into a flood the server may be when it says GOAWAY: its burst and the refill meanwhile, twice."""
    return int(ABOUT * (burst + per_second * seconds))


# --- the server under attack, and the checks every case makes ------------------------------------------------------

class Findings:
    """Every check of a case, failed or not, reported together; the numbers measured, printed (pytest -rP)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.failed: list[str] = []
        self.notes: list[str] = []

    def check(self, ok: bool, what: str) -> bool:
        if not ok:
            self.failed.append(what)
        return ok

    def note(self, text: str) -> None:
        self.notes.append(text)

    def done(self) -> None:
        print(f"MEASURED | {self.name} | " + " | ".join(self.notes))
        if self.failed:
            pytest.fail(f"{self.name}:\n- " + "\n- ".join(self.failed) + "\nmeasured: " + " | ".join(self.notes),
                        pytrace=False)


@dataclass
class Target:
    """A server on a unix socket: the daemon, or grpcio's reference server (no ProbeService there)."""
    socket_path: str
    pid: int
    probe_service: bool


def serves_normally(target: Target) -> list[str]:
    """A new connection's Health/Check (and ShimVersion on the daemon); what went wrong, if anything."""
    problems = []
    channel = grpc.insecure_channel(f"unix:{target.socket_path}", options=[("grpc.use_local_subchannel_pool", 1)])
    try:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        if answer.status != health_pb2.HealthCheckResponse.SERVING:
            problems.append(f"Health/Check after: {answer.status}")
        if target.probe_service:
            version = service_grpc.ProbeServiceStub(channel).ShimVersion(service_pb.ShimVersionRequest(), timeout=5)
            if not version.api_version:
                problems.append("ShimVersion after: no api_version")
    except grpc.RpcError as error:
        problems.append(f"a new connection after the attack: {error.code().name} {error.details()}")
    finally:
        channel.close()
    return problems


def warm_up(target: Target) -> None:
    """The code paths of the attacks, once, before the baseline (a server allocates its pools and caches lazily)."""
    assert not serves_normally(target)
    with Attacker(target.socket_path).start() as attacker:
        ids, chunks = attacker.repeated_calls(200, HEALTH_CHECK, per_chunk=100)
        attacker.send(chunks)
        _, chunks = attacker.repeated_calls(100, HEALTH_CHECK, message=None, end_stream=False, reset=True)
        attacker.send(chunks)
        if target.probe_service:
            ids += [attacker.call(WATCH_PROBE_STATUS) for _ in range(10)]
        assert attacker.read_until(lambda view: all(view.stream(i).answered or view.stream(i).headers
                                                    for i in ids), ANSWER_TIMEOUT_S)


@dataclass
class Siege:
    """One attack on `target`: the monitor running, the RSS baseline taken, the findings collected."""
    target: Target
    findings: Findings
    monitor: SocketMonitor | None = None
    start_kib: int = 0
    attackers: list[Attacker] = field(default_factory=list)

    def begin(self) -> Siege:
        warm_up(self.target)
        self.monitor = SocketMonitor(self.target.socket_path).start()
        reset_peak(self.target.pid)
        self.start_kib = memory_kib(self.target.pid)["VmRSS"]
        return self

    def attacker(self, *, reads: bool = True, start: bool = True, open_windows: bool = True,
                 sndbuf: int | None = None) -> Attacker:
        attacker = Attacker(self.target.socket_path, reads=reads, sndbuf=sndbuf)
        self.attackers.append(attacker)
        return attacker.start(open_windows=open_windows) if start else attacker

    def end(self, *, peak_mib: float, after_mib: float | None = None,
            monitor_codes: frozenset[str] = frozenset({"OK"}), monitor_latency_s: float = MONITOR_LATENCY_S) -> None:
        """Closes the attackers, then checks: a new connection is served, RSS growth (peak < peak_mib; once the
        attack's connections are closed < after_mib), the monitor's answers, then reports every finding."""
        for attacker in self.attackers:
            attacker.close()
        f = self.findings
        for problem in serves_normally(self.target):  # also: the server has seen the closes before RSS is read
            f.check(False, problem)
        memory = memory_kib(self.target.pid)
        peak = (memory["VmHWM"] - self.start_kib) / 1024
        after = (memory["VmRSS"] - self.start_kib) / 1024
        f.note(f"RSS start {self.start_kib / 1024:.0f} MiB, peak +{peak:.1f} MiB, after +{after:.1f} MiB")
        f.check(peak < peak_mib, f"RSS peak grew {peak:.1f} MiB (bound {peak_mib} MiB)")
        if after_mib is not None:
            f.check(after < after_mib, f"RSS after the close {after:+.1f} MiB of the start (bound {after_mib} MiB)")
        self.check_monitor(self.monitor.stop(), monitor_codes, monitor_latency_s)
        f.done()

    def check_monitor(self, answers: list[Answer], codes: frozenset[str], latency_s: float) -> None:
        f = self.findings
        slowest = max(answers, key=lambda answer: answer.latency_s)
        f.note(f"monitor {len(answers)} calls, slowest {slowest.latency_s * 1000:.0f} ms")
        bad = late_or_failed(answers, latency_s, codes)
        f.check(not bad, f"the monitor: {len(bad)} of {len(answers)} calls not {'/'.join(sorted(codes))} within "
                         f"{latency_s} s, e.g. {[(round(a.latency_s, 2), a.code) for a in bad[:5]]}")

    def check_goaway(self, attacker: Attacker, *, position: int | None, bound: int, unit: str,
                     debug: bytes | None = None) -> None:
        """The GOAWAY ENHANCE_YOUR_CALM, within `bound` `unit`s of the flood (position: where the server was), and
        the socket closed within CLOSE_WITHIN_S after it."""
        f, goaway = self.findings, attacker.view.goaway
        f.note(describe(goaway))
        if not f.check(goaway is not None and goaway.error_code == ENHANCE_YOUR_CALM,
                       f"GOAWAY ENHANCE_YOUR_CALM expected: {describe(goaway)}"):
            return  # nothing will close the connection: not waited for
        if debug is not None:
            f.check(goaway.debug == debug, f"GOAWAY debug data {goaway.debug!r}, expected {debug!r}")
        if position is not None:
            f.note(f"GOAWAY after {position} {unit}")
            f.check(position <= bound, f"GOAWAY after {position} {unit}, expected within {bound}")
        closed = attacker.read_until_closed(CLOSE_WITHIN_S)
        f.check(closed, f"the connection not closed {CLOSE_WITHIN_S} s after the GOAWAY")
        if closed:
            f.note(f"closed {attacker.closed_at - goaway.at:.2f} s after its GOAWAY")


@pytest.fixture
def siege(request, daemon):
    s = Siege(Target(daemon.socket_path, daemon.proc.pid, probe_service=True), Findings(request.node.name)).begin()
    yield s
    for attacker in s.attackers:
        attacker.close()
    if s.monitor is not None:
        s.monitor.stop()


def streams_up_to(stream_ids: list[int], last_stream_id: int) -> int:
    """How many of the attack's streams the server had seen when it said GOAWAY (its last stream id)."""
    return sum(1 for stream_id in stream_ids if stream_id <= last_stream_id)


# --- a. rapid reset (CVE-2023-44487) --------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("timeout", [None, "1n"], ids=["no-grpc-timeout", "grpc-timeout-1n"])
def test_rapid_reset(siege, timeout):
    """120k HEADERS + RST_STREAM pairs on one connection, written as fast as the socket takes them. Expected:
    GOAWAY ENHANCE_YOUR_CALM after about RESET_BURST pairs (its last stream within 2 x (RESET_BURST + RESETS_PER_S
    x the attack's seconds) of the first) and the socket closed; RSS peak under 32 MiB over the start (RESET_BURST
    calls at a few KB each, and the reads' buffers) and within 10 MiB of it once the connection is closed."""
    attacker = siege.attacker()
    stream_ids, chunks = attacker.repeated_calls(PAIRS, HEALTH_CHECK, message=None, end_stream=False, reset=True,
                                                 timeout=timeout)
    sent = attacker.send(chunks, stall_s=STALL_S)
    siege.findings.note(f"wrote {sent.bytes / MIB:.1f} MiB in {sent.seconds:.1f} s, stopped: {sent.stopped}")
    goaway = attacker.view.goaway
    siege.check_goaway(attacker, position=goaway and streams_up_to(stream_ids, goaway.last_stream_id),
                       bound=cut_bound(limits.RESET_BURST, limits.RESETS_PER_S, sent.seconds), unit="pairs")
    siege.end(peak_mib=32, after_mib=10)


# --- b. calls whose deadline has passed ----------------------------------------------------------------------------

def test_expired_deadlines(siege):
    """More calls than CONCURRENT_CALLS with grpc-timeout 1n or 0n, none reset: a first wave of CONCURRENT_CALLS
    (half 1n with their request, a quarter 1n with the client's side left open, a quarter 0n), every answer read,
    then a second wave of 200. Expected: every one answered DEADLINE_EXCEEDED (grpc-status 4; Trailers-Only is fine)
    and an ordinary Health/Check on the same connection afterwards answered OK: a call whose deadline passed holds
    no slot. RSS peak under 48 MiB over the start (a wave of CONCURRENT_CALLS at once)."""
    attacker = siege.attacker()
    f = siege.findings
    all_ids: list[int] = []
    for wave in (limits.CONCURRENT_CALLS, 200):
        ids = []
        for share, timeout, end_stream in ((2, "1n", True), (1, "1n", False), (1, "0n", True)):
            batch, chunks = attacker.repeated_calls(wave * share // 4, HEALTH_CHECK, timeout=timeout,
                                                    message=b"" if end_stream else None, end_stream=end_stream)
            attacker.send(chunks)
            ids += batch
        answered = attacker.read_until(lambda view: all(view.stream(i).answered for i in ids), ANSWER_TIMEOUT_S)
        statuses = attacker.view.statuses(ids)
        f.note(f"wave of {len(ids)}: {statuses}")
        f.check(answered, f"a wave of {len(ids)} calls not all answered in {ANSWER_TIMEOUT_S} s: {statuses}")
        f.check(statuses == {DEADLINE_EXCEEDED: len(ids)},
                f"a wave of {len(ids)}: every call DEADLINE_EXCEEDED expected, got {statuses}")
        all_ids += ids
        if attacker.closed:
            break
    ordinary = attacker.call(HEALTH_CHECK)
    attacker.read_until(lambda view: view.stream(ordinary).answered, ANSWER_TIMEOUT_S)
    status = attacker.view.statuses([ordinary])
    f.note(f"{len(all_ids)} expired calls, then an ordinary call: {status}; {describe(attacker.view.goaway)}")
    f.check(status == {OK: 1}, f"an ordinary call after the expired ones: {status} (not OK)")
    siege.end(peak_mib=48)


# --- c. SETTINGS flood ---------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_settings_flood_not_read(siege):
    """3M empty SETTINGS frames (27 MB) from a client that never reads: each owes it a SETTINGS ACK. Expected: RSS
    peak under 16 MiB over the start (the server stops reading once INDUCED_FRAMES answers wait, or ends the
    connection after GLITCH_BURST), instead of buffering every ACK."""
    attacker = siege.attacker(reads=False)
    sent = attacker.send(repeated(settings_frame(), FLOOD), stall_s=STALL_S)
    settled = settle(siege.target.pid)
    siege.findings.note(f"wrote {sent.bytes / MIB:.1f} MiB in {sent.seconds:.1f} s, stopped: {sent.stopped}"
                        f"{'' if settled else ', the daemon still busy 20 s later'}")
    siege.end(peak_mib=16)


@pytest.mark.slow
def test_settings_flood_read(siege):
    """The same SETTINGS flood from a client that reads every ACK. Expected: GOAWAY ENHANCE_YOUR_CALM after about
    GLITCH_BURST SETTINGS (the ACKs before it within 2 x (GLITCH_BURST + GLITCHES_PER_S x seconds)), the socket
    closed; RSS peak under 16 MiB."""
    attacker = siege.attacker()
    sent = attacker.send(repeated(settings_frame(), FLOOD), stall_s=STALL_S)
    siege.findings.note(f"wrote {sent.bytes / MIB:.1f} MiB in {sent.seconds:.1f} s, stopped: {sent.stopped}, "
                        f"{attacker.view.settings_acks} ACKs read")
    goaway = attacker.view.goaway
    siege.check_goaway(attacker, position=goaway and goaway.settings_acks,
                       bound=cut_bound(limits.GLITCH_BURST, limits.GLITCHES_PER_S, sent.seconds), unit="SETTINGS")
    siege.end(peak_mib=16)


# --- d. PING flood -------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_ping_flood_not_read(siege):
    """3M PINGs (51 MB) from a client that never reads: each owes it a PING ACK. Expected: RSS peak under 16 MiB
    over the start (GOAWAY after PING_STRIKES, the socket closed CLOSE_GRACE_S later whether or not the GOAWAY
    was read; or the server stops reading)."""
    attacker = siege.attacker(reads=False)
    sent = attacker.send(repeated(ping_frame(), FLOOD), stall_s=STALL_S)
    settled = settle(siege.target.pid)
    siege.findings.note(f"wrote {sent.bytes / MIB:.1f} MiB in {sent.seconds:.1f} s, stopped: {sent.stopped}"
                        f"{'' if settled else ', the daemon still busy 20 s later'}")
    siege.end(peak_mib=16)


def test_ping_flood_read(siege):
    """100k PINGs, no call, from a client that reads. Expected (grpc-go's keepalive enforcement): GOAWAY
    ENHANCE_YOUR_CALM with debug data "too_many_pings" once the strikes pass PING_STRIKES, that is after at most
    PING_STRIKES + 1 PING ACKs; the socket closed; RSS peak under 16 MiB."""
    attacker = siege.attacker()
    sent = attacker.send(repeated(ping_frame(), READ_FLOOD), stall_s=STALL_S)
    siege.findings.note(f"wrote {sent.bytes / MIB:.1f} MiB, stopped: {sent.stopped}, {attacker.view.ping_acks} "
                        f"PING ACKs read")
    goaway = attacker.view.goaway
    siege.check_goaway(attacker, position=goaway and goaway.ping_acks, bound=limits.PING_STRIKES + 1,
                       unit="PING ACKs", debug=b"too_many_pings")
    siege.end(peak_mib=16)


# --- e. frames that move nothing forward ---------------------------------------------------------------------------

def glitch_flood(siege, opening: Callable[[Attacker], bytes], glitch: Callable[[int], bytes]) -> None:
    """After `opening` (its frames, written first) `glitch(stream)` frames in chunks of 64, from a client with a
    small send buffer: what it has written and the server has not read is at most that buffer (a unix socket
    charges the bytes in the receiver's queue to the sender). Expected: GOAWAY ENHANCE_YOUR_CALM within 2 x
    (GLITCH_BURST + GLITCHES_PER_S x seconds) frames, plus the buffer's and a chunk's, written; the socket closed;
    RSS peak under 16 MiB."""
    attacker = siege.attacker(sndbuf=SMALL_SNDBUF)
    stream_id = attacker.new_stream()
    attacker.send(opening(attacker, stream_id))
    one = glitch(stream_id)
    sent = attacker.send(repeated(one, READ_FLOOD, per_chunk=64), stall_s=STALL_S)
    written = sent.bytes // len(one)
    in_flight = attacker.sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) // len(one) + 64
    siege.findings.note(f"wrote {written} frames in {sent.seconds:.1f} s, stopped: {sent.stopped}")
    siege.check_goaway(attacker, position=written, unit="frames written",
                       bound=cut_bound(limits.GLITCH_BURST, limits.GLITCHES_PER_S, sent.seconds) + in_flight)
    siege.end(peak_mib=16)


def test_empty_data_frames(siege):
    """Empty DATA frames (no data, no END_STREAM) on an open Health/Check stream waiting for its request."""
    glitch_flood(siege,
                 lambda attacker, sid: headers_frame(sid, attacker.blocks.block(request_headers(HEALTH_CHECK))),
                 lambda sid: data_frame(sid))


def test_empty_continuation_frames(siege):
    """A HEADERS frame without END_HEADERS, then empty CONTINUATION frames: a header block that never grows."""
    glitch_flood(siege,
                 lambda attacker, sid: headers_frame(sid, attacker.blocks.block(request_headers(HEALTH_CHECK)),
                                                     end_headers=False),
                 lambda sid: continuation_frame(sid))


# --- f. made you reset (CVE-2025-8671) ------------------------------------------------------------------------------

@pytest.mark.parametrize("provocation, code", [
    ("window-update-0", ErrorCodes.PROTOCOL_ERROR),
    ("data-after-end-stream", ErrorCodes.STREAM_CLOSED),
], ids=["window-update-0", "data-after-end-stream"])
def test_made_you_reset(siege, provocation, code):
    """20k WatchProbeStatus calls (they stay open), each followed at once by a frame the server must answer with
    RST_STREAM: a WINDOW_UPDATE of 0 on the stream (PROTOCOL_ERROR), or DATA after the client's END_STREAM
    (STREAM_CLOSED). Expected: the server resets them with that code, then GOAWAY ENHANCE_YOUR_CALM after about
    RESET_BURST of them (its last stream within 2 x (RESET_BURST + RESETS_PER_S x seconds) of the first), the
    socket closed; RSS peak under 32 MiB."""
    provoke = {"window-update-0": lambda sid: window_update_frame(sid, 0),
               "data-after-end-stream": lambda sid: data_frame(sid, b"x")}[provocation]
    attacker = siege.attacker()
    stream_ids, chunks = attacker.repeated_calls(MADE_RESETS, WATCH_PROBE_STATUS, extra=provoke, per_chunk=256)
    sent = attacker.send(chunks, stall_s=STALL_S)
    if not attacker.closed:
        attacker.read_until(lambda view: view.goaway is not None, 2.0)  # the resets of the last chunk
    resets = sum(1 for sid in stream_ids if attacker.view.streams.get(sid) and attacker.view.streams[sid].reset == code)
    f = siege.findings
    f.note(f"wrote {sent.bytes / MIB:.1f} MiB in {sent.seconds:.1f} s, stopped: {sent.stopped}, "
           f"{resets} streams reset {code.name}")
    f.check(resets > 0, f"the server reset no stream with {code.name}: the provocation did not work")
    goaway = attacker.view.goaway
    siege.check_goaway(attacker, position=goaway and streams_up_to(stream_ids, goaway.last_stream_id),
                       bound=cut_bound(limits.RESET_BURST, limits.RESETS_PER_S, sent.seconds), unit="streams")
    siege.end(peak_mib=32)


# --- g. connection flood -------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_connection_flood(siege):
    """SERVER_CONNECTIONS + 20 connections, each with a Health/Check call, beside the monitor's (connected before)
    and the test's own channel to the daemon. Expected: those beyond SERVER_CONNECTIONS (20, and as many as were
    there before) get GOAWAY ENHANCE_YOUR_CALM and are closed, the others answered OK; once they are all closed
    (the daemon's fds back), new connections are served. RSS peak under 40 MiB (SERVER_CONNECTIONS at about 20 KB
    idle each, plus a call each)."""
    count = limits.SERVER_CONNECTIONS + 20
    raise_fd_limit(count + 512)
    pid = siege.target.pid
    fds_before = fd_count(pid)
    attackers: list[Attacker] = []
    while len(attackers) < count:  # in batches under the listener's backlog, each one accepted before the next
        batch = [siege.attacker(start=False) for _ in range(min(64, count - len(attackers)))]
        for attacker in batch:
            attacker.start(handshake=False)
            attacker.call(HEALTH_CHECK)
        pump_all(batch, lambda a: a.view.settings_seen or a.view.goaway is not None or a.closed, ANSWER_TIMEOUT_S)
        attackers += batch
    done = pump_all(attackers, lambda a: a.view.stream(1).answered or a.closed, ANSWER_TIMEOUT_S)
    served = [a for a in attackers if a.view.stream(1).grpc_status == OK]
    refused = [a for a in attackers if a.view.goaway is not None and a.view.goaway.error_code == ENHANCE_YOUR_CALM
               and not a.view.stream(1).answered]
    pump_all(refused, lambda a: a.closed, CLOSE_WITHIN_S)
    refused_closed = [a for a in refused if a.closed]
    f = siege.findings
    f.note(f"{count} connections: {len(served)} served, {len(refused)} GOAWAY ENHANCE_YOUR_CALM "
           f"({len(refused_closed)} closed), {count - len(served) - len(refused)} neither; daemon fds "
           f"{fds_before} -> {fd_count(pid)}")
    f.check(done, f"not every connection answered or closed within {ANSWER_TIMEOUT_S} s")
    f.check(20 <= len(refused) <= 20 + 8, f"{len(refused)} connections refused (GOAWAY ENHANCE_YOUR_CALM), "
                                          f"expected the 20 over SERVER_CONNECTIONS (and the few there before)")
    f.check(len(served) + len(refused) == count, f"{count - len(served) - len(refused)} connections neither "
                                                 f"served nor refused")
    f.check(len(refused_closed) == len(refused), f"{len(refused) - len(refused_closed)} refused connections "
                                                 f"not closed")
    for attacker in attackers:
        attacker.close()
    left = wait_fds_at_most(pid, fds_before + 2)
    f.check(left <= fds_before + 2, f"the daemon still holds {left} fds (before: {fds_before})")
    siege.end(peak_mib=40)


# --- h. parked calls -----------------------------------------------------------------------------------------------

def park(attacker: Attacker, count: int) -> list[int]:
    """`count` WatchProbeStatus calls (the daemon has no probes: each answers its first message and stays open)."""
    stream_ids, chunks = attacker.repeated_calls(count, WATCH_PROBE_STATUS, per_chunk=1024)
    attacker.send(chunks)
    attacker.read_until(lambda view: all(view.stream(i).headers or view.stream(i).answered for i in stream_ids),
                        ANSWER_TIMEOUT_S)
    return stream_ids


def parked(attacker: Attacker, stream_ids: list[int]) -> list[int]:
    return [i for i in stream_ids if attacker.view.stream(i).headers and not attacker.view.stream(i).answered]


def test_calls_parked_on_one_connection(siege):
    """CONCURRENT_CALLS + 16 WatchProbeStatus calls on one connection, all open at once. Expected: the first
    CONCURRENT_CALLS served (their first answer, the stream open), the 16 beyond refused with RST_STREAM
    REFUSED_STREAM; the connection goes on (no GOAWAY). RSS peak under 48 MiB (CONCURRENT_CALLS watches: 36 MiB
    measured for 4096)."""
    attacker = siege.attacker()
    stream_ids = park(attacker, limits.CONCURRENT_CALLS + 16)
    open_ = parked(attacker, stream_ids)
    statuses = attacker.view.statuses(stream_ids)
    f = siege.findings
    f.note(f"{len(stream_ids)} calls: {len(open_)} open, answered {statuses}; {describe(attacker.view.goaway)}")
    f.check(open_ == stream_ids[:limits.CONCURRENT_CALLS], f"{len(open_)} calls open, expected the first "
                                                           f"{limits.CONCURRENT_CALLS}")
    f.check(attacker.view.statuses(stream_ids[limits.CONCURRENT_CALLS:]) == {"RST REFUSED_STREAM": 16},
            f"the 16 beyond CONCURRENT_CALLS: {attacker.view.statuses(stream_ids[limits.CONCURRENT_CALLS:])}, "
            f"expected RST_STREAM REFUSED_STREAM")
    f.check(attacker.view.goaway is None and not attacker.closed, f"the connection ended: "
                                                                  f"{describe(attacker.view.goaway)}")
    siege.end(peak_mib=48)


@pytest.mark.slow
def test_calls_parked_across_connections(siege):
    """SERVER_CALLS WatchProbeStatus calls parked over SERVER_CALLS / CONCURRENT_CALLS connections (about 1 s), then
    16 Health/Check calls on one more connection. Expected: those 16 answered at once, Trailers-Only grpc-status 8
    RESOURCE_EXHAUSTED (one may be served if a monitor call ended just then: it held a slot while the others were
    parked). The monitor's own calls, while the calls are parked, are over SERVER_CALLS too: they must be answered
    within 1 s, OK or RESOURCE_EXHAUSTED. Once their connections are closed, the monitor is answered OK again
    (within 30 s) and new connections are served. RSS peak under 96 MiB (SERVER_CALLS watches: 70 MiB measured for
    8192)."""
    f = siege.findings
    parked_count = 0
    for _ in range(-(-limits.SERVER_CALLS // limits.CONCURRENT_CALLS)):
        attacker = siege.attacker()
        stream_ids = park(attacker, min(limits.CONCURRENT_CALLS, limits.SERVER_CALLS - parked_count))
        parked_count += len(parked(attacker, stream_ids))
    f.note(f"{parked_count} calls parked")
    f.check(parked_count >= limits.SERVER_CALLS - 1, f"only {parked_count} calls parked of {limits.SERVER_CALLS}")
    extra = siege.attacker()
    ids, chunks = extra.repeated_calls(16, HEALTH_CHECK)
    extra.send(chunks)
    extra.read_until(lambda view: all(view.stream(i).answered for i in ids), ANSWER_TIMEOUT_S)
    statuses = extra.view.statuses(ids)
    trailers_only = all(len(extra.view.stream(i).headers) == 1 for i in ids
                        if extra.view.stream(i).grpc_status == RESOURCE_EXHAUSTED)
    f.note(f"16 calls beyond SERVER_CALLS: {statuses}, Trailers-Only: {trailers_only}")
    f.check(statuses.get(RESOURCE_EXHAUSTED, 0) >= 15 and set(statuses) <= {OK, RESOURCE_EXHAUSTED},
            f"calls beyond SERVER_CALLS: {statuses}, expected RESOURCE_EXHAUSTED")
    f.check(trailers_only, "the refusals are not Trailers-Only")
    # The parked calls end as their handlers finish cancelling, after the closes: the monitor's first OK says the
    # count is under SERVER_CALLS again (it only falls from there), so a new connection's calls fit.
    for attacker in siege.attackers:
        attacker.close()
    closed = time.monotonic()
    freed = siege.monitor.wait_answer(lambda answer: answer.at > closed and answer.code == "OK", ANSWER_TIMEOUT_S)
    f.note(f"the monitor OK again {freed.at - closed:.2f} s after the close" if freed else "the monitor never OK again")
    f.check(freed is not None, f"no call served within {ANSWER_TIMEOUT_S} s of the parked calls' connections closing")
    siege.end(peak_mib=96, monitor_codes=frozenset({"OK", "RESOURCE_EXHAUSTED"}))


# --- i. request bytes a connection holds ----------------------------------------------------------------------------

@pytest.mark.slow
def test_inbound_bytes(siege):
    """48 Health/Check calls on one connection, each sending a 4 MiB message's prefix and all but its last byte
    (within the server's windows, which it opens as the bytes arrive). Expected: the calls whose bytes cross
    CONNECTION_INBOUND_BYTES answered RESOURCE_EXHAUSTED (at least 48 - CONNECTION_INBOUND_BYTES / 4 MiB of them,
    no other answer), an ordinary call on the same connection answered OK afterwards; RSS peak under 48 MiB over
    the start (CONNECTION_INBOUND_BYTES and the reads' buffers, not 192 MiB)."""
    attacker = siege.attacker()
    body = message_prefix(INBOUND_MESSAGE) + bytes(INBOUND_MESSAGE - 1)
    stream_ids = []
    start = time.monotonic()
    f = siege.findings
    for _ in range(INBOUND_CALLS):
        stream_id = attacker.call(HEALTH_CHECK, None, end_stream=False)
        stream_ids.append(stream_id)
        sent = attacker.send_data(stream_id, body, timeout=WINDOW_TIMEOUT_S)
        if attacker.closed or attacker.view.goaway is not None:
            break
        if sent < len(body) and not attacker.view.stream(stream_id).answered:
            f.check(False, f"call {len(stream_ids)}: no window after {sent} bytes of its message for "
                           f"{WINDOW_TIMEOUT_S} s (a message larger than the window must be let in as it arrives)")
            break
    expected = INBOUND_CALLS - limits.CONNECTION_INBOUND_BYTES // INBOUND_MESSAGE
    attacker.read_until(lambda view: view.statuses(stream_ids).get(RESOURCE_EXHAUSTED, 0) >= expected, 5.0)
    statuses = attacker.view.statuses(stream_ids)
    ordinary = attacker.call(HEALTH_CHECK)
    attacker.read_until(lambda view: view.stream(ordinary).answered, ANSWER_TIMEOUT_S)
    f.note(f"{len(stream_ids)} calls sent in {time.monotonic() - start:.1f} s: {statuses}; then an ordinary call: "
           f"{attacker.view.statuses([ordinary])}; {describe(attacker.view.goaway)}")
    f.check(statuses.get(RESOURCE_EXHAUSTED, 0) >= expected and set(statuses) <= {RESOURCE_EXHAUSTED, None},
            f"expected at least {expected} calls RESOURCE_EXHAUSTED and the others unanswered: {statuses}")
    f.check(attacker.view.statuses([ordinary]) == {OK: 1}, f"the ordinary call after: "
                                                           f"{attacker.view.statuses([ordinary])}")
    siege.end(peak_mib=48)


# --- j. oversized metadata ------------------------------------------------------------------------------------------

def test_oversized_metadata(siege):
    """On one connection: a WatchProbeStatus call (open before), a Health/Check with 100 KiB of metadata (25 values
    of 4 KiB, never indexed: a header block of HEADERS + CONTINUATIONs under HEADER_BLOCK_BYTES, a header list over
    HEADER_LIST_BYTES), then an ordinary Health/Check. Expected: the big call alone ends, Trailers-Only
    RESOURCE_EXHAUSTED or RST_STREAM REFUSED_STREAM; the watch stays open, the ordinary call (and one more after)
    answered OK; no GOAWAY. RSS peak under 16 MiB."""
    attacker = siege.attacker()
    watch = attacker.call(WATCH_PROBE_STATUS)
    attacker.read_until(lambda view: bool(view.stream(watch).headers), ANSWER_TIMEOUT_S)
    rng = random.Random(0)
    metadata = [(f"x-big-{i}", "".join(rng.choices(string.ascii_letters + string.digits, k=4096)))
                for i in range(25)]
    big = attacker.call(HEALTH_CHECK, big_metadata=metadata)
    after = attacker.call(HEALTH_CHECK)
    attacker.read_until(lambda view: view.stream(big).answered and view.stream(after).answered, ANSWER_TIMEOUT_S)
    later = attacker.call(HEALTH_CHECK) if not attacker.closed else None
    if later is not None:
        attacker.read_until(lambda view: view.stream(later).answered, ANSWER_TIMEOUT_S)
    view, f = attacker.view, siege.findings
    big_answer = view.statuses([big])
    watch_open = bool(view.stream(watch).headers) and not view.stream(watch).answered and not attacker.closed
    f.note(f"the big call: {big_answer}; the watch: {'open' if watch_open else view.statuses([watch])}; "
           f"after: {view.statuses([after])}; {describe(view.goaway)}")
    f.check(big_answer in ({RESOURCE_EXHAUSTED: 1}, {"RST REFUSED_STREAM": 1}),
            f"the call with 100 KiB of metadata: {big_answer}, expected RESOURCE_EXHAUSTED or REFUSED_STREAM")
    f.check(big_answer != {RESOURCE_EXHAUSTED: 1} or len(view.stream(big).headers) == 1,
            "its RESOURCE_EXHAUSTED is not Trailers-Only")
    f.check(watch_open, f"the watch open before: {view.statuses([watch])}, the connection "
                        f"{'closed' if attacker.closed else 'open'}")
    f.check(view.statuses([after]) == {OK: 1}, f"the call after: {view.statuses([after])}")
    f.check(later is not None and view.statuses([later]) == {OK: 1},
            f"one more call: {'not sent, the connection is closed' if later is None else view.statuses([later])}")
    f.check(view.goaway is None and not attacker.closed, f"the connection ended: {describe(view.goaway)}")
    siege.end(peak_mib=16)


# --- k. silent and stalled connections -----------------------------------------------------------------------------

@pytest.mark.slow
def test_silent_and_stalled_connections(siege):
    """Three connections at once: one sends nothing; one the preface, SETTINGS and 4 bytes of a frame header; one a
    HEADERS frame header announcing 1000 bytes and 100 of them. Expected: the silent one closed within
    PREFACE_TIMEOUT_S + 5 s; meanwhile the monitor is answered as ever (nothing waits on a stalled frame). RSS peak
    under 8 MiB."""
    silent = siege.attacker(start=False)
    opened = time.monotonic()
    half_header = siege.attacker()
    half_header.send(settings_frame()[:4])
    half_frame = siege.attacker()
    block = half_frame.blocks.block(request_headers(HEALTH_CHECK))
    half_frame.send(headers_frame(half_frame.new_stream(), block + bytes(1000 - len(block)))[:9 + 100])
    closed = silent.read_until_closed(limits.PREFACE_TIMEOUT_S + 5)
    f = siege.findings
    f.note(f"the silent connection: {'closed after %.1f s' % (silent.closed_at - opened) if closed else 'open'}"
           f" ({describe(silent.view.goaway)}); the stalled ones closed: {half_header.closed}, {half_frame.closed}")
    f.check(closed, f"the silent connection still open after {limits.PREFACE_TIMEOUT_S + 5} s")
    siege.end(peak_mib=8)


# --- l. a client that does not read its answers ---------------------------------------------------------------------

@pytest.mark.slow
def test_slow_reader(siege):
    """64 server-reflection streams (ServerReflectionInfo: each request of 42 bytes answered with 7.4 KB, the
    descriptors of probe_service.proto) with 200 requests each, on a connection that never reads and never opens a
    window (the default 64 KiB). A daemon without probes streams nothing on WatchProbeStatus; reflection is its
    server stream that can be made to talk. Expected: RSS peak under 16 MiB over the start. What a connection's
    calls queue for a client that does not read is bounded per connection (WRITE_BUFFER_HIGH: "what a call writes
    waits below it too"), not per call: 1 MiB per call (call.py's WRITE_BACKLOG) times CONCURRENT_CALLS would
    be 4 GiB."""
    request = grpc_message(reflection_pb2.ServerReflectionRequest(
        file_containing_symbol="runtime.probe.v1alpha1.ProbeService").SerializeToString())
    attacker = siege.attacker(reads=False, open_windows=False)
    out = []
    for _ in range(64):
        stream_id, frames = attacker.call_frames(REFLECTION, None, end_stream=False)
        body = request * 200
        out.append(frames + b"".join(data_frame(stream_id, body[i:i + 16384]) for i in range(0, len(body), 16384)))
    sent = attacker.send(out, stall_s=STALL_S)
    settled = settle(siege.target.pid)
    siege.findings.note(f"wrote {sent.bytes / 1024:.0f} KiB, stopped: {sent.stopped}"
                        f"{'' if settled else ', the daemon still busy 20 s later'}")
    siege.end(peak_mib=16)


# --- the reference: grpcio's own server under the same attacks ------------------------------------------------------

@dataclass
class ReferenceServer:
    socket_path: str
    proc: subprocess.Popen | None = None

    def start(self) -> ReferenceServer:
        self.proc = subprocess.Popen([sys.executable, str(REPO_ROOT / "tests/support/servers/grpcio_unix_server.py"),
                                      self.socket_path], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()  # READY, or "" if it died
        assert line.strip() == "READY", f"grpcio's server did not start: {line!r}"
        return self

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def grpcio_siege(request, tmp_path):
    server = ReferenceServer(str(tmp_path / "grpcio.sock")).start()
    s = Siege(Target(server.socket_path, server.proc.pid, probe_service=False),
              Findings("grpcio " + request.node.name)).begin()
    yield s
    for attacker in s.attackers:
        attacker.close()
    if s.monitor is not None:
        s.monitor.stop()
    server.stop()



@pytest.mark.slow
def test_reference_grpcio_rapid_reset(grpcio_siege):
    """grpcio's server (1.85) under test_rapid_reset's 120k pairs, as measured: no GOAWAY, every pair read (about
    2 s); other clients' calls, while the flood lasts and for a moment after it, sometimes answered at once but
    CANCELLED (in some runs every call of the monitor, in others none, but a new connection's right after), the
    slowest 0.3 to 0.7 s; RSS +51 to +64 MiB. Asserted: no GOAWAY; the monitor's answers within their 5 s deadline,
    OK or CANCELLED; an OK from it within 30 s of the attack's end (the time is recorded), then a new connection
    served; RSS peak under 128 MiB."""
    siege, f = grpcio_siege, grpcio_siege.findings
    attacker = siege.attacker()
    stream_ids, chunks = attacker.repeated_calls(PAIRS, HEALTH_CHECK, message=None, end_stream=False, reset=True)
    sent = attacker.send(chunks, stall_s=STALL_S)
    attacker.close()
    ended = time.monotonic()
    recovered = siege.monitor.wait_answer(lambda answer: answer.at > ended and answer.code == "OK", 30.0)
    f.note(f"wrote {sent.bytes / MIB:.1f} MiB in {sent.seconds:.1f} s, stopped: {sent.stopped}; "
           f"{describe(attacker.view.goaway)}; cancelled monitor calls: "
           f"{sum(1 for answer in siege.monitor.answers if answer.code == 'CANCELLED')}; the monitor OK again "
           f"{'%.1f s after the attack' % (recovered.at - ended) if recovered else 'never (30 s)'}")
    f.check(sent.stopped == "done" and attacker.view.goaway is None, "grpcio ended the rapid reset: "
                                                                     f"{describe(attacker.view.goaway)}")
    f.check(recovered is not None, "grpcio did not answer the monitor OK within 30 s of the attack's end")
    siege.end(peak_mib=128, monitor_codes=frozenset({"OK", "CANCELLED"}), monitor_latency_s=DEADLINE_S)


@pytest.mark.slow
def test_reference_grpcio_settings_flood_not_read(grpcio_siege):
    """grpcio's server under test_settings_flood_not_read's 3M SETTINGS, as measured: it stops reading after about
    0.6 MiB of them (grpc core's DEFAULT_MAX_PENDING_INDUCED_FRAMES: ACKs wait unwritten, nothing more is read),
    RSS +1 MiB, no GOAWAY. Asserted: the writes stall, RSS peak under 16 MiB."""
    siege, f = grpcio_siege, grpcio_siege.findings
    attacker = siege.attacker(reads=False)
    sent = attacker.send(repeated(settings_frame(), FLOOD), stall_s=STALL_S)
    settle(siege.target.pid)
    f.note(f"wrote {sent.bytes / MIB:.1f} MiB in {sent.seconds:.1f} s, stopped: {sent.stopped}")
    f.check(sent.stopped == "stalled", f"grpcio read the whole flood: stopped {sent.stopped}")
    siege.end(peak_mib=16)


@pytest.mark.slow
def test_reference_grpcio_settings_flood_read(grpcio_siege):
    """grpcio's server under test_settings_flood_read's 3M SETTINGS from a client that reads, as measured: every
    one acknowledged, no GOAWAY (grpc core has no budget for SETTINGS), RSS +8 MiB. Asserted: that, RSS under 16
    MiB."""
    siege, f = grpcio_siege, grpcio_siege.findings
    attacker = siege.attacker()
    sent = attacker.send(repeated(settings_frame(), FLOOD), stall_s=STALL_S)
    attacker.read_until(lambda view: view.settings_acks > FLOOD or view.goaway is not None, ANSWER_TIMEOUT_S)
    f.note(f"wrote {sent.bytes / MIB:.1f} MiB in {sent.seconds:.1f} s, stopped: {sent.stopped}; "
           f"{attacker.view.settings_acks} SETTINGS ACKs; {describe(attacker.view.goaway)}")
    f.check(attacker.view.settings_acks == FLOOD + 1 and attacker.view.goaway is None,
            f"grpcio: {attacker.view.settings_acks} ACKs of {FLOOD + 1}, {describe(attacker.view.goaway)}")
    siege.end(peak_mib=16)
