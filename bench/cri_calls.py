"""The calls the proxy and exec comparisons time: raw unary CRI calls, ExecProbe, CRI ExecSync and subprocesses.

Each builder returns a no-argument call (bench/interleave.py's `Call`) with the deadline its real caller sets (the
kubelet's for CRI), so the timing loop holds nothing but the call; a call that does not succeed raises, so a
broken path aborts the benchmark instead of timing errors.
"""

from __future__ import annotations

import subprocess

import grpc

from bench.interleave import Call
from cri_proto import cri_runtime_v1_pb2 as cri_pb
from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_service_pb2_grpc as service_grpc
from cri_proto import probe_spec_pb2 as spec_pb

RUNTIME = "/runtime.v1.RuntimeService"
KUBELET_TIMEOUT_S = 120.0  # kubelet's default --runtime-request-timeout (2m)
HEALTHZ_PATH = "/healthz"   # the busybox httpd of the test image
SERVER_PATH = "/ok"         # tests/support/servers/http_server.py
PROBE_TIMEOUT_MS = 1000


def cri_call(channel: grpc.Channel, method: str, request: bytes) -> Call:
    """A raw unary CRI call (bytes in, bytes out: nothing is decoded in the loop) with the kubelet's deadline."""
    stub = channel.unary_unary(f"{RUNTIME}/{method}")
    return lambda: stub(request, timeout=KUBELET_TIMEOUT_S)


def exec_probe_call(channel: grpc.Channel, sandbox_id: str, spec: spec_pb.ProbeSpec,
                    attempts_ms: list[float] | None = None) -> Call:
    """One ExecProbe on a persistent channel; a failed attempt aborts the benchmark. With `attempts_ms`, each
    attempt's own duration (measured by the worker) is appended to it."""
    stub = service_grpc.ProbeServiceStub(channel)
    request = service_pb.ExecProbeRequest(pod_sandbox_id=sandbox_id, spec=spec)

    def call() -> service_pb.ExecProbeResponse:
        response = stub.ExecProbe(request, timeout=10)
        if response.attempt.result != spec_pb.RESULT_SUCCESS:
            raise RuntimeError(f"ExecProbe failed: {response.attempt.output}")
        if attempts_ms is not None:
            attempts_ms.append(response.attempt.duration_ns / 1e6)
        return response

    return call


def exec_sync_call(channel: grpc.Channel, container_id: str, argv: list[str]) -> Call:
    stub = channel.unary_unary(f"{RUNTIME}/ExecSync", request_serializer=cri_pb.ExecSyncRequest.SerializeToString,
                               response_deserializer=cri_pb.ExecSyncResponse.FromString)
    request = cri_pb.ExecSyncRequest(container_id=container_id, cmd=argv, timeout=1)

    def call() -> cri_pb.ExecSyncResponse:
        response = stub(request, timeout=30)
        if response.exit_code != 0:
            raise RuntimeError(f"ExecSync exit {response.exit_code}: {response.stderr!r}")
        return response

    return call


def subprocess_call(argv: list[str]) -> Call:
    return lambda: subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=30)


def http_probe_spec(port: int, path: str = HEALTHZ_PATH) -> spec_pb.ProbeSpec:
    return spec_pb.ProbeSpec(
        http_get=spec_pb.HTTPGetAction(path=path, port=spec_pb.PortRef(number=port)),
        target=spec_pb.LOOPBACK, timeout_ms=PROBE_TIMEOUT_MS,
    )


def wget_argv(port: int, path: str = HEALTHZ_PATH) -> list[str]:
    # No -T: busybox-static's wget crashes (SIGSEGV) with it here; ExecSync and subprocess timeouts bound it.
    return ["busybox", "wget", "-q", "-O", "-", f"http://127.0.0.1:{port}{path}"]


def curl_argv(port: int, path: str = HEALTHZ_PATH) -> list[str]:
    return ["curl", "-sf", "-m", "1", "-o", "/dev/null", f"http://127.0.0.1:{port}{path}"]
