"""The probe store: durable registrations in SQLite (round trip, upsert, delete, reopen, crash, corruption; full and
read-only disks: tests/system/test_store_disk_refusals.py)."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
import threading
from contextlib import closing
from pathlib import Path

import pytest

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from shim.state import schema
from shim.state import store as store_mod
from shim.state.schema import decode_registration, registration_of
from shim.state.store import CorruptRow, ProbeStore, StoreCorrupt, StoreError, StoreUnavailable
from tests.support.store_records import registration

REPO_ROOT = Path(__file__).resolve().parents[2]


def with_status(probe: service_pb.Probe) -> service_pb.Probe:
    """The same probe with everything the daemon observes filled in (none of it may be persisted)."""
    out = service_pb.Probe()
    out.CopyFrom(probe)
    status = out.status
    status.state = spec_pb.STATE_SUCCESS
    status.state_changed_at = 42
    status.last_attempt.CopyFrom(spec_pb.Attempt(result=spec_pb.RESULT_SUCCESS, output="ok", duration_ns=1000))
    status.last_trace_id, status.last_span_id = "ab" * 16, "cd" * 8
    status.consecutive_successes, status.consecutive_failures, status.on_hold = 3, 0, True
    status.totals.success = 9
    status.worker.CopyFrom(service_pb.WorkerStatus(state=service_pb.WORKER_RUNNING, pid=1234, restarts=2))
    out.revision = 77
    return out


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "nested" / "probes.db"


# --- pure ------------------------------------------------------------------------------------------


def test_registration_of_keeps_only_the_registered_fields():
    full = with_status(registration())
    kept = registration_of(full)
    assert kept == registration()
    assert {f.name for f, _ in kept.ListFields()} == schema.REGISTRATION_FIELDS
    assert full.revision == 77, "the argument is not modified"


def test_decode_registration_rejects_garbage_and_foreign_rows():
    good = registration("p1").SerializeToString()
    assert decode_registration("p1", good) == registration("p1")
    with pytest.raises(ValueError, match="does not decode"):
        decode_registration("p1", b"\xff\xff\xff\xff")
    with pytest.raises(ValueError, match="not a blob"):
        decode_registration("p1", "text")
    with pytest.raises(ValueError, match="for probe 'p1', not 'p2'"):
        decode_registration("p2", good)


def test_every_migration_step_is_counted_in_the_schema_version():
    assert schema.SCHEMA_VERSION == len(schema.MIGRATIONS) >= 1


def sqlite_error(message: str, code: int | None) -> sqlite3.OperationalError:
    exc = sqlite3.OperationalError(message)
    if code is not None:
        exc.sqlite_errorcode = code
    return exc


def test_file_system_refusals_are_told_apart_from_damage():
    for code in (13, 8, 10, 778, 14, 3):  # FULL, READONLY, IOERR, IOERR_WRITE (extended), CANTOPEN, PERM
        assert store_mod.is_io_error(sqlite_error("x", code)), code
    for code in (11, 26, 1, None):  # CORRUPT, NOTADB, ERROR, no code at all
        assert not store_mod.is_io_error(sqlite_error("x", code)), code


def test_an_unwritable_state_dir_is_named_with_the_os_reason(tmp_path):
    full = store_mod.unavailable(tmp_path, "probe p1 not stored", sqlite_error("database or disk is full", 13))
    # The directory is writable now, so SQLITE_FULL's own errno is the reason.
    assert str(full) == (f"state directory {tmp_path} is not writable: [Errno 28] No space left on device "
                         "(SQLite: database or disk is full); probe p1 not stored")
    missing = tmp_path / "gone"
    readonly = store_mod.unavailable(missing, "p1 not stored", sqlite_error("attempt to write a readonly database", 8))
    assert str(readonly) == (f"state directory {missing} is not writable: [Errno 2] No such file or directory "
                             "(SQLite: attempt to write a readonly database); p1 not stored")
    refused = store_mod.unavailable(tmp_path, "cannot open", PermissionError(13, "Permission denied"))
    assert str(refused) == f"state directory {tmp_path} is not writable: [Errno 13] Permission denied; cannot open"
    assert store_mod.os_reason(tmp_path) is None and os.listdir(tmp_path) == []  # the check leaves no file behind


# --- with a database -------------------------------------------------------------------------------


def test_round_trip_stores_only_the_registration(db_path):
    with ProbeStore(db_path) as store:
        store.save(with_status(registration("p1")))
        store.save(registration("p2", sandbox="sb0", probe_type=spec_pb.LIVENESS))
        loaded = store.load_all()
    assert loaded == [registration("p2", sandbox="sb0", probe_type=spec_pb.LIVENESS), registration("p1")]
    assert store.corrupt_rows == ()


def test_indexed_columns_follow_the_probe(db_path):
    with ProbeStore(db_path) as store:
        store.save(registration("p1", sandbox="sb9", container="c7", probe_type=spec_pb.STARTUP))
    with closing(sqlite3.connect(db_path, isolation_level=None)) as raw:
        rows = raw.execute("SELECT probe_id, pod_sandbox_id, container_id, type FROM probes").fetchall()
        indexes = {r[1] for r in raw.execute("PRAGMA index_list(probes)")}
    assert rows == [("p1", "sb9", "c7", spec_pb.STARTUP)]
    assert "probes_by_container" in indexes


def test_upsert_keeps_one_row_with_the_latest_registration(db_path):
    replaced = registration("p1")
    replaced.spec.period_ms = 1000
    replaced.labels["tier"] = "db"
    with ProbeStore(db_path) as store:
        store.save(registration("p1"))
        store.save(replaced)
        assert store.load_all() == [replaced]
    with closing(sqlite3.connect(db_path, isolation_level=None)) as raw:
        assert raw.execute("SELECT count(*) FROM probes").fetchone() == (1,)


def test_delete_removes_only_the_given_ids_and_ignores_unknown_ones(db_path):
    with ProbeStore(db_path) as store:
        for probe_id in ("p1", "p2", "p3"):
            store.save(registration(probe_id, container=probe_id))
        store.delete(iter(["p1", "p3", "never-registered"]))  # any iterable, even a one-shot one
        store.delete([])
        assert [p.probe_id for p in store.load_all()] == ["p2"]


def test_registrations_survive_reopen(db_path):
    with ProbeStore(db_path) as store:
        store.save(registration("p1"))
        store.save(registration("p2", container="c2"))
        store.delete(["p1"])
    with ProbeStore(db_path) as store:
        assert store.load_all() == [registration("p2", container="c2")]


def test_database_is_wal_fully_synchronous_and_versioned(db_path):
    with ProbeStore(db_path) as store:
        store.save(registration())
        conn = store._conn  # the store's own connection: synchronous is per connection
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("PRAGMA synchronous").fetchone() == (2,)  # FULL
    with closing(sqlite3.connect(db_path, isolation_level=None)) as raw:
        assert raw.execute("PRAGMA user_version").fetchone() == (schema.SCHEMA_VERSION,)


def test_a_newer_schema_is_refused_not_downgraded(db_path):
    ProbeStore(db_path).close()
    with closing(sqlite3.connect(db_path, isolation_level=None)) as raw:
        raw.execute(f"PRAGMA user_version = {schema.SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match="newer than this shim"):
        ProbeStore(db_path)


def test_a_file_that_is_not_a_database_is_a_clear_error(db_path):
    db_path.parent.mkdir(parents=True)
    db_path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreCorrupt, match="cannot use .*probes.db"):
        ProbeStore(db_path)


def test_a_state_dir_that_cannot_be_created_is_unavailable_not_corrupt(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(StoreUnavailable, match=r"state directory .*/file is not writable: \[Errno 17\] File exists"):
        ProbeStore(tmp_path / "file" / "probes.db")


def test_saved_probe_survives_sigkill_right_after_save_returns(db_path):
    """A real process saves, then is killed by SIGKILL before it can do anything else (no close, no atexit)."""
    child = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(REPO_ROOT)!r})
        from tests.support.store_records import registration
        from shim.state.store import ProbeStore
        store = ProbeStore({str(db_path)!r})
        store.save(registration("before", container="c0"))
        store.save(registration("acked", container="c1"))
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", child], cwd=REPO_ROOT, capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    with ProbeStore(db_path) as store:
        assert store.load_all() == [registration("before", container="c0"), registration("acked", container="c1")]


def test_corrupt_rows_are_skipped_logged_and_reported(db_path, caplog):
    with ProbeStore(db_path) as store:
        for probe_id in ("good", "garbage", "foreign", "text"):
            store.save(registration(probe_id, container=probe_id))
    with closing(sqlite3.connect(db_path, isolation_level=None)) as raw:
        raw.execute("UPDATE probes SET registration = x'ffffffff' WHERE probe_id = 'garbage'")
        raw.execute("UPDATE probes SET registration = ? WHERE probe_id = 'foreign'",
                    (registration("someone-else").SerializeToString(),))
        raw.execute("UPDATE probes SET registration = 'plain text' WHERE probe_id = 'text'")
    caplog.set_level(logging.ERROR, logger="shim.state.store")
    with ProbeStore(db_path) as store:
        assert store.load_all() == [registration("good", container="good")]
        skipped = {row.probe_id: row.reason for row in store.corrupt_rows}
        assert set(skipped) == {"garbage", "foreign", "text"}
        assert "does not decode" in skipped["garbage"]
        assert "someone-else" in skipped["foreign"]
        assert "not a blob" in skipped["text"]
        assert all(isinstance(row, CorruptRow) for row in store.corrupt_rows)
        logged = {r.probe_id for r in caplog.records if r.name == "shim.state.store"}
        assert logged == {"garbage", "foreign", "text"}
        # A corrupt row does not block saving that probe again, which repairs it.
        store.save(registration("garbage", container="garbage"))
        assert [p.probe_id for p in store.load_all()] == ["garbage", "good"]
        assert {row.probe_id for row in store.corrupt_rows} == {"foreign", "text"}


def test_files_are_private(db_path):
    old_umask = os.umask(0o022)  # the usual umask would give 0644 to a file SQLite creates
    try:
        with ProbeStore(db_path) as store:
            store.save(registration())
            files = [p for p in db_path.parent.iterdir() if p.name.startswith(db_path.name)]
            assert {p.name for p in files} >= {"probes.db", "probes.db-wal", "probes.db-shm"}
            for path in files:
                assert stat.S_IMODE(path.stat().st_mode) == 0o600, path.name
            assert stat.S_IMODE(db_path.parent.stat().st_mode) == 0o700
    finally:
        os.umask(old_umask)


def test_an_existing_world_readable_database_is_tightened(db_path):
    ProbeStore(db_path).close()
    db_path.chmod(0o644)
    ProbeStore(db_path).close()
    assert stat.S_IMODE(db_path.stat().st_mode) == 0o600


def test_closed_store_refuses_calls_and_close_is_idempotent(db_path):
    store = ProbeStore(db_path)
    store.close()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.save(registration())


def test_a_probe_without_id_is_refused(db_path):
    with ProbeStore(db_path) as store:
        with pytest.raises(ValueError):
            store.save(registration(probe_id=""))


def test_concurrent_saves_from_threads(db_path):
    """The daemon calls the store through asyncio.to_thread: several threads share one store."""
    with ProbeStore(db_path) as store:
        errors: list[BaseException] = []

        def save_many(prefix: str) -> None:
            try:
                for i in range(25):
                    store.save(registration(f"{prefix}-{i}", container=f"{prefix}-{i}"))
            except BaseException as exc:  # surfaced below: a thread's exception is otherwise lost
                errors.append(exc)

        threads = [threading.Thread(target=save_many, args=(f"t{n}",)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert len(store.load_all()) == 100
