"""What each containerd release says about a pod sandbox, read by the shim's resolver as the runtime says it.

The shim finds a sandbox's network namespace in the verbose PodSandboxStatus answer (shim/sandboxes/resolver.py),
whose `info` is each runtime's own JSON: containerd 1.6 names the namespace in the runtime spec only; 2.x (whose
CRI plugin was rewritten around a sandbox controller) also keeps it in `sandboxMetadata.Metadata.NetNSPath` and
drops the top-level `runtimeHandler`. These tests run on every runtime of the suite (tests/e2e/conftest.py) and
check the layout each one really has, so that a release that moves a field fails here rather than in a probe.
"""

from __future__ import annotations

import json
import os

import pytest

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from shim.sandboxes.resolver import sandbox_from_status

pytestmark = pytest.mark.e2e


def verbose_info(containerd, pod_id: str) -> tuple[cri_pb.PodSandboxStatusResponse, dict]:
    response = containerd.cri.call("PodSandboxStatus", cri_pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id,
                                                                                        verbose=True))
    return response, json.loads(response.info["info"])


def test_the_resolver_finds_the_namespace_the_pause_process_is_in(containerd, kubelet):
    pod = kubelet.run_pod("layout")
    response, info = verbose_info(containerd, pod.id)
    sandbox = sandbox_from_status(response)
    assert sandbox.netns_path.startswith(containerd.session.netns_dir + "/cni-")
    assert os.stat(sandbox.netns_path).st_ino == os.stat(f"/proc/{sandbox.pid}/ns/net").st_ino
    assert (sandbox.pod_ips, sandbox.ready, sandbox.host_network) == ((pod.ip,), True, False)
    spec_paths = [ns.get("path") for ns in info["runtimeSpec"]["linux"]["namespaces"] if ns["type"] == "network"]
    assert spec_paths == [sandbox.netns_path]
    if containerd.runtime.major >= 2:
        assert info["sandboxMetadata"]["Metadata"]["NetNSPath"] == sandbox.netns_path
        assert "runtimeHandler" not in info
    else:
        assert "sandboxMetadata" not in info and "runtimeHandler" in info


def test_a_host_network_sandbox_names_no_namespace_and_says_node(containerd, kubelet):
    pod = kubelet.run_pod("layout-host", host_network=True)
    response, info = verbose_info(containerd, pod.id)
    sandbox = sandbox_from_status(response)
    assert (sandbox.netns_path, sandbox.host_network, sandbox.pod_ips) == ("", True, ())
    assert response.status.linux.namespaces.options.network == cri_pb.NODE
    assert not [ns for ns in info["runtimeSpec"]["linux"]["namespaces"] if ns["type"] == "network"]
    if containerd.runtime.major >= 2:
        assert info["sandboxMetadata"]["Metadata"]["NetNSPath"] == ""
    # The pause process is in the node's namespace: what the resolver's rule refuses (probe_api/node_netns.py).
    assert os.stat(f"/proc/{sandbox.pid}/ns/net").st_ino == os.stat("/proc/self/ns/net").st_ino
