"""The probe store on disks that refuse writes: a full tmpfs and a read-only bind mount (both need root to mount;
the store's other cases: tests/unit/test_store.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from shim.state.store import ProbeStore, StoreUnavailable
from tests.support.store_records import registration

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a tmpfs")


@pytest.fixture
def tiny_tmpfs(tmp_path: Path):
    state = tmp_path / "state"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(state)], check=True)
    yield state
    subprocess.run(["umount", "-l", str(state)], check=True)


def fill_up(directory: Path) -> Path:
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f:
        with pytest.raises(OSError, match="No space left"):
            while True:
                f.write(bytes(4096))
    return filler


@needs_root
def test_a_full_state_dir_refuses_writes_and_keeps_what_was_committed(tiny_tmpfs):
    with ProbeStore(tiny_tmpfs / "probes.db") as store:
        store.save(registration("p1"))
        filler = fill_up(tiny_tmpfs)
        with pytest.raises(StoreUnavailable, match=r"\[Errno 28\] No space left on device .*probe p2 not stored"):
            store.save(registration("p2", container="c2"))
        with pytest.raises(StoreUnavailable, match="1 probe.s. not removed"):
            store.delete(["p1"])
        assert [p.probe_id for p in store.load_all()] == ["p1"]
        filler.unlink()
        store.save(registration("p2", container="c2"))  # the same connection works again
        store.delete(["p1"])
    with ProbeStore(tiny_tmpfs / "probes.db") as store:
        assert [p.probe_id for p in store.load_all()] == ["p2"]


@needs_root
def test_a_read_only_state_dir_is_unavailable_and_left_untouched(tmp_path):
    state = tmp_path / "state"
    ProbeStore(state / "probes.db").close()
    before = sorted(os.listdir(state))
    subprocess.run(["mount", "--bind", "-o", "ro", str(state), str(state)], check=True)
    try:
        with pytest.raises(StoreUnavailable, match=r"\[Errno 30\] Read-only file system; cannot open the probe store"):
            ProbeStore(state / "probes.db")
        assert sorted(os.listdir(state)) == before
    finally:
        subprocess.run(["umount", str(state)], check=True)
