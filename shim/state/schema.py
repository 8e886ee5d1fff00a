"""The probe store's schema: its tables, its migrations, and how a row's blob is a Probe (shim/state/store.py).

Two kinds of blobs, both serialized `Probe` messages:
- a registration (table probes) holds only REGISTRATION_FIELDS: what RunProbe was given;
- an observation (table probe_state) is the board's row, `status` included (shim/state/writer.py writes it).

Migrations run forward on open, in one transaction, each step once: SQL text, or a function of the connection for
a step that rewrites blobs. Step 3 moved a probe's observed fields from Probe (numbers 10 to 19, flat) into
`Probe.status`; ProbeStatus keeps their numbers, so an old blob's bytes parse as its status unchanged
(tests/unit/test_store_migration.py opens a file written before it).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable

from google.protobuf.message import DecodeError

from cri_proto import probe_service_pb2 as service_pb

log = logging.getLogger(__name__)

# The fields of a Probe that RunProbe registers; everything else is metadata or status, not kept in its row.
REGISTRATION_FIELDS = frozenset({
    "probe_id", "pod_sandbox_id", "container_id", "container_name", "type", "spec", "labels",
    "container_started_at", "container_ports", "created_at",
})


def status_from_flat(blob: bytes) -> service_pb.Probe:
    """A Probe stored before schema 3 (status fields flat in Probe), as a Probe with its `status`."""
    probe = service_pb.Probe.FromString(blob)
    probe.status.ParseFromString(blob)  # fields 10 to 19 are ProbeStatus's; the rest is unknown to it
    probe.status.DiscardUnknownFields()
    probe.DiscardUnknownFields()  # the flat fields, reserved in Probe now
    return probe


def _nest_the_status(conn: sqlite3.Connection) -> None:
    """Schema 2 -> 3: every observation rewritten with its status nested. A row that does not decode is left as it
    is (load_observed skips and logs it, as it did before)."""
    rows = conn.execute("SELECT probe_id, observed FROM probe_state").fetchall()
    rewritten = []
    for probe_id, blob in rows:
        try:
            rewritten.append((status_from_flat(blob).SerializeToString(deterministic=True), probe_id))
        except (DecodeError, TypeError) as exc:
            log.error("observation not migrated: %s", exc, extra={"probe_id": probe_id})
    conn.executemany("UPDATE probe_state SET observed = ? WHERE probe_id = ?", rewritten)


Step = tuple[str, ...] | Callable[[sqlite3.Connection], None]

# MIGRATIONS[n] takes the schema from version n to n + 1. Append only; never edit a released step.
MIGRATIONS: tuple[Step, ...] = (
    (
        """CREATE TABLE probes (
            probe_id       TEXT    NOT NULL PRIMARY KEY,
            pod_sandbox_id TEXT    NOT NULL,
            container_id   TEXT    NOT NULL,
            type           INTEGER NOT NULL,
            registration   BLOB    NOT NULL  -- a Probe holding only REGISTRATION_FIELDS
        )""",
        "CREATE INDEX probes_by_container ON probes (pod_sandbox_id, container_id)",
    ),
    (
        """CREATE TABLE probe_state (
            probe_id TEXT NOT NULL PRIMARY KEY,
            observed BLOB NOT NULL  -- a Probe: the board's row, its status included
        )""",
        "CREATE TABLE meta (key TEXT NOT NULL PRIMARY KEY, value TEXT NOT NULL)",
    ),
    _nest_the_status,
)
SCHEMA_VERSION = len(MIGRATIONS)


def run_step(conn: sqlite3.Connection, step: Step) -> None:
    if callable(step):
        step(conn)
    else:
        for statement in step:
            conn.execute(statement)


def registration_of(probe: service_pb.Probe) -> service_pb.Probe:
    """A copy of the probe with only its registration fields (status, metadata and unknown fields dropped)."""
    out = service_pb.Probe()
    out.CopyFrom(probe)
    for field in out.DESCRIPTOR.fields:
        if field.name not in REGISTRATION_FIELDS:
            out.ClearField(field.name)
    out.DiscardUnknownFields()
    return out


def encode_registration(probe: service_pb.Probe) -> bytes:
    return registration_of(probe).SerializeToString(deterministic=True)


def decode_registration(probe_id: str, blob: object) -> service_pb.Probe:
    """The probe stored in a row; ValueError (with the reason) when the row is not a valid registration of probe_id."""
    if not isinstance(blob, bytes):
        raise ValueError(f"registration is a {type(blob).__name__}, not a blob")
    probe = service_pb.Probe()
    try:
        probe.ParseFromString(blob)
    except DecodeError as exc:
        raise ValueError(f"registration does not decode: {exc}") from None
    # Protobuf decodes many random byte strings without complaint; the id check catches those.
    if probe.probe_id != probe_id:
        raise ValueError(f"registration is for probe {probe.probe_id!r}, not {probe_id!r}")
    return registration_of(probe)


def decode_observed(probe_id: str, blob: object) -> service_pb.Probe:
    """The board's row stored for probe_id; ValueError, TypeError or DecodeError when it is not one."""
    probe = service_pb.Probe()
    probe.ParseFromString(blob)
    if probe.probe_id != probe_id:
        raise ValueError(f"the row is for probe {probe.probe_id!r}")
    return probe
