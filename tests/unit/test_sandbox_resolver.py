"""Sandbox resolution (shim/sandboxes/resolver.py): parsing the runtime's verbose status, and the embedded netns mode."""

import asyncio
import json
import os

import pytest

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from shim.sandboxes import resolver as sandboxes
from shim.sandboxes.resolver import (SandboxNotReady, NETNS_DIR, NetnsSandboxes, SandboxNotFound, netns_path_for, sandbox_from_status,
                            sandbox_gone_reason)

NETNS = "/run/containerd-test/io.containerd.grpc.v1.cri/netns/cni-1234"


def status_response(info: dict | None, ip="10.244.77.5", extra_ips=("fd00::5",), state=cri_pb.SANDBOX_READY):
    status = cri_pb.PodSandboxStatus(
        id="abc123", state=state, created_at=42,
        metadata=cri_pb.PodSandboxMetadata(name="web-0", namespace="shop", uid="uid-1"),
        network=cri_pb.PodSandboxNetworkStatus(ip=ip, additional_ips=[cri_pb.PodIP(ip=i) for i in extra_ips]),
    )
    return cri_pb.PodSandboxStatusResponse(status=status, info={"info": json.dumps(info)} if info is not None else {})


def containerd_info(path=NETNS, pid=4321):
    namespaces = [{"type": "pid"}, {"type": "network", "path": path}] if path else [{"type": "pid"}]
    return {"pid": pid, "runtimeSpec": {"linux": {"namespaces": namespaces}},
            "sandboxMetadata": {"Metadata": {"NetNSPath": path}}}


def test_containerd_verbose_status_gives_netns_ips_and_identity():
    sandbox = sandbox_from_status(status_response(containerd_info()))
    assert sandbox.netns_path == NETNS
    assert sandbox.pod_ips == ("10.244.77.5", "fd00::5")
    assert (sandbox.name, sandbox.namespace, sandbox.uid, sandbox.pid) == ("web-0", "shop", "uid-1", 4321)
    assert sandbox.ready and sandbox.created_at == 42


def test_metadata_path_is_the_fallback():
    info = containerd_info()
    info["runtimeSpec"]["linux"]["namespaces"] = []
    assert sandbox_from_status(status_response(info)).netns_path == NETNS


def test_host_network_pod_uses_the_sandbox_process_namespace():
    sandbox = sandbox_from_status(status_response(containerd_info(path=""), ip=""))
    assert sandbox.netns_path == "/proc/4321/ns/net" and sandbox.pod_ips == ("fd00::5",)


def test_not_ready_and_missing_info():
    assert not sandbox_from_status(status_response(containerd_info(), state=cri_pb.SANDBOX_NOTREADY)).ready
    assert sandbox_from_status(status_response(None)).netns_path == ""
    broken = status_response(None)
    broken.info["info"] = "{not json"
    assert sandbox_from_status(broken).netns_path == ""


def test_verbose_status_decodes_fields_this_subset_leaves_out():
    # containers_statuses (field 3) is not declared in the subset: a full answer still decodes.
    full = status_response(containerd_info()).SerializeToString() + b"\x1a\x04\x0a\x02c1"
    decoded = cri_pb.PodSandboxStatusResponse.FromString(full)
    assert sandbox_from_status(decoded).netns_path == NETNS and decoded.status.id == "abc123"


def test_embedded_mode_maps_names_and_refuses_escapes():
    assert netns_path_for("pod-a") == f"{NETNS_DIR}/pod-a"
    assert netns_path_for("/proc/1/ns/net") == "/proc/1/ns/net"
    assert netns_path_for("/run/netns/pod-b") == "/run/netns/pod-b"
    for bad in ("", "..", "a/b", "/etc/passwd", "/var/run/netns/../../etc/shadow", "/proc/self/ns/net",
                "/proc/1/ns/mnt", "/var/run/netns/a/b"):
        with pytest.raises(SandboxNotFound):
            netns_path_for(bad)


def test_embedded_mode_refuses_the_nodes_own_netns():
    # The daemon's own netns is the node's: a "sandbox" there would probe the node, not a pod.
    with pytest.raises(SandboxNotReady, match="node's own network namespace"):
        asyncio.run(NetnsSandboxes().resolve(f"/proc/{os.getpid()}/ns/net"))


def test_embedded_mode_lists_the_nodes_own_netns_as_not_ready_instead_of_failing(tmp_path, monkeypatch):
    # `ip netns attach host 1` puts the node's own netns under /var/run/netns: listed, never probed.
    monkeypatch.setattr(sandboxes, "NETNS_DIR", str(tmp_path))
    (tmp_path / "pod-a").write_text("")  # a plain file stands in for a pod's netns file
    (tmp_path / "host").symlink_to(f"/proc/{os.getpid()}/ns/net")
    listed = {info.id: info.ready for info in asyncio.run(NetnsSandboxes().list())}
    assert listed == {"host": False, "pod-a": True}


def test_embedded_mode_unknown_netns_is_not_found():
    with pytest.raises(SandboxNotFound, match="no network namespace at /var/run/netns/cps-nope"):
        asyncio.run(NetnsSandboxes().resolve("cps-nope"))


def test_embedded_mode_says_which_sandboxes_are_gone_and_why(tmp_path, monkeypatch):
    monkeypatch.setattr(sandboxes, "NETNS_DIRS", (str(tmp_path),))  # plain files stand in for netns files
    present, replaced = tmp_path / "netns-file", tmp_path / "replaced"
    present.write_text("")
    replaced.write_text("")
    inode, other = os.stat(present).st_ino, os.stat(replaced).st_ino
    gone = asyncio.run(NetnsSandboxes().gone({
        str(present): inode, str(replaced): inode, str(tmp_path / "idle"): 0,
        str(tmp_path / "deleted"): inode, "cps-nope": 0, "a/b": 0,
    }))
    assert gone == {
        str(replaced): f"the network namespace at {replaced} was replaced (inode {inode}, now {other})",
        str(tmp_path / "idle"): f"no network namespace at {tmp_path}/idle any more",
        str(tmp_path / "deleted"): f"no network namespace at {tmp_path}/deleted any more",
        "cps-nope": f"no network namespace at {NETNS_DIR}/cps-nope any more",
        "a/b": "invalid network namespace name 'a/b'",
    }


def test_runtime_mode_gone_reasons():
    assert sandbox_gone_reason(None) == "the runtime no longer lists the pod sandbox"
    listed = cri_pb.PodSandbox(id="abc", state=cri_pb.SANDBOX_NOTREADY)
    assert sandbox_gone_reason(listed) == "the runtime lists the pod sandbox as SANDBOX_NOTREADY"
