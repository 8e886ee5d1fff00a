"""The measured setup of bench/perf_probe_path.py: which tree's code is measured, the probes every measurement
runs (one HTTP, TCP and gRPC spec against a throwaway pod netns's servers), and that netns.

Nothing here imports the measured packages at module level: a child interpreter first puts the measured tree
first on sys.path (`use_tree`), then imports them.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
KINDS = ("http", "tcp", "grpc")
POD_IPV4 = "198.18.0.2"
POD_IPS = (POD_IPV4, "fd00:5a::2")


def use_tree(tree: str | None) -> None:
    """Imports the measured packages from `tree` (default: this checkout)."""
    sys.path.insert(0, str(Path(tree).resolve() if tree else REPO_ROOT))


def specs(ports: dict[str, int]):
    from cri_proto import probe_spec_pb2 as spec_pb

    def port(kind: str):
        return spec_pb.PortRef(number=ports[kind])

    return {
        "http": spec_pb.ProbeSpec(http_get=spec_pb.HTTPGetAction(path="/ok", port=port("http"))),
        "tcp": spec_pb.ProbeSpec(tcp_socket=spec_pb.TCPSocketAction(port=port("tcp"))),
        "grpc": spec_pb.ProbeSpec(grpc=spec_pb.GRPCAction(port=ports["grpc"])),
    }


def periodic_registration(spec, kind: str, period_ms: int, **fields):
    """A readiness registration of a copy of `spec` at `period_ms`, under the probe id `kind`. `fields`: more
    fields of the registration (only those the measured tree knows)."""
    from cri_proto import probe_spec_pb2 as spec_pb
    from cri_proto import probe_worker_pb2 as worker_pb

    periodic = spec_pb.ProbeSpec()
    periodic.CopyFrom(spec)
    periodic.period_ms = period_ms
    return worker_pb.ProbeRegistration(probe_id=kind, type=spec_pb.READINESS, spec=periodic, **fields,
                                       container=worker_pb.ContainerRef(id="c", name="app"))


class PodUnderTest:
    """A throwaway pod netns with HTTP, TCP (accept and close) and gRPC health servers."""

    def __enter__(self) -> "PodUnderTest":
        sys.path.insert(0, str(REPO_ROOT))
        from tests.support.netns_env import PodNetns, listen, netns_unavailable_reason

        reason = netns_unavailable_reason()
        if reason:
            raise SystemExit(f"perf_probe_path: {reason}")
        self.ns = PodNetns.create()
        try:
            self.ports = {
                "http": self.ns.spawn_python("http_server.py", "--host", "::").port,
                "tcp": listen(self.ns).port,
                "grpc": self.ns.spawn_python("grpc_health_server.py", "--host", "::").port,
            }
        except BaseException:
            self.ns.destroy()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.ns.destroy()
