"""The storage engine: every location of a database root, and the flush and checkpoint clocks.

Two threads drive the three routines of the seeds: the flusher writes a location's dirty
buffers and publishes within ``flush_interval_ms`` of its rows' arrival, visiting only locations
with something to flush; the checkpointer checkpoints each location every
``checkpoint_interval_ms`` (``storage.clock``).  They are separate so a slow fsync never delays
publishing.
Locations are independent: one in error state stops only itself.  A third thread, the reopener,
reopens a location in error after an I/O error from its checkpoint when its backoff is due
(``Location.reopen``), so a full disk needs no restart once space is back.

All file-system calls go through one ``FileSystem`` (``storage.fsio``), wrapped so its failures
are counted in ``dis_io_errors_total``.

Schema versions.  The engine declares every table's schema to the database's version record
(``storage.versionstore``) when it is built, so ``schemas`` holds each table's newest version
carrying every version the database holds; a change the rules refuse raises SchemaError there,
before any location opens.  Each location is opened in its own version (the one its
``table.size`` names; a new location takes the version of the log that creates it).
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import structlog

from disd.config import ImportConfig, StorageConfig
from disd.errors import DisError
from disd.names import InvalidNameError, LocationKey
from disd.schema import SchemaRegistry, TableSchema
from disd.storage import columns as colfmt
from disd.storage import fsio
from disd.storage.checkpoint import FILE_NAME, TEMP_NAME
from disd.storage.clock import CheckpointClock, FlushClock
from disd.storage.filehandles import TrackedFileHandleFactory, default_max_open_files
from disd.storage.fsio import OS, FileSystem, MeteredFileSystem
from disd.storage.location import IoRetry, Location, new_record
from disd.storage.versionstore import VersionStore
from disd.storage.writeout import flush_many
from disd.storage.errors import NoLocationError, StorageStateError

log = structlog.get_logger(__name__)


#: the least time between two walks of the database root by ``locations``
SCAN_EVERY_S = 1.0

#: how often the reopener looks for locations due (each attempt is scheduled by its own backoff)
REOPEN_POLL_S = 0.05

#: locations ``open_many`` opens at once (each open waits mostly on the disk: mkdir, fsyncs)
OPEN_AHEAD_THREADS = 8


class UnknownTableError(DisError, LookupError):
    """No schema for (namespace, table)."""


def location_path(db_root: str, key: LocationKey) -> str:
    return os.path.join(db_root, "Intraday", key.namespace, key.table, key.internal_partition,
                        key.column_partition, key.table)


def _creation_interrupted(path: str) -> bool:
    """A location directory with no ``table.size`` and no column file holding a byte: a new
    location a crash interrupted before its first record was durable.  It has no rows and no
    schema version yet, so it is left for the first stream to make, in the version of that
    stream's log; opened at start, it would take the table's newest version, and a log of the
    version it was being made for would be refused for ever.  (With data it is damage, and is
    opened, in error.)"""
    try:
        entries = list(os.scandir(path))
    except OSError:
        return False
    if any(e.name == FILE_NAME for e in entries):
        return False
    return not any(e.name.endswith((".dat", ".off")) and e.is_file() and e.stat().st_size > 0 for e in entries)


class StorageEngine:
    def __init__(self, db_root: str, schemas: SchemaRegistry, storage: StorageConfig | None = None,
                 import_default: ImportConfig | None = None, import_tables: dict[str, ImportConfig] | None = None,
                 fs: FileSystem = OS, compiled: bool | None = None) -> None:
        self.db_root = str(db_root)
        self.storage = storage or StorageConfig()
        self.import_default = import_default or ImportConfig()
        self.import_tables = dict(import_tables or {})
        self.fs = MeteredFileSystem(fs)
        #: the locations' write states: compiled when built (None), or as asked (a test comparing
        #: the two paths; ``storage.writestate.new_write_state``)
        self.compiled = compiled
        # Each declared schema becomes the table's newest version, with the versions the database
        # holds; raises SchemaError (naming table, versions, column) for a refused change.
        self.versions = VersionStore(self.db_root, self.fs)
        self.schemas = SchemaRegistry(self.versions.declare(s) for s in schemas)
        self.file_handles = TrackedFileHandleFactory(self.storage.max_open_files or default_max_open_files(), self.fs)
        self.io_retry = IoRetry(self.storage.io_retry_initial_ms / 1000.0, self.storage.io_retry_max_ms / 1000.0)
        self._locs: dict[LocationKey, Location] = {}
        self._opening: dict[LocationKey, threading.Event] = {}  # locations being opened, by one thread each
        self._failing: set[Location] = set()  # locations that went into error, until out of it
        #: changes whenever a location goes into error or is reopened (the ingest reaper then
        #: looks for the streams to end; it need not look through every stream otherwise)
        self.failures = 0
        self._lock = threading.Lock()
        self._open_pool: ThreadPoolExecutor | None = None  # open_many's threads, started on first use
        self._subscribers: tuple[Callable[..., Any], ...] = ()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._warned: set[tuple[str, ...]] = set()
        self._closed = False
        self._next_scan = 0.0  # time.monotonic() from which ``locations`` walks the disk again
        self.flusher = FlushClock(Location.flush_marked, self._stop, batch=flush_many)
        self.checkpointer = CheckpointClock(
            Location.checkpoint, lambda loc: loc.import_config.checkpoint_interval_ms / 1000.0, self._stop)
        self._discover()

    def import_config(self, table_key: str) -> ImportConfig:
        return self.import_tables.get(table_key, self.import_default)

    # -- locations -----------------------------------------------------------------------------
    def _scan(self) -> list[LocationKey]:
        """Every location directory under ``<db_root>/Intraday`` of a known table."""
        base = os.path.join(self.db_root, "Intraday")
        keys: list[LocationKey] = []
        if not os.path.isdir(base):
            return keys
        for ns in subdirs(base):
            for table in subdirs(os.path.join(base, ns)):
                if self.schemas.get(ns, table) is None:
                    self._warn_once(("table", ns, table), "location directory of an unknown table ignored",
                                    namespace=ns, table=table)
                    continue
                for ip in subdirs(os.path.join(base, ns, table)):
                    for cp in subdirs(os.path.join(base, ns, table, ip)):
                        try:
                            key = LocationKey(ns, table, ip, cp)
                        except InvalidNameError as e:
                            self._warn_once(("name", ns, table, ip, cp),
                                            "location directory with an invalid name ignored", error=str(e))
                            continue
                        path = location_path(self.db_root, key)
                        if os.path.isdir(path) and not _creation_interrupted(path):
                            keys.append(key)
        return keys

    def _warn_once(self, what: tuple[str, ...], message: str, **kw: object) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning(message, **kw)

    def _discover(self) -> None:
        """Open (and so recover) every location found under the database root."""
        for key in self._scan():
            if key not in self._locs:
                self.location(key)

    def admit(self, logged: TableSchema) -> TableSchema:
        """Make an older version first seen in a log header known (persisted in the table's
        ``schema.versions``); the table's newest schema with its history.  SchemaError when the
        rules refuse it (``disd.schemaversions.admit``)."""
        newest = self.versions.admit(logged)
        with self._lock:
            if self.schemas.get(newest.namespace, newest.table) is not newest:
                self.schemas = SchemaRegistry(newest if (s.namespace, s.table) == (newest.namespace, newest.table)
                                              else s for s in self.schemas)
        return newest

    def location(self, key: LocationKey, create: bool = True, version: int | None = None) -> Location:
        """The open location for ``key``; opens (and recovers) it from disk, or creates it when
        ``create``.  Raises UnknownTableError without a schema, LookupError when absent and not
        ``create``.  A location that cannot be recovered is returned in error state.

        ``version``: the schema version a location created now is written in (the version of
        the log that creates it; default the table's newest).  An existing location keeps the
        version its ``table.size`` names whatever ``version`` says: the caller compares
        ``Location.schema_version``."""
        while True:
            with self._lock:
                if self._closed:
                    raise StorageStateError("the storage engine is closed")
                loc = self._locs.get(key)
                if loc is not None:
                    return loc
                opening = self._opening.get(key)
                if opening is None:
                    opening = self._opening[key] = threading.Event()
                    break
            # Another thread is opening this location: wait for it, then look again (it may
            # have failed, or been asked with create=False for a location that is absent).
            opening.wait()
        # Opening a location (recovery, or creating its directory, table.size and column files
        # with their fsyncs) happens outside the engine's lock: it holds only this key, so a
        # burst over many new locations creates them side by side, and listings, clocks and
        # the other locations' streams never wait behind a disk.
        try:
            schema = self.schemas.get(key.namespace, key.table)
            if schema is None:
                raise UnknownTableError(f"unknown table {key.namespace}.{key.table}")
            path = location_path(self.db_root, key)
            if not create and not os.path.isdir(path):
                raise NoLocationError(f"no location {key}")
            loc = self._new_location(key, schema, path, version)
            self._register(loc)
        finally:
            with self._lock:
                del self._opening[key]
            opening.set()
        self._published(loc)
        return loc

    def _new_location(self, key: LocationKey, schema: TableSchema, path: str, version: int | None,
                      created: object = None) -> Location:
        return Location(key, schema, path, self.file_handles, self.storage.block_size_bytes,
                        self.import_config(schema.key), on_publish=self._published, io_retry=self.io_retry,
                        create_version=version, on_dirty=self._dirty, on_error=self._failed,
                        compiled=self.compiled, created=created)  # type: ignore[arg-type]

    def _register(self, loc: Location) -> None:
        with self._lock:
            closed = self._closed
            if not closed:
                self._locs[loc.key] = loc
        if closed:
            loc.close()
            raise StorageStateError("the storage engine is closed")
        self.checkpointer.add(loc)

    def open_many(self, wanted: Sequence[tuple[LocationKey, int | None]]) -> None:
        """Open (creating when absent) the locations ``wanted`` names, with the schema version
        each is created in; then ``location`` returns each at once.

        Why: a burst (a day's start) opens hundreds of new locations at once, each some
        thirty-five file-system calls (directories and ``table.size`` made durable, column files
        created).  The new ones are made in one operation of the file system for all of them
        (``fsio.create_locations``: each step for every location before the next, so a parent
        directory is fsynced once for all its new children, and in C with the interpreter's lock
        given up once and the disk waits overlapped); the ones that exist are opened (recovered)
        side by side on a few threads.  Failures are not raised here: the caller's own
        ``location`` call meets them again (a location that cannot be made or recovered is open,
        in error state)."""
        claimed: list[tuple[LocationKey, int | None, threading.Event]] = []
        with self._lock:
            if self._closed or self._stop.is_set():  # closing: close() has taken the pool away
                return
            for k, v in wanted:
                if k not in self._locs and k not in self._opening:
                    ev = self._opening[k] = threading.Event()
                    claimed.append((k, v, ev))
        if not claimed:
            return
        opened: list[Location] = []
        try:
            existing = self._create_many(claimed, opened)
            if existing:
                opened.extend(self._recover_many(existing))
        finally:
            with self._lock:
                for k, _, _ in claimed:
                    self._opening.pop(k, None)
            for _, _, ev in claimed:
                ev.set()
        for loc in opened:
            self._published(loc)

    def _create_many(self, claimed: list[tuple[LocationKey, int | None, threading.Event]],
                     opened: list[Location]) -> list[tuple[LocationKey, int | None]]:
        """Make the new locations of ``claimed`` in one operation; returns those that exist."""
        existing: list[tuple[LocationKey, int | None]] = []
        new: list[tuple[LocationKey, TableSchema, TableSchema, str, int | None]] = []
        for k, v, _ in claimed:
            table = self.schemas.get(k.namespace, k.table)
            path = location_path(self.db_root, k)
            if table is None or os.path.isdir(path):
                existing.append((k, v))  # (an unknown table is refused by the caller's own open)
            else:
                new.append((k, table, table.at_version(v or table.version), path, v))
        if not new:
            return existing
        files = self.file_handles
        names = [colfmt.schema_file_names(schema) for _, _, schema, _, _ in new]
        records = [new_record(schema) for _, _, schema, _, _ in new]
        data = [rec.to_bytes() for rec in records]
        # The descriptors there is room for are kept open, the rest closed again; decided and
        # counted in one step, as another request's batch may be deciding at the same moment,
        # and counted until the factory holds the kept ones (``adopt``).
        with files.reserving_new([len(n) for n in names], at_once=8) as held:
            items = [(path, TEMP_NAME, FILE_NAME, d, n, kept)
                     for (_, _, _, path, _), d, n, kept in zip(new, data, names, held.keep)]
            answers = fsio.create_locations(self.fs, items, held.at_once)
            made = [a if a is None or isinstance(a, BaseException) else
                    (rec, files.adopt([os.path.join(path, f) for f in n], a))
                    for (_, _, _, path, _), rec, n, a in zip(new, records, names, answers)]
        for (k, table, _schema, path, v), created in zip(new, made):
            if created is None:  # made meanwhile (not by this engine: it holds the database's lock)
                existing.append((k, v))
                continue
            loc = self._new_location(k, table, path, v, created=created)
            try:
                self._register(loc)
            except RuntimeError:  # the engine closed meanwhile (the location is closed again)
                continue
            opened.append(loc)
        return existing

    def _recover_many(self, existing: list[tuple[LocationKey, int | None]]) -> list[Location]:
        """Open existing locations side by side (each recovery waits on the disk)."""
        with self._lock:
            if self._closed or self._stop.is_set():
                return []
            if self._open_pool is None:
                self._open_pool = ThreadPoolExecutor(OPEN_AHEAD_THREADS, thread_name_prefix="location-open")
            pool = self._open_pool

        def one(k: LocationKey, v: int | None) -> Location | None:
            schema = self.schemas.get(k.namespace, k.table)
            if schema is None:
                return None
            loc = self._new_location(k, schema, location_path(self.db_root, k), v)
            self._register(loc)
            return loc

        try:
            futures = [pool.submit(one, k, v) for k, v in existing]
        except RuntimeError:  # the pool was shut down: the engine is closing
            return []
        out = []
        for f in futures:
            try:
                loc = f.result()
            except Exception:  # noqa: BLE001 - met again, and answered, by the caller's own open
                continue
            if loc is not None:
                out.append(loc)
        return out

    def in_error_count(self) -> int:
        """Open locations in error state (not accepting rows): the ``dis_partitions_in_error``
        gauge of this engine's server."""
        return sum(1 for loc in self.locations() if loc.in_error)

    def locations(self) -> list[Location]:
        """Every location open, and every location on disk, opened now if need be.  The disk is
        walked again at most every ``SCAN_EVERY_S`` (or 20 times the last walk's time, if
        longer): a walk visits every location's directory (tens of ms at 2,000 locations), and
        listings, status and metrics scrapes call this all the time, while a location appears
        on disk without being ingested here only when an operator puts it there."""
        if not self._closed and time.monotonic() >= self._next_scan:
            t0 = time.monotonic()
            for key in self._scan():
                if key not in self._locs and key not in self._opening:  # (one being opened shows when open)
                    try:
                        self.location(key)
                    except (LookupError, RuntimeError):
                        pass
            took = time.monotonic() - t0
            self._next_scan = time.monotonic() + max(SCAN_EVERY_S, 20 * took)
        return self.open_locations()

    def open_locations(self) -> list[Location]:
        """The locations open now, without walking the disk: what a metrics scrape reports.  A
        walk visits every location's directory, a few system calls each, and each call gives up
        the interpreter's lock and waits to take it back from the threads ingesting: at 10,000
        locations under ingest load, seconds, which a scrape cannot wait for."""
        with self._lock:
            return list(self._locs.values())

    # -- subscriptions -------------------------------------------------------------------------
    def subscribe(self, callback: Callable[..., Any]) -> Callable[[], None]:
        """``callback(location, published_rows)`` on each new location and each publish."""
        with self._lock:
            self._subscribers = (*self._subscribers, callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._subscribers:
                    subs = list(self._subscribers)
                    subs.remove(callback)
                    self._subscribers = tuple(subs)

        return unsubscribe

    def _published(self, loc: Location) -> None:
        """Tell the subscribers.  The list is replaced, never changed, on (un)subscribe, so a
        publish reads it without the engine's lock (a batch publishes many locations)."""
        for cb in self._subscribers:
            try:
                cb(loc, loc.published_rows)
            except Exception as e:  # noqa: BLE001 - a subscriber's failure is its own
                log.warning("subscriber failed", error=str(e))

    # -- clocks --------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the flush and checkpoint clocks and the file-handle cleaner."""
        if self._threads:
            return
        self.file_handles.start()
        for name, run in (("flusher", self.flusher.run), ("checkpointer", self.checkpointer.run),
                          ("reopener", self._reopener)):
            t = threading.Thread(target=run, name=f"dis-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def _dirty(self, loc: Location, within_s: float | None) -> None:
        """A location took rows (or cut some back): the flusher visits it at its next tick
        (of ``within_s`` when given: a caught-up source's rows held back by ``Location.caught_up_flush_s``)."""
        self.flusher.mark(loc, within_s or loc.import_config.flush_interval_ms / 1000.0)

    def flush_age(self, loc: Location, now: float | None = None) -> float | None:
        """Seconds the location's published rows have been behind what it holds: since it took
        rows not yet flushed; with nothing to flush, since the flusher's last cycle (so a stopped
        flusher still shows).  ``None`` before its first flush while the clocks are not running."""
        return self.flush_ages([loc], now)[0]

    def flush_ages(self, locs: Sequence[Location], now: float | None = None) -> list[float | None]:
        """``flush_age`` of each of ``locs``, in one pass (a scrape asks for every location's)."""
        now = time.time() if now is None else now
        dirty = [loc.dirty_since for loc in locs]
        if self._threads:
            idle = max(0.0, now - self.flusher.last_cycle)
            return [idle if d is None else now - d if d < now else 0.0 for d in dirty]
        return [max(0.0, now - d) if d is not None
                else None if loc.last_flush_time is None else max(0.0, now - loc.last_flush_time)
                for d, loc in zip(dirty, locs)]

    def _failed(self, loc: Location) -> None:
        """A location entered (or stayed in) error: the reopener looks at it until it is out."""
        with self._lock:
            self._failing.add(loc)
            self.failures += 1

    def _reopener(self) -> None:
        """Reopen each location in error after an I/O error once its backoff is due."""
        while not self._stop.wait(REOPEN_POLL_S):
            self.reopen_due()

    def reopen_due(self, now: float | None = None) -> int:
        """Try ``reopen`` on every location whose retry is due; returns how many accept rows again.

        Only the locations that went into error are looked at (``_failing``), not every open
        one: this runs every ``REOPEN_POLL_S``, and at ten thousand locations a pass over all
        of them twenty times a second was a sixth of the DIS's interpreter time."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self._failing = {loc for loc in self._failing if loc.in_error and not loc.closed}
            due = [loc for loc in self._failing
                   if self._locs.get(loc.key) is loc and loc.retryable and loc.retry_at is not None
                   and loc.retry_at <= now]
        done = 0
        for loc in due:
            try:
                if loc.reopen():
                    done += 1
                    with self._lock:
                        self.failures += 1  # a new epoch: the streams of its old one end
            except Exception as e:  # noqa: BLE001 - one location must not stop the others
                log.error("reopening a location failed", location=str(loc.key), error=repr(e))
        return done

    def close(self) -> None:
        """Stop the clocks, then flush and checkpoint every location and close its files."""
        self._stop.set()
        with self._lock:
            pool, self._open_pool = self._open_pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        for t in self._threads:
            t.join(timeout=60)
        self._threads.clear()
        with self._lock:
            self._closed = True
            locs = list(self._locs.values())
        for loc in locs:
            try:
                loc.checkpoint()
            except Exception as e:  # noqa: BLE001
                log.error("final checkpoint failed", location=str(loc.key), error=repr(e))
            loc.close()
        with self._lock:
            self._locs.clear()
        self.file_handles.close_all()

    def __enter__(self) -> "StorageEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def subdirs(path: str) -> list[str]:
    """The names of the directories in ``path``, sorted; none when it is not a readable directory.
    The walk of ``<db_root>/Intraday`` (here, ``dis verify``, merges reading column files)."""
    try:
        return sorted(e.name for e in os.scandir(path) if e.is_dir())
    except OSError:
        return []
