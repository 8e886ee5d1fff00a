"""Tiny OCI images without a registry: an image-layout tar built with the standard library.

`ctr images import` reads the tar (oci-layout, index.json, blobs/sha256/*) and names each image from its
index entry's `io.containerd.image.name` annotation, so no flag and no network is needed. Every image here
is one shared layer holding a static busybox (plus the applet links, /etc/passwd and /etc/group) and
optionally a second small layer of extra files. The tar is reproducible: fixed mtimes, owners and order,
so the same inputs give the same digests.

Pure apart from reading busybox and writing the tar: `layer_tar`, `image_blobs` and `layout_tar` build bytes.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import tarfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"
NAME_ANNOTATION = "io.containerd.image.name"
REF_ANNOTATION = "org.opencontainers.image.ref.name"

# The applets the test images run by name (`sh -c`, exec probes, workloads).
APPLETS = ("sh", "true", "false", "sleep", "cat", "echo", "ls", "httpd", "nc", "wget", "ip", "ps", "kill")
PASSWD = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
GROUP = b"root:x:0:\nnogroup:x:65534:\n"
MTIME = 1_700_000_000  # fixed, for reproducible digests


def go_arch(machine: str | None = None) -> str:
    """OCI/Go architecture name of this machine (containerd imports only matching platforms)."""
    machine = machine or platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "i686": "386"}.get(machine, machine)


def is_static_elf(path: str | Path) -> bool:
    """True for an ELF executable without a PT_INTERP program header (needs no dynamic loader)."""
    with open(path, "rb") as f:
        head = f.read(64)
        if len(head) < 64 or head[:4] != b"\x7fELF":
            return False
        is64, order = head[4] == 2, "little" if head[5] == 1 else "big"
        def num(at: int, size: int) -> int:
            return int.from_bytes(head[at:at + size], order)
        phoff, phentsize, phnum = (num(32, 8), num(54, 2), num(56, 2)) if is64 else (num(28, 4), num(42, 2), num(44, 2))
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    return all(int.from_bytes(table[i * phentsize:i * phentsize + 4], order) != 3 for i in range(phnum))  # PT_INTERP


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _json(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _info(name: str, kind: bytes, mode: int, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.linkname = kind, mode, size, link
    info.mtime, info.uid, info.gid, info.uname, info.gname = MTIME, 0, 0, "root", "root"
    return info


def layer_tar(files: Mapping[str, bytes], symlinks: Mapping[str, str] = {}, dirs: Iterable[str] = (),
              executables: Iterable[str] = ()) -> bytes:
    """An uncompressed layer: directories (parents implied), files, symlinks, in a fixed order."""
    executables = set(executables)
    all_dirs = set(dirs)
    for path in [*files, *symlinks]:
        parts = path.split("/")[:-1]
        all_dirs.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in sorted(all_dirs):
            tar.addfile(_info(d + "/", tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755))
        for path in sorted(files):
            data = files[path]
            tar.addfile(_info(path, tarfile.REGTYPE, 0o755 if path in executables else 0o644, len(data)),
                        io.BytesIO(data))
        for path in sorted(symlinks):
            tar.addfile(_info(path, tarfile.SYMTYPE, 0o777, link=symlinks[path]))
    return out.getvalue()


def busybox_layer(busybox: bytes) -> bytes:
    """The base layer: /bin/busybox, its applet links, users and groups, and the usual mount points."""
    return layer_tar(
        {"bin/busybox": busybox, "etc/passwd": PASSWD, "etc/group": GROUP},
        symlinks={f"bin/{applet}": "busybox" for applet in APPLETS},
        dirs=("dev", "proc", "sys", "tmp", "root", "etc", "www"),
        executables=("bin/busybox",),
    )


@dataclass(frozen=True)
class ImageDef:
    name: str                                     # full reference, e.g. probe-e2e.local/pause:1
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...] = ()
    extra_files: Mapping[str, bytes] = field(default_factory=dict)  # a second layer when not empty
    extra_executables: tuple[str, ...] = ()                         # which of extra_files are mode 0755


@dataclass(frozen=True)
class ImageBlobs:
    manifest_digest: str
    manifest_size: int
    blobs: dict[str, bytes]                      # digest -> content (config, manifest, layers)


def image_blobs(image: ImageDef, base_layer: bytes, arch: str) -> ImageBlobs:
    layers = [base_layer] + ([layer_tar(image.extra_files, executables=image.extra_executables)]
                             if image.extra_files else [])
    config = _json({
        "architecture": arch,
        "os": "linux",
        "created": "2023-11-14T22:13:20Z",
        "config": {"Entrypoint": list(image.entrypoint), "Cmd": list(image.cmd) or None,
                   "Env": ["PATH=/bin"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [_digest(layer) for layer in layers]},
        "history": [{"created": "2023-11-14T22:13:20Z", "created_by": "tests/support/oci_images.py"} for _ in layers],
    })
    manifest = _json({
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": _digest(config), "size": len(config)},
        "layers": [{"mediaType": MEDIA_LAYER, "digest": _digest(layer), "size": len(layer)} for layer in layers],
    })
    blobs = {_digest(blob): blob for blob in [config, manifest, *layers]}
    return ImageBlobs(_digest(manifest), len(manifest), blobs)


def layout_tar(images: Iterable[ImageDef], busybox: bytes, arch: str | None = None) -> bytes:
    """One OCI image-layout tar holding every image (shared blobs stored once)."""
    arch = arch or go_arch()
    base = busybox_layer(busybox)
    blobs: dict[str, bytes] = {}
    manifests = []
    for image in images:
        built = image_blobs(image, base, arch)
        blobs.update(built.blobs)
        manifests.append({
            "mediaType": MEDIA_MANIFEST, "digest": built.manifest_digest, "size": built.manifest_size,
            "platform": {"architecture": arch, "os": "linux"},
            "annotations": {NAME_ANNOTATION: image.name, REF_ANNOTATION: image.name.rpartition(":")[2]},
        })
    files = {"oci-layout": _json({"imageLayoutVersion": "1.0.0"}),
             "index.json": _json({"schemaVersion": 2, "manifests": manifests})}
    files.update({f"blobs/sha256/{digest.removeprefix('sha256:')}": blob for digest, blob in blobs.items()})
    return layer_tar(files)


def write_layout(path: Path, images: Iterable[ImageDef], busybox_path: str | Path) -> Path:
    path.write_bytes(layout_tar(images, Path(busybox_path).read_bytes()))
    return path
