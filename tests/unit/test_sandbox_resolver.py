"""Sandbox resolution (shim/sandboxes/resolver.py): parsing the runtime's verbose status, and the embedded netns mode."""

import asyncio
import json
import os

import pytest

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from shim.sandboxes import resolver as sandboxes
from shim.sandboxes.resolver import (
    NETNS_DIR, CriSandboxes, HostNetworkSandbox, NetnsSandboxes, SandboxNotFound, SandboxNotReady, netns_path_for,
    sandbox_from_status, sandbox_gone_reason,
)

NETNS = "/run/containerd-test/io.containerd.grpc.v1.cri/netns/cni-1234"


def node_namespace_files() -> list[str]:
    """The node's namespace files this process may stat (PID 1's is not, on some sandboxed machines)."""
    files = [f"/proc/{os.getpid()}/ns/net"]
    try:
        os.stat("/proc/1/ns/net")
    except OSError:
        return files
    return files + ["/proc/1/ns/net"]


def status_response(info: dict | None, ip="10.244.77.5", extra_ips=("fd00::5",), state=cri_pb.SANDBOX_READY,
                    network_mode=cri_pb.POD):
    status = cri_pb.PodSandboxStatus(
        id="abc123", state=state, created_at=42,
        metadata=cri_pb.PodSandboxMetadata(name="web-0", namespace="shop", uid="uid-1"),
        network=cri_pb.PodSandboxNetworkStatus(ip=ip, additional_ips=[cri_pb.PodIP(ip=i) for i in extra_ips]),
        linux=cri_pb.LinuxPodSandboxStatus(namespaces=cri_pb.Namespace(
            options=cri_pb.NamespaceOption(network=network_mode))),
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


def test_a_runtime_that_names_no_path_gives_the_sandbox_process_namespace_to_be_checked():
    sandbox = sandbox_from_status(status_response(containerd_info(path=""), ip=""))
    assert sandbox.netns_path == "/proc/4321/ns/net" and sandbox.pod_ips == ("fd00::5",)
    assert not sandbox.host_network  # not by the runtime's account: the resolver stats the path (below)


def test_a_pod_the_runtime_puts_in_the_nodes_network_namespace_is_host_network_with_no_path():
    sandbox = sandbox_from_status(status_response(containerd_info(path=""), ip="", network_mode=cri_pb.NODE))
    assert sandbox.host_network and sandbox.netns_path == ""


class Runtime:
    """A Channel whose PodSandboxStatus answers `response` (what CriSandboxes calls)."""

    def __init__(self, response: cri_pb.PodSandboxStatusResponse) -> None:
        self.response = response

    def unary_unary(self, path, request_serializer, response_deserializer):
        async def call(request, *, timeout=None, metadata=()):
            return self.response
        return call


@pytest.mark.parametrize("mode,info", [
    (cri_pb.NODE, containerd_info(path="")),  # the runtime says so (containerd fills the namespace options)
    (cri_pb.POD, containerd_info(path="", pid=os.getpid())),  # it does not: the pause process's is the node's
    (cri_pb.POD, containerd_info(path=f"/proc/{os.getpid()}/ns/net")),  # a path that is the node's namespace
])
def test_the_cri_resolver_refuses_a_sandbox_in_the_nodes_network_namespace(mode, info):
    runtime = Runtime(status_response(info, ip="", network_mode=mode))
    with pytest.raises(HostNetworkSandbox, match=r"^pod sandbox abc123 uses the node's network namespace "
                                                 r"\(hostNetwork\): cri-probe-shim never probes"):
        asyncio.run(CriSandboxes(runtime).resolve("abc123"))


def test_the_cri_resolver_takes_a_pod_network_namespace():
    runtime = Runtime(status_response(containerd_info(path=f"/proc/{os.getpid()}/ns/../ns/net")))
    with pytest.raises(HostNetworkSandbox):  # the node's however spelt
        asyncio.run(CriSandboxes(runtime).resolve("abc123"))
    runtime.response = status_response(containerd_info(path="/var/run/netns/somewhere-else"))
    assert asyncio.run(CriSandboxes(runtime).resolve("abc123")).netns_path == "/var/run/netns/somewhere-else"


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
    for path in node_namespace_files():
        with pytest.raises(HostNetworkSandbox, match="uses the node's network namespace"):
            asyncio.run(NetnsSandboxes().resolve(path))
    assert issubclass(HostNetworkSandbox, SandboxNotReady)  # FAILED_PRECONDITION to the API's callers


def test_embedded_mode_lists_the_nodes_own_netns_as_not_ready_instead_of_failing(tmp_path, monkeypatch):
    # `ip netns attach host 1` puts the node's own netns under /var/run/netns: listed, never probed.
    monkeypatch.setattr(sandboxes, "NETNS_DIR", str(tmp_path))
    (tmp_path / "pod-a").write_text("")  # a plain file stands in for a pod's netns file
    (tmp_path / "host").symlink_to(f"/proc/{os.getpid()}/ns/net")
    listed = {info.id: (info.ready, info.host_network) for info in asyncio.run(NetnsSandboxes().list())}
    assert listed == {"host": (False, True), "pod-a": (True, False)}


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
