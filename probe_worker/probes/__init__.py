"""Probe kinds, one executor each, all with the signature of probe_worker.attempt.ProbeFn.

tcp.py is one module; http/ and grpc/ hold their executor beside its pure rules and wire code."""

from __future__ import annotations

from dataclasses import dataclass

from cri_proto import probe_spec_pb2 as spec_pb
from probe_worker.attempt import ProbeFn
from probe_worker.probes import tcp
from probe_worker.probes.grpc import executor as grpc
from probe_worker.probes.http import executor as http


@dataclass(frozen=True)
class Handler:
    kind: str          # "http", "tcp" or "grpc": trace and log label
    probe: ProbeFn
    host: str          # explicit host from the spec ("" for the pod's own address)
    port: spec_pb.PortRef


def handler_for(spec: spec_pb.ProbeSpec) -> Handler | None:
    """The handler a validated spec carries (validation guarantees at most one)."""
    if spec.HasField("http_get"):
        return Handler("http", http.probe, spec.http_get.host, spec.http_get.port)
    if spec.HasField("tcp_socket"):
        return Handler("tcp", tcp.probe, spec.tcp_socket.host, spec.tcp_socket.port)
    if spec.HasField("grpc"):
        # GRPCAction has no host field: the kubelet always dials the pod IP.
        return Handler("grpc", grpc.probe, "", spec_pb.PortRef(number=spec.grpc.port))
    return None
