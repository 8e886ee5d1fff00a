"""What the bridge answers a marker ExecSync (shim/bridge/answer.py), and what kubelet 1.37 makes of it.

Each case checks both sides: the answer itself, and what tests/support/kubelet_exec_model.py, the tests' stand-in for
kubelet 1.37's exec prober and exec hook runner, makes of it: the verdict, whether it is counted or thrown away, the
Unhealthy event, how many ExecSyncs a period sends, a hook's error and message. The model itself is checked against
the Go source in tests/unit/test_kubelet_exec_model.py; tests/e2e/test_real_kubelet_answers.py reads the same texts
in a real kubelet's log.
Pure: no sockets.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import pytest

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.bridge_command import command_for
from shim.bridge import answer
from tests.support.kubelet_exec_model import (
    MAX_PROBE_RETRIES, MAX_READ_LENGTH, ProbeVerdict, StatusError, hook_error, hook_message, pod_desc, probe_event,
    probe_period, probe_verdict,
)

PROBE_CMD = command_for("readiness", {"httpGet": {"path": "/healthz", "port": 8080}})
HOOK_CMD = command_for("preStop", {"httpGet": {"path": "/stop", "port": 8080}})
PROBE_TIMEOUT_S = 1  # timeoutSeconds, which the kubelet sends as ExecSync's timeout
REFUSED = 'Get "http://10.0.0.7:8080/stop": dial tcp 10.0.0.7:8080: connect: connection refused'


def on_the_wire(result: answer.Answer) -> cri_pb.ExecSyncResponse | StatusError:
    """What reaches the kubelet: the response message, or the status the CRI proxy aborts the call with."""
    if isinstance(result, answer.StatusAnswer):
        return StatusError(result.code, result.details)
    return cri_pb.ExecSyncResponse.FromString(result.SerializeToString())


def kubelet_probe(result: answer.Answer) -> ProbeVerdict:
    return probe_verdict(PROBE_CMD, PROBE_TIMEOUT_S, on_the_wire(result))


def kubelet_period(result: answer.Answer) -> tuple[ProbeVerdict, int]:
    """One period of the kubelet's probe when the bridge answers every ExecSync alike: the verdict, and how many
    ExecSyncs the period sent (runProbeWithRetries asks again after an error)."""
    return probe_period(PROBE_CMD, PROBE_TIMEOUT_S, lambda: on_the_wire(result))


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
    verdict, sent = kubelet_period(case.result)
    assert (verdict.result, verdict.output) == case.verdict
    assert not verdict.discarded and sent == 1
    result, output = case.verdict
    assert verdict.counted == {"success": "successful", "failure": "failed"}[result]
    # The event `kubectl describe` shows: none for a success, the output after "Readiness probe failed: ".
    assert probe_event("Readiness", verdict) == (None if result == "success" else f"Readiness probe failed: {output}")


@pytest.mark.parametrize("output, details", [
    ("dial tcp: lookup pod: no such host", "dial tcp: lookup pod: no such host"),
    ("", "the probe could not be run"),
])
def test_an_unknown_attempt_is_an_unknown_status_the_kubelet_discards(output, details):
    # The kubelet's own prober would have errored (probe.Unknown with an error): it throws the result away and
    # keeps the previous one, so the bridge answers with an error status, which the kubelet treats the same.
    result = answer.attempt_answer(attempt(spec_pb.RESULT_UNKNOWN, output), hook=False)
    assert result == answer.StatusAnswer(grpc.StatusCode.UNKNOWN, details)
    verdict, sent = kubelet_period(result)
    assert verdict == ProbeVerdict("unknown", "", f"rpc error: code = Unknown desc = {details}")
    assert verdict.discarded and verdict.counted is None
    # The kubelet asks three times in the period, as it retries its own prober's errors.
    assert sent == MAX_PROBE_RETRIES == 3
    assert probe_event("Readiness", verdict) == (
        f"Readiness probe errored and resulted in unknown state: rpc error: code = Unknown desc = {details}")


def test_a_host_network_pod_is_a_failed_precondition_the_kubelet_discards_never_a_counted_failure():
    # Fail closed without a restart loop: discarded, readiness stays at its initial Failure, liveness at its
    # initial Success; the kubelet's "probe errored" event says why.
    reason = "pod sandbox sb-1 uses the node's network namespace (hostNetwork): cri-probe-shim never probes ..."
    result = answer.host_network(reason)
    assert result == answer.StatusAnswer(grpc.StatusCode.FAILED_PRECONDITION, f"cri-probe-shim: {reason}")
    verdict, sent = kubelet_period(result)
    assert verdict.discarded and verdict.result == "unknown" and sent == 3
    assert verdict.error == f"rpc error: code = FailedPrecondition desc = cri-probe-shim: {reason}"
    assert probe_event("Liveness", verdict) == f"Liveness probe errored and resulted in unknown state: {verdict.error}"


def test_an_unknown_container_is_left_to_the_runtime():
    # Not the bridge's to answer: forwarded, so the kubelet gets the runtime's own NOT_FOUND, word for word
    # (containerd's text differs between versions: 1.x ContainerStatus-style, 2.x "failed to find container").
    assert answer.exit_code_of(answer.FORWARD) == "forwarded"


@pytest.mark.parametrize("budget_s, details", [(3.0, "cri-probe-shim: no answer within 3s"),
                                               (2.5, "cri-probe-shim: no answer within 2.5s")])
def test_no_answer_in_time_is_deadline_exceeded_which_the_kubelet_reads_as_a_timed_out_command(budget_s, details):
    result = answer.timed_out(budget_s)
    assert result == answer.StatusAnswer(grpc.StatusCode.DEADLINE_EXCEEDED, details)
    verdict, sent = kubelet_period(result)
    # A counted failure, as for a command that outlived its timeout (no ExecProbeTimeout gate in 1.37); the text
    # is the kubelet's own, not the details; no retry, since it is not an error.
    assert (verdict.result, verdict.counted, sent) == ("failure", "failed", 1)
    assert verdict.output.startswith("command timed out: ") and verdict.output.endswith(" timed out after 1s")
    assert "no answer within" not in verdict.output
    assert probe_event("Readiness", verdict) == f"Readiness probe failed: {verdict.output}"


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


def test_a_failed_hooks_message_names_the_error_twice_as_the_kubelet_writes_it():
    # handlers.go Run: "... failed - error: <err>, message: <output %q>"; err carries stderr, output is stdout +
    # stderr, so the text is in both. On stdout alone, "PreStop hook failed" (logged with err only) would not say why.
    response = answer.attempt_answer(attempt(spec_pb.RESULT_FAILURE, REFUSED), hook=True)
    message = hook_message(HOOK_CMD, "web", pod_desc("shop-node1", "default", "77da"), on_the_wire(response))
    assert message == (
        f"Exec lifecycle hook ([{' '.join(HOOK_CMD)}]) for Container \"web\" in Pod \"shop-node1_default(77da)\" "
        f"failed - error: command '{' '.join(HOOK_CMD)}' exited with 1: {REFUSED}, message: "
        '"Get \\"http://10.0.0.7:8080/stop\\": dial tcp 10.0.0.7:8080: connect: connection refused"')


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
