"""The committed stubs are exactly what `python -m cri_proto.generate` produces from the protos."""

from pathlib import Path

import pytest

from cri_proto import generate

GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def _generated(root: Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes()
        for p in (root / "cri_proto").iterdir()
        if p.name.endswith(GENERATED_SUFFIXES)
    }


def test_stubs_match_the_protos(tmp_path):
    pytest.importorskip("grpc_tools", reason="grpcio-tools (test extra) regenerates the stubs")
    generate.generate(tmp_path)
    fresh = _generated(tmp_path)
    committed = _generated(generate.REPO_ROOT)
    assert fresh, "no stubs generated"
    assert sorted(committed) == sorted(fresh), "stub files differ from the protos: run `make protos`"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert stale == [], f"stale stubs {stale}: run `make protos`"


def test_every_proto_has_its_stub():
    for proto in generate.proto_files():
        assert (proto.parent / f"{proto.stem}_pb2.py").exists(), proto.name
