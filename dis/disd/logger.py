"""The Python logger: how applications write binary logs, modelled on IntradayLoggerBuilder.

    log = (IntradayLoggerBuilder("config/schemas/Market.Trade.yaml")
           .set_process_name("feed").set_log_dir("var/logs").set_namespace_set("System")
           .set_column_partition_value("2026-11-22").build())
    log.log(Timestamp=..., Sym="AAPL", Price=1.5, Size=100)      # one SingleRow
    with log.transaction():                                      # Start, None..., End
        log.log(...); log.log(...)
    log.log_batch(table)                                         # vectorized; atomic=True: one transaction
    log.close()

Callers hand rows to one writer thread through a bounded queue: when the queue is full the
caller blocks (backpressure) instead of memory growing without bound.  The writer drains what is
queued, encodes it in batches (vectorized, see disd.binlog.format) and appends it to the current
file of each column partition with one write per batch, so rows reach the OS promptly; close()
fsyncs.

Transactions are assembled on the calling thread and queued as one unit, so rows of other
threads never interleave with them.  A transaction abandoned by an exception inside ``with`` is
dropped before anything is written: readers can never see it.  (A DIS would not publish it even
if it were written without its End row, but not writing it at all is simpler to reason about.)

Internal partition: ``set_internal_partition`` or the legalized host name (dots to underscores),
then the optional suffix, then the optional log-format suffix, joined by ``_``.
Column partition precedence: a fixed value, then a function of the row, then the date of the
write time in the configured time zone.  Rollover: ``HOURLY`` (default: a new file each hour),
``DAILY`` (a new file only when the column partition changes), ``FIXED`` (one file per column
partition with a fixed time stamp, appended to across restarts).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import pathlib
import queue
import socket
import threading
import zoneinfo
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import pyarrow as pa

from disd.binlog import BinlogWriter, LogFileName, NamespaceSet, RowFlag, normalize_columns
from disd.names import NameKind, legalize, validate_name
from disd.schema import TableSchema, coerce_schema


class Rollover(str, Enum):
    HOURLY = "hourly"
    DAILY = "daily"
    FIXED = "fixed"


class LoggerClosedError(RuntimeError):
    pass


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


@dataclass
class _Batch:
    columns: list[pa.Array]
    flags: np.ndarray
    partition: str
    when: dt.datetime


_STOP = object()


class IntradayLoggerBuilder:
    def __init__(self, schema: TableSchema | str | os.PathLike[str]) -> None:
        self._schema = coerce_schema(schema if not isinstance(schema, os.PathLike) else str(schema))
        self._process_name = "python"
        self._log_dir = "var/logs"
        self._namespace_set = NamespaceSet.SYSTEM
        self._partition_value: str | None = None
        self._partition_fn: Callable[[Mapping[str, Any]], str] | None = None
        self._tz = dt.timezone.utc
        self._internal_partition: str | None = None
        self._suffix: str | None = None
        self._format_suffix: str | None = None
        self._rollover = Rollover.HOURLY
        self._queue_size = 1024
        self._clock: Callable[[], dt.datetime] = _utcnow
        self._fixed_stamp: dt.datetime | None = None

    def set_process_name(self, name: str) -> "IntradayLoggerBuilder":
        self._process_name = name
        return self

    def set_log_dir(self, path: str | os.PathLike[str]) -> "IntradayLoggerBuilder":
        self._log_dir = str(path)
        return self

    def set_namespace_set(self, value: str) -> "IntradayLoggerBuilder":
        self._namespace_set = NamespaceSet(value)
        return self

    def set_column_partition_value(self, value: str) -> "IntradayLoggerBuilder":
        self._partition_value = validate_name(NameKind.COLUMN_PARTITION, value)
        return self

    def set_column_partition_function(self, fn: Callable[[Mapping[str, Any]], str]) -> "IntradayLoggerBuilder":
        self._partition_fn = fn
        return self

    def set_time_zone_name(self, name: str) -> "IntradayLoggerBuilder":
        self._tz = zoneinfo.ZoneInfo(name)
        return self

    def set_internal_partition(self, name: str) -> "IntradayLoggerBuilder":
        self._internal_partition = validate_name(NameKind.INTERNAL_PARTITION, name)
        return self

    def set_internal_partition_suffix(self, suffix: str) -> "IntradayLoggerBuilder":
        self._suffix = suffix
        return self

    def set_log_format_suffix(self, suffix: str) -> "IntradayLoggerBuilder":
        self._format_suffix = suffix
        return self

    def set_rollover(self, mode: Rollover | str, fixed_timestamp: dt.datetime | None = None) -> "IntradayLoggerBuilder":
        self._rollover = Rollover(mode)
        self._fixed_stamp = fixed_timestamp
        return self

    def set_queue_size(self, n: int) -> "IntradayLoggerBuilder":
        if n < 1:
            raise ValueError("queue size must be at least 1")
        self._queue_size = n
        return self

    def set_clock(self, clock: Callable[[], dt.datetime]) -> "IntradayLoggerBuilder":
        """The source of "now" (timezone-aware); for tests of rollover."""
        self._clock = clock
        return self

    def internal_partition(self) -> str:
        base = self._internal_partition or legalize(socket.gethostname())
        parts = [base] + [p for p in (self._suffix, self._format_suffix) if p]
        return validate_name(NameKind.INTERNAL_PARTITION, "_".join(parts))

    def build(self) -> "IntradayLogger":
        return IntradayLogger(self)


class IntradayLogger:
    def __init__(self, b: IntradayLoggerBuilder) -> None:
        self.schema = b._schema
        self.log_dir = pathlib.Path(b._log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.process_name = b._process_name
        self.namespace_set = b._namespace_set
        self.internal_partition = b.internal_partition()
        self._partition_value = b._partition_value
        self._partition_fn = b._partition_fn
        self._tz = b._tz
        self._rollover = b._rollover
        self._clock = b._clock
        self._fixed_stamp = b._fixed_stamp or self._clock()
        self._queue: queue.Queue = queue.Queue(maxsize=b._queue_size)
        self._txn = threading.local()
        self._writers: dict[str, tuple[tuple, BinlogWriter]] = {}  # partition -> (period, writer)
        self._error: BaseException | None = None
        self._closed = False
        self._lock = threading.Lock()
        self.files: list[pathlib.Path] = []
        self._thread = threading.Thread(target=self._run, name=f"dis-logger-{self.schema.key}", daemon=True)
        self._thread.start()

    # -- public API ----------------------------------------------------------------------------
    def log(self, **values: Any) -> None:
        """Log one row (a SingleRow, or part of the open transaction on this thread)."""
        self._check()
        rows = getattr(self._txn, "rows", None)
        if rows is not None:
            rows.append(values)
            return
        self._put_rows([values], atomic=False)

    @contextlib.contextmanager
    def transaction(self) -> Iterator["IntradayLogger"]:
        """Rows logged inside are written as one transaction when the block ends normally, and
        dropped unwritten when it raises."""
        if getattr(self._txn, "rows", None) is not None:
            raise RuntimeError("transactions do not nest")
        self._txn.rows = []
        try:
            yield self
        except BaseException:
            self._txn.rows = None
            raise
        rows, self._txn.rows = self._txn.rows, None
        if rows:
            self._put_rows(rows, atomic=True)

    def log_batch(self, data: pa.Table | pa.RecordBatch | Mapping[str, Any], atomic: bool = False) -> None:
        """Log many rows: each a SingleRow, or all one transaction with ``atomic=True``."""
        self._check()
        cols = normalize_columns(self.schema, data)
        n = len(cols[0]) if cols else 0
        if n == 0:
            return
        now = self._clock()
        if self._partition_value is None and self._partition_fn is not None:
            table = pa.Table.from_arrays(cols, schema=self.schema.arrow_schema())
            parts = np.array([self._partition_fn(r) for r in table.to_pylist()], dtype=object)
            uniq = list(dict.fromkeys(parts.tolist()))
            if len(uniq) > 1 and atomic:
                raise ValueError("an atomic batch must fall in one column partition")
            for p in uniq:
                idx = pa.array(np.flatnonzero(parts == p))
                sub = [c.take(idx) for c in cols]
                self._queue_put(_Batch(sub, _flags(len(idx), atomic), validate_name(NameKind.COLUMN_PARTITION, p), now))
            return
        self._queue_put(_Batch(cols, _flags(n, atomic), self._partition_for(None, now), now))

    def flush(self, timeout: float | None = None) -> None:
        """Block until everything queued so far has been written to the OS."""
        self._check()
        done = threading.Event()
        self._queue_put(done)
        if not done.wait(timeout):
            raise TimeoutError("logger flush timed out")
        self._check()

    def close(self) -> None:
        """Write what is queued, fsync and close the files."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._queue.put(_STOP)
        self._thread.join()
        if self._error is not None:
            raise RuntimeError(f"logger writer failed: {self._error}") from self._error

    def __enter__(self) -> "IntradayLogger":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- internals -----------------------------------------------------------------------------
    def _check(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"logger writer failed: {self._error}") from self._error
        if self._closed:
            raise LoggerClosedError("logger is closed")

    def _queue_put(self, item: Any) -> None:
        self._queue.put(item)  # blocks while the queue is full: backpressure

    def _partition_for(self, row: Mapping[str, Any] | None, now: dt.datetime) -> str:
        if self._partition_value is not None:
            return self._partition_value
        if self._partition_fn is not None and row is not None:
            return validate_name(NameKind.COLUMN_PARTITION, self._partition_fn(row))
        return now.astimezone(self._tz).date().isoformat()

    def _put_rows(self, rows: list[Mapping[str, Any]], atomic: bool) -> None:
        now = self._clock()
        partition = self._partition_for(rows[0], now)
        if self._partition_fn is not None and self._partition_value is None and not atomic:
            for r in rows:
                self._put_rows_one_partition([r], False, self._partition_for(r, now), now)
            return
        self._put_rows_one_partition(rows, atomic, partition, now)

    def _put_rows_one_partition(self, rows, atomic: bool, partition: str, now: dt.datetime) -> None:  # noqa: ANN001
        unknown = {k for r in rows for k in r} - set(self.schema.column_names)
        if unknown:
            raise ValueError(f"{self.schema.key} has no column {sorted(unknown)[0]!r}")
        data = {c: [r.get(c) for r in rows] for c in self.schema.column_names}
        cols = normalize_columns(self.schema, data)
        self._queue_put(_Batch(cols, _flags(len(rows), atomic), partition, now))

    def _period(self, when: dt.datetime) -> tuple:
        if self._rollover is Rollover.HOURLY:
            local = when.astimezone(self._tz)
            return (local.date(), local.hour)
        return ()

    def _file_for(self, partition: str, when: dt.datetime) -> BinlogWriter:
        local = when.astimezone(self._tz)
        period = self._period(when)
        cur = self._writers.get(partition)
        if cur is not None and cur[0] == period:
            return cur[1]
        if cur is not None:
            cur[1].fsync()
            cur[1].close()
        stamp = self._fixed_stamp.astimezone(self._tz) if self._rollover is Rollover.FIXED else local
        name = LogFileName(self.schema.namespace, self.schema.table, self.namespace_set, self.internal_partition,
                           partition, stamp.replace(microsecond=(stamp.microsecond // 1000) * 1000))
        path = self.log_dir / name.format()
        w = BinlogWriter(path, self.schema)
        self._writers[partition] = (period, w)
        self.files.append(path)
        return w

    def _run(self) -> None:
        stop = False
        while not stop:
            item = self._queue.get()
            items = [item]
            while len(items) < 256:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                pending: list[_Batch] = []
                for it in items:
                    if it is _STOP:
                        stop = True
                        break
                    if isinstance(it, threading.Event):
                        self._write(pending)
                        pending = []
                        it.set()
                        continue
                    pending.append(it)
                self._write(pending)
            except BaseException as e:  # noqa: BLE001 - surfaced to callers on their next call
                self._error = e
                for it in items:
                    if isinstance(it, threading.Event):
                        it.set()
                stop = True
        try:
            for _, w in self._writers.values():
                w.fsync()
                w.close()
        except BaseException as e:  # noqa: BLE001
            self._error = self._error or e
        # release callers blocked on a full queue after a failure
        while True:
            try:
                it = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(it, threading.Event):
                it.set()

    def _write(self, batches: list[_Batch]) -> None:
        """Write batches, joining consecutive ones of the same file into one write."""
        i = 0
        while i < len(batches):
            b = batches[i]
            key = (b.partition, self._period(b.when))
            j = i + 1
            while j < len(batches) and (batches[j].partition, self._period(batches[j].when)) == key:
                j += 1
            group = batches[i:j]
            w = self._file_for(b.partition, b.when)
            if len(group) == 1:
                w.write_rows(b.columns, b.flags)
            else:
                cols = [pa.concat_arrays([g.columns[k] for g in group]) for k in range(len(b.columns))]
                w.write_rows(cols, np.concatenate([g.flags for g in group]))
            i = j


def _flags(n: int, atomic: bool) -> np.ndarray:
    if not atomic or n == 1:
        return np.full(n, RowFlag.SINGLE_ROW, np.uint8)
    f = np.zeros(n, np.uint8)
    f[0] = RowFlag.START_TRANSACTION
    f[-1] = RowFlag.END_TRANSACTION
    return f
