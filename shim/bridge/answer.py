"""What the shim answers a marker ExecSync, so that the kubelet reads it as it reads its own network prober.

The kubelet's side, as read in 1.37.2 (1.35.4 is the same on this path): an exec probe goes pkg/kubelet/prober
prober.go runProbe -> newExecInContainer -> kuberuntime RunInContainer -> cri-client ExecSync, then pkg/probe/exec
Probe. Output = stdout + stderr (10 KiB at most); exit code 0 = success, any other exit code =
failure with that output (the event "Readiness probe failed: <output>"); a DeadlineExceeded status = failure
"command timed out: ..." (always since 1.35, which locked the ExecProbeTimeout gate on; 1.32 made it an error
when the gate was off); any other error status = an error: runProbeWithRetries asks twice more in the same period,
then the kubelet records "Readiness probe errored and resulted in unknown state: rpc error: ..." and
worker.doProbe throws the result away (not counted, the previous result kept). For a hook
(pkg/kubelet/lifecycle/handlers.go Run) a non-zero exit code fails the hook with the error "command '...' exited
with N: <stderr>", which is what the kubelet logs for a failed preStop ("PreStop hook failed"); its message adds
", message: <stdout + stderr quoted>".

So, for an attempt the engine ran:
| attempt / situation                                | answer                                               |
|----------------------------------------------------|------------------------------------------------------|
| SUCCESS or WARNING                                 | exit 0, stdout = the probe's output (e.g. the body)  |
| FAILURE (probe)                                    | exit 1, stdout = the kubelet's own network output    |
| FAILURE (hook)                                     | exit 1, stderr = the error, so the hook's error names it |
| UNKNOWN (the kubelet's prober would have errored)  | status UNKNOWN with the output: discarded, as before |
| bad arguments (EXIT_BAD_ARGUMENTS)                 | exit 2, stderr = "cri-probe-shim: bad arguments: ..." |
| the sandbox cannot be probed (EXIT_CANNOT_PROBE)   | exit 3, stderr = "cri-probe-shim: cannot probe ...: ..." |
| the pod is in the node's network namespace         | status FAILED_PRECONDITION saying so: discarded      |
| the runtime does not know the container            | forwarded: the runtime's own NOT_FOUND               |
A hostNetwork pod is never probed from the node's namespace (probe_api/node_netns.py), and must fail closed
without a restart loop: an error status is a result the kubelet throws away, so readiness keeps its initial
Failure (not ready), liveness its initial Success (no restart) and a startup probe never succeeds nor counts a
failure; the kubelet's "probe errored" event and log carry the reason. An exit code would be a counted failure,
and a liveness probe would restart the container for ever.
A WARNING (an HTTP 3xx the kubelet did not follow) becomes a plain success: an exec probe has no warning, so the
kubelet's ProbeWarning event is not sent. That is the one result the bridge cannot carry.
Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from cri_proto import probe_spec_pb2 as spec_pb

EXIT_SUCCESS = 0
EXIT_FAILURE = 1
EXIT_BAD_ARGUMENTS = 2
EXIT_CANNOT_PROBE = 3
PREFIX = "cri-probe-shim"
MAX_OUTPUT_BYTES = 10 * 1024  # pkg/probe/exec maxReadLength: the kubelet keeps no more
MAX_DETAILS_BYTES = 4096      # of a status's details, as for RunProbe's errors (probe_api/request_rules.py)


@dataclass(frozen=True)
class StatusAnswer:
    """An answer that is a gRPC status, not an ExecSyncResponse."""

    code: grpc.StatusCode
    details: str


class Forward:
    """Not the bridge's to answer: the request goes to the runtime as it came. For a container the runtime does
    not know, the runtime's own NOT_FOUND is then the answer, word for word, whatever its version says."""


FORWARD = Forward()
Answer = cri_pb.ExecSyncResponse | StatusAnswer | Forward


def attempt_answer(attempt: spec_pb.Attempt, *, hook: bool) -> Answer:
    output = _bounded(attempt.output)
    if attempt.result in (spec_pb.RESULT_SUCCESS, spec_pb.RESULT_WARNING):
        return cri_pb.ExecSyncResponse(stdout=output, exit_code=EXIT_SUCCESS)
    if attempt.result == spec_pb.RESULT_FAILURE:
        if hook:
            return cri_pb.ExecSyncResponse(stderr=output, exit_code=EXIT_FAILURE)
        return cri_pb.ExecSyncResponse(stdout=output, exit_code=EXIT_FAILURE)
    # Status details travel as metadata, which clients cap (grpc core: 16 KiB in all): bounded like RunProbe's errors.
    details = (attempt.output or "the probe could not be run").encode()[:MAX_DETAILS_BYTES]
    return StatusAnswer(grpc.StatusCode.UNKNOWN, details.decode("utf-8", "ignore"))


def bad_arguments(reason: str) -> cri_pb.ExecSyncResponse:
    return cri_pb.ExecSyncResponse(stderr=_bounded(f"{PREFIX}: bad arguments: {reason}"),
                                   exit_code=EXIT_BAD_ARGUMENTS)


def cannot_probe(reason: str) -> cri_pb.ExecSyncResponse:
    return cri_pb.ExecSyncResponse(stderr=_bounded(f"{PREFIX}: cannot probe: {reason}"), exit_code=EXIT_CANNOT_PROBE)


def host_network(reason: str) -> StatusAnswer:
    return StatusAnswer(grpc.StatusCode.FAILED_PRECONDITION, f"{PREFIX}: {reason}")


def timed_out(timeout_s: float) -> StatusAnswer:
    """The worker did not answer within the ExecSync timeout (plus grace): the kubelet reads DeadlineExceeded as
    an exec probe that timed out (a counted failure, never retried), exactly as for a command that outlived its
    timeout. Its text is the kubelet's own ("... timed out after 1s"), not these details; a hook, which the kubelet
    runs with no timeout, reads "timed out after 0s"."""
    return StatusAnswer(grpc.StatusCode.DEADLINE_EXCEEDED, f"{PREFIX}: no answer within {timeout_s:g}s")


def exit_code_of(answer: Answer) -> str:
    """A label for metrics and logs: the exit code, the status code's name, or "forwarded"."""
    if isinstance(answer, cri_pb.ExecSyncResponse):
        return str(answer.exit_code)
    return answer.code.name if isinstance(answer, StatusAnswer) else "forwarded"


def _bounded(text: str) -> bytes:
    return text.encode("utf-8", "replace")[:MAX_OUTPUT_BYTES]
