"""The marker command's shape, shared by the bridge command's tests (tests/unit/test_bridge_command_*.py): the marker,
a container's declared ports, the command read as the daemon reads it (shim/bridge/command.py: parse_command), a
refusal's errors, and the handlers expected."""

from __future__ import annotations

import pytest

from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.bridge_command import MARKER, BadArguments, BridgedCall
from shim.bridge.command import parse_command

M = MARKER
PORTS = (spec_pb.ContainerPort(name="web", container_port=8080, protocol="TCP"),
         spec_pb.ContainerPort(name="metrics", container_port=9090, protocol="TCP"))


def parse(*args: str, ports=PORTS, timeout_ms: int = 1000, allow_host: bool = False) -> BridgedCall:
    return parse_command([M, *args], ports=ports, timeout_ms=timeout_ms, allow_host=allow_host)


def refusal(*args: str, **kwargs) -> list[str]:
    with pytest.raises(BadArguments) as caught:
        parse(*args, **kwargs)
    assert str(caught.value) == "; ".join(caught.value.errors)
    return caught.value.errors


def http_get(port: int | str, path: str = "/", **fields) -> spec_pb.HTTPGetAction:
    ref = spec_pb.PortRef(name=port) if isinstance(port, str) else spec_pb.PortRef(number=port)
    return spec_pb.HTTPGetAction(path=path, port=ref, **fields)


def tcp(port: int | str) -> spec_pb.TCPSocketAction:
    ref = spec_pb.PortRef(name=port) if isinstance(port, str) else spec_pb.PortRef(number=port)
    return spec_pb.TCPSocketAction(port=ref)
