"""One location: its column files, transactions, flush, checkpoint and recovery.

A location holds three row counts, always ``published <= committed <= written``:

* written: rows in the column files or their buffers, including an open transaction's rows;
* committed: rows of single rows and ended transactions (they will survive a rollback);
* published: committed rows as of the last flush, the only rows readers ever see.

Checkpoints record the committed count, the file sizes at that count and the source record, and
recovery truncates every column file back to them.  Everything is in docs/storage-format.md.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np
import pyarrow as pa
import structlog

from disd import metrics
from disd.binlog import DecodedRows, FrameRun, LocationKey, RowFlag
from disd.schema import ColumnType, TableSchema
from disd.storage import columns as colfmt
from disd.storage.checkpoint import (
    CheckpointError,
    CheckpointRecord,
    FileOps,
    SourcePosition,
    read_record,
    write_record,
)
from disd.storage.filehandles import TrackedFile, TrackedFileHandleFactory

if TYPE_CHECKING:
    from disd.storage.engine import ImportConfig

log = structlog.get_logger(__name__)


class LocationError(Exception):
    """The location is in error state and accepts no rows; the message says why."""


class ColumnFileWriter:
    """A column file with its block buffer.

    Appends fill a ``block_size`` buffer; a full buffer is written at once, and data larger than a
    block is written a block at a time, so no write exceeds the block size.  ``flush`` writes a
    partial buffer (a write as small as 1 byte)."""

    def __init__(self, handle: TrackedFile, disk_size: int, block_size: int) -> None:
        self.handle = handle
        self.disk_size = disk_size
        self.block_size = block_size
        self.buf = bytearray()

    @property
    def size(self) -> int:
        return self.disk_size + len(self.buf)

    def _write(self, data) -> None:  # noqa: ANN001
        self.handle.pwrite(data, self.disk_size)
        self.disk_size += len(data)
        metrics.WRITE_SIZE.observe(len(data))

    def append(self, data) -> None:  # noqa: ANN001
        mv = memoryview(data).cast("B")
        bs = self.block_size
        if self.buf:
            room = bs - len(self.buf)
            self.buf += mv[:room]
            mv = mv[room:]
            if len(self.buf) < bs:
                return
            self._write(bytes(self.buf))
            self.buf.clear()
        while len(mv) >= bs:
            self._write(mv[:bs])
            mv = mv[bs:]
        if len(mv):
            self.buf += mv

    def flush(self) -> bool:
        if not self.buf:
            return False
        self._write(bytes(self.buf))
        self.buf.clear()
        return True

    def truncate_to(self, size: int) -> None:
        if size >= self.disk_size:
            del self.buf[size - self.disk_size :]
        else:
            self.handle.truncate(size)
            self.disk_size = size
            self.buf.clear()


@dataclass
class TransactionPlan:
    """How a batch of flags applies to a location (see docs/storage-format.md, Transactions)."""

    keep: np.ndarray | None  # rows to write; None = all
    rollback_open: bool  # the transaction open before this batch is abandoned
    last_commit: int  # index of the batch's last committing row, -1 when none
    open_at_end: bool  # a transaction is still open after the batch
    abandoned: int  # transactions abandoned by a Start or SingleRow inside them
    end_without_start: int


def plan_transactions(flags: np.ndarray, in_txn: bool) -> TransactionPlan:
    """Apply the flag rules to a batch in O(transactions) steps, not O(rows).

    Outside a transaction every row commits by itself (SingleRow; also None and a stray End).
    Start opens a transaction; End commits it.  A Start or SingleRow inside an open transaction
    abandons it: its rows are rolled back and the row is then processed outside a transaction."""
    n = len(flags)
    starts = np.flatnonzero(flags == RowFlag.START_TRANSACTION)
    breakers = np.flatnonzero(flags != RowFlag.NONE)
    keep: np.ndarray | None = None
    rollback_open = False
    last_commit = -1
    abandoned = end_without_start = 0
    txn_begin = -1  # batch index where the open transaction began; -1: before this batch
    pos = 0
    while pos < n:
        if in_txn:
            i = int(np.searchsorted(breakers, pos))
            if i == len(breakers):
                break
            b = int(breakers[i])
            if flags[b] == RowFlag.END_TRANSACTION:
                last_commit = b
                in_txn = False
                pos = b + 1
            else:
                abandoned += 1
                if txn_begin < 0:
                    rollback_open = True
                if b > max(txn_begin, 0):
                    if keep is None:
                        keep = np.ones(n, bool)
                    keep[max(txn_begin, 0) : b] = False
                in_txn = False
                pos = b
        else:
            i = int(np.searchsorted(starts, pos))
            stop = int(starts[i]) if i < len(starts) else n
            if stop > pos:
                last_commit = stop - 1
                end_without_start += int(np.count_nonzero(flags[pos:stop] == RowFlag.END_TRANSACTION))
            if stop == n:
                break
            in_txn = True
            txn_begin = stop
            pos = stop + 1
    return TransactionPlan(keep, rollback_open, last_commit, in_txn, abandoned, end_without_start)


class Location:
    def __init__(
        self,
        key: LocationKey,
        schema: TableSchema,
        path: str,
        files: TrackedFileHandleFactory,
        block_size: int,
        import_config: "ImportConfig",
        on_publish: Callable[["Location"], None] | None = None,
        file_ops: FileOps | None = None,
    ) -> None:
        self.key = key
        self.schema = schema
        self.path = path
        self.block_size = block_size
        self.import_config = import_config
        self._files = files
        self._on_publish = on_publish
        self._file_ops = file_ops or FileOps()
        self.lock = threading.RLock()
        self._checkpoint_lock = threading.Lock()
        self.in_error = False
        self.error: str | None = None
        self.writers: dict[str, ColumnFileWriter] = {}
        self.last_flush_time: float | None = None
        self.last_checkpoint_time: float | None = None
        self.written_rows = self.committed_rows = self.published_rows = self.checkpointed_rows = 0
        self.committed_sizes: dict[str, int] = {}
        self.published_sizes: dict[str, int] = {}
        self.source = SourcePosition(None, 0, 0)
        self.txn_open = False
        self._skip_pending = False
        self._last_checkpoint: tuple | None = None
        self._recover()

    # -- recovery ------------------------------------------------------------------------------
    def _recover(self) -> None:
        os.makedirs(self.path, exist_ok=True)
        names = [n for c in self.schema.columns for n in colfmt.file_names(c)]
        try:
            record = read_record(self.path)
        except CheckpointError as e:
            self._fail(f"{e}; refusing to guess which rows are committed (restore table.size or remove the location)")
            return
        if record is not None and record.fingerprint != self.schema.fingerprint:
            self._fail(f"table.size was written for schema {record.fingerprint}, the table is now {self.schema.fingerprint}")
            return
        sizes = record.files if record is not None else {n: 0 for n in names}
        if record is not None and set(sizes) != set(names):
            self._fail(f"table.size lists files {sorted(sizes)}, the schema needs {sorted(names)}")
            return
        try:
            for name in names:
                fpath = os.path.join(self.path, name)
                existed = os.path.exists(fpath)
                if not existed and sizes[name] > 0:
                    self._fail(f"column file {name} is missing but the checkpoint records {sizes[name]} bytes")
                    return
                handle = self._files.open(fpath, create=True)
                actual = handle.size()
                if actual < sizes[name]:
                    self._fail(f"column file {name} has {actual} bytes, fewer than the {sizes[name]} checkpointed")
                    return
                if actual > sizes[name]:
                    handle.truncate(sizes[name])
                self.writers[name] = ColumnFileWriter(handle, sizes[name], self.block_size)
        except OSError as e:
            self._fail(f"cannot open column files: {e}")
            return
        rows = record.rows if record is not None else 0
        self.written_rows = self.committed_rows = self.published_rows = self.checkpointed_rows = rows
        self.committed_sizes = dict(sizes)
        self.published_sizes = dict(sizes)
        if record is not None:
            self.source = record.source
            self.last_checkpoint_time = record.time
            self._last_checkpoint = (record.rows, tuple(sorted(record.files.items())), record.source)
        self._skip_pending = self.source.skip_rows > 0
        if record is None and any(self.writers[n].size for n in names):
            log.warning("location without checkpoint: column files truncated to empty", location=str(self.key))

    def _fail(self, message: str) -> None:
        if not self.in_error:
            metrics.PARTITIONS_IN_ERROR.inc()
        self.in_error = True
        self.error = message
        log.error("location in error", location=str(self.key), error=message)

    @property
    def resume_point(self) -> SourcePosition:
        with self.lock:
            return self.source

    # -- ingestion -----------------------------------------------------------------------------
    def ingest(self, file_name: str, run: FrameRun, rows: DecodedRows) -> None:
        """Append the decoded rows of ``run`` (frames of ``file_name``) and apply their flags."""
        with self.lock:
            if self.in_error:
                raise LocationError(self.error)
            flags = rows.flags
            cols = rows.columns
            skip = 0
            if self._skip_pending:
                self._skip_pending = False
                if run.starts and file_name == self.source.file_name and run.starts[0] == self.source.offset:
                    skip = min(self.source.skip_rows, len(flags))
                    flags = flags[skip:]
                    cols = [c.slice(skip) for c in cols]
            if len(flags) == 0:
                return
            plan = plan_transactions(flags, self.txn_open)
            if plan.abandoned or plan.end_without_start:
                if plan.abandoned:
                    metrics.MALFORMED_FLAGS.labels(self.schema.key, "abandoned_transaction").inc(plan.abandoned)
                if plan.end_without_start:
                    metrics.MALFORMED_FLAGS.labels(self.schema.key, "end_without_start").inc(plan.end_without_start)
            try:
                if plan.rollback_open:
                    self._rollback_locked()
                keep_idx = None
                if plan.keep is not None:
                    keep_idx = np.flatnonzero(plan.keep)
                    cols = [c.take(pa.array(keep_idx)) for c in cols]
                string_ends = self._append(cols)
            except OSError as e:
                self._fail(f"write failed: {e}")
                raise LocationError(self.error) from None
            n_kept = len(cols[0]) if cols else 0
            before = self.written_rows
            self.written_rows += n_kept
            metrics.ROWS_INGESTED.labels(self.schema.key).inc(n_kept)
            metrics.BYTES_INGESTED.labels(self.schema.key).inc(run.end_offset - (run.starts[0] if run.starts else run.end_offset))
            if plan.last_commit >= 0:
                upto = plan.last_commit + 1 if keep_idx is None else int(np.searchsorted(keep_idx, plan.last_commit, side="right"))
                new_committed = before + upto
                sizes = dict(self.committed_sizes)
                for c in self.schema.columns:
                    if c.type is ColumnType.STRING:
                        off, dat = colfmt.file_names(c)
                        sizes[off] = new_committed * colfmt.OFFSET_WIDTH
                        ends = string_ends[c.name]
                        if upto > 0:
                            sizes[dat] = int(ends[upto - 1] & colfmt.OFFSET_MASK)
                    else:
                        sizes[colfmt.file_names(c)[0]] = new_committed * c.type.width
                metrics.ROWS_COMMITTED.labels(self.schema.key).inc(new_committed - self.committed_rows)
                self.committed_rows = new_committed
                self.committed_sizes = sizes
                self.source = self._position(file_name, run, plan.last_commit + skip)
            self.txn_open = plan.open_at_end

    def _position(self, file_name: str, run: FrameRun, row: int) -> SourcePosition:
        """The source record just past batch row ``row``."""
        cum = np.cumsum(run.row_counts)
        j = int(np.searchsorted(cum, row, side="right"))
        if row == cum[j] - 1:
            return SourcePosition(file_name, run.ends[j], 0)
        first = int(cum[j] - run.row_counts[j])
        return SourcePosition(file_name, run.starts[j], row - first + 1)

    def _append(self, cols: list[pa.Array]) -> dict[str, np.ndarray]:
        string_ends: dict[str, np.ndarray] = {}
        for c, arr in zip(self.schema.columns, cols):
            if c.type is ColumnType.STRING:
                off, dat = colfmt.file_names(c)
                ends, _lens, data = colfmt.encode_string(arr, self.writers[dat].size)
                self.writers[off].append(ends)
                self.writers[dat].append(data)
                string_ends[c.name] = ends
            else:
                self.writers[colfmt.file_names(c)[0]].append(colfmt.encode_fixed(c, arr))
        return string_ends

    def rollback(self) -> None:
        """Abandon the open transaction (its client is gone): truncate its rows away."""
        with self.lock:
            self._skip_pending = self.source.skip_rows > 0
            if not self.txn_open and self.written_rows == self.committed_rows:
                return
            try:
                self._rollback_locked()
            except OSError as e:
                self._fail(f"rollback failed: {e}")

    def _rollback_locked(self) -> None:
        rolled = self.written_rows - self.committed_rows
        for name, w in self.writers.items():
            w.truncate_to(self.committed_sizes[name])
        self.written_rows = self.committed_rows
        self.txn_open = False
        if rolled:
            metrics.ROWS_ROLLED_BACK.labels(self.schema.key).inc(rolled)

    # -- flush and checkpoint ------------------------------------------------------------------
    def flush(self) -> None:
        """Write dirty buffers (no sync) and publish the committed row count."""
        t0 = time.perf_counter()
        with self.lock:
            if self.in_error:
                return
            try:
                for w in self.writers.values():
                    w.flush()
            except OSError as e:
                self._fail(f"flush failed: {e}")
                return
            changed = self.published_rows != self.committed_rows
            self.published_rows = self.committed_rows
            self.published_sizes = dict(self.committed_sizes)
            self.last_flush_time = time.time()
        metrics.FLUSH_DURATION.observe(time.perf_counter() - t0)
        if changed and self._on_publish is not None:
            self._on_publish(self)

    def checkpoint(self) -> bool:
        """Flush, snapshot, fsync every column file, write table.size atomically.  The location
        lock is held only for the flush and snapshot: ingestion goes on during the fsyncs."""
        with self._checkpoint_lock:
            t0 = time.perf_counter()
            self.flush()
            with self.lock:
                if self.in_error:
                    return False
                record = CheckpointRecord(self.committed_rows, dict(self.committed_sizes), self.source,
                                          self.schema.fingerprint)
                handles = [w.handle for w in self.writers.values()]
            ident = (record.rows, tuple(sorted(record.files.items())), record.source)
            if ident == self._last_checkpoint:
                self.last_checkpoint_time = time.time()
                return False
            try:
                for h in handles:
                    h.fsync()
                write_record(self.path, record, self._file_ops)
            except OSError as e:
                with self.lock:
                    self._fail(f"checkpoint failed: {e}")
                return False
            self._last_checkpoint = ident
            self.checkpointed_rows = record.rows
            self.last_checkpoint_time = time.time()
            metrics.CHECKPOINT_DURATION.observe(time.perf_counter() - t0)
            return True

    # -- reading -------------------------------------------------------------------------------
    def column_files(self) -> dict[str, int]:
        """Each column file's size covering exactly the published rows."""
        with self.lock:
            return dict(self.published_sizes)

    def snapshot(self) -> tuple[int, dict[str, int]]:
        with self.lock:
            return self.published_rows, dict(self.published_sizes)

    def read_block(self, file_name: str, block_index: int, block_size: int | None = None) -> bytes:
        bs = block_size or self.block_size
        with self.lock:
            size = self.published_sizes.get(file_name)
            w = self.writers.get(file_name)
        if size is None or w is None:
            raise KeyError(f"{self.key} has no column file {file_name!r}")
        start = block_index * bs
        if start >= size:
            return b""
        return w.handle.pread(min(bs, size - start), start)

    def _fetch(self, sizes: dict[str, int]) -> colfmt.Fetch:
        def fetch(name: str, start: int, stop: int) -> bytes:
            stop = min(stop, sizes[name])
            if stop <= start:
                return b""
            return self.writers[name].handle.pread(stop - start, start)

        return fetch

    def read_table(self, columns: list[str] | None = None, start: int = 0, stop: int | None = None) -> pa.Table:
        rows, sizes = self.snapshot()
        stop = rows if stop is None else min(stop, rows)
        return colfmt.read_rows(self.schema, columns, start, max(start, stop), self._fetch(sizes))

    def close(self) -> None:
        with self.lock:
            for w in self.writers.values():
                w.handle.close()
