"""What kubelet 1.37 makes of an ExecSync answer: a stand-in for the kubelet's side, for tests only. Pure.

Read from kubernetes v1.37.2 and k8s.io/cri-client v0.37.2; v1.35.4 is the same on every line used here, so the
model holds for 1.35 too. What changed since 1.32 is said where it matters.

An exec probe, one period:
- pkg/kubelet/prober/prober.go probe -> runProbeWithRetries: runProbe up to maxProbeRetries (3) times, again only
  while it returns an error; runProbe -> newExecInContainer(cmd, timeout = timeoutSeconds) -> pkg/probe/exec
  Probe, with the command's $(VAR) expanded (kubecontainer.ExpandContainerCommandOnlyStatic; `$$` is `$`).
- pkg/kubelet/kuberuntime/kuberuntime_container.go RunInContainer: `append(stdout, stderr...)`, err.
- cri-client pkg/remote_runtime.go ExecSync: the call's deadline is runtimeRequestTimeout (2 min unless
  configured) + timeout, none for a timeout of 0; execSyncV1 sends Timeout = int64(timeout.Seconds()). A
  DeadlineExceeded status becomes `fmt.Errorf("%w: %q timed out after %s", ErrCommandTimedOut, cmd, timeout)`,
  any other status stays the gRPC error ("rpc error: code = NotFound desc = ..."), and an exit code other than 0
  a CodeExitError "command '<cmd>' exited with N: <stderr>".
- pkg/probe/exec exec.go Probe: 10 KiB of the output (maxReadLength); an exit code: 0 success, any other failure,
  with the output; ErrCommandTimedOut: failure whose output is the error's text (1.32 asked the ExecProbeTimeout
  gate first and, with it off, made this an error; the gate is locked on since 1.35 and 1.37 reads it no more);
  any other error: unknown, "", err.
- prober.go probe: an error is the Warning event Unhealthy "<Type> probe errored and resulted in <result> state:
  <err>" (1.32: "<Type> probe errored: <err>") and the V(1) log "Probe errored" (probeResult, err); a failure is
  the event "<Type> probe failed: <output>" and the log "Probe failed" (output); a success neither.
- pkg/kubelet/prober/worker.go doProbe: an error is thrown away ("Prober error, throw away the result"): not
  counted in prober_probe_total, the previous result kept; a success or failure is counted and thresholded.

An exec lifecycle hook: pkg/kubelet/lifecycle/handlers.go Run runs RunInContainer with timeout 0 (no deadline,
Timeout 0 on the wire); any error fails the hook with the message "Exec lifecycle hook (%v) for Container %q in Pod
%q failed - error: %v, message: %q". kuberuntime_container.go: a failed postStart is the event FailedPostStartHook
"PostStartHook failed" (no message: "so that secrets won't leak"), the container is killed, and startContainer
returns the message with ErrPostStartHook, which kuberuntime_manager.go SyncPod's `start` hands to
utilruntime.HandleError as "%v %v start failed in pod %v: %w: %s"; a failed preStop is the event FailedPreStopHook
"PreStopHook failed" and the log "PreStop hook failed" with the error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from probe_api.gostrings import go_duration, go_quote

MAX_READ_LENGTH = 10 * 1024        # pkg/probe/exec maxReadLength
MAX_PROBE_RETRIES = 3              # prober.go maxProbeRetries
RUNTIME_REQUEST_TIMEOUT_S = 120    # KubeletConfiguration runtimeRequestTimeout's default (v1beta1 defaults.go)

Answer = cri_pb.ExecSyncResponse | grpc.RpcError


@dataclass(frozen=True)
class ProbeVerdict:
    result: str        # "success", "failure" or "unknown" (pkg/probe Result)
    output: str        # what the kubelet's event shows after "Readiness probe failed: "
    error: str = ""    # set for "unknown": the kubelet logs "probe errored" and discards the result

    @property
    def discarded(self) -> bool:
        return self.result == "unknown"

    @property
    def counted(self) -> str | None:
        """The result label worker.doProbe counts in prober_probe_total, None for a discarded result."""
        return None if self.discarded else {"success": "successful", "failure": "failed"}[self.result]


class StatusError(grpc.RpcError):
    """An error status as the kubelet's gRPC client hands it back (a status.Error), for feeding the model."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def probe_verdict(cmd: Sequence[str], timeout_s: int, answer: Answer) -> ProbeVerdict:
    """One runProbe: pkg/probe/exec Probe of what RunInContainer returned for this answer."""
    if isinstance(answer, grpc.RpcError):
        if answer.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            return ProbeVerdict("failure", _timed_out(cmd, timeout_s))
        return ProbeVerdict("unknown", "", grpc_error(answer))
    data = (answer.stdout + answer.stderr)[:MAX_READ_LENGTH].decode("utf-8", "replace")
    return ProbeVerdict("success" if answer.exit_code == 0 else "failure", data)


def probe_period(cmd: Sequence[str], timeout_s: int, exec_sync: Callable[[], Answer]) -> tuple[ProbeVerdict, int]:
    """One period of an exec probe (prober.go runProbeWithRetries): ExecSync again while the verdict is an error,
    at most MAX_PROBE_RETRIES times. The last verdict, and how many ExecSyncs the period sent."""
    for sent in range(1, MAX_PROBE_RETRIES + 1):
        verdict = probe_verdict(cmd, timeout_s, exec_sync())
        if not verdict.discarded:
            break
    return verdict, sent


def probe_event(probe_type: str, verdict: ProbeVerdict) -> str | None:
    """The Unhealthy event prober.go probe records for the period's verdict (probe_type as probeType.String():
    "Readiness", "Liveness", "Startup"), None for a success. An exec probe's error is always result "unknown"."""
    if verdict.discarded:
        return f"{probe_type} probe errored and resulted in {verdict.result} state: {verdict.error}"
    if verdict.result == "failure":
        return f"{probe_type} probe failed: {verdict.output}"
    return None


def exec_sync_deadline_s(timeout_s: int, runtime_request_timeout_s: float = RUNTIME_REQUEST_TIMEOUT_S) -> float | None:
    """How long the kubelet waits for an ExecSync answer (cri-client ExecSync), None: as long as it takes (a hook)."""
    return None if timeout_s == 0 else runtime_request_timeout_s + timeout_s


def hook_error(cmd: Sequence[str], answer: Answer) -> str | None:
    """None when the hook succeeded, else RunInContainer's error: what "PreStop hook failed" logs."""
    if isinstance(answer, grpc.RpcError):
        if answer.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            return _timed_out(cmd, 0)  # the kubelet gives a hook no timeout
        return grpc_error(answer)
    if answer.exit_code == 0:
        return None
    return f"command '{' '.join(cmd)}' exited with {answer.exit_code}: {answer.stderr.decode('utf-8', 'replace')}"


def hook_message(cmd: Sequence[str], container: str, pod: str, answer: Answer) -> str | None:
    """handlers.go Run's message for a failed exec hook (pod as format.Pod: pod_desc), None when it succeeded."""
    error = hook_error(cmd, answer)
    if error is None:
        return None
    output = b"" if isinstance(answer, grpc.RpcError) else answer.stdout + answer.stderr
    return (f"Exec lifecycle hook ([{' '.join(cmd)}]) for Container {go_quote(container)} in Pod {go_quote(pod)} "
            f"failed - error: {error}, message: {go_quote(output)}")


def post_start_failure(container: str, pod: str, message: str) -> str:
    """The error SyncPod's `start` hands to utilruntime.HandleError ("Unhandled Error") for a failed postStart."""
    return f"container {container} start failed in pod {pod}: PostStartHookError: {message}"


def pod_desc(name: str, namespace: str, uid: str) -> str:
    """pkg/kubelet/util/format PodDesc: how the kubelet names a pod in its messages."""
    return f"{name}_{namespace}({uid})"


def grpc_error(error: grpc.RpcError) -> str:
    """A grpc-go status error's text."""
    return f"rpc error: code = {_go_code(error.code())} desc = {error.details()}"


def _timed_out(cmd: Sequence[str], timeout_s: int) -> str:
    """cri-client: fmt.Errorf("%w: %q timed out after %s", ErrCommandTimedOut, strings.Join(cmd, " "), timeout)."""
    return f"command timed out: {go_quote(' '.join(cmd))} timed out after {go_duration(timeout_s * 10**9)}"


def _go_code(code: grpc.StatusCode) -> str:
    """grpc-go's codes.Code.String(): "NotFound", "DeadlineExceeded", ... and "Canceled" (one l)."""
    if code == grpc.StatusCode.CANCELLED:
        return "Canceled"
    return "".join(part.capitalize() for part in code.name.split("_"))
