"""tests/support/kubelet_exec_model.py against the kubelet 1.37.2 source it stands in for. Pure: no sockets.

The Go each test follows (kubernetes v1.37.2, k8s.io/cri-client v0.37.2):
- cri-client pkg/remote_runtime.go ExecSync: `if timeout != 0 { ctx, cancel = context.WithTimeout(ctx,
  r.timeout+timeout) } else { ctx, cancel = context.WithCancel(ctx) }`; execSyncV1:
      if status.Code(err) == codes.DeadlineExceeded {
          err = fmt.Errorf("%w: %q timed out after %s", ErrCommandTimedOut, strings.Join(cmd, " "), timeout) }
      ...
      if resp.ExitCode != 0 { err = utilexec.CodeExitError{Err: fmt.Errorf("command '%s' exited with %d: %s",
          strings.Join(cmd, " "), resp.ExitCode, resp.Stderr), Code: int(resp.ExitCode)} }
- pkg/kubelet/kuberuntime RunInContainer: `return append(stdout, stderr...), err`
- pkg/probe/exec exec.go Probe: `maxReadLength = 10 * 1 << 10`; an ExitError with ExitStatus() == 0 is
  `probe.Success, string(data)`, any other `probe.Failure, string(data)`; `if errors.Is(err,
  remote.ErrCommandTimedOut) { return probe.Failure, err.Error(), nil }` (no feature gate since 1.35); anything
  else `probe.Unknown, "", err`.
- pkg/kubelet/prober/prober.go probe: `"%s probe errored and resulted in %s state: %s", probeType, result, err` and
  `"%s probe failed: %s", probeType, output`; runProbeWithRetries(..., maxProbeRetries) with maxProbeRetries = 3,
  returning at the first run without an error; worker.go doProbe: "Prober error, throw away the result".
- pkg/kubelet/lifecycle/handlers.go Run: `hr.commandRunner.RunInContainer(ctx, containerID, handler.Exec.Command,
  0)`, then `fmt.Sprintf("Exec lifecycle hook (%v) for Container %q in Pod %q failed - error: %v, message: %q",
  handler.Exec.Command, container.Name, format.Pod(pod), err, string(output))`.
- kuberuntime_manager.go SyncPod's start: `utilruntime.HandleError(fmt.Errorf("%v %v start failed in pod %v: %w:
  %s", typeName, spec.container.Name, format.Pod(pod), err, msg))` with err = ErrPostStartHook
  (errors.New("PostStartHookError")); pkg/kubelet/util/format PodDesc: `fmt.Sprintf("%s_%s(%s)", ...)`.
"""

from __future__ import annotations

import grpc
import pytest

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from probe_api.bridge_command import command_for
from probe_api.gostrings import go_duration, go_quote
from tests.support.kubelet_exec_model import (
    MAX_PROBE_RETRIES, ProbeVerdict, StatusError, exec_sync_deadline_s, hook_error, hook_message, pod_desc,
    post_start_failure, probe_event, probe_period, probe_verdict,
)

PROBE_CMD = command_for("readiness", {"httpGet": {"path": "/healthz", "port": 8080}})


def response(exit_code: int, stdout: bytes = b"", stderr: bytes = b"") -> cri_pb.ExecSyncResponse:
    return cri_pb.ExecSyncResponse(exit_code=exit_code, stdout=stdout, stderr=stderr)


# --- one runProbe: pkg/probe/exec of what RunInContainer returned ----------------------------------------------

def test_exit_code_zero_is_success_with_stdout_then_stderr():
    # RunInContainer: append(stdout, stderr...)
    assert probe_verdict(["x"], 1, response(0, b"out ", b"err")) == ProbeVerdict("success", "out err")


@pytest.mark.parametrize("exit_code", [1, 2, 126, 127, 137, -1])
def test_any_other_exit_code_is_failure_with_the_output(exit_code):
    assert probe_verdict(["x"], 1, response(exit_code, b"o", b"e")) == ProbeVerdict("failure", "oe")


def test_10_kib_of_stdout_and_stderr_together_are_kept():
    verdict = probe_verdict(["x"], 1, response(1, b"a" * 8192, b"b" * 8192))
    assert verdict.output == "a" * 8192 + "b" * 2048


def test_deadline_exceeded_is_a_counted_failure_whose_output_is_the_timeout_error():
    verdict = probe_verdict(["cat", "/tmp/healthy"], 5, StatusError(grpc.StatusCode.DEADLINE_EXCEEDED, "ignored"))
    assert verdict == ProbeVerdict("failure", 'command timed out: "cat /tmp/healthy" timed out after 5s')
    assert not verdict.discarded and verdict.counted == "failed"


OTHER_CODES = [code for code in grpc.StatusCode if code not in (grpc.StatusCode.OK, grpc.StatusCode.DEADLINE_EXCEEDED)]
GO_NAMES = {grpc.StatusCode.UNKNOWN: "Unknown", grpc.StatusCode.INVALID_ARGUMENT: "InvalidArgument",
            grpc.StatusCode.NOT_FOUND: "NotFound", grpc.StatusCode.ALREADY_EXISTS: "AlreadyExists",
            grpc.StatusCode.PERMISSION_DENIED: "PermissionDenied", grpc.StatusCode.RESOURCE_EXHAUSTED:
            "ResourceExhausted", grpc.StatusCode.FAILED_PRECONDITION: "FailedPrecondition",
            grpc.StatusCode.ABORTED: "Aborted", grpc.StatusCode.OUT_OF_RANGE: "OutOfRange",
            grpc.StatusCode.UNIMPLEMENTED: "Unimplemented", grpc.StatusCode.INTERNAL: "Internal",
            grpc.StatusCode.UNAVAILABLE: "Unavailable", grpc.StatusCode.DATA_LOSS: "DataLoss",
            grpc.StatusCode.UNAUTHENTICATED: "Unauthenticated", grpc.StatusCode.CANCELLED: "Canceled"}


@pytest.mark.parametrize("code", OTHER_CODES, ids=[code.name for code in OTHER_CODES])
def test_any_other_status_is_unknown_and_thrown_away(code):
    # grpc-go codes.Code.String() names, as in "rpc error: code = NotFound desc = ..."; "Canceled" with one l.
    verdict = probe_verdict(["x"], 1, StatusError(code, "why"))
    assert verdict == ProbeVerdict("unknown", "", f"rpc error: code = {GO_NAMES[code]} desc = why")
    assert verdict.discarded and verdict.counted is None


def test_the_timed_out_command_is_quoted_with_go_q_and_the_timeout_is_a_go_duration():
    verdict = probe_verdict(PROBE_CMD, 1, StatusError(grpc.StatusCode.DEADLINE_EXCEEDED, ""))
    assert verdict.output == f"command timed out: {go_quote(' '.join(PROBE_CMD))} timed out after 1s"
    assert verdict.output == ('command timed out: "cri-probe-shim readiness {\\"httpGet\\":{\\"path\\":\\"/healthz\\",'
                              '\\"port\\":8080}}" timed out after 1s')
    verdict = probe_verdict(["x"], 90, StatusError(grpc.StatusCode.DEADLINE_EXCEEDED, ""))
    assert verdict.output == f'command timed out: "x" timed out after {go_duration(90 * 10**9)}' == \
        'command timed out: "x" timed out after 1m30s'


# --- one period: runProbeWithRetries, the event, the counter ------------------------------------------------------

def answers(*given):
    sent = []

    def exec_sync():
        sent.append(given[len(sent)])
        return sent[-1]
    return exec_sync, sent


def test_an_errored_period_sends_three_exec_syncs_and_keeps_the_last_error():
    exec_sync, sent = answers(*[StatusError(grpc.StatusCode.UNKNOWN, f"try {i}") for i in range(1, 5)])
    verdict, count = probe_period(PROBE_CMD, 1, exec_sync)
    assert count == len(sent) == MAX_PROBE_RETRIES == 3
    assert verdict.error == "rpc error: code = Unknown desc = try 3" and verdict.counted is None


@pytest.mark.parametrize("first, result", [(response(0, b"ok"), "success"), (response(1, b"no"), "failure"),
                                           (StatusError(grpc.StatusCode.DEADLINE_EXCEEDED, ""), "failure")])
def test_a_period_without_an_error_sends_one_exec_sync(first, result):
    exec_sync, sent = answers(first, response(0))
    verdict, count = probe_period(PROBE_CMD, 1, exec_sync)
    assert (verdict.result, count, len(sent)) == (result, 1, 1)


def test_an_error_then_an_answer_is_that_answer():
    exec_sync, _ = answers(StatusError(grpc.StatusCode.UNAVAILABLE, "restarting"), response(1, b"HTTP probe failed"))
    assert probe_period(PROBE_CMD, 1, exec_sync) == (ProbeVerdict("failure", "HTTP probe failed"), 2)


@pytest.mark.parametrize("probe_type, verdict, event", [
    ("Readiness", ProbeVerdict("success", "ok"), None),
    ("Readiness", ProbeVerdict("failure", "HTTP probe failed with statuscode: 500"),
     "Readiness probe failed: HTTP probe failed with statuscode: 500"),
    ("Liveness", ProbeVerdict("failure", ""), "Liveness probe failed: "),
    # 1.32: "Startup probe errored: rpc error: ..."
    ("Startup", ProbeVerdict("unknown", "", "rpc error: code = FailedPrecondition desc = cri-probe-shim: why"),
     "Startup probe errored and resulted in unknown state: rpc error: code = FailedPrecondition desc = "
     "cri-probe-shim: why"),
])
def test_the_unhealthy_event_is_prober_gos(probe_type, verdict, event):
    assert probe_event(probe_type, verdict) == event


def test_the_kubelet_waits_two_minutes_past_the_timeout_for_a_probe_and_for_ever_for_a_hook():
    assert exec_sync_deadline_s(1) == 121
    assert exec_sync_deadline_s(30, runtime_request_timeout_s=10) == 40
    assert exec_sync_deadline_s(0) is None


# --- hooks ---------------------------------------------------------------------------------------------------------

def test_a_hook_fails_on_any_non_zero_exit_with_stderr_only():
    assert hook_error(["x"], response(0, b"out", b"err")) is None
    assert hook_error(["/bin/stop", "now"], response(3, b"out", b"err")) == "command '/bin/stop now' exited with 3: err"
    assert hook_error(["x"], StatusError(grpc.StatusCode.NOT_FOUND, "gone")) == "rpc error: code = NotFound desc = gone"


def test_a_hook_that_timed_out_fails_with_the_timeout_error_of_a_zero_timeout():
    # The kubelet passes a hook no timeout, so it prints 0s.
    error = hook_error(["x"], StatusError(grpc.StatusCode.DEADLINE_EXCEEDED, "cri-probe-shim: no answer within 32s"))
    assert error == 'command timed out: "x" timed out after 0s'


def test_the_hook_message_is_handlers_gos():
    cmd = command_for("preStop", {"httpGet": {"path": "/stop", "port": 8080}})
    pod = pod_desc("shop-web-node1", "default", "77da")
    assert pod == "shop-web-node1_default(77da)"
    assert hook_message(cmd, "web", pod, response(0, b"out")) is None
    message = hook_message(cmd, "web", pod, response(1, b"out\n", b'Get "http://x/stop": EOF'))
    assert message == ('Exec lifecycle hook ([cri-probe-shim preStop {"httpGet":{"path":"/stop","port":8080}}]) '
                       'for Container "web" in Pod "shop-web-node1_default(77da)" failed - error: command '
                       '\'cri-probe-shim preStop {"httpGet":{"path":"/stop","port":8080}}\' exited with 1: '
                       'Get "http://x/stop": EOF, message: "out\\nGet \\"http://x/stop\\": EOF"')
    status = hook_message(["x"], "web", pod, StatusError(grpc.StatusCode.UNKNOWN, "no route"))
    assert status.endswith('failed - error: rpc error: code = Unknown desc = no route, message: ""')


def test_a_failed_post_start_is_handed_to_handle_error_with_the_message():
    assert post_start_failure("web", "p_default(1)", "M") == "container web start failed in pod p_default(1): " \
                                                            "PostStartHookError: M"
