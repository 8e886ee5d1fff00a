"""Hostile probe targets: real misbehaving servers in a pod netns, probed by a real worker.

Each scenario proves three things about an attempt against the server:
  - its result and output are the kubelet's for that server (mostly FAILURE; where
    the kubelet's semantics say otherwise, the documented result: an endless 200 body
    is a SUCCESS cut at 10 KiB, a body read error is a prober error (UNKNOWN), a
    redirect to another host is a WARNING that is not followed);
  - it ends within the probe timeout + 100 ms, measured by the worker itself
    (Attempt.duration_ns: from the attempt's start, without process start-up); a body
    that times out is a prober error the kubelet tries 3 times, each try with the
    full timeout, so that attempt ends within 3 timeouts + 100 ms;
  - the worker's peak memory (VmHWM) grows by less than MEMORY_BOUND_KIB over
    REPEATS attempts, far below what the servers send (1 MiB heads, endless bodies,
    a 100 MiB gRPC message): no attempt buffers more than the caps (response head
    64 KiB, body 10 KiB, gRPC reads 64 KiB).
Each scenario prints one MEASURED line (`pytest -rP` shows them) for the closing note.

The last tests show that hostile targets do not delay the probes of other containers
in the same sandbox, nor of another sandbox, through a real daemon.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from probe_worker import go_errors
from probe_worker.probes.grpc import rules as grpc_rules
from probe_worker.probes.grpc import unary_call
from probe_worker.probes.http import response as http_response
from tests.support.daemon_env import DaemonProcess, run, status
from tests.support.netns_env import PodNetns
from tests.support.process_memory import memory_kib

pytestmark = pytest.mark.netns

TIMEOUT_MS = 1000
LATE_BOUND_MS = 100          # the bound past the timeout
REPEATS = 3                  # hostile attempts per scenario, after the warm-up
# Peak RSS growth allowed over a scenario's attempts. Buffering any of the hostile
# payloads (1 MiB heads, 100 MiB message) would blow it; what the caps allow
# (64 KiB reads, a 64 KiB head, h11's copies, and the allocator touching fresh
# pages of a new arena for them: up to ~440 KiB seen with random bytes) stays inside.
MEMORY_BOUND_KIB = 768

SUCCESS, WARNING = spec_pb.RESULT_SUCCESS, spec_pb.RESULT_WARNING
FAILURE, UNKNOWN = spec_pb.RESULT_FAILURE, spec_pb.RESULT_UNKNOWN
AWAITING_HEADERS = go_errors.TIMEOUT_AWAITING_HEADERS
BROKEN = "net/http: HTTP/1.x transport connection broken: "
HEAD_CAP = f"{BROKEN}net/http: server response headers exceeded {http_response.MAX_HEAD_BYTES} bytes; aborted"


@dataclass(frozen=True)
class Target:
    """Where the probe went: the text an expected output is built from."""

    ip: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.ip}:{self.port}/healthz"

    @property
    def https_url(self) -> str:
        return f"https://{self.ip}:{self.port}/healthz"

    @property
    def reset_by_peer(self) -> str:
        """A read reset, from whatever local port the worker had."""
        return rf"read tcp {re.escape(self.ip)}:\d+->{re.escape(self.ip)}:{self.port}: read: connection reset by peer"


@dataclass(frozen=True)
class Scenario:
    name: str
    server: str                          # tests/support/servers/<server>
    mode: str
    kind: str                            # "http", "https" or "grpc"
    result: int
    # The expected output: exact text, or a regex (fullmatch) when part of it cannot be known.
    output: Callable[[Target], str]
    regex: bool = False
    server_args: tuple[str, ...] = ()
    http_status_code: int = 0
    check: Callable[[spec_pb.Attempt], None] = field(default=lambda attempt: None)
    # The kubelet runs a probe that errs (UNKNOWN) again at once, 3 tries in all, each
    # with the full timeout: an attempt whose tries time out ends after 3 timeouts.
    tries: int = 1


def no_redirect_followed(attempt: spec_pb.Attempt) -> None:
    assert "redirect" not in [p.name for p in attempt.phases]


def ten_requests(attempt: spec_pb.Attempt) -> None:
    assert [p.name for p in attempt.phases].count("redirect") == http_response.MAX_REDIRECT_REQUESTS - 1


def three_tries(attempt: spec_pb.Attempt) -> None:
    """A body read error is a prober error: the kubelet tries again at once, 3 tries in all."""
    assert [p.name for p in attempt.phases].count("connect") == 3


def http_case(name, mode, result, output, **kw) -> Scenario:
    return Scenario(name, "hostile_http.py", mode, "http", result, output, **kw)


def grpc_case(name, mode, output) -> Scenario:
    return Scenario(name, "hostile_grpc.py", mode, "grpc", FAILURE, lambda t: output)


def rpc_failed(code: str, desc: str) -> str:
    return f"error: health rpc probe failed: rpc error: code = {code} desc = {desc}"


SCENARIOS = [
    http_case("accepts and never answers", "silent", FAILURE, lambda t: f'Get "{t.url}": {AWAITING_HEADERS}'),
    Scenario("accepts and never answers (HTTPS)", "hostile_http.py", "silent", "https", FAILURE,
             lambda t: f'Get "{t.https_url}": {AWAITING_HEADERS}'),
    Scenario("accepts and never answers (gRPC)", "hostile_http.py", "silent", "grpc", FAILURE,
             lambda t: grpc_rules.dial_timeout_output(f"{t.ip}:{t.port}", TIMEOUT_MS * 1_000_000)),
    http_case("slowloris: one byte per second", "slowloris", FAILURE, lambda t: f'Get "{t.url}": {AWAITING_HEADERS}'),
    http_case("slowloris in the body", "slowloris-body", UNKNOWN,
              lambda t: go_errors.TIMEOUT_READING_BODY, http_status_code=200,
              check=three_tries, tries=3),
    # The kubelet reads at most 10 KiB of a body and ignores the rest: a 200 is a success.
    http_case("endless body (200)", "endless-body", SUCCESS, lambda t: "x" * http_response.MAX_BODY_BYTES,
              http_status_code=200),
    http_case("endless chunked body (500)", "endless-chunked", FAILURE,
              lambda t: "HTTP probe failed with statuscode: 500", server_args=("--status", "500"),
              http_status_code=500),
    http_case("1 MiB status line", "huge-status-line", FAILURE, lambda t: f'Get "{t.url}": {HEAD_CAP}'),
    http_case("1 MiB header", "huge-header", FAILURE, lambda t: f'Get "{t.url}": {HEAD_CAP}'),
    http_case("100,000 headers", "many-headers", FAILURE, lambda t: f'Get "{t.url}": {HEAD_CAP}'),
    http_case("random bytes, not HTTP", "garbage", FAILURE,
              lambda t: re.escape(f'Get "{t.url}": {BROKEN}malformed HTTP ') + r'(response|status code|version) ".*"',
              regex=True),
    http_case("an SSH banner, then silence", "banner", FAILURE,
              lambda t: f'Get "{t.url}": {BROKEN}malformed HTTP status code "Debian-2"'),
    http_case("HTTP/0.9 answer", "http09", FAILURE,
              lambda t: f'Get "{t.url}": {BROKEN}malformed HTTP status code "and"'),
    http_case("reset in the response head", "reset-mid-head", FAILURE,
              lambda t: re.escape(f'Get "{t.url}": {BROKEN}') + t.reset_by_peer, regex=True),
    http_case("reset in the body", "reset-mid-body", UNKNOWN,
              lambda t: t.reset_by_peer, regex=True,
              http_status_code=200, check=three_tries),
    Scenario("TLS garbage on HTTPS", "hostile_http.py", "tls-garbage", "https", FAILURE,
             lambda t: f'Get "{t.https_url}": tls: first record does not look like a TLS handshake'),
    Scenario("TLS garbage in a handshake record", "hostile_http.py", "tls-garbage-record", "https", FAILURE,
             lambda t: re.escape(f'Get "{t.https_url}": tls: ') + ".+", regex=True),
    http_case("redirects forever", "redirect-loop", FAILURE, lambda t: 'Get "/healthz": stopped after 10 redirects',
              http_status_code=302, check=ten_requests),
    http_case("redirect to another host", "redirect-other-host", WARNING,
              lambda t: "Probe terminated redirects, Response body: moved", http_status_code=302,
              check=no_redirect_followed),
    grpc_case("gRPC 100 MiB message", "huge-message",
              rpc_failed("ResourceExhausted", f"grpc: received message larger than max ({100 << 20} vs. "
                                              f"{unary_call.MAX_MESSAGE_BYTES})")),
    grpc_case("gRPC never sends trailers", "no-trailers", "timeout: health rpc did not complete within 1s"),
    grpc_case("gRPC GOAWAY", "goaway", rpc_failed("Unavailable", "the connection is draining")),
]


def probe_spec(kind: str, port: int, path: str = "/healthz") -> spec_pb.ProbeSpec:
    if kind == "grpc":
        return spec_pb.ProbeSpec(grpc=spec_pb.GRPCAction(port=port), timeout_ms=TIMEOUT_MS)
    scheme = spec_pb.HTTPS if kind == "https" else spec_pb.HTTP
    return spec_pb.ProbeSpec(
        http_get=spec_pb.HTTPGetAction(path=path, port=spec_pb.PortRef(number=port), scheme=scheme),
        timeout_ms=TIMEOUT_MS,
    )


# A well-behaved server of each kind: the worker's first use of a code path (TLS
# above all) allocates, and that is not what an attempt buffers.
WARM_UP_SERVERS = {
    "http": ("hostile_http.py", "--mode", "healthy"),
    "https": ("http_server.py", "--tls"),
    "grpc": ("hostile_grpc.py", "--mode", "healthy"),
}


def warm_up(pod_netns, worker, kind: str) -> None:
    server = pod_netns.spawn_python(*WARM_UP_SERVERS[kind])
    for _ in range(2):
        attempt = worker.run_once(probe_spec(kind, server.port, path="/ok"))
        assert attempt.result == SUCCESS, attempt.output
    server.stop()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_hostile_target(scenario: Scenario, pod_netns, worker):
    warm_up(pod_netns, worker, scenario.kind)
    server = pod_netns.spawn_python(scenario.server, "--mode", scenario.mode, *scenario.server_args)
    target = Target(pod_netns.ipv4, server.port)
    before = memory_kib(worker.proc.pid, pss=True)

    spec = probe_spec(scenario.kind, server.port)
    attempts = [worker.run_once(spec, timeout=scenario.tries * TIMEOUT_MS / 1000 + 10) for _ in range(REPEATS)]
    after = memory_kib(worker.proc.pid, pss=True)

    durations_ms = [a.duration_ns / 1e6 for a in attempts]
    growth = {key: after[key] - before[key] for key in after}
    # The measurement for the closing note (`pytest -rP` shows it).
    print(f"MEASURED | {scenario.name} | {spec_pb.AttemptResult.Name(attempts[0].result)} | "
          f"{attempts[0].output[:100]!r} | max {max(durations_ms):.1f} ms of {scenario.tries} x {TIMEOUT_MS} ms | "
          f"HWM +{growth['VmHWM']} KiB, RSS {growth['VmRSS']:+d} KiB, PSS {growth['Pss']:+d} KiB")

    expected = scenario.output(target)
    for attempt in attempts:
        assert attempt.result == scenario.result, attempt.output
        if scenario.regex:
            assert re.fullmatch(expected, attempt.output, re.DOTALL), attempt.output
        else:
            assert attempt.output == expected
        assert attempt.http_status_code == scenario.http_status_code
        scenario.check(attempt)
    assert max(durations_ms) <= scenario.tries * TIMEOUT_MS + LATE_BOUND_MS, durations_ms
    assert growth["VmHWM"] < MEMORY_BOUND_KIB, (before, after)
    assert worker.proc.poll() is None  # and the worker is still there


# --- one hostile target does not delay other probes ------------------------------------------------

HEALTHY_PERIOD_MS = 100
HEALTHY_ATTEMPTS = 30        # 3 s of a healthy probe's schedule
# The busiest hostile targets: holding connections open, streaming as fast as TCP allows,
# making the worker parse a capped head or garbage, failing the TLS handshake.
NEIGHBOURS = [
    ("hostile_http.py", "silent", "http"),
    ("hostile_http.py", "slowloris", "http"),
    ("hostile_http.py", "endless-body", "http"),
    ("hostile_http.py", "many-headers", "http"),
    ("hostile_http.py", "garbage", "http"),
    ("hostile_http.py", "tls-garbage", "https"),
    ("hostile_grpc.py", "huge-message", "grpc"),
    ("hostile_grpc.py", "no-trailers", "grpc"),
]


def healthy_spec(port: int) -> spec_pb.ProbeSpec:
    return spec_pb.ProbeSpec(http_get=spec_pb.HTTPGetAction(path="/healthz", port=spec_pb.PortRef(number=port)),
                             period_ms=HEALTHY_PERIOD_MS, timeout_ms=TIMEOUT_MS)


def collect_attempts(daemon, healthy: set[str], count: int) -> dict[str, list[spec_pb.Attempt]]:
    """Every attempt of every probe, from one watch, until each healthy probe has `count`."""
    request = service_pb.WatchProbeStatusRequest(filter=service_pb.ProbeFilter(), every_attempt=True)
    stream = daemon.stub.WatchProbeStatus(request, timeout=count * HEALTHY_PERIOD_MS / 1000 + 30)
    attempts: dict[str, list[spec_pb.Attempt]] = {}
    try:
        for event in stream:
            if event.type == service_pb.ATTEMPT:
                attempts.setdefault(event.probe.probe_id, []).append(event.probe.status.last_attempt)
                if all(len(attempts.get(p, ())) >= count for p in healthy):
                    return attempts
    finally:
        stream.cancel()
    raise AssertionError("the watch ended before the healthy probes had their attempts")


@pytest.fixture(params=["pooled", "sandbox"])
def daemon(request, tmp_path):
    """The daemon in each worker mode. Pooled, the other sandbox shares the hostile targets' worker."""
    d = DaemonProcess(tmp_path, ["--worker-isolation", request.param]).start()
    d.isolation = request.param
    yield d
    d.stop()


def test_hostile_targets_do_not_delay_other_containers_or_sandboxes(daemon, pod_netns):
    other = PodNetns.create()
    try:
        for i, (script, mode, kind) in enumerate(NEIGHBOURS):
            server = pod_netns.spawn_python(script, "--mode", mode)
            spec = probe_spec(kind, server.port)
            # The kubelet's shortest period. Shorter ones measure this 2-core machine instead:
            # the hostile servers' own CPU (streaming, garbage) starves every process on it.
            spec.period_ms = TIMEOUT_MS
            run(daemon, pod_netns, spec, container=f"hostile-{i}")
        same_sandbox = run(daemon, pod_netns, healthy_spec(pod_netns.spawn_python(
            "hostile_http.py", "--mode", "healthy").port), container="healthy")
        other_sandbox = run(daemon, other, healthy_spec(other.spawn_python(
            "hostile_http.py", "--mode", "healthy").port), container="healthy")

        attempts = collect_attempts(daemon, {same_sandbox, other_sandbox}, HEALTHY_ATTEMPTS)
        workers = {p.probe_id: p.status.worker.pid for p in status(daemon).probes}
        assert (workers[same_sandbox] == workers[other_sandbox]) == (daemon.isolation == "pooled")
    finally:
        other.destroy()

    hostile = {p: a for p, a in attempts.items() if p not in (same_sandbox, other_sandbox)}
    window = attempts[same_sandbox][0].started_at_unix_ns, attempts[same_sandbox][-1].started_at_unix_ns
    # Every hostile probe was at work while the healthy ones ran.
    assert len(hostile) == len(NEIGHBOURS)
    for probe_attempts in hostile.values():
        assert any(window[0] <= a.started_at_unix_ns <= window[1] for a in probe_attempts)

    healthy = {name: attempts[probe_id][:HEALTHY_ATTEMPTS]
               for name, probe_id in (("same sandbox", same_sandbox), ("other sandbox", other_sandbox))}
    # Each attempt started on its tick (the worker's own due time), and no tick was dropped.
    lateness = {name: [(a.started_at_unix_ns - a.scheduled_at_unix_ns) / 1e6 for a in probe_attempts]
                for name, probe_attempts in healthy.items()}
    for name, late in lateness.items():
        print(f"MEASURED | healthy probe, {name} | max lateness {max(late):.1f} ms, "
              f"median {sorted(late)[len(late) // 2]:.1f} ms over {len(late)} attempts")
    for name, probe_attempts in healthy.items():
        assert all(a.result == SUCCESS and a.scheduled_at_unix_ns > 0 for a in probe_attempts)
        assert max(lateness[name]) < LATE_BOUND_MS, (name, lateness[name])
        assert [a.ticks_missed for a in probe_attempts] == [0] * len(probe_attempts)
