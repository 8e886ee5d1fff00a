"""Resolution of a probe's port (number or container port name) to a port number.

Owns the kubelet's probe.ResolveContainerPort (pkg/probe/util.go, 1.32): a name is
looked up among the container's ports, and a name that is really a number ("8080")
is accepted the way Go's strconv.Atoi would read it. Pure, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.gostrings import go_quote
from probe_worker.go_errors import strconv_error

# strconv.Atoi: optional sign, ASCII digits only (Python's int() would also take
# spaces, underscores and non-ASCII digits).
_GO_ATOI_RE = re.compile(r"[+-]?[0-9]+")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


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
    # The first match wins, as in findPortByName. An empty name never matches: the
    # kubelet would pick the first unnamed port, but the API never lets "" through.
    if name:
        for port in container_ports:
            if port.name == name:
                return port.container_port
    # "Last ditch effort - maybe it was an int stored as string?"
    if _GO_ATOI_RE.fullmatch(name):
        number = int(name)
        if not _INT64_MIN <= number <= _INT64_MAX:
            raise PortError(strconv_error("Atoi", name, "value out of range"))
        return number
    # The kubelet returns the Atoi error here (`strconv.Atoi: parsing "http": invalid
    # syntax`), which hides the real problem; we say what went wrong instead.
    raise PortError(f"port {go_quote(name)} not found in the container's ports")
