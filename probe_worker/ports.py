"""Resolution of a probe's port (number or container port name) to a port number.

Owns the kubelet's probe.ResolveContainerPort (pkg/probe/util.go, 1.37): a name is looked up among the container's
ports, the first one of that name wins, and a name the container has not fails the attempt. Pure, no I/O.
(Up to 1.35 a name that was not found was read as a number with strconv.Atoi; 1.37 dropped that, and the API's
port name rule, at least one letter, never let such a name through anyway.)
"""

from __future__ import annotations

from collections.abc import Sequence

from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.gostrings import go_quote


class PortError(ValueError):
    """The port cannot be resolved; str() is the message for the attempt's output."""


def resolve_port(ref: spec_pb.PortRef, container_ports: Sequence[spec_pb.ContainerPort]) -> int:
    kind = ref.WhichOneof("port")
    if kind == "number":
        port = ref.number
    elif kind == "name":
        port = _port_by_name(ref.name, container_ports)
    else:
        # Kubernetes: "intOrString had no kind"; validation refuses this before we get here.
        raise PortError("port is not set")
    if 0 < port < 65536:
        return port
    raise PortError(f"invalid port number: {port}")


def _port_by_name(name: str, container_ports: Sequence[spec_pb.ContainerPort]) -> int:
    # findPortByName. An empty name never matches: the kubelet would pick the first unnamed port, but the API never
    # lets "" through.
    if name:
        for port in container_ports:
            if port.name == name:
                return port.container_port
    raise PortError(f"port {go_quote(name)} not found")
