"""What `host` means inside the pod's netns (probe_api.pod_loopback): three spellings are the pod's own loopback."""

import pytest

from cri_proto import probe_spec_pb2 as spec_pb
from probe_api.pod_loopback import is_pod_loopback, loopback_addresses


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost"])
def test_the_three_spellings_are_the_pods_loopback(host):
    assert is_pod_loopback(host)


# Loopback too, or close to it, but not one of the three spellings: each keeps the gate, so the rule is checked by eye.
@pytest.mark.parametrize("host", ["", "127.0.0.2", "127.1", "[::1]", "0:0:0:0:0:0:0:1", "::ffff:127.0.0.1",
                                  "LOCALHOST", "localhost.", "localhost.localdomain", "ip6-localhost", "0.0.0.0",
                                  "10.0.0.1", "169.254.169.254", "example.com"])
def test_every_other_host_is_not(host):
    assert not is_pod_loopback(host)
    assert loopback_addresses(host, spec_pb.PRIMARY) == ()


@pytest.mark.parametrize("family, addresses", [
    (spec_pb.PRIMARY, ("127.0.0.1", "::1")), (spec_pb.ANY, ("127.0.0.1", "::1")),
    (spec_pb.IPV4, ("127.0.0.1",)), (spec_pb.IPV6, ("::1",)),
])
def test_localhost_is_both_families_ipv4_first(family, addresses):
    assert loopback_addresses("localhost", family) == addresses


@pytest.mark.parametrize("family", [spec_pb.PRIMARY, spec_pb.IPV4, spec_pb.IPV6, spec_pb.ANY])
def test_a_literal_is_the_address_it_names(family):
    assert loopback_addresses("127.0.0.1", family) == ("127.0.0.1",)
    assert loopback_addresses("::1", family) == ("::1",)
