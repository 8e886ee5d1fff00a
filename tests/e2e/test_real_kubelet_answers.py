"""What the real kubelet (1.37.2 by default) does with each kind of bridge answer, read in its own log and counters.

The node is test_real_kubelet.py's (a kubelet whose CRI endpoint is the shim, in front of the suite's containerd),
a node of this module's own. The kubelet logs its events (kubelet_env.py: `--vmodule=event=3`), so a test reads the
very Unhealthy event `kubectl describe` would show. Every expected text comes from the kubelet's Go source through
tests/support/kubelet_exec_model.py (what prober.go, pkg/probe/exec, cri-client and lifecycle/handlers.go make of
an answer) and from the Go texts of the network probers it stands in for; never from what the shim prints. The
same tests pass with kubelet 1.35.4 (K8S_VERSION=1.35.4), whose code on these paths is 1.37's.

What each test proves:
- a failed bridged HTTP or TCP probe is the kubelet's "Probe failed" with its own network prober's text, the event
  "Readiness probe failed: ...", and a counted failure;
- a probe that outlives timeoutSeconds is a counted failure with the HTTP prober's timeout text (the shim's engine
  ends it at the timeout), not an error;
- a bridge that answers after timeoutSeconds + its grace (a worker stopped) is read as 1.37 reads DeadlineExceeded:
  a counted failure, "command timed out: "<cmd>" timed out after 1s" (no ExecProbeTimeout gate any more);
- an answer the kubelet's own prober would have errored on (a body cut short) is an error status: the event reads
  "... probe errored and resulted in unknown state: rpc error: ...", nothing is counted, a liveness probe with
  failureThreshold 1 restarts nothing, and the kubelet asks three times a period (runProbeWithRetries);
- failed converted postStart and preStop hooks fail with the kubelet's exec hook message, word for word.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from typing import TypeVar

import grpc
import pytest

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from cri_proto import probe_service_pb2 as service_pb
from probe_api.bridge_command import command_for
from probe_api.gostrings import join_host_port
from tests.e2e.test_real_kubelet import k, node  # noqa: F401  (the module's node, and each test's pods removed)
from tests.support import kubelet_env
from tests.support.kubelet_exec_model import (
    MAX_PROBE_RETRIES, ProbeVerdict, StatusError, hook_error, hook_message, pod_desc, post_start_failure, probe_event,
    probe_verdict,
)
from tests.support.kubelet_node import HTTP_PORT, http_get, httpd, probe, static_pod
from tests.support.kubelet_views import LogRecord, log_records

pytestmark = pytest.mark.e2e

CLOSED_PORT = 9999   # nothing listens there in these pods
WAIT_S = 30.0
T = TypeVar("T")

# busybox httpd hands a CGI's output on as it is: a header of its own, then whatever the script printed.
SLOW_CGI = "#!/bin/sh\n/bin/busybox sleep 3\nprintf 'Content-Type: text/plain\\r\\n\\r\\nlate\\n'\n"
SHORT_CGI = "#!/bin/sh\nprintf 'Content-Type: text/plain\\r\\nContent-Length: 100\\r\\n\\r\\nshort'\n"


def cgi(k, pod: str, name: str, script: str):
    www = k.www(pod)
    (www / "cgi-bin" / name).write_text(script)
    (www / "cgi-bin" / name).chmod(0o755)
    return www


def wait_for(what: str, find: Callable[[], T], k, timeout_s: float = WAIT_S) -> T:
    """find()'s first true value (the kubelet's log and read-only port have no watch)."""
    deadline = time.monotonic() + timeout_s
    while not (found := find()):
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:g}s:\n{k.kubelet.log_tail(40)}"
        time.sleep(kubelet_env.POLL_S)
    return found


def records(k, message: str, pod: str, **values: str) -> list[LogRecord]:
    """The kubelet's log records with this message about this pod (klog.KObj: namespace/name)."""
    return [r for r in log_records(k.kubelet.log_text(), message)
            if r.values.get("pod") == f"default/{pod}" and all(r.values.get(key) == v for key, v in values.items())]


def events(k, pod: str, reason: str) -> list[str]:
    """The messages of the events the kubelet recorded for the pod with this reason ("Event occurred")."""
    return [r.values["message"] for r in log_records(k.kubelet.log_text(), "Event occurred")
            if r.values.get("object") == f"default/{pod}" and r.values.get("reason") == reason]


def wait_event(k, pod: str, reason: str, message: str) -> None:
    """The event is logged by the broadcaster's own goroutine, a moment after the log line of what caused it."""
    wait_for(f"the event {reason} {message!r} of {pod}", lambda: message in events(k, pod, reason), k)


def counted(k, pod: str, probe_type: str) -> dict[str, float]:
    """The kubelet's prober_probe_total for the pod's probe of this type, by result."""
    return {key[3]: value for key, value in k.kubelet.probe_counts().items() if key[0] == pod and key[2] == probe_type}


def pod_ip(k, name: str) -> str:
    return wait_for(f"an IP for {name}", lambda: name in (pods := k.kubelet.pods()) and pods[name].pod_ip, k)


# --- failures ---------------------------------------------------------------------------------------------------

def test_a_failed_bridged_probe_is_the_kubelets_failure_with_its_own_network_probers_text(k):
    image = k.containerd.images.http
    http = k.apply(static_pod("fail-http", k.www("fail-http"), [
        httpd("web", image, readinessProbe=probe(http_get(path="/missing")))]))
    tcp = k.apply(static_pod("fail-tcp", k.www("fail-tcp"), [
        httpd("web", image, readinessProbe=probe({"tcpSocket": {"port": CLOSED_PORT}}))]))
    expected = {
        http: "HTTP probe failed with statuscode: 404",  # pkg/probe/http DoHTTPProbe
        # pkg/probe/tcp DoTCPProbe: net.DialTimeout's *net.OpError
        tcp: f"dial tcp {join_host_port(pod_ip(k, tcp), CLOSED_PORT)}: connect: connection refused",
    }
    for pod, output in expected.items():
        # A first probe may find httpd not listening yet: the record wanted is the one with the endpoint's answer.
        (record, *_) = wait_for(f"a 'Probe failed' of {pod} with {output!r}",
                                lambda: records(k, "Probe failed", pod, output=output), k)
        assert (record.values["probeType"], record.values["probeResult"]) == ("Readiness", "failure")
        wait_event(k, pod, "Unhealthy", probe_event("Readiness", ProbeVerdict("failure", output)))
        assert counted(k, pod, "Readiness").get("failed", 0) >= 1
        assert "successful" not in counted(k, pod, "Readiness")
    assert not any(p.ready for name, p in k.kubelet.pods().items() if name in expected)


def test_a_probe_that_outlives_its_timeout_is_a_counted_failure_with_the_http_probers_timeout_text(k):
    www = cgi(k, "slow", "slow", SLOW_CGI)
    name = k.apply(static_pod("slow", www, [httpd("web", k.containerd.images.http, readinessProbe=probe(
        http_get(path="/cgi-bin/slow"), timeoutSeconds=1))]))
    # net/http Client.do: a url.Error around the transport's context error, marked as the client's timeout.
    output = (f'Get "http://{join_host_port(pod_ip(k, name), HTTP_PORT)}/cgi-bin/slow": context deadline exceeded '
              "(Client.Timeout exceeded while awaiting headers)")
    wait_for("a timed-out probe", lambda: records(k, "Probe failed", name, output=output), k)
    wait_event(k, name, "Unhealthy", probe_event("Readiness", ProbeVerdict("failure", output)))
    assert counted(k, name, "Readiness").get("failed", 0) >= 1
    assert not records(k, "Probe errored", name)


def test_a_bridge_that_answers_after_the_timeout_and_its_grace_is_a_timed_out_command_a_counted_failure(k):
    handler = http_get()
    name = k.apply(static_pod("late", k.www("late"), [httpd("web", k.containerd.images.http,
                                                            readinessProbe=probe(handler, timeoutSeconds=1))]))
    k.wait_ready(name)
    # cri-client execSyncV1 turns DeadlineExceeded into ErrCommandTimedOut with the command as the kubelet ran it;
    # pkg/probe/exec makes that a failure (1.35 locked ExecProbeTimeout on, 1.37 no longer reads it).
    cmd = command_for("readiness", handler)
    verdict = probe_verdict(cmd, 1, StatusError(grpc.StatusCode.DEADLINE_EXCEEDED, "cri-probe-shim: no answer"))
    assert verdict.output == f'command timed out: "cri-probe-shim readiness {{\\"httpGet\\":{{\\"path\\":' \
                             f'\\"/healthz\\",\\"port\\":{HTTP_PORT}}}}}" timed out after 1s'
    failed_before = counted(k, name, "Readiness").get("failed", 0)
    # A stopped worker answers nothing: the shim answers DEADLINE_EXCEEDED after timeoutSeconds + 2 s. The shim
    # replaces a worker silent for 5 s (heartbeat_timeout_s), which a probe may meet first: then again.
    for _ in range(3):
        workers = {s.worker.pid for s in k.shim.stub.ListProbeSandboxes(
            service_pb.ListProbeSandboxesRequest(), timeout=10).sandboxes if s.worker.pid}
        assert workers
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 10
            while not records(k, "Probe failed", name, output=verdict.output) and time.monotonic() < deadline:
                time.sleep(kubelet_env.POLL_S)
        finally:
            for pid in workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        if records(k, "Probe failed", name, output=verdict.output):
            break
    else:
        pytest.fail(f"no timed-out probe in 3 tries:\n{k.kubelet.log_tail(40)}")
    wait_event(k, name, "Unhealthy", probe_event("Readiness", verdict))
    assert counted(k, name, "Readiness").get("failed", 0) > failed_before  # counted, not thrown away
    assert not records(k, "Probe errored", name)
    k.wait_ready(name)  # and the next worker answers again


# --- errors ------------------------------------------------------------------------------------------------------

def test_an_answer_the_kubelets_prober_would_have_errored_on_is_thrown_away_after_three_tries(k):
    www = cgi(k, "short", "short", SHORT_CGI)
    handler = http_get(path="/cgi-bin/short")
    name = k.apply(static_pod("short", www, [httpd(
        "web", k.containerd.images.http, readinessProbe=probe(handler),
        livenessProbe=probe(handler, failureThreshold=1))]))  # one counted failure would restart it
    # A body short of its Content-Length: io.ErrUnexpectedEOF, which the kubelet's HTTP prober returns as an error
    # (DoHTTPProbe: `return probe.Failure, "", err`); the bridge answers it with an UNKNOWN status.
    verdict = probe_verdict(command_for("readiness", handler), 1, StatusError(grpc.StatusCode.UNKNOWN,
                                                                              "unexpected EOF"))
    assert verdict.discarded
    errored = wait_for("4 errored readiness probes", lambda: len(records(
        k, "Probe errored", name, probeType="Readiness")) >= 4 and records(k, "Probe errored", name), k)
    assert {(r.values["probeResult"], r.values["err"]) for r in errored} == {("unknown", verdict.error)}
    assert probe_event("Readiness", verdict) == (
        "Readiness probe errored and resulted in unknown state: rpc error: code = Unknown desc = unexpected EOF")
    wait_event(k, name, "Unhealthy", probe_event("Readiness", verdict))
    # Thrown away: nothing counted for either probe, readiness keeps its initial Failure, liveness its Success.
    periods = len(records(k, "Probe errored", name, probeType="Readiness"))
    assert not any(counted(k, name, "Readiness").values()) and not any(counted(k, name, "Liveness").values())
    pod = k.kubelet.pods()[name]
    assert not pod.ready and pod.restarts == 0
    # runProbeWithRetries: each errored period is MAX_PROBE_RETRIES ExecSyncs, each an attempt on the shim's row.
    (row,) = [p for p in k.shim.stub.ProbeStatus(service_pb.ProbeStatusRequest(), timeout=10).probes
              if p.labels.get("io.kubernetes.pod.name") == name and p.bridged.role == "readiness"]
    assert row.status.totals.unknown >= MAX_PROBE_RETRIES * periods
    assert (row.status.totals.success, row.status.totals.failure) == (0, 0)


# --- hooks -------------------------------------------------------------------------------------------------------

def test_failed_converted_hooks_fail_with_the_kubelets_exec_hook_message(k):
    post_start, pre_stop = http_get(CLOSED_PORT, "/start"), http_get(CLOSED_PORT, "/stop")
    name = k.apply(static_pod("hook-fail", k.www("hook-fail"), [httpd(
        "web", k.containerd.images.http, lifecycle={"postStart": post_start, "preStop": pre_stop})]))
    ip = pod_ip(k, name)
    pod = pod_desc(name, "default", k.kubelet.pods()[name].uid)

    def refused(path: str) -> cri_pb.ExecSyncResponse:
        """The bridge's answer to a hook that failed (answer.py: exit 1, the error on stderr), with the text of
        the kubelet's own HTTP hook: net/http's url.Error around net.DialTimeout's refusal."""
        address = join_host_port(ip, CLOSED_PORT)
        text = f'Get "http://{address}{path}": dial tcp {address}: connect: connection refused'
        return cri_pb.ExecSyncResponse(exit_code=1, stderr=text.encode())

    start_cmd, stop_cmd = command_for("postStart", post_start), command_for("preStop", pre_stop)
    message = hook_message(start_cmd, "web", pod, refused("/start"))
    (unhandled, *_) = wait_for("the failed postStart's error", lambda: [
        r for r in log_records(k.kubelet.log_text(), "Unhandled Error")
        if r.values.get("err") == post_start_failure("web", pod, message)], k)
    assert message.startswith("Exec lifecycle hook ([cri-probe-shim postStart ")
    assert [r.values["err"] for r in records(k, "Failed to execute PostStartHook", name)][:1] == [
        hook_error(start_cmd, refused("/start"))]
    # The container is killed with its preStop hook, which fails the same way.
    (stopped, *_) = wait_for("the failed preStop", lambda: records(k, "PreStop hook failed", name), k)
    assert stopped.values["err"] == hook_error(stop_cmd, refused("/stop"))
    # The events carry no message ("so that secrets won't leak from the server").
    wait_event(k, name, "FailedPostStartHook", "PostStartHook failed")
    wait_event(k, name, "FailedPreStopHook", "PreStopHook failed")
    k.kubelet.wait_for("a restart after the failed postStart", lambda pods: pods[name].restarts >= 1)
