"""A full registration as the probe store keeps it: shared by the store's unit tests, its system tests (full and
read-only disks) and the child process the SIGKILL test starts."""

from __future__ import annotations

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb


def registration(probe_id: str = "p1", sandbox: str = "sb1", container: str = "c1",
                 probe_type: int = spec_pb.READINESS, **overrides) -> service_pb.Probe:
    probe = service_pb.Probe(
        probe_id=probe_id,
        pod_sandbox_id=sandbox,
        container_id=container,
        container_name="app",
        type=probe_type,
        spec=spec_pb.ProbeSpec(
            http_get=spec_pb.HTTPGetAction(path="/healthz", port=spec_pb.PortRef(name="http")),
            period_ms=2500, timeout_ms=700, failure_threshold=5,
        ),
        labels={"team": "a", "tier": "web"},
        container_started_at=1_700_000_000_000_000_000,
        container_ports=[spec_pb.ContainerPort(name="http", container_port=8080, protocol="TCP")],
        created_at=1_700_000_000_123_456_789,
    )
    for name, value in overrides.items():
        setattr(probe, name, value)
    return probe
