"""Port resolution: kubelet probe.ResolveContainerPort semantics (pkg/probe/util.go, 1.37)."""

from __future__ import annotations

import pytest

from cri_proto import probe_spec_pb2 as pb
from probe_worker.ports import PortError, resolve_port

CONTAINER_PORTS = (
    pb.ContainerPort(name="http", container_port=8080, protocol="TCP"),
    pb.ContainerPort(name="grpc", container_port=9090, protocol="TCP"),
    pb.ContainerPort(name="http", container_port=8081, protocol="TCP"),   # duplicate: first wins
    pb.ContainerPort(name="", container_port=7070, protocol="TCP"),
    pb.ContainerPort(name="zero", container_port=0),
    pb.ContainerPort(name="huge", container_port=70000),
    pb.ContainerPort(name="123", container_port=4444),
)


def number(value: int) -> pb.PortRef:
    return pb.PortRef(number=value)


def name(value: str) -> pb.PortRef:
    return pb.PortRef(name=value)


@pytest.mark.parametrize("ref, ports, expected", [
    (number(80), (), 80),
    (number(1), (), 1),
    (number(65535), (), 65535),
    (name("http"), CONTAINER_PORTS, 8080),
    (name("grpc"), CONTAINER_PORTS, 9090),
    (name("123"), CONTAINER_PORTS, 4444),
])
def test_resolves(ref, ports, expected):
    assert resolve_port(ref, ports) == expected


@pytest.mark.parametrize("ref, ports, message", [
    (number(0), (), "invalid port number: 0"),
    (number(-1), (), "invalid port number: -1"),
    (number(65536), (), "invalid port number: 65536"),
    (name("zero"), CONTAINER_PORTS, "invalid port number: 0"),
    (name("huge"), CONTAINER_PORTS, "invalid port number: 70000"),
    # 1.37's findPortByName: `port %q not found`, and no strconv.Atoi of the name any more (1.35 had it).
    (name("8443"), (), 'port "8443" not found'),
    (name("0"), (), 'port "0" not found'),
    (name("metrics"), CONTAINER_PORTS, 'port "metrics" not found'),
    (name("http"), (), 'port "http" not found'),
    (name("HTTP"), CONTAINER_PORTS, 'port "HTTP" not found'),  # case matters
    (name(" 80"), (), 'port " 80" not found'),
    (name("8_0"), (), 'port "8_0" not found'),
    (name("٨٠"), (), 'port "٨٠" not found'),
    (name("a\nb"), (), 'port "a\\nb" not found'),
    # An empty name never picks an unnamed container port.
    (name(""), CONTAINER_PORTS, 'port "" not found'),
    (pb.PortRef(), CONTAINER_PORTS, "port is not set"),
])
def test_errors(ref, ports, message):
    with pytest.raises(PortError) as caught:
        resolve_port(ref, ports)
    assert str(caught.value) == message


def test_port_error_is_a_value_error():
    assert issubclass(PortError, ValueError)
