"""The pure parts of the end-to-end fixtures, without containerd or root: the OCI image layout, the
containerd and CNI configuration, and the parsing the teardown relies on."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import tomllib

import pytest

from cri_proto import cri_runtime_v1_pb2 as cri_pb
from tests.support.containerd_session import (
    CNI_BIN_DIR, RUNC, SHIM_SOCKET_DIR, Runtime, Session, cni_conflist, containerd_config, free_subnet, image_defs,
    mount_of, mounts_under, runtimes_from, unescape_mount_path, workdir_root,
)
from tests.support.cri_client import sandbox_network
from tests.support.oci_images import NAME_ANNOTATION, go_arch, is_static_elf, layout_tar

FAKE_BUSYBOX = b"\x7fELF not really busybox"
SESSION = Session(workdir="/tmp/probe-shim-e2e-abc", token="0a1b2c", subnet="10.244.77.0/24")


def _members(tar_bytes: bytes) -> dict[str, tarfile.TarInfo | bytes]:
    out = {}
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        for member in tar.getmembers():
            out[member.name] = tar.extractfile(member).read() if member.isfile() else member
    return out


def test_the_image_layout_names_every_image_and_every_blob_is_content_addressed():
    files = _members(layout_tar(image_defs("tok"), FAKE_BUSYBOX, arch="amd64"))
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads(files["index.json"])
    names = [m["annotations"][NAME_ANNOTATION] for m in index["manifests"]]
    assert names == ["probe-e2e.local/pause:1", "probe-e2e.local/http:1", "probe-e2e.local/tcp:1"]
    blobs = {name.removeprefix("blobs/sha256/"): data for name, data in files.items()
             if name.startswith("blobs/sha256/") and isinstance(data, bytes)}
    assert all(hashlib.sha256(data).hexdigest() == digest for digest, data in blobs.items())

    layers_of = {}
    for entry, name in zip(index["manifests"], names):
        assert entry["platform"] == {"architecture": "amd64", "os": "linux"}
        manifest = json.loads(blobs[entry["digest"].removeprefix("sha256:")])
        config = json.loads(blobs[manifest["config"]["digest"].removeprefix("sha256:")])
        layers_of[name] = [layer["digest"] for layer in manifest["layers"]]
        assert config["rootfs"]["diff_ids"] == layers_of[name]  # uncompressed: diff id == digest
        assert all(layer["digest"].removeprefix("sha256:") in blobs for layer in manifest["layers"])
    # One busybox layer shared by all three; the HTTP image adds its document root.
    assert len({layers[0] for layers in layers_of.values()}) == 1
    assert [len(layers) for layers in layers_of.values()] == [1, 2, 1]


def test_the_base_layer_holds_busybox_its_applets_and_users():
    index_and_blobs = _members(layout_tar(image_defs("tok"), FAKE_BUSYBOX, arch="amd64"))
    layers = [_members(data) for name, data in index_and_blobs.items()
              if name.startswith("blobs/") and isinstance(data, bytes) and data[257:262] == b"ustar"]
    base = next(layer for layer in layers if "bin/busybox" in layer)
    www = next(layer for layer in layers if "www/healthz" in layer)
    assert base["bin/busybox"] == FAKE_BUSYBOX
    assert base["bin/sh"].issym() and base["bin/sh"].linkname == "busybox"
    assert base["bin/true"].linkname == "busybox" and base["bin/nc"].linkname == "busybox"
    assert base["etc/passwd"].startswith(b"root:x:0:0:") and b"nobody:x:65534" in base["etc/passwd"]
    assert base["tmp"].mode == 0o1777
    assert www["www/healthz"] == b"ok tok\n"


def test_the_image_layout_is_reproducible():
    assert layout_tar(image_defs("t"), FAKE_BUSYBOX, "amd64") == layout_tar(image_defs("t"), FAKE_BUSYBOX, "amd64")


def _elf64(program_header_types: list[int]) -> bytes:
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    header[32:40] = (64).to_bytes(8, "little")           # e_phoff
    header[54:56] = (56).to_bytes(2, "little")           # e_phentsize
    header[56:58] = len(program_header_types).to_bytes(2, "little")
    table = b"".join(t.to_bytes(4, "little") + bytes(52) for t in program_header_types)
    return bytes(header) + table


@pytest.mark.parametrize(("content", "static"), [
    (_elf64([1, 1]), True),        # PT_LOAD only
    (_elf64([6, 3, 1]), False),    # PT_INTERP: needs the dynamic loader
    (b"#!/bin/sh\n", False),
])
def test_static_elf_detection(tmp_path, content, static):
    path = tmp_path / "binary"
    path.write_bytes(content)
    assert is_static_elf(path) is static


def test_go_arch_names():
    assert (go_arch("x86_64"), go_arch("aarch64"), go_arch("riscv64")) == ("amd64", "arm64", "riscv64")


def test_the_containerd_config_has_every_setting_this_machine_needs():
    config = tomllib.loads(containerd_config(SESSION, "probe-e2e.local/pause:1"))
    assert config["version"] == 2
    assert (config["root"], config["state"]) == ("/tmp/probe-shim-e2e-abc/root", "/tmp/probe-shim-e2e-abc/state")
    assert config["grpc"]["address"] == "/tmp/probe-shim-e2e-abc/containerd.sock"
    assert config["ttrpc"]["address"].startswith("/tmp/probe-shim-e2e-abc/")
    assert set(config["disabled_plugins"]) == {
        "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp",
        "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
        "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"}
    plugins = config["plugins"]
    assert plugins["io.containerd.internal.v1.opt"]["path"].startswith("/tmp/probe-shim-e2e-abc/")
    cri = plugins["io.containerd.grpc.v1.cri"]
    assert cri["restrict_oom_score_adj"] is True
    assert (cri["enable_selinux"], cri["disable_apparmor"], cri["netns_mounts_under_state_dir"]) == (False, True, True)
    assert cri["sandbox_image"] == "probe-e2e.local/pause:1"
    assert cri["containerd"]["snapshotter"] == "overlayfs"
    runc = cri["containerd"]["runtimes"]["runc"]
    assert runc["runtime_type"] == "io.containerd.runc.v2"
    assert runc["options"] == {"SystemdCgroup": False, "BinaryName": RUNC, "Root": "/tmp/probe-shim-e2e-abc/runc"}
    assert cri["cni"] == {"bin_dir": CNI_BIN_DIR, "conf_dir": "/tmp/probe-shim-e2e-abc/cni/net.d", "max_conf_num": 1}


def test_the_containerd_2_config_splits_the_cri_plugin_and_keeps_every_path_private(monkeypatch):
    monkeypatch.setenv("CONTAINERD_CACHE_DIR", "/cache/containerd")
    session = Session(workdir="/tmp/probe-shim-e2e-abc", token="0a1b2c", subnet="10.244.77.0/24", containerd="2.4.2")
    text = containerd_config(session, "probe-e2e.local/pause:1")
    config = tomllib.loads(text)
    assert config["version"] == 3 and config["imports"] == []
    assert (config["root"], config["state"]) == ("/tmp/probe-shim-e2e-abc/root", "/tmp/probe-shim-e2e-abc/state")
    assert config["grpc"]["address"] == "/tmp/probe-shim-e2e-abc/containerd.sock"
    plugins = config["plugins"]
    assert plugins["io.containerd.cri.v1.images"]["pinned_images"] == {"sandbox": "probe-e2e.local/pause:1"}
    runtime = plugins["io.containerd.cri.v1.runtime"]
    assert (runtime["restrict_oom_score_adj"], runtime["netns_mounts_under_state_dir"]) == (True, True)
    assert runtime["cni"] == {"bin_dirs": [CNI_BIN_DIR], "conf_dir": "/tmp/probe-shim-e2e-abc/cni/net.d",
                              "max_conf_num": 1}
    runc = runtime["containerd"]["runtimes"]["runc"]
    # Its own release's shim: the first one on PATH is Debian's 1.6 shim.
    assert runc["runtime_path"] == "/cache/containerd/v2.4.2/containerd-shim-runc-v2"
    assert runc["options"] == {"SystemdCgroup": False, "BinaryName": RUNC, "Root": "/tmp/probe-shim-e2e-abc/runc"}
    assert plugins["io.containerd.shim.v1.manager"]["socket_dir"] == "/tmp/probe-shim-e2e-abc/s"
    assert session.shim_socket_dir != SHIM_SOCKET_DIR and SESSION.shim_socket_dir == SHIM_SOCKET_DIR
    # NRI is on in 2.x: its socket and plugin dirs are the session's, like every path the config names.
    assert all(path.startswith("/tmp/probe-shim-e2e-abc/") for path in plugins["io.containerd.nri.v1.nri"].values())
    named = [line.split('"')[1] for line in text.splitlines() if '= "/' in line]
    assert all(path.startswith(("/tmp/probe-shim-e2e-abc/", "/cache/containerd/", CNI_BIN_DIR, RUNC))
               for path in named), named


def test_the_runtimes_are_the_newest_2x_then_debians_and_pair_with_the_kubelets_that_support_them(monkeypatch):
    assert [r.version for r in runtimes_from(None)] == ["2.4.2", "1.6"]
    assert [r.version for r in runtimes_from("1.6, 2.2.9")] == ["1.6", "2.2.9"]
    assert [r.version for r in runtimes_from("", first_2x="2.3.1")] == ["2.3.1", "1.6"]
    with pytest.raises(ValueError, match="CONTAINERD_VERSIONS: '1.7' is neither 1.6"):
        runtimes_from("1.7")
    debian, built = Runtime("1.6"), Runtime("2.4.2")
    assert debian.bin_dir is None and debian.binary("ctr") == "ctr"
    monkeypatch.setenv("CONTAINERD_CACHE_DIR", "/c")
    assert built.binary("ctr") == "/c/v2.4.2/ctr"
    assert [debian.supports_kubelet(minor) for minor in (35, 36, 37)] == [True, False, False]
    assert [built.supports_kubelet(minor) for minor in (35, 36, 37)] == [True, True, True]


def test_the_cni_network_is_private_to_the_session():
    conflist = cni_conflist(SESSION)
    bridge, loopback = conflist["plugins"]
    assert conflist["name"] == "probe-e2e-0a1b2c" and conflist["cniVersion"] == "1.0.0"
    assert bridge["type"] == "bridge" and len(bridge["bridge"]) <= 15 and bridge["bridge"] == SESSION.bridge
    assert bridge["isGateway"] and bridge["hairpinMode"]
    ipam = bridge["ipam"]
    assert ipam["type"] == "host-local" and ipam["dataDir"].startswith(SESSION.workdir)
    assert ipam["ranges"] == [[{"subnet": "10.244.77.0/24", "gateway": "10.244.77.1"}]]
    assert loopback == {"type": "loopback"}


def test_free_subnet_skips_what_the_node_routes():
    routes = "default via 192.0.2.1 dev eth0\n10.244.77.0/24 dev old-bridge proto kernel scope link\n"
    assert free_subnet(routes) == "10.244.78.0/24"
    assert free_subnet("") == "10.244.77.0/24"
    assert free_subnet(routes, claimed=["10.244.78.0/24"]) == "10.244.79.0/24"  # a live session's, no bridge yet
    with pytest.raises(RuntimeError):
        free_subnet("10.244.0.0/16 dev cni0\n")


MOUNTINFO = """\
22 1 253:1 / / rw,relatime - ext4 /dev/vda rw
30 22 0:5 / /tmp/w/state/netns/cni-1 rw - nsfs nsfs rw
31 22 0:40 / /tmp/w/state/task/abc/rootfs rw - overlay overlay rw,lowerdir=/x
32 31 0:41 / /tmp/w/state/task/abc/rootfs/with\\040space rw - tmpfs tmpfs rw
33 22 0:42 / /tmp/wider rw - tmpfs tmpfs rw
"""


def test_mounts_under_a_dir_deepest_first():
    assert mounts_under("/tmp/w", MOUNTINFO) == [
        "/tmp/w/state/task/abc/rootfs/with space", "/tmp/w/state/task/abc/rootfs", "/tmp/w/state/netns/cni-1"]
    assert unescape_mount_path("a\\011b\\134") == "a\tb\\"


def test_the_workdir_avoids_overlay_filesystems():
    container_root = "22 1 0:20 / / rw - overlay overlay rw\n23 22 0:21 / /dev/shm rw - tmpfs tmpfs rw\n"
    assert mount_of("/tmp/x", container_root) == ("/", "overlay")
    assert workdir_root(["/tmp", "/dev/shm"], container_root) == "/dev/shm"
    assert workdir_root(["/tmp", "/dev/shm"], MOUNTINFO) == "/tmp"


def test_the_netns_path_comes_from_the_verbose_sandbox_status():
    info = {"pid": 4242, "runtimeSpec": {"linux": {"namespaces": [
        {"type": "pid"}, {"type": "network", "path": "/state/io.containerd.grpc.v1.cri/netns/cni-1"}]}}}
    response = cri_pb.PodSandboxStatusResponse(
        status=cri_pb.PodSandboxStatus(id="abc", network=cri_pb.PodSandboxNetworkStatus(ip="10.244.77.5")),
        info={"info": json.dumps(info)})
    network = sandbox_network(response)
    assert (network.ip, network.netns_path, network.pid) == (
        "10.244.77.5", "/state/io.containerd.grpc.v1.cri/netns/cni-1", 4242)
