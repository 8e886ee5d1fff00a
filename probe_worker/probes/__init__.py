"""Probe kinds, one executor each, all with the signature of probe_worker.attempt.ProbeFn.

tcp.py is one module; http/ and grpc/ hold their executor (the I/O) beside the pure rules it applies:
  http/: request.py, headers.py, url.py with url_escape.py (the request), response.py (the response and its
         redirects), hooks.py (a lifecycle hook's own rules), and one exchange per HTTP version, h1_exchange.py
         (h11) and h2_exchange.py with h2_rules.py;
  grpc/: rules.py (request, dial backoff, the kubelet's outputs), unary_call.py (grpc-go's view of the call),
         wire.py (the HTTP/2 bytes).
Go's error texts, which every kind prints, are probe_worker/go_errors.py's."""

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
