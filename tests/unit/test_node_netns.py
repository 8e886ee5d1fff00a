"""The node's network namespace (probe_api/node_netns.py): the rule every resolver and the netns broker apply."""

from __future__ import annotations

import os

from probe_api.node_netns import host_network_refusal, is_node_netns, netns_id, node_netns_ids


def test_the_callers_own_namespace_is_the_nodes_and_a_file_elsewhere_is_not(tmp_path):
    own = os.stat("/proc/self/ns/net")
    assert netns_id(own) in node_netns_ids()
    assert is_node_netns(own)
    assert is_node_netns(os.stat(f"/proc/{os.getpid()}/ns/net"))
    other = tmp_path / "not-a-namespace"
    other.write_text("")
    assert not is_node_netns(os.stat(other))


def test_open_namespace_files_count_too_and_explicit_ids_are_used_as_given(tmp_path):
    other = tmp_path / "stand-in"
    other.write_text("")
    fd = os.open(other, os.O_RDONLY)
    try:
        assert netns_id(os.fstat(fd)) in node_netns_ids((fd,))
    finally:
        os.close(fd)
    assert not is_node_netns(os.stat("/proc/self/ns/net"), frozenset())


def test_the_refusal_says_why_and_what_to_do():
    assert host_network_refusal("abc") == (
        "pod sandbox abc uses the node's network namespace (hostNetwork): cri-probe-shim never probes from the "
        "node's network namespace; a hostNetwork pod keeps the kubelet's own probes (do not convert it)")
