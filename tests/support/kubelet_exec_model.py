"""What today's kubelet makes of an ExecSync answer: a stand-in for the kubelet's side, for tests only.

Mirrors, for an exec probe: pkg/kubelet/prober/prober.go (runProbe -> newExecInContainer -> RunInContainer),
pkg/kubelet/kuberuntime RunInContainer (output = stdout + stderr), staging cri-client remote_runtime.go
execSyncV1 (exit code != 0 -> CodeExitError; DeadlineExceeded -> ErrCommandTimedOut "<cmd>" timed out after <t>;
any other status -> that error) and pkg/probe/exec exec.go Probe (10 KiB of output; exit 0 success, other exit
codes failure with the output; a timeout is a failure whose output is the error text; any other error: unknown,
with the error, which prober.probe turns into "probe errored" and worker.doProbe throws away, keeping the
previous result). For an exec lifecycle hook: pkg/kubelet/lifecycle/handlers.go Run (any error fails the hook,
with "command '<cmd>' exited with N: <stderr>" for an exit code).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from probe_api.gostrings import go_duration, go_quote

MAX_READ_LENGTH = 10 * 1024  # pkg/probe/exec maxReadLength


@dataclass(frozen=True)
class ProbeVerdict:
    result: str        # "success", "failure" or "unknown" (pkg/probe Result)
    output: str        # what the kubelet's event shows after "Readiness probe failed: "
    error: str = ""    # set for "unknown": the kubelet logs "probe errored" and discards the result

    @property
    def discarded(self) -> bool:
        return self.result == "unknown"


def probe_verdict(cmd: Sequence[str], timeout_s: int, answer: cri_pb.ExecSyncResponse | grpc.RpcError) -> ProbeVerdict:
    if isinstance(answer, grpc.RpcError):
        if answer.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            return ProbeVerdict("failure", _timed_out(cmd, timeout_s))
        return ProbeVerdict("unknown", "", f"rpc error: code = {_go_code(answer.code())} desc = {answer.details()}")
    data = (answer.stdout + answer.stderr)[:MAX_READ_LENGTH].decode("utf-8", "replace")
    return ProbeVerdict("success" if answer.exit_code == 0 else "failure", data)


def hook_error(cmd: Sequence[str], answer: cri_pb.ExecSyncResponse | grpc.RpcError) -> str | None:
    """None when the hook succeeded, else the error the kubelet reports in FailedPreStopHook/FailedPostStartHook."""
    if isinstance(answer, grpc.RpcError):
        if answer.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            return _timed_out(cmd, 0)  # the kubelet gives a hook no timeout
        return f"rpc error: code = {_go_code(answer.code())} desc = {answer.details()}"
    if answer.exit_code == 0:
        return None
    return f"command '{' '.join(cmd)}' exited with {answer.exit_code}: {answer.stderr.decode('utf-8', 'replace')}"


def _timed_out(cmd: Sequence[str], timeout_s: int) -> str:
    """cri-client: fmt.Errorf("%w: %q timed out after %s", ErrCommandTimedOut, strings.Join(cmd, " "), timeout)."""
    return f"command timed out: {go_quote(' '.join(cmd))} timed out after {go_duration(timeout_s * 10**9)}"


def _go_code(code: grpc.StatusCode) -> str:
    """grpc-go's codes.Code.String(): "NotFound", "DeadlineExceeded", ... and "Canceled" (one l)."""
    if code == grpc.StatusCode.CANCELLED:
        return "Canceled"
    return "".join(part.capitalize() for part in code.name.split("_"))
