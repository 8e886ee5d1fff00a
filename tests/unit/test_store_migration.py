"""The store's schema 2 -> 3 migration: a file written by the daemon before ProbeStatus (status fields flat in
Probe) opens with today's code and gives back every registration, observation and meta row.

tests/data/store_schema2.sqlite was written by the store code of commit c7a508e (tests/data/make_store_schema2.py
is the script that wrote it); it is copied before each test, never opened in place.
"""

from __future__ import annotations

import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from cri_proto import probe_service_pb2 as service_pb
from cri_proto import probe_spec_pb2 as spec_pb
from shim.state import schema
from shim.state.registry import _with_stored_observations
from shim.state.store import ProbeStore
from shim.state.writer import board_identity

WRITTEN_BEFORE = Path(__file__).resolve().parents[1] / "data" / "store_schema2.sqlite"


@pytest.fixture
def old_store(tmp_path: Path) -> Path:
    path = tmp_path / "probes.db"
    shutil.copyfile(WRITTEN_BEFORE, path)
    path.chmod(0o600)
    return path


def test_the_file_is_of_the_schema_before_the_status_moved():
    with closing(sqlite3.connect(f"file:{WRITTEN_BEFORE}?mode=ro", uri=True)) as raw:
        assert raw.execute("PRAGMA user_version").fetchone() == (2,)
    assert schema.SCHEMA_VERSION == 3


def test_registrations_come_back_unchanged(old_store):
    with ProbeStore(old_store) as store:
        (probe,) = store.load_all()
        assert store.corrupt_rows == ()
    assert (probe.probe_id, probe.pod_sandbox_id, probe.container_id, probe.container_name, probe.type) == (
        "p-http", "sb1", "c1", "app", spec_pb.READINESS)
    assert (probe.spec.http_get.path, probe.spec.http_get.port.number, probe.spec.period_ms,
            probe.spec.failure_threshold) == ("/healthz", 8080, 7000, 4)
    assert dict(probe.labels) == {"app": "web"}
    assert (probe.container_started_at, probe.created_at) == (1_700_000_000_000_000_001, 1_700_000_000_000_000_002)
    assert [(p.name, p.container_port) for p in probe.container_ports] == [("http", 8080)]
    assert not probe.HasField("status")


def test_observations_come_back_with_their_status_nested(old_store):
    with ProbeStore(old_store) as store:
        observed = store.load_observed()
        (registration,) = store.load_all()
    row = _with_stored_observations(registration, observed["p-http"])  # as the registry restores it
    assert row.revision == 41 and row.created_at == 1_700_000_000_000_000_002
    expected = service_pb.ProbeStatus(
        state=spec_pb.STATE_FAILURE, state_changed_at=1_700_000_000_000_000_003,
        last_attempt=spec_pb.Attempt(result=spec_pb.RESULT_FAILURE, output="HTTP probe failed with statuscode: 503",
                                     started_at_unix_ns=1_700_000_000_000_000_004, duration_ns=5_000_000,
                                     scheduled_at_unix_ns=1_700_000_000_000_000_000, ticks_missed=2,
                                     address="10.0.0.5:8080", http_status_code=503,
                                     phases=[spec_pb.Phase(name="connect", duration_ns=7)]),
        last_trace_id="0af7651916cd43dd8448eb211c80319c", last_span_id="b7ad6b7169203331",
        consecutive_successes=0, consecutive_failures=4, on_hold=True,
        totals=service_pb.AttemptTotals(success=11, warning=2, failure=4, unknown=1),
        worker=service_pb.WorkerStatus(state=service_pb.WORKER_RUNNING, pid=4242, netns_path="/var/run/netns/x",
                                       netns_inode=99, restarts=3, last_error="boom", started_at=5,
                                       group="default#1", group_sandboxes=2))
    assert row.status == expected
    assert row.spec == registration.spec


def test_a_bridged_row_comes_back_whole(old_store):
    with ProbeStore(old_store) as store:
        bridged = store.load_observed()["b-exec"]
    assert (bridged.probe_id, bridged.pod_sandbox_id, bridged.container_id, bridged.container_name, bridged.type) == (
        "b-exec", "sb2", "c2", "side", spec_pb.LIVENESS)
    assert bridged.bridged == service_pb.BridgedHandler(role="liveness", last_exec_at=1_700_000_000_000_000_011)
    assert (bridged.revision, bridged.created_at, bridged.spec.tcp_socket.port.number) == (
        42, 1_700_000_000_000_000_010, 9000)
    assert bridged.status == service_pb.ProbeStatus(
        last_attempt=spec_pb.Attempt(result=spec_pb.RESULT_SUCCESS, started_at_unix_ns=1_700_000_000_000_000_012),
        last_trace_id="1af7651916cd43dd8448eb211c80319c", last_span_id="c7ad6b7169203331",
        totals=service_pb.AttemptTotals(success=7),
        worker=service_pb.WorkerStatus(state=service_pb.WORKER_RUNNING, pid=4343, group="sb2"))


def test_the_boards_identity_comes_back_and_the_migration_runs_once(old_store):
    with ProbeStore(old_store) as store:
        identity = board_identity(store.load_meta())
        first = store.load_observed()
    assert (identity.instance_id, identity.revision, identity.resume_point) == ("feedbeef", 1048618, 42)
    with closing(sqlite3.connect(old_store)) as raw:
        assert raw.execute("PRAGMA user_version").fetchone() == (schema.SCHEMA_VERSION,)
    with ProbeStore(old_store) as store:  # opened again: nothing to migrate, the same rows
        assert store.load_observed() == first


def test_an_observation_that_does_not_decode_is_left_for_load_observed_to_skip(tmp_path):
    path = tmp_path / "probes.db"
    shutil.copyfile(WRITTEN_BEFORE, path)
    with closing(sqlite3.connect(path)) as raw:
        raw.execute("INSERT INTO probe_state (probe_id, observed) VALUES ('bad', x'ffffffff')")
        raw.commit()
    with ProbeStore(path) as store:
        observed = store.load_observed()
    assert sorted(observed) == ["b-exec", "p-http"]
