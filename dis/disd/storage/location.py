"""One location: its column files, transactions, flush, checkpoint and recovery.

A location holds three row counts, always ``published <= committed <= written``:

* written: rows in the column files or their buffers, including an open transaction's rows;
* committed: rows of single rows and ended transactions (they survive a rollback);
* published: committed rows as of the last flush, the only rows readers ever see.

Checkpoints record the committed count, the file sizes at that count and the source record, and
recovery truncates every column file back to them.  Everything is in docs/storage-format.md.

Schema versions.  A location is written in exactly one version of its table, for ever: the one
its ``table.size`` names (``schema_version``; in a record older than versions, the version whose
fingerprint is the record's), or for a new location the version of the log that creates it.
``schema`` is that version (its columns are the location's column files), ``table`` the table's
newest schema carrying every version the database holds.  A record naming a version the
database does not hold is damage: its files cannot be read with confidence.

Errors.  Any failure of a write, truncate, flush or checkpoint puts the location in error state:
its buffers and counts may now disagree with its files, so it accepts nothing until it is reopened
from its last checkpoint.  A failure the OS reported with an errno (ENOSPC, EIO, ...) is retried:
the engine calls ``reopen`` with exponential backoff, which truncates every column file back to the
checkpoint and proves the disk takes writes again (by rewriting ``table.size``) before accepting.
Nothing past the checkpoint is trusted after a failure, and never the page cache after a failed
fsync (Linux marks the unwritten pages clean, so an fsync retried on them succeeds and proves
nothing); the sender resends from the resume point instead.  Damage (a bad ``table.size``, data
missing under the DIS, a replaced file) is never retried: it needs an operator.  Each reopen bumps
``epoch``, so an ingest stream opened before it cannot append after it (its offsets would skip
the rows between the checkpoint and the failure).

What a chunk changes in memory (the buffers of the column files, the written and committed rows
and sizes, the open transaction, the resume point) is the location's write state
(``storage.writestate``: C data the compiled ingest path works on without the interpreter, or its
Python reference); the location owns it and makes the cuts and writes it makes due
(``storage.writeout``).  Rows arrive as a log's chunks (``storage.ingest``), as decoded rows
(``ingest``, the reference path) or as a pull source's committed batch (``append_committed``);
the last two are ``storage.decodedrows``.

Locking: ``lock`` (re-entrant) guards the counts, the write state and the files; ingestion, flush,
rollback and the snapshot half of a checkpoint take it.  The fsyncs of a checkpoint run without
it, under ``_checkpoint_lock`` alone, so ingestion goes on while the disk syncs.  ``reopen`` takes
both (``_checkpoint_lock`` first, as a checkpoint does).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import threading
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import pyarrow as pa
import structlog

from disd.errors import DisError
from disd.names import LocationKey
from disd.storage import metrics
from disd.binlog import DecodedRows, FrameRun
from disd.schema import TableSchema
from disd.storage import columns as colfmt
from disd.storage import fsio
from disd.storage.checkpoint import (
    FILE_NAME,
    TEMP_NAME,
    CheckpointError,
    CheckpointRecord,
    SourcePosition,
    read_record,
    remove_stale_temp,
    write_record,
)
from disd.storage import decodedrows
from disd.storage.lastby import LastBy, Snapshot
from disd.storage.filehandles import FileIdentityError, TrackedFile, TrackedFileHandleFactory
from disd.storage.versionstore import LocationVersionError, location_schema
from disd.storage.writeout import write_out
from disd.storage.writestate import WriteState, new_write_state
from disd.storage.errors import StorageKeyError, StorageValueError

if TYPE_CHECKING:
    from disd.config import ImportConfig

log = structlog.get_logger(__name__)
_T = TypeVar("_T")


class LocationError(DisError):
    """The location is in error state (or closed, or was reopened under the caller) and accepts
    no rows; the message says why.  ``errno`` is the OS error behind it, when there is one (the
    Ingest service answers ENOSPC with RESOURCE_EXHAUSTED)."""

    def __init__(self, message: str | None, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


class _Damaged(DisError):
    """What recovery found cannot be trusted; an operator must look (never retried)."""


@dataclass(frozen=True)
class IoRetry:
    """Backoff of the reopen attempts of a location in error after an I/O error: the first after
    ``initial_s``, then doubling up to ``max_s``.  It starts over once a checkpoint after the
    reopen has made new rows durable (a disk that fails again at once keeps backing off)."""

    initial_s: float = 1.0
    max_s: float = 60.0


def describe_failure(what: str, e: BaseException) -> str:
    """``write failed: ENOSPC (No space left on device) on pwrite of /db/.../Sym.dat``."""
    return f"{what} failed: {_detail(e)}"


def _detail(e: BaseException) -> str:
    if _retryable_cause(e):
        assert isinstance(e, OSError)
        op = fsio.failed_op(e)
        return (f"{fsio.errno_name(e.errno)} ({e.strerror or e})" + (f" on {op}" if op else "")
                + (f" of {e.filename}" if e.filename else ""))
    return str(e)


def _retryable_cause(e: BaseException | None) -> bool:
    """The OS refused an operation (full disk, I/O error, ...): worth retrying from the
    checkpoint.  A replaced column file is damage, whatever its errno."""
    return isinstance(e, OSError) and e.errno is not None and not isinstance(e, FileIdentityError)


#: a caught-up source's rows are published at once, but no more often than this a location, nor
#: than a quarter of its own ``flush_interval_ms`` (``caught_up_flush_s``): a trickle costs at most
#: 4 times the flusher's flushes
CAUGHT_UP_FLUSH_S = 0.025
#: a caught-up source's publish (on its ingest thread) leaves the last-by update to the flusher,
#: which takes it up within this: the ingest thread goes on reading meanwhile
LASTBY_HANDOFF_S = 0.001

IMPORT_STATE_KEYS = ("transactions_abandoned", "ends_without_start", "rows_rolled_back", "restarts", "io_recoveries")


def new_record(schema: TableSchema) -> CheckpointRecord:
    """The first record of a location written in ``schema``: no rows, every column file empty."""
    names = colfmt.schema_file_names(schema)
    return CheckpointRecord(0, {n: 0 for n in names}, SourcePosition(None, 0, 0), schema.fingerprint,
                            {k: 0 for k in IMPORT_STATE_KEYS}, schema_version=schema.version, lastby=None)


class ColumnFile:
    """A column file of a location, as readers reach it: its handle (``writers`` maps names to
    these)."""

    __slots__ = ("handle",)

    def __init__(self, handle: TrackedFile) -> None:
        self.handle = handle


class Location:
    def __init__(
        self,
        key: LocationKey,
        schema: TableSchema,
        path: str | os.PathLike[str],
        files: TrackedFileHandleFactory,
        block_size: int,
        import_config: "ImportConfig",
        on_publish: Callable[["Location"], None] | None = None,
        io_retry: IoRetry = IoRetry(),
        create_version: int | None = None,
        on_dirty: Callable[["Location", float | None], None] | None = None,
        on_error: Callable[["Location"], None] | None = None,
        compiled: bool | None = None,
        created: "tuple[CheckpointRecord, list[TrackedFile]] | BaseException | None" = None,
    ) -> None:
        if block_size < 1:
            raise StorageValueError("block_size must be positive")
        self.key = key
        # ``table``: the table's newest schema with every version the database holds.  ``schema``:
        # the version this location is written in (its column files, its rows), which recovery
        # reads from table.size; until then (and when that fails) the version it would be created in.
        self.table = schema
        self._create_version = create_version or schema.version
        self.schema = schema.at_version(self._create_version)
        self.schema_version = 0  # the version once known from table.size (0: unknown, in error)
        self.path = pathlib.Path(path)
        self.block_size = block_size
        self.import_config = import_config
        self._files = files
        self.fs = files.fs
        self._on_publish = on_publish
        self._on_dirty = on_dirty
        self._on_error = on_error  # told each time the location enters (or stays in) error
        self.io_retry = io_retry
        self.lock = threading.RLock()
        self._checkpoint_lock = threading.Lock()
        self.in_error = False
        self.error: str | None = None
        self.error_errno: int | None = None  # the OS error behind ``error``, if any
        self.retryable = False  # the error is an I/O error: ``reopen`` is tried at ``retry_at``
        self.retry_at: float | None = None  # time.monotonic() of the next reopen attempt
        self._retry_delay = io_retry.initial_s
        self._first_error: str | None = None
        self.reopens = 0  # reopen attempts since the location was opened
        self.epoch = 0  # bumped by every successful reopen
        self.closed = False
        self._compiled = compiled
        self.state: WriteState | None = None  # made once the location's version is known
        self.handles: list[TrackedFile] = []  # one per column file, in the schema's order
        self.last_flush_time: float | None = None
        #: time.time() since which the location holds rows (or a cut) no flush has written; None
        #: when there is nothing to flush (the flush clock visits only marked locations)
        self.dirty_since: float | None = None
        self.last_checkpoint_time: float | None = None
        self.published_rows = self.checkpointed_rows = 0
        self._published: tuple[int, ...] = ()  # the files' sizes at the published rows
        self._kafka: tuple[str, int | None] | None = None  # (topic, partition) of a pull source's resume point
        self.import_state: dict[str, int] = {k: 0 for k in IMPORT_STATE_KEYS}
        self._last_checkpoint: tuple[Any, ...] | None = None
        self.lastby: LastBy | None = None  # the last-by state, when the table declares keys (docs/lastby.md)
        self._file_names = colfmt.schema_file_names(self.schema)
        self._recover(created)

    # -- the write state's counts, by name -----------------------------------------------------
    @property
    def written_rows(self) -> int:
        return self.state.written_rows if self.state is not None else 0

    @property
    def committed_rows(self) -> int:
        return self.state.committed_rows if self.state is not None else 0

    @property
    def txn_open(self) -> bool:
        return bool(self.state.txn_open) if self.state is not None else False

    @property
    def committed_sizes(self) -> dict[str, int]:
        return dict(zip(self._file_names, self.state.committed_sizes())) if self.state is not None else {}

    @property
    def published_sizes(self) -> dict[str, int]:
        return dict(zip(self._file_names, self._published))

    @property
    def source(self) -> SourcePosition:
        if self.state is None:
            return SourcePosition(None, 0, 0)
        file_name, offset, skip = self.state.source
        if self._kafka is not None:
            return SourcePosition(file_name, offset, skip, *self._kafka)
        return SourcePosition(file_name, offset, skip)

    def set_source(self, source: SourcePosition) -> None:
        assert self.state is not None
        self.state.source = (source.file_name, source.offset, source.skip_rows)
        self._kafka = (source.topic, source.partition) if source.topic is not None else None

    @property
    def writers(self) -> dict[str, ColumnFile]:
        """Each column file's handle, by name."""
        return {n: ColumnFile(h) for n, h in zip(self._file_names, self.handles)}

    @property
    def file_names(self) -> list[str]:
        return list(self._file_names)

    # -- recovery ------------------------------------------------------------------------------
    def _recover(self, created: "tuple[CheckpointRecord, list[TrackedFile]] | BaseException | None" = None) -> None:
        """Open the location from its checkpoint; any failure puts it in error state."""
        try:
            self._open_from_checkpoint(created)
        except _Damaged as e:
            self._fail(str(e))
        except Exception as e:  # noqa: BLE001 - whatever broke, this location stops, others go on
            self._fail(describe_failure("opening the location", e), e)

    def _open_from_checkpoint(self, made: "tuple[CheckpointRecord, list[TrackedFile]] | BaseException | None" = None
                              ) -> None:
        """Read ``table.size`` and cut every column file back to it; reset every count to it.
        Raises _Damaged for what needs an operator, OSError for what the OS refused.

        ``made``: the record and handles of a location the engine has just created (a batch of
        new locations, ``storage.newlocations``)."""
        fs, path = self.fs, str(self.path)
        # A new location is made in one operation of the file system (``_create``); otherwise a
        # directory made just now is empty: no temp file, record or column file to look for.
        if isinstance(made, BaseException):  # the batch that was to create it failed
            raise made
        created: CheckpointRecord | None
        new_files: list[TrackedFile] | None
        if made is not None:
            created, new_files = made
        else:
            created, new_files = self._create() if not self.handles else (None, None)
        fresh = created is not None or fsio.make_dirs(fs, path)
        if not fresh and remove_stale_temp(path, fs):
            log.info("removed a table.size.tmp left by an interrupted checkpoint", location=str(self.key))
        try:
            record = None if fresh else read_record(path, fs)
        except CheckpointError as e:
            raise _Damaged(f"{e}; refusing to guess which rows are committed "
                           "(restore table.size, or move the location away to re-ingest it from the logs)") from None
        if record is not None:
            try:
                self._use_version(location_schema(self.table, record.schema_version, record.fingerprint))
            except LocationVersionError as e:
                raise _Damaged(str(e)) from None
        else:
            self._use_version(self.table.at_version(self._create_version))
        names = self._file_names
        if created is not None:
            record = created
        elif record is None:
            with_data = [] if fresh else sorted(n for n in names if fsio.size_or_zero(fs, os.path.join(path, n)) > 0)
            if with_data:
                raise _Damaged(
                    f"table.size is missing but column files hold data ({', '.join(with_data)}); the committed "
                    "row count and source record are unknown (restore table.size, or move the location away "
                    "to re-ingest it from the logs)"
                )
            # A new location: its record exists (durably) before any column file does, so a
            # location with data and no table.size can only be damage, never a crash.
            record = self._record(0, {n: 0 for n in names}, SourcePosition(None, 0, 0))
            write_record(path, record, fs)
        sizes = record.files
        if set(sizes) != set(names):
            raise _Damaged(f"table.size lists column files {sorted(sizes)}, the schema needs {sorted(names)}")
        problem = colfmt.check_sizes(self.schema, record.rows, sizes)
        if problem:
            raise _Damaged(f"table.size is inconsistent: {problem}")
        if new_files is not None:
            self.handles = list(new_files)
        for i, name in enumerate(names):
            fpath = os.path.join(path, name)
            if i < len(self.handles):
                handle = self.handles[i]  # a reopen: same file (the handle checks its identity), buffer dropped
            else:
                if sizes[name] > 0 and not fsio.exists(fs, fpath):
                    raise _Damaged(f"column file {name} is missing but the checkpoint records {sizes[name]} bytes")
                handle = self._files.open(fpath, create=True)
                self.handles.append(handle)
            actual = 0 if fresh else handle.size()
            if actual < sizes[name]:
                raise _Damaged(f"column file {name} has {actual} bytes, fewer than the {sizes[name]} checkpointed")
            if actual > sizes[name]:
                handle.truncate(sizes[name])  # rows written after the checkpoint
        rows = record.rows
        assert self.state is not None
        file_sizes = [sizes[n] for n in names]
        self.state.reset(rows, file_sizes, (None, 0, 0))
        self.set_source(record.source)
        self.published_rows = self.checkpointed_rows = rows
        self._published = tuple(file_sizes)
        self.dirty_since = None
        self.last_checkpoint_time = record.time
        for k, v in record.import_state.items():
            self.import_state[k] = v
        self._last_checkpoint = (record.rows, tuple(sorted(record.files.items())), record.source)
        if self.import_config.last_by:  # the state at exactly the checkpointed rows (a file, or rebuilt)
            if self.lastby is None:
                self.lastby = LastBy(self.schema, self.import_config.last_by, self.import_config.lastby_max_keys)
            committed = self._fetch(dict(sizes))  # (the files, cut to the checkpoint)
            self.lastby.recover(path, fs, record.lastby, rows,
                                lambda a, b: colfmt.read_rows(self.schema, None, a, b, committed), str(self.key))

    def _create(self) -> tuple[CheckpointRecord, list[TrackedFile]] | tuple[None, None]:
        """Make this location if its directory does not exist yet: directories, its first record
        (no rows) and its column files, in the file system's one operation
        (``fsio.create_location``), which the real one does in C outside the interpreter's lock:
        made from Python, each of its thirty-odd calls gave up the lock and waited to take it
        back behind the threads decoding chunks.  The record and the column files' handles in
        the schema's order; (None, None) when the directory exists, or the descriptor limit is
        too small to hold a location's files at once: the caller then opens it the usual way."""
        schema = self.table.at_version(self._create_version)
        names = colfmt.schema_file_names(schema)
        if not self._files.holds_at_once(len(names)):
            return None, None
        path = str(self.path)
        record = self.first_record(schema)
        data = record.to_bytes()
        handles = self._files.open_created(
            [os.path.join(path, n) for n in names],
            lambda: fsio.create_location(self.fs, path, TEMP_NAME, FILE_NAME, data, names))
        if handles is None:
            return None, None
        return record, handles

    def first_record(self, schema: TableSchema) -> CheckpointRecord:
        """The record of this location new, written in ``schema``: no rows, every file empty."""
        return new_record(schema)

    def _use_version(self, schema: TableSchema) -> None:
        """Open the location in ``schema`` (a version of its table): its column files are that
        version's.  A reopen finds the same version (table.size never changes it)."""
        if self.handles and schema.version != self.schema_version:
            raise _Damaged(f"table.size now says schema version {schema.version}, the location was opened in "
                           f"version {self.schema_version}")
        self.schema = schema
        self.schema_version = schema.version
        self._file_names = colfmt.schema_file_names(schema)
        if self.state is None:
            self.state = new_write_state(schema, self.block_size, self._compiled)

    def _record(self, rows: int, files: dict[str, int], source: SourcePosition,
                schema: TableSchema | None = None) -> CheckpointRecord:
        """The checkpoint record of this location's state, in its schema version (``schema``,
        for a location not yet opened in one)."""
        schema = schema or self.schema
        return CheckpointRecord(rows, files, source, schema.fingerprint, dict(self.import_state),
                                schema_version=schema.version,
                                lastby=self.lastby.durable_ref if self.lastby is not None else None)

    def reopen(self) -> bool:
        """After an I/O error: reopen from the last checkpoint and accept rows again.

        Every column file is cut back to the checkpoint (nothing written after it is trusted:
        a failed write may have left part of a buffer, a failed fsync left pages the kernel
        will never write), then ``table.size`` is rewritten, which proves the disk takes a
        write, an fsync and a rename again.  Returns whether the location accepts rows now;
        if not, it stays in error and the next attempt is due later (``retry_at``)."""
        with self._checkpoint_lock, self.lock:
            if self.closed or not self.in_error or not self.retryable:
                return False
            self.reopens += 1
            cause = self._first_error
            try:
                self._open_from_checkpoint()
                self.import_state["io_recoveries"] += 1
                record = self._record(self.committed_rows, dict(self.committed_sizes), self.source)
                write_record(str(self.path), record, self.fs)
            except _Damaged as e:
                metrics.LOCATION_RECOVERIES.labels("failed").inc()
                self._fail(str(e))
                return False
            except Exception as e:  # noqa: BLE001
                metrics.LOCATION_RECOVERIES.labels("failed").inc()
                self._fail(f"{cause} (still failing at reopen #{self.reopens}: {_detail(e)})", e)
                return False
            self.in_error = self.retryable = False
            self.error = self.error_errno = self.retry_at = self._first_error = None
            self.epoch += 1
            metrics.LOCATION_RECOVERIES.labels("reopened").inc()
            log.warning("location reopened from its checkpoint after an I/O error", location=str(self.key),
                        rows=self.committed_rows, resume_file=self.source.file_name, resume_offset=self.source.offset,
                        attempt=self.reopens, cause=cause)
        if self._on_publish is not None:
            self._on_publish(self)
        return True

    def _fail(self, message: str, cause: BaseException | None = None) -> None:
        """Enter (or stay in) error state.  With an OS error as ``cause`` the error is retried:
        the next ``reopen`` is due after the current backoff, which then doubles."""
        first = not self.in_error
        self.in_error = True
        self.error = message
        if first or self._first_error is None:
            self._first_error = message
        self.retryable = _retryable_cause(cause)
        self.error_errno = cause.errno if self.retryable else None  # type: ignore[union-attr]
        if self.retryable:
            self.retry_at = time.monotonic() + self._retry_delay
            retry_in: float | None = self._retry_delay
            self._retry_delay = min(self._retry_delay * 2, self.io_retry.max_s)
        else:
            self.retry_at = retry_in = None
        log.error("location in error", location=str(self.key), error=message,
                  errno=fsio.errno_name(self.error_errno) if self.retryable else None,
                  reopen_in_s=retry_in)
        if self._on_error is not None:
            self._on_error(self)

    def _check_usable(self) -> None:
        if self.closed:
            raise LocationError(f"location {self.key} is closed")
        if self.in_error:
            raise LocationError(self.error, self.error_errno)

    @property
    def resume_point(self) -> SourcePosition:
        """Where the sender resumes: just past the last committed row (in memory; the
        checkpointed value after recovery)."""
        with self.lock:
            return self.source

    def resume(self) -> tuple[SourcePosition, int]:
        """The resume point and the ``epoch`` it belongs to, read together: a sender that passes
        this epoch to ``ingest`` can never append after a reopen moved the resume point back."""
        with self.lock:
            return self.source, self.epoch

    # -- ingestion -----------------------------------------------------------------------------
    def ingest(self, file_name: str, run: FrameRun, rows: DecodedRows, epoch: int | None = None) -> None:
        """Append the decoded rows of the frames of ``run`` (of log ``file_name``) and apply their
        transaction flags: the reference path of a chunk (``storage.decodedrows.ingest``; the
        compiled one is ``storage.ingest``).  See docs/storage-format.md, "Transactions".

        ``epoch``: the location's ``epoch`` when the sender learnt its resume point; refused when
        the location was reopened since (the sender must ask for the resume point again)."""
        with self.lock:
            self.check_epoch(epoch)
            decodedrows.ingest(self, file_name, run, rows)
            self.write_due()

    def append_committed(self, cols: list[pa.Array], source: SourcePosition, nbytes: int = 0,
                         epoch: int | None = None) -> None:
        """Append rows that commit together and move the resume point to ``source`` in the same
        step, under the lock, so a checkpoint records both or neither: a pull source's batch
        (``disd.kafka``), whose resume point is its own (a Kafka offset), not a log file's.  With
        no rows only the resume point moves.  ``epoch`` as in ``ingest``."""
        with self.lock:
            self.check_epoch(epoch)
            decodedrows.append_committed(self, cols, source, nbytes)
            self.write_due()

    def check_epoch(self, epoch: int | None) -> None:
        """Under the lock: LocationError unless the location takes rows from a sender that learnt
        its resume point at ``epoch`` (None: any)."""
        self._check_usable()
        if epoch is not None and epoch != self.epoch:
            raise LocationError(f"location {self.key} was reopened from its checkpoint after an I/O error; "
                                "resume from its resume point")

    def write_due(self) -> None:
        """Under the lock: make the writes of whole blocks the last rows filled (and the cuts a
        rollback made due), so memory holds at most a block a file between flushes."""
        if self.state is not None and self.state.needs_io(False):
            self.guarded(lambda: write_out([(self, False)], raise_first=True), "write")

    def rollback(self) -> None:
        """Abandon the open transaction (its client is gone): truncate its rows away."""
        with self.lock:
            if self.closed or self.in_error:
                return
            if not self.txn_open and self.written_rows == self.committed_rows:
                return
            try:
                self.guarded(self._rollback_now, "rollback")
            except LocationError:
                pass  # the location is in error state and said so

    def _rollback_now(self) -> None:
        self.rollback_locked()
        if self.state is not None and self.state.needs_io(False):  # the cut, made now
            write_out([(self, False)], raise_first=True)

    def rollback_locked(self) -> None:
        """Under the lock: cut back to the committed rows (the cut is made with the next writes)."""
        assert self.state is not None
        rolled = self.state.rollback()
        if self.lastby is not None:
            self.lastby.pending.truncate(self.committed_rows)
        self.mark_dirty()
        self.note_rolled_back(rolled)

    def note_rolled_back(self, rolled: int) -> None:
        if rolled:
            self.import_state["rows_rolled_back"] += rolled
            metrics.ROWS_ROLLED_BACK.labels(self.schema.key).inc(rolled)

    def fail_io(self, what: str, e: BaseException) -> None:
        """Under the lock: ``what`` (a write, a flush) failed with ``e``; the location is in error."""
        self._fail(describe_failure(what, e), e)

    def guarded(self, fn: Callable[[], _T], what: str) -> _T:
        """Run a step that touches the column files; any failure puts the location in error
        (its files may now disagree with its counts) and raises LocationError."""
        try:
            return fn()
        except Exception as e:  # whatever broke, this location stops, others go on
            self._fail(describe_failure(what, e), e)
            raise LocationError(self.error, self.error_errno) from e

    # -- flush and checkpoint ------------------------------------------------------------------
    def mark_dirty(self) -> None:
        """Under the lock, after every change a flush must write or publish (rows taken, rows
        cut back): the first since the last flush tells the engine's flush clock, which visits
        only locations that told it."""
        if self.dirty_since is None:
            self.dirty_since = time.time()
            if self._on_dirty is not None:
                self._on_dirty(self, None)

    def flush(self, lastby: bool = True) -> None:
        """Write dirty buffers (no sync), then publish the committed row count; bring the last-by
        state up to it (``lastby``), or have the flusher do it (a caught-up source's thread)."""
        t0 = time.perf_counter()
        with self.lock:
            if self.closed or self.in_error:
                return
            changed = self._flush_locked()
            published = (self.published_rows, self.published_sizes, self.epoch)
        behind = self.lastby_behind()
        lastby = lastby or self._on_dirty is None  # (no flusher to hand it to)
        if behind and lastby:  # off the lock: ingestion goes on meanwhile
            self._update_lastby(*published)
        elif behind:
            self._on_dirty(self, LASTBY_HANDOFF_S)  # type: ignore[misc]
        metrics.FLUSH_DURATION.observe(time.perf_counter() - t0)
        if (changed or behind and lastby) and self._on_publish is not None:
            self._on_publish(self)

    def lastby_behind(self) -> bool:
        """Whether the last-by state covers fewer rows than are published."""
        return self.lastby is not None and self.lastby.snapshot().rows < self.published_rows

    def flush_marked(self) -> bool:
        """The flush clock's visit: flush unless a flush since the location told the clock (a
        caught-up source's, ``publish_soon``) left nothing to write or publish.  Returns whether
        it flushed.  ``dirty_since`` is read without the lock: a change racing with this read
        marks the location again, so the next tick flushes it."""
        if self.dirty_since is None and not self.lastby_behind():
            return False
        self.flush()
        return True

    def caught_up_flush_s(self) -> float:
        """The least time between two caught-up flushes of this location: ``CAUGHT_UP_FLUSH_S``,
        or a quarter of its ``flush_interval_ms`` when that is shorter: with a fixed 25 ms, a
        location flushed every 10 ms and written every 5 ms would have every other caught-up
        chunk held back to the next tick of its interval, its rows visible up to an interval late
        however fast they came in."""
        return min(CAUGHT_UP_FLUSH_S, self.import_config.flush_interval_ms / 4000.0)

    def flush_due_soon(self, now: float) -> bool:
        """A caught-up source's rows: whether to publish them now (else the flush clock does at
        its next ``caught_up_flush_s`` tick, which this tells it); see ``publish_soon``."""
        last = self.last_flush_time
        if last is not None:
            least = self.caught_up_flush_s()
            if now - last < least:
                if self._on_dirty is not None:  # not the flusher's next tick: the next caught-up one
                    self._on_dirty(self, least)
                return False
        return True

    def publish_soon(self) -> bool:
        """Flush now, unless the last flush was under ``caught_up_flush_s`` ago (then False:
        the flush clock flushes the location at its next ``caught_up_flush_s`` tick): for a source
        that has caught up (a tailer at the end of its files, a Kafka partition drained), whose
        rows are then visible as soon as they are in rather than at the flusher's next tick,
        while a trickle of single rows still costs at most one flush per ``caught_up_flush_s``."""
        if not self.flush_due_soon(time.time()):
            return False
        self.flush(lastby=False)
        return True

    def _flush_locked(self) -> bool:
        try:
            write_out([(self, True)], raise_first=True)
        except Exception as e:  # noqa: BLE001
            self._fail(describe_failure("flush", e), e)
            return False
        return self.published_locked(time.time())

    def published_locked(self, now: float) -> bool:
        """Under the lock, every write made: the committed rows are the published ones now.
        Returns whether that changed anything."""
        self.dirty_since = None
        state = self.state
        assert state is not None
        sizes = state.committed_sizes()
        changed = self.published_rows != state.committed_rows or self._published != sizes
        self.published_rows = state.committed_rows
        self._published = sizes
        self.last_flush_time = now
        return changed

    def checkpoint(self) -> bool:
        """Flush and snapshot (under the location lock, as one step, so every byte the snapshot
        counts is in the files), then, with the lock released so ingestion goes on: fsync every
        column file and replace table.size atomically.  Returns whether a record was written."""
        # The last-by state's update lock, held from the snapshot until the state has caught up
        # with exactly its rows: no flush moves the state past them meanwhile.
        guard = self.lastby.apply_lock if self.lastby is not None else contextlib.nullcontext()
        with self._checkpoint_lock:
            t0 = time.perf_counter()
            with guard:
                with self.lock:
                    if self.closed or self.in_error:
                        return False
                    changed = self._flush_locked()
                    if self.in_error:
                        return False
                    record = self._record(self.committed_rows, self.committed_sizes, self.source)
                    handles = list(self.handles)
                    epoch = self.epoch
                state = None
                if self.lastby is not None:
                    state = self._update_lastby(record.rows, record.files, epoch, held=True)
                    if state is None or state.rows != record.rows:
                        return False
            if changed and self._on_publish is not None:
                self._on_publish(self)
            ident = (record.rows, tuple(sorted(record.files.items())), record.source)
            if ident == self._last_checkpoint:
                self.last_checkpoint_time = time.time()
                return False
            try:
                self._make_durable(handles, record, state)
            except Exception as e:  # noqa: BLE001
                with self.lock:
                    self._fail(describe_failure("checkpoint", e), e)
                return False
            self._last_checkpoint = ident
            self.checkpointed_rows = record.rows
            self.last_checkpoint_time = time.time()
            self._retry_delay = self.io_retry.initial_s  # new rows are durable: the disk works
            metrics.CHECKPOINT_DURATION.observe(time.perf_counter() - t0)
            return True

    def _make_durable(self, handles: list[TrackedFile], record: CheckpointRecord, state: Snapshot | None) -> None:
        """The order that makes a crash at any point safe: the column files' bytes first, then
        the last-by state at exactly the record's rows, then the record that counts them (temp,
        fsync, rename, directory fsync); superseded state files go only after that."""
        for h in handles:
            h.fsync()
        if state is not None and self.lastby is not None:
            assert state.rows == record.rows, (state.rows, record.rows)
            record = replace(record, lastby=self.lastby.write(str(self.path), self.fs, state))
        write_record(str(self.path), record, self.fs)
        if state is not None and self.lastby is not None and record.lastby is not None:
            self.lastby.committed(str(self.path), self.fs, record.lastby)

    # -- reading -------------------------------------------------------------------------------
    def column_files(self) -> dict[str, int]:
        """Each column file's size covering exactly the published rows."""
        with self.lock:
            return self.published_sizes

    def snapshot(self) -> tuple[int, dict[str, int]]:
        """(published rows, column file sizes at that count), consistent with each other."""
        with self.lock:
            return self.published_rows, self.published_sizes

    def read_range(self, file_name: str, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of a column file, never past its published size (``b""`` from
        there): the one way published bytes leave a location (TableData's reads, the block
        endpoint).  Right while rows come in (the bytes below a published size are in the file,
        written by the flush that published them, and no later write touches them) and while the
        handle factory closes descriptors to stay within ``max_open_files`` (the handle reopens
        its file, checking it is the same one).  Every byte asked below the published size is
        returned, unless the file holds fewer: the location was reopened from an earlier
        checkpoint (after an I/O error) while the read was under way.  LocationError when the
        location is closed, KeyError for a file it does not have."""
        if start < 0:
            raise StorageValueError(f"{self.key} {file_name}: start must not be negative, got {start}")
        with self.lock:
            if self.closed:
                raise LocationError(f"location {self.key} is closed")
            size = self.published_sizes.get(file_name)
            handle = self._handle(file_name)
        if size is None or handle is None:
            raise StorageKeyError(f"{self.key} has no column file {file_name!r}")
        stop = min(stop, size)
        if stop <= start:
            return b""
        try:
            return handle.pread(stop - start, start)
        except ValueError:  # its handle was closed after the check above: closed meanwhile
            raise LocationError(f"location {self.key} is closed") from None

    def read_block(self, file_name: str, block_index: int, block_size: int | None = None) -> bytes:
        """Block ``block_index`` of a column file: ``read_range`` of its bytes."""
        bs = block_size or self.block_size
        if block_index < 0:
            raise StorageValueError("block_index must not be negative")
        return self.read_range(file_name, block_index * bs, (block_index + 1) * bs)

    def _handle(self, file_name: str) -> TrackedFile | None:
        try:
            return self.handles[self._file_names.index(file_name)]
        except (ValueError, IndexError):
            return None

    def _fetch(self, sizes: dict[str, int]) -> colfmt.Fetch:
        def fetch(name: str, start: int, stop: int) -> bytes:
            stop = min(stop, sizes[name])
            if stop <= start:
                return b""
            handle = self._handle(name)
            assert handle is not None, name
            return handle.pread(stop - start, start)

        return fetch

    def _update_lastby(self, rows: int, sizes: dict[str, int], epoch: int, held: bool = False) -> Snapshot | None:
        """Bring the last-by state up to ``rows`` (published, their files' ``sizes``).  Too many
        keys or a failed read stop the location (unless a reopen since made the read moot)."""
        lastby = self.lastby
        assert lastby is not None  # (made once, never dropped; the callers checked it is there)

        def read(a: int, b: int) -> pa.Table | list[pa.Array]:
            if self.epoch != epoch:  # reopened since: these sizes are no longer the files'
                raise LocationError(f"location {self.key} was reopened")
            return lastby.rows(a, b, lambda: colfmt.read_rows(self.schema, None, a, b, self._fetch(sizes)))

        try:
            return lastby.catch_up(rows, read, held)
        except Exception as e:  # noqa: BLE001
            with self.lock:
                if self.epoch == epoch and not self.in_error and not self.closed:
                    self._fail(describe_failure("last-by update", e), e)
                    lastby.pending.clear()  # the state will not take them; a reopen starts afresh
            return None

    def publish_snapshot(self) -> tuple[int, dict[str, int], int] | None:
        """Under the lock, after a publish: what the last-by state's update needs (the published
        rows, their files' sizes, the epoch), None without last-by state."""
        if self.lastby is None:
            return None
        return self.published_rows, self.published_sizes, self.epoch

    def update_lastby(self, published: tuple[int, dict[str, int], int] | None) -> None:
        """After a publish, off the lock (``published``: ``publish_snapshot``'s)."""
        if self.lastby is not None and published is not None:
            self._update_lastby(*published)

    def hand_off_lastby(self, published: tuple[int, dict[str, int], int] | None) -> None:
        """After a publish on an ingest thread, off the lock: the flusher brings the last-by state
        up to the published rows (within ``LASTBY_HANDOFF_S``), so the stream's next chunk does not
        wait for the update; without a flusher (tests of a bare location), now."""
        if self.lastby is None or published is None:
            return
        if self._on_dirty is None:
            self._update_lastby(*published)
        else:
            self._on_dirty(self, LASTBY_HANDOFF_S)

    def published(self) -> None:
        """Tell the engine's subscribers of a publish (off the lock)."""
        if self._on_publish is not None:
            self._on_publish(self)

    def read_table(self, columns: list[str] | None = None, start: int = 0, stop: int | None = None) -> pa.Table:
        """Published rows ``[start, stop)`` as a Table with the schema's Arrow types."""
        rows, sizes = self.snapshot()
        if self.closed:
            raise LocationError(f"location {self.key} is closed")
        stop = rows if stop is None else min(stop, rows)
        start = max(0, min(start, stop))
        return colfmt.read_rows(self.schema, columns, start, stop, self._fetch(sizes))

    def close(self) -> None:
        """Close the column files (no flush: the engine checkpoints first)."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            for h in self.handles:
                h.close()

    def __repr__(self) -> str:
        state = f"error={self.error!r}" if self.in_error else f"rows={self.published_rows}"
        return f"Location({self.key}, {state})"
