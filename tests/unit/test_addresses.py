"""The target/ip_family rule of KEP-4559, without sockets."""

import socket

import pytest

from cri_proto import probe_spec_pb2 as spec_pb
from probe_worker.addresses import AddressError, choose_endpoint

DUAL = ["10.1.0.5", "fd00::5"]
DUAL_V6_PRIMARY = ["fd00::5", "10.1.0.5"]


@pytest.mark.parametrize(
    ("target", "family", "pod_ips", "addresses"),
    [
        (spec_pb.POD_IP, spec_pb.PRIMARY, DUAL, ("10.1.0.5",)),
        (spec_pb.POD_IP, spec_pb.PRIMARY, DUAL_V6_PRIMARY, ("fd00::5",)),
        (spec_pb.POD_IP, spec_pb.IPV4, DUAL_V6_PRIMARY, ("10.1.0.5",)),
        (spec_pb.POD_IP, spec_pb.IPV6, DUAL, ("fd00::5",)),
        (spec_pb.POD_IP, spec_pb.ANY, DUAL, ("10.1.0.5", "fd00::5")),
        (spec_pb.POD_IP, spec_pb.ANY, DUAL_V6_PRIMARY, ("fd00::5", "10.1.0.5")),
        (spec_pb.POD_IP, spec_pb.ANY, ["10.1.0.5"], ("10.1.0.5",)),
        (spec_pb.LOOPBACK, spec_pb.PRIMARY, DUAL, ("127.0.0.1",)),
        (spec_pb.LOOPBACK, spec_pb.PRIMARY, DUAL_V6_PRIMARY, ("::1",)),
        (spec_pb.LOOPBACK, spec_pb.IPV6, DUAL, ("::1",)),
        (spec_pb.LOOPBACK, spec_pb.ANY, DUAL, ("127.0.0.1", "::1")),
        # A netns with no global address: loopback, like the last fallback.
        (spec_pb.POD_IP, spec_pb.PRIMARY, [], ("127.0.0.1",)),
        (spec_pb.POD_IP, spec_pb.IPV6, [], ("::1",)),
    ],
)
def test_choose_endpoint(target, family, pod_ips, addresses):
    endpoint = choose_endpoint("", target, family, 8080, pod_ips)
    assert endpoint.addresses == addresses
    assert endpoint.host == addresses[0]
    assert endpoint.port == 8080


def test_missing_family_is_an_error_naming_it():
    with pytest.raises(AddressError, match="no IPv6 address"):
        choose_endpoint("", spec_pb.POD_IP, spec_pb.IPV6, 80, ["10.1.0.5"])


def test_explicit_host_literal_wins_over_target():
    endpoint = choose_endpoint("10.9.9.9", spec_pb.LOOPBACK, spec_pb.IPV6, 80, DUAL)
    assert endpoint.addresses == ("10.9.9.9",)


def test_explicit_hostname_is_resolved_later_with_the_family_filter():
    endpoint = choose_endpoint("db.local", spec_pb.POD_IP, spec_pb.IPV6, 80, DUAL)
    assert endpoint.host == "db.local" and endpoint.addresses == ()
    assert endpoint.family_filter == socket.AF_INET6


# --- the pod's own loopback as a host (probe_api.pod_loopback) ------------------------------------------------------

@pytest.mark.parametrize(("family", "addresses"), [
    # The kubelet's resolver order (127.0.0.1, then ::1), whatever the pod's primary family: Go's dialer races them.
    (spec_pb.PRIMARY, ("127.0.0.1", "::1")),
    (spec_pb.ANY, ("127.0.0.1", "::1")),
    (spec_pb.IPV4, ("127.0.0.1",)),
    (spec_pb.IPV6, ("::1",)),
])
def test_localhost_is_the_pods_loopback_ipv4_first(family, addresses):
    endpoint = choose_endpoint("localhost", spec_pb.POD_IP, family, 8080, DUAL_V6_PRIMARY)
    assert endpoint.addresses == addresses
    assert endpoint.host == "localhost"  # what the URL and the Host header show, as the kubelet's do
    assert endpoint.family_filter == 0   # nothing is resolved: the node's /etc/hosts is never read


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_a_loopback_literal_is_that_address(host):
    endpoint = choose_endpoint(host, spec_pb.POD_IP, spec_pb.PRIMARY, 8080, ["fd00::5"])
    assert endpoint.addresses == (host,) and endpoint.host == host
