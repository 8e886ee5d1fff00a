"""The TCP probe spec the TCP executor's tests probe with: shared by the in-process tests and those through a worker."""

from __future__ import annotations

from cri_proto import probe_spec_pb2 as spec_pb


def tcp_spec(port: int, timeout_ms: int = 1000) -> spec_pb.ProbeSpec:
    return spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=spec_pb.PortRef(number=port)), timeout_ms=timeout_ms)
