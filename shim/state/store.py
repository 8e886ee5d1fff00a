"""Durable registrations: the probes RunProbe acknowledged, kept in SQLite under the state dir.

Owns the database file (mode 0600), its durability settings, and the schema's upkeep (versioned with PRAGMA
user_version, migrated forward on open; the tables and steps are in shim/state/schema.py). Two kinds of rows:
- registrations (table probes): what RunProbe was given, its id and creation time. WAL with synchronous=FULL, one
  transaction per call, so every commit is fsynced before save() or delete() returns: RunProbe acknowledges only
  what survives a crash or a power loss.
- observations (table probe_state, written by writer.py): what the daemon saw of each probe (its
  status: thresholded state and what the thresholds need, last attempt, totals; a kubelet bridge row whole),
  and the board's identity (table meta: instance id, revisions). Written behind the probes' backs, in batches,
  with synchronous=NORMAL: such a commit survives the daemon's crash (the WAL is in the page cache), and a power
  loss may take the last ones back, which only matters to a node whose pods are gone with it.

Robustness: a row that cannot be read or decoded is skipped, logged and listed in `corrupt_rows`; it never stops
the daemon from starting (the daemon also serves the CRI proxy, so refusing to start would cut kubelet off its
runtime). A file that is not a SQLite database at all raises StoreCorrupt (the daemon moves it aside); a schema
newer than this code, or a file system where SQLite cannot use WAL, raises StoreError (never moved aside).

Faults of the machine rather than of the data (a read-only, full or unwritable state directory) raise
StoreUnavailable, at open and from save()/delete(), naming the state directory and the OS's reason; nothing is
acknowledged that was not committed, and nothing is discarded because of them.

Thread-safe: the daemon calls it through run() (its own thread, calls in order); one connection, guarded by a lock.
"""

from __future__ import annotations

import errno
import logging
import os
import asyncio
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from google.protobuf.message import DecodeError

from cri_proto import probe_service_pb2 as service_pb
from shim.state.schema import MIGRATIONS, SCHEMA_VERSION, decode_observed, decode_registration, encode_registration, run_step

log = logging.getLogger(__name__)

DEFAULT_FILENAME = "probes.db"
FILE_MODE = 0o600
DIR_MODE = 0o700
# SQLite creates these beside the database (with the database's mode); tightened too if they pre-exist.
SIDE_FILE_SUFFIXES = ("-wal", "-shm", "-journal")

_UPSERT = """
    INSERT INTO probes (probe_id, pod_sandbox_id, container_id, type, registration) VALUES (?, ?, ?, ?, ?)
    ON CONFLICT (probe_id) DO UPDATE SET
        pod_sandbox_id = excluded.pod_sandbox_id, container_id = excluded.container_id,
        type = excluded.type, registration = excluded.registration
"""


class StoreError(Exception):
    """The database cannot be used at all (too new a schema, closed, or one of the two below)."""


class StoreCorrupt(StoreError):
    """The file is not a usable SQLite database."""


class StoreUnavailable(StoreError):
    """The state directory cannot be written now (read-only, full, no permission): the data is fine."""


# SQLite primary result codes that mean "the file system said no", not "the file is damaged".
_SQLITE_IO_CODES = frozenset({
    3,   # SQLITE_PERM
    5,   # SQLITE_BUSY
    6,   # SQLITE_LOCKED
    8,   # SQLITE_READONLY
    10,  # SQLITE_IOERR
    13,  # SQLITE_FULL
    14,  # SQLITE_CANTOPEN
    22,  # SQLITE_NOLFS
})
_SQLITE_FULL = 13


def is_io_error(exc: sqlite3.Error) -> bool:
    """True when SQLite failed because of the file system (the primary code; extended codes keep it in the low byte)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in _SQLITE_IO_CODES


def os_reason(directory: Path) -> str | None:
    """Why the OS refuses writes in `directory` right now (its errno text), found by trying one; None if it does not.

    SQLite reports "attempt to write a readonly database" or "disk I/O error" without the errno: this names it."""
    check = directory / ".probe-shim-write-check"
    try:
        fd = os.open(check, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
        try:
            os.write(fd, bytes(4096))  # a whole page: a full tmpfs refuses at allocation, not at open
        finally:
            os.close(fd)
            os.unlink(check)
    except OSError as exc:
        return f"[Errno {exc.errno}] {exc.strerror}"
    return None


def unavailable(directory: Path, what: str, exc: BaseException) -> StoreUnavailable:
    """The one message for an unwritable state directory: the directory, the OS's reason, SQLite's words."""
    if isinstance(exc, OSError):
        reason, detail = f"[Errno {exc.errno}] {exc.strerror}", ""
    else:
        reason = os_reason(directory)
        if reason is None and getattr(exc, "sqlite_errorcode", 0) & 0xFF == _SQLITE_FULL:
            reason = f"[Errno {errno.ENOSPC}] {os.strerror(errno.ENOSPC)}"
        detail = f" (SQLite: {exc})"
    reason = reason or "unknown reason"
    return StoreUnavailable(f"state directory {directory} is not writable: {reason}{detail}; {what}")


@dataclass(frozen=True)
class CorruptRow:
    """A row load_all() skipped. probe_id is "" when the row could not even be listed."""

    probe_id: str
    reason: str


def _tighten(path: Path) -> None:
    try:
        os.chmod(path, FILE_MODE)
    except FileNotFoundError:
        pass


def _prepare_file(path: Path) -> None:
    """Creates the database file 0600 before SQLite does (SQLite would use 0644 minus umask)."""
    path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    except FileExistsError:
        created = False
    else:
        created = True
        os.close(fd)
    _tighten(path)  # umask may have removed bits we want, and an existing file may be wider
    for suffix in SIDE_FILE_SUFFIXES:
        _tighten(path.with_name(path.name + suffix))
    if created:
        # The new directory entry must be durable too, or a crash could lose the whole file.
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


class ProbeStore:
    """The acknowledged probes. `path` is the database file (conventionally STATE_DIR/probes.db)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.corrupt_rows: tuple[CorruptRow, ...] = ()  # what the last load_all() skipped
        self._lock = threading.Lock()
        # One thread for every call made through run(): the writes happen in the order they were asked for.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="probe-store")
        try:
            _prepare_file(self.path)
        except OSError as exc:
            raise unavailable(self.path.parent, "cannot open the probe store", exc) from None
        self._conn: sqlite3.Connection | None = None
        try:
            self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=5.0)
            self._configure()
            self._migrate()
        except sqlite3.DatabaseError as exc:
            self.close()
            if is_io_error(exc):
                raise unavailable(self.path.parent, "cannot open the probe store", exc) from None
            raise StoreCorrupt(f"cannot use {self.path} as the probe store: {exc}") from exc
        except BaseException:
            self.close()
            raise

    # --- API ---------------------------------------------------------------------------

    async def run(self, method: Callable, *args):
        """Calls one of the methods below on the store's own thread, in the order of the calls."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, method, *args)

    def save(self, probe: service_pb.Probe) -> None:
        """Inserts or replaces the registration of probe.probe_id; durable when this returns."""
        if not probe.probe_id:
            raise ValueError("a probe without probe_id cannot be stored")
        row = (probe.probe_id, probe.pod_sandbox_id, probe.container_id, int(probe.type), encode_registration(probe))
        with self._lock, self._writing(f"probe {probe.probe_id} not stored"):
            self._connection().execute(_UPSERT, row)  # autocommit: its own fsynced transaction

    def delete(self, probe_ids: Iterable[str]) -> None:
        """Removes these probes (unknown ids are ignored), and what was observed of them, in one durable
        transaction."""
        rows = [(probe_id,) for probe_id in probe_ids]
        if not rows:
            return
        with self._lock, self._writing(f"{len(rows)} probe(s) not removed"), self._transaction() as conn:
            conn.executemany("DELETE FROM probes WHERE probe_id = ?", rows)
            conn.executemany("DELETE FROM probe_state WHERE probe_id = ?", rows)

    def save_observed(self, rows: dict[str, bytes | None], meta: dict[str, str], durable: bool = False) -> None:
        """Writes observations (None deletes one) and meta keys in one transaction; fsynced only if durable
        (the daemon's last write before it stops, and the revision reservation)."""
        upserts = [(pid, blob) for pid, blob in rows.items() if blob is not None]
        deletes = [(pid,) for pid, blob in rows.items() if blob is None]
        with self._lock, self._writing(f"{len(rows)} observation(s) not stored"):
            conn = self._connection()
            if not durable:
                conn.execute("PRAGMA synchronous = NORMAL")
            try:
                with self._transaction() as tx:
                    tx.executemany("INSERT INTO probe_state (probe_id, observed) VALUES (?, ?) ON CONFLICT "
                                   "(probe_id) DO UPDATE SET observed = excluded.observed", upserts)
                    tx.executemany("DELETE FROM probe_state WHERE probe_id = ?", deletes)
                    tx.executemany("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE "
                                   "SET value = excluded.value", list(meta.items()))
            finally:
                if not durable:
                    conn.execute("PRAGMA synchronous = FULL")

    def load_observed(self) -> dict[str, service_pb.Probe]:
        """Every readable observation, by probe id (a row that does not decode is skipped and logged)."""
        out: dict[str, service_pb.Probe] = {}
        with self._lock:
            rows = self._connection().execute("SELECT probe_id, observed FROM probe_state").fetchall()
        for probe_id, blob in rows:
            try:
                out[probe_id] = decode_observed(probe_id, blob)
            except (DecodeError, TypeError, ValueError) as exc:
                log.error("skipping an unreadable observation in the store: %s", exc, extra={"probe_id": probe_id})
        return out

    def load_meta(self) -> dict[str, str]:
        with self._lock:
            return dict(self._connection().execute("SELECT key, value FROM meta").fetchall())

    def load_all(self) -> list[service_pb.Probe]:
        """Every readable registration, ordered by sandbox, container, type. Skipped rows: `corrupt_rows`."""
        probes: list[service_pb.Probe] = []
        corrupt: list[CorruptRow] = []
        with self._lock:
            conn = self._connection()
            for probe_id, blob in self._rows(conn, corrupt):
                try:
                    probes.append(decode_registration(probe_id, blob))
                except ValueError as exc:
                    corrupt.append(CorruptRow(probe_id, str(exc)))
        for row in corrupt:
            log.error("skipping unreadable probe in the store: %s", row.reason,
                      extra={"probe_id": row.probe_id, "store": str(self.path)})
        self.corrupt_rows = tuple(corrupt)
        return probes

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> ProbeStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- internals ---------------------------------------------------------------------

    def _rows(self, conn: sqlite3.Connection, corrupt: list[CorruptRow]) -> Iterator[tuple[str, object]]:
        """(probe_id, blob) per row. Blobs are read one by one so that a damaged page loses only its own rows."""
        listed: list[tuple[int, str]] = []
        try:
            ordered = "SELECT rowid, probe_id FROM probes ORDER BY pod_sandbox_id, container_id, type, probe_id"
            for rowid, probe_id in conn.execute(ordered):
                listed.append((rowid, probe_id))
        except sqlite3.DatabaseError as exc:
            corrupt.append(CorruptRow("", f"listing the probes stopped after {len(listed)} rows: {exc}"))
        for rowid, probe_id in listed:
            if not isinstance(probe_id, str) or not probe_id:
                corrupt.append(CorruptRow(str(probe_id or ""), f"row {rowid} has no valid probe_id"))
                continue
            try:
                found = conn.execute("SELECT registration FROM probes WHERE rowid = ?", (rowid,)).fetchone()
            except sqlite3.DatabaseError as exc:
                corrupt.append(CorruptRow(probe_id, f"registration unreadable: {exc}"))
                continue
            if found is not None:
                yield probe_id, found[0]

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"the probe store {self.path} is closed")
        return self._conn

    @contextmanager
    def _writing(self, what: str) -> Iterator[None]:
        """A write the file system refuses becomes StoreUnavailable; SQLite has rolled it back (nothing committed)."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            if not is_io_error(exc):
                raise
            raise unavailable(self.path.parent, what, exc) from None

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        conn = self._connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:  # a COMMIT that failed (e.g. disk full) leaves it open
                with suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise

    def _configure(self) -> None:
        conn = self._connection()
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise StoreError(f"{self.path}: SQLite refused WAL mode (journal_mode is {mode})")
        # FULL: the WAL is fsynced at every commit. NORMAL would only fsync at checkpoints, and a power loss
        # could then drop a probe RunProbe had acknowledged.
        conn.execute("PRAGMA synchronous = FULL")

    def _migrate(self) -> None:
        with self._transaction() as conn:  # IMMEDIATE: a concurrent opener waits instead of migrating twice
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} has schema version {version}, newer than this shim's {SCHEMA_VERSION}: "
                    "refusing to downgrade it"
                )
            for step in MIGRATIONS[version:]:
                run_step(conn, step)
            if version != SCHEMA_VERSION:
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                log.info("probe store schema migrated", extra={"from_version": version, "to_version": SCHEMA_VERSION,
                                                               "store": str(self.path)})
