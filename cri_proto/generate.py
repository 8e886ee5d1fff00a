"""Regenerates the Python stubs next to the .proto files in this package.

One command, reproducible: `python -m cri_proto.generate` (or `make protos`).
The output depends only on the .proto files and the pinned grpcio-tools version
(see pyproject.toml); tests/unit/test_proto_stubs.py fails when the committed stubs drift.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent

# Protos whose services are served or called through grpcio get _pb2_grpc modules too.
SERVICE_PROTOS: frozenset[str] = frozenset({"probe_service.proto"})


def proto_files() -> list[Path]:
    return sorted(PACKAGE_DIR.glob("*.proto"))


def generate(out_dir: Path) -> None:
    """Writes *_pb2.py and *_pb2.pyi (and *_pb2_grpc.py for services) under out_dir/cri_proto."""
    from grpc_tools import protoc  # build-time only: the worker never imports grpc
    import grpc_tools

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    (out_dir / "cri_proto").mkdir(parents=True, exist_ok=True)
    for proto in proto_files():
        rel = proto.relative_to(REPO_ROOT).as_posix()
        args = [
            "protoc",
            f"-I{REPO_ROOT}",
            f"-I{well_known}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
        ]
        if proto.name in SERVICE_PROTOS:
            args.append(f"--grpc_python_out={out_dir}")
        if protoc.main(args + [rel]) != 0:
            raise SystemExit(f"protoc failed on {rel}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO_ROOT, help="output root (default: the repository)")
    args = parser.parse_args(argv)
    generate(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
