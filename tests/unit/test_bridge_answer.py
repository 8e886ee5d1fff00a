"""What the bridge answers a marker ExecSync (shim/bridge/answer.py), and what today's kubelet makes of it.

Each case checks both sides: the answer itself, and the verdict of tests/support/kubelet_exec_model.py, the tests' stand-in
for the kubelet's exec prober and exec hook runner. The model is checked here too, against the Go rules it mirrors:

- cri-client remote_runtime.go execSyncV1:
      if status.Code(err) == codes.DeadlineExceeded {
          err = fmt.Errorf("%w: %q timed out after %s", ErrCommandTimedOut, strings.Join(cmd, " "), timeout) }
      ...
      if resp.ExitCode != 0 { err = utilexec.CodeExitError{Err: fmt.Errorf("command '%s' exited with %d: %s",
          strings.Join(cmd, " "), resp.ExitCode, resp.Stderr), Code: int(resp.ExitCode)} }
- kuberuntime RunInContainer: `return append(stdout, stderr...), err`
- pkg/probe/exec exec.go Probe: `maxReadLength = 10 * 1 << 10`; an ExitError with ExitStatus() == 0 is
  `probe.Success, string(data)`, any other exit status `probe.Failure, string(data)`; a timeout is
  `probe.Failure, timeoutErr.Error()` ("When exec probe timeout, data is empty, so we should return
  timeoutErr.Error() as the stdout"); anything else `probe.Unknown, "", err`, which prober.probe logs as
  "Probe errored" and worker.doProbe throws away ("Prober error, throw away the result").
- pkg/kubelet/lifecycle/handlers.go Run: `output, err := hr.commandRunner.RunInContainer(ctx, containerID,
  handler.Exec.Command, 0)`; any err fails the hook with that error's text.
Pure: no sockets.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import pytest

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.bridge_command import command_for
from probe_api.gostrings import go_duration, go_quote
from shim.bridge import answer
from tests.support.kubelet_exec_model import MAX_READ_LENGTH, ProbeVerdict, hook_error, probe_verdict

PROBE_CMD = command_for("readiness", {"httpGet": {"path": "/healthz", "port": 8080}})
HOOK_CMD = command_for("preStop", {"httpGet": {"path": "/stop", "port": 8080}})
PROBE_TIMEOUT_S = 1  # timeoutSeconds, which the kubelet sends as ExecSync's timeout
REFUSED = 'Get "http://10.0.0.7:8080/stop": dial tcp 10.0.0.7:8080: connect: connection refused'


class StatusError(grpc.RpcError):
    """An error status as the kubelet's gRPC client hands it back (a status.Error)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def on_the_wire(result: answer.Answer) -> cri_pb.ExecSyncResponse | StatusError:
    """What reaches the kubelet: the response message, or the status the CRI proxy aborts the call with."""
    if isinstance(result, answer.StatusAnswer):
        return StatusError(result.code, result.details)
    return cri_pb.ExecSyncResponse.FromString(result.SerializeToString())


def kubelet_probe(result: answer.Answer) -> ProbeVerdict:
    return probe_verdict(PROBE_CMD, PROBE_TIMEOUT_S, on_the_wire(result))


def kubelet_hook(result: answer.Answer) -> str | None:
    return hook_error(HOOK_CMD, on_the_wire(result))


def attempt(result: int, output: str) -> spec_pb.Attempt:
    return spec_pb.Attempt(result=result, output=output)


# ---------------------------------------------------------------- the table, for a probe


@dataclass(frozen=True)
class ProbeCase:
    name: str
    result: answer.Answer
    exit_code: int | None           # None: a status, not a response
    stdout: bytes = b""
    stderr: bytes = b""
    status: tuple[grpc.StatusCode, str] | None = None
    verdict: tuple[str, str] = ("", "")  # what the kubelet records: (result, output)


PROBE_CASES = [
    ProbeCase("success", answer.attempt_answer(attempt(spec_pb.RESULT_SUCCESS, "ok 1234\n"), hook=False),
              0, stdout=b"ok 1234\n", verdict=("success", "ok 1234\n")),
    # An exec probe has no warning: a redirect the kubelet did not follow becomes a plain success, and the
    # kubelet's ProbeWarning event is not sent.
    ProbeCase("warning", answer.attempt_answer(attempt(spec_pb.RESULT_WARNING, "Probe terminated redirects"),
                                               hook=False),
              0, stdout=b"Probe terminated redirects", verdict=("success", "Probe terminated redirects")),
    ProbeCase("failure", answer.attempt_answer(
        attempt(spec_pb.RESULT_FAILURE, "HTTP probe failed with statuscode: 500"), hook=False),
              1, stdout=b"HTTP probe failed with statuscode: 500",
              verdict=("failure", "HTTP probe failed with statuscode: 500")),
    ProbeCase("failure-empty-output", answer.attempt_answer(attempt(spec_pb.RESULT_FAILURE, ""), hook=False),
              1, verdict=("failure", "")),
    # Bad arguments and an unprobeable sandbox are failures the kubelet reports with the reason in its event.
    ProbeCase("bad-arguments", answer.bad_arguments('tcpSocket.port: unknown named port "nope"'),
              2, stderr=b'cri-probe-shim: bad arguments: tcpSocket.port: unknown named port "nope"',
              verdict=("failure", 'cri-probe-shim: bad arguments: tcpSocket.port: unknown named port "nope"')),
    ProbeCase("cannot-probe", answer.cannot_probe("pod sandbox sb-1 is not ready"),
              3, stderr=b"cri-probe-shim: cannot probe: pod sandbox sb-1 is not ready",
              verdict=("failure", "cri-probe-shim: cannot probe: pod sandbox sb-1 is not ready")),
]


@pytest.mark.parametrize("case", PROBE_CASES, ids=[case.name for case in PROBE_CASES])
def test_probe_answers_and_the_kubelets_verdict(case):
    assert isinstance(case.result, cri_pb.ExecSyncResponse)
    assert (case.result.exit_code, case.result.stdout, case.result.stderr) == (case.exit_code, case.stdout,
                                                                               case.stderr)
    verdict = kubelet_probe(case.result)
    assert (verdict.result, verdict.output) == case.verdict
    assert not verdict.discarded


@pytest.mark.parametrize("output, details", [
    ("dial tcp: lookup pod: no such host", "dial tcp: lookup pod: no such host"),
    ("", "the probe could not be run"),
])
def test_an_unknown_attempt_is_an_unknown_status_the_kubelet_discards(output, details):
    # The kubelet's own prober would have errored (probe.Unknown with an error): it throws the result away and
    # keeps the previous one, so the bridge answers with an error status, which the kubelet treats the same.
    result = answer.attempt_answer(attempt(spec_pb.RESULT_UNKNOWN, output), hook=False)
    assert result == answer.StatusAnswer(grpc.StatusCode.UNKNOWN, details)
    verdict = kubelet_probe(result)
    assert verdict == ProbeVerdict("unknown", "", f"rpc error: code = Unknown desc = {details}")
    assert verdict.discarded


def test_a_host_network_pod_is_a_failed_precondition_the_kubelet_discards_never_a_counted_failure():
    # Fail closed without a restart loop: discarded, readiness stays at its initial Failure, liveness at its
    # initial Success; the kubelet's "probe errored" event says why.
    reason = "pod sandbox sb-1 uses the node's network namespace (hostNetwork): cri-probe-shim never probes ..."
    result = answer.host_network(reason)
    assert result == answer.StatusAnswer(grpc.StatusCode.FAILED_PRECONDITION, f"cri-probe-shim: {reason}")
    verdict = kubelet_probe(result)
    assert verdict.discarded and verdict.result == "unknown"
    assert verdict.error == f"rpc error: code = FailedPrecondition desc = cri-probe-shim: {reason}"


def test_an_unknown_container_is_left_to_the_runtime():
    # Not the bridge's to answer: forwarded, so the kubelet gets the runtime's own NOT_FOUND, word for word
    # (containerd's text differs between versions: 1.x ContainerStatus-style, 2.x "failed to find container").
    assert answer.exit_code_of(answer.FORWARD) == "forwarded"


@pytest.mark.parametrize("budget_s, details", [(3.0, "cri-probe-shim: no answer within 3s"),
                                               (2.5, "cri-probe-shim: no answer within 2.5s")])
def test_no_answer_in_time_is_deadline_exceeded_which_the_kubelet_reads_as_a_timed_out_command(budget_s, details):
    result = answer.timed_out(budget_s)
    assert result == answer.StatusAnswer(grpc.StatusCode.DEADLINE_EXCEEDED, details)
    verdict = kubelet_probe(result)
    # A failure, as for a command that outlived its timeout; the text is the kubelet's own, not the details.
    assert verdict.result == "failure" and not verdict.discarded
    assert verdict.output.startswith("command timed out: ") and verdict.output.endswith(" timed out after 1s")
    assert "no answer within" not in verdict.output


# ---------------------------------------------------------------- the table, for a hook


@pytest.mark.parametrize("result, exit_code, error", [
    (spec_pb.RESULT_SUCCESS, 0, None),
    (spec_pb.RESULT_WARNING, 0, None),
    # The error goes to stderr, since CodeExitError's text carries resp.Stderr and not resp.Stdout.
    (spec_pb.RESULT_FAILURE, 1, f"command '{' '.join(HOOK_CMD)}' exited with 1: {REFUSED}"),
], ids=["success", "warning", "failure"])
def test_hook_answers_and_the_kubelets_hook_error(result, exit_code, error):
    response = answer.attempt_answer(attempt(result, REFUSED), hook=True)
    assert isinstance(response, cri_pb.ExecSyncResponse) and response.exit_code == exit_code
    if exit_code:
        assert (response.stdout, response.stderr) == (b"", REFUSED.encode())
    else:
        assert (response.stdout, response.stderr) == (REFUSED.encode(), b"")
    assert kubelet_hook(response) == error


def test_a_failed_probe_keeps_its_output_on_stdout_and_a_failed_hook_on_stderr():
    failed = attempt(spec_pb.RESULT_FAILURE, REFUSED)
    probe, hook = answer.attempt_answer(failed, hook=False), answer.attempt_answer(failed, hook=True)
    assert (probe.stdout, probe.stderr, hook.stdout, hook.stderr) == (REFUSED.encode(), b"", b"", REFUSED.encode())
    # The probe output the kubelet records is the same either way (stdout + stderr) ...
    assert kubelet_probe(probe).output == kubelet_probe(hook).output == REFUSED
    # ... but only stderr reaches the hook's error message.
    assert kubelet_hook(probe) == f"command '{' '.join(HOOK_CMD)}' exited with 1: "


@pytest.mark.parametrize("result, error", [
    (answer.bad_arguments("--grpc: Forbidden: a lifecycle hook handler is httpGet or tcpSocket"),
     "exited with 2: cri-probe-shim: bad arguments: --grpc: Forbidden: a lifecycle hook handler is httpGet or "
     "tcpSocket"),
    (answer.cannot_probe("pod sandbox sb-1 not found"),
     "exited with 3: cri-probe-shim: cannot probe: pod sandbox sb-1 not found"),
], ids=["bad-arguments", "cannot-probe"])
def test_a_hook_that_cannot_run_fails_naming_why(result, error):
    assert kubelet_hook(result) == f"command '{' '.join(HOOK_CMD)}' {error}"


@pytest.mark.parametrize("result, error", [
    (answer.attempt_answer(attempt(spec_pb.RESULT_UNKNOWN, "no route to pod"), hook=True),
     "rpc error: code = Unknown desc = no route to pod"),
], ids=["unknown"])
def test_a_hook_answered_with_a_status_fails_with_the_status(result, error):
    # No silent success: an error status fails the hook (FailedPreStopHook / FailedPostStartHook).
    assert kubelet_hook(result) == error


# ---------------------------------------------------------------- the 10 KiB bound


def test_outputs_are_cut_at_the_kubelets_10_kib():
    assert answer.MAX_OUTPUT_BYTES == MAX_READ_LENGTH == 10 * 1024
    long = "".join(f"{i:05d}\n" for i in range(4000))  # 24000 bytes
    probe = answer.attempt_answer(attempt(spec_pb.RESULT_SUCCESS, long), hook=False)
    assert probe.stdout == long.encode()[:10 * 1024]
    assert kubelet_probe(probe).output == long[:10 * 1024]  # nothing the kubelet would have kept is lost
    hook = answer.attempt_answer(attempt(spec_pb.RESULT_FAILURE, long), hook=True)
    assert hook.stderr == long.encode()[:10 * 1024]


@pytest.mark.parametrize("make, prefix", [(answer.bad_arguments, "cri-probe-shim: bad arguments: "),
                                          (answer.cannot_probe, "cri-probe-shim: cannot probe: ")])
def test_refusals_are_cut_at_10_kib_too(make, prefix):
    response = make("x" * 50_000)
    assert len(response.stderr) == 10 * 1024 and response.stderr.startswith(prefix.encode())


def test_the_bound_counts_bytes_not_characters():
    output = "é" * 6000  # 12000 bytes of UTF-8
    response = answer.attempt_answer(attempt(spec_pb.RESULT_FAILURE, output), hook=False)
    assert response.stdout == output.encode()[:10 * 1024]


def test_the_details_of_an_unknown_status_are_bounded_like_every_output():
    result = answer.attempt_answer(attempt(spec_pb.RESULT_UNKNOWN, "y" * 50_000), hook=False)
    assert len(result.details.encode()) <= answer.MAX_OUTPUT_BYTES


# ---------------------------------------------------------------- labels for metrics and logs


@pytest.mark.parametrize("result, label", [
    (answer.attempt_answer(attempt(spec_pb.RESULT_SUCCESS, ""), hook=False), "0"),
    (answer.attempt_answer(attempt(spec_pb.RESULT_FAILURE, ""), hook=True), "1"),
    (answer.bad_arguments("x"), "2"),
    (answer.cannot_probe("x"), "3"),
    (answer.attempt_answer(attempt(spec_pb.RESULT_UNKNOWN, ""), hook=False), "UNKNOWN"),
    (answer.timed_out(1.0), "DEADLINE_EXCEEDED"),
])
def test_exit_code_of_labels_each_answer(result, label):
    assert answer.exit_code_of(result) == label


# ---------------------------------------------------------------- the kubelet model follows pkg/probe/exec


def response(exit_code: int, stdout: bytes = b"", stderr: bytes = b"") -> cri_pb.ExecSyncResponse:
    return cri_pb.ExecSyncResponse(exit_code=exit_code, stdout=stdout, stderr=stderr)


def test_model_exit_code_zero_is_success_with_stdout_then_stderr():
    # RunInContainer: append(stdout, stderr...)
    assert probe_verdict(["x"], 1, response(0, b"out ", b"err")) == ProbeVerdict("success", "out err")


@pytest.mark.parametrize("exit_code", [1, 2, 126, 127, 137, -1])
def test_model_any_other_exit_code_is_failure_with_the_output(exit_code):
    assert probe_verdict(["x"], 1, response(exit_code, b"o", b"e")) == ProbeVerdict("failure", "oe")


def test_model_keeps_10_kib_of_stdout_and_stderr_together():
    verdict = probe_verdict(["x"], 1, response(1, b"a" * 8192, b"b" * 8192))
    assert verdict.output == "a" * 8192 + "b" * 2048


def test_model_deadline_exceeded_is_a_failure_whose_output_is_the_timeout_error():
    verdict = probe_verdict(["cat", "/tmp/healthy"], 5, StatusError(grpc.StatusCode.DEADLINE_EXCEEDED, "ignored"))
    assert verdict == ProbeVerdict("failure", 'command timed out: "cat /tmp/healthy" timed out after 5s')
    assert not verdict.discarded


OTHER_CODES = [code for code in grpc.StatusCode
               if code not in (grpc.StatusCode.OK, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)]
GO_NAMES = {grpc.StatusCode.UNKNOWN: "Unknown", grpc.StatusCode.INVALID_ARGUMENT: "InvalidArgument",
            grpc.StatusCode.NOT_FOUND: "NotFound", grpc.StatusCode.ALREADY_EXISTS: "AlreadyExists",
            grpc.StatusCode.PERMISSION_DENIED: "PermissionDenied", grpc.StatusCode.RESOURCE_EXHAUSTED:
            "ResourceExhausted", grpc.StatusCode.FAILED_PRECONDITION: "FailedPrecondition",
            grpc.StatusCode.ABORTED: "Aborted", grpc.StatusCode.OUT_OF_RANGE: "OutOfRange",
            grpc.StatusCode.UNIMPLEMENTED: "Unimplemented", grpc.StatusCode.INTERNAL: "Internal",
            grpc.StatusCode.UNAVAILABLE: "Unavailable", grpc.StatusCode.DATA_LOSS: "DataLoss",
            grpc.StatusCode.UNAUTHENTICATED: "Unauthenticated", grpc.StatusCode.CANCELLED: "Canceled"}


@pytest.mark.parametrize("code", OTHER_CODES, ids=[code.name for code in OTHER_CODES])
def test_model_any_other_status_is_unknown_and_discarded(code):
    # grpc-go codes.Code.String() names, as in "rpc error: code = NotFound desc = ..."
    verdict = probe_verdict(["x"], 1, StatusError(code, "why"))
    assert verdict == ProbeVerdict("unknown", "", f"rpc error: code = {GO_NAMES[code]} desc = why")
    assert verdict.discarded


def test_model_a_hook_fails_on_any_non_zero_exit_with_stderr_only():
    assert hook_error(["x"], response(0, b"out", b"err")) is None
    assert hook_error(["/bin/stop", "now"], response(3, b"out", b"err")) == "command '/bin/stop now' exited with 3: err"
    assert hook_error(["x"], StatusError(grpc.StatusCode.NOT_FOUND, "gone")) == "rpc error: code = NotFound desc = gone"


def test_model_quotes_the_timed_out_command_with_go_q():
    verdict = probe_verdict(PROBE_CMD, 1, StatusError(grpc.StatusCode.DEADLINE_EXCEEDED, ""))
    assert verdict.output == f"command timed out: {go_quote(' '.join(PROBE_CMD))} timed out after 1s"
    assert '{\\"httpGet\\":' in verdict.output


def test_model_prints_the_timeout_as_a_go_duration():
    verdict = probe_verdict(["x"], 90, StatusError(grpc.StatusCode.DEADLINE_EXCEEDED, ""))
    assert verdict.output == f'command timed out: "x" timed out after {go_duration(90 * 10**9)}'  # 1m30s


def test_model_a_hook_that_timed_out_fails_with_the_timeout_error():
    # The bridge does answer a hook with DEADLINE_EXCEEDED (answer.timed_out after hook_timeout_s); the kubelet
    # passes a hook no timeout, so it prints 0s.
    error = hook_error(["x"], StatusError(grpc.StatusCode.DEADLINE_EXCEEDED, "cri-probe-shim: no answer within 32s"))
    assert error == 'command timed out: "x" timed out after 0s'


def test_model_names_cancelled_as_grpc_go_does():
    verdict = probe_verdict(["x"], 1, StatusError(grpc.StatusCode.CANCELLED, "why"))
    assert verdict.error == "rpc error: code = Canceled desc = why"
