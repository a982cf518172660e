"""The Python logger: how applications write binary logs, modelled on IntradayLoggerBuilder.

    log = (IntradayLoggerBuilder("config/schemas/Market.Trade.yaml")   # or a TableSchema
           .set_process_name("feed").set_log_dir("var/logs").set_namespace_set("System")
           .set_column_partition_value("2026-11-22")
           .build())
    log.log(Timestamp=..., Sym="AAPL", Price=1.5, Size=100)      # one SingleRow
    with log.transaction():                                      # Start, None..., End
        log.log(...); log.log(...)
    log.log_batch(table)                # pyarrow Table/RecordBatch or dict of columns; SingleRows
    log.log_batch(table, atomic=True)   # ... or one transaction
    log.flush()                         # wait until everything logged so far is in the OS
    log.close()                         # write what is queued, fsync, close

Threads and the queue
    Callers hand work to one writer thread through a bounded queue whose capacity is counted in
    rows (``set_queue_size``).  A caller that finds it full blocks until the writer has taken
    what is queued: backpressure, instead of memory growing without bound.  (A batch larger than
    the whole queue is admitted when the queue is empty, so nothing waits forever.)  The writer
    takes everything queued at once, turns consecutive small items of one file into one batch
    of columns, encodes it with whole-batch numpy operations (``disd.binlog.format``) and hands
    it to the OS with one ``write`` per file, immediately: a row logged under light load is in
    the file (visible to a tailer) within a millisecond or so.  Nothing is fsynced per row;
    ``flush(fsync=True)`` and ``close()`` fsync, and so does every file closed by a rollover.

    Values are checked and converted on the calling thread, so a bad value raises from
    ``log``/``log_batch`` itself and never reaches the writer.  Numpy arrays handed to
    ``log_batch`` are copied (Arrow would otherwise share their memory, and a caller reusing its
    buffer would change rows already logged).  If the writer thread fails (a full disk, an
    unwritable directory, a failing clock) the logger stops: every later call, and ``close()``,
    raises ``LoggerWriterError`` with the original error as its cause.

Transactions
    ``with log.transaction():`` collects the rows this thread logs inside the block, including
    ``log_batch`` calls, on the calling thread; when the block ends normally they are queued as
    one unit, so no other thread's rows can ever come between them, and written as
    StartTransaction, None..., EndTransaction (a one-row transaction is written as one
    SingleRow: a row cannot be both Start and End).  Transactions do not nest.

    A transaction abandoned by an exception inside ``with`` is never seen by readers.  The
    guarantee needed is only that its End is never written (the DIS publishes no row of a
    transaction before its End, and treats a Start or SingleRow that arrives while a transaction
    is open as rolling the open one back); this logger goes further and writes none of its rows.
    It also ends the writer's current batch there, so the rows logged after an abandoned
    transaction begin a new frame.  A transaction's rows must all fall in one column partition
    (one location); ``ValueError`` otherwise, which abandons it.  Rows of a transaction stay in
    the caller's memory until the block ends (compacted to Arrow columns every 65,536 rows).

Internal partition
    ``set_internal_partition(name)`` if given (used as is), otherwise the legalized host name
    (dots and other illegal characters become ``_``), prefixed with ``<process name>_`` when a
    process name is set (as IntradayLoggerBuilder does for logs written directly, e.g.
    ``feed_host1``); then the optional ``set_internal_partition_suffix`` and the optional
    ``set_log_format_suffix``, each joined with ``_``.  The result is checked by ``disd.names``.

Column partition
    Precedence: a fixed value (``set_column_partition_value``); else a function of the row
    (``set_column_partition_function``); else the date, in the time zone of
    ``set_time_zone_name`` (default UTC), of the write time.  A function receives each row as a
    dict of column name to Python value (timestamps as int nanoseconds since the epoch, chars as
    int UTF-16 code units, nulls as None).  For ``log_batch`` it is called once per distinct
    combination of the ``columns=`` it names, found with vectorized dictionary encoding (or once
    per row when no columns are named); with ``vectorized=True`` it is instead called with a
    pyarrow Table and returns one partition (a str) or one per row.  A batch spanning several
    partitions is split and each partition's rows go to its own file, in their original order.

Files and rollover
    Files are named by ``disd.binlog.LogFileName``: ``<Ns>.<Table>.<System|User>.<Internal>.
    <Column>.bin.<time>``, where the time is the file's creation time in the configured zone,
    made strictly later than any existing file of the same location in the directory so that
    files order as they were written.  ``Rollover.HOURLY`` (default) starts a new file at each
    hour of the zone, ``DAILY`` only when the column partition changes, ``FIXED`` keeps one
    file per column partition for the logger's life, its time stamp fixed (given, or the
    build time), so a logger built again with the same stamp appends to the same file.  Times
    come from ``set_clock`` (default: the system clock), read by the writer thread, never
    allowed to run backwards.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import datetime as dt
import os
import pathlib
import socket
import threading
import time
import weakref
import zoneinfo
from enum import Enum
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa

from disd.binlog import BinlogWriter, LogFileName, NamespaceSet, RowFlag, normalize_columns
from disd.binlog.format import MAX_FRAME_PAYLOAD, layout_for
from disd.names import NameKind, legalize, validate_name
from disd.schema import Column, ColumnType, TableSchema, coerce_schema

__all__ = [
    "IntradayLogger",
    "IntradayLoggerBuilder",
    "LoggerClosedError",
    "LoggerError",
    "LoggerWriterError",
    "Rollover",
]

#: Items smaller than this are merged with their neighbours into one batch by the writer;
#: larger ones are written as they are.
_COALESCE_ROWS = 65536
#: A transaction collected on the caller is compacted to Arrow columns every this many rows.
_TXN_COMPACT_ROWS = 65536
_DEFAULT_QUEUE_ROWS = 1 << 18
_DEFAULT_MAX_OPEN_FILES = 128
_DEFAULT_WRITE_DELAY = 0.002  # seconds
_SINGLE, _START, _NONE, _END = (int(f) for f in (RowFlag.SINGLE_ROW, RowFlag.START_TRANSACTION, RowFlag.NONE,
                                                 RowFlag.END_TRANSACTION))


class Rollover(str, Enum):
    HOURLY = "hourly"
    DAILY = "daily"
    FIXED = "fixed"


class LoggerError(RuntimeError):
    """Base of the logger's own errors."""


class LoggerClosedError(LoggerError):
    """The logger was closed."""


class LoggerWriterError(LoggerError):
    """The writer thread failed; ``__cause__`` is what it failed with.  The logger is stopped."""


def _system_clock() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_I64_MIN = -(2**63)


# --------------------------------------------------------------------------------------------
# Per-value checks for single rows: run on the caller, so bad values raise there.


def _dt_to_ns(v: dt.datetime) -> int:
    if v.tzinfo is None:
        v = v.replace(tzinfo=dt.timezone.utc)
    d = v - _EPOCH
    return (d.days * 86400 + d.seconds) * 1_000_000_000 + d.microseconds * 1000


def _value_normalizer(col: Column, row_size: int) -> Callable[[Any], Any]:
    """A function turning one user value of ``col`` into the Python value its Arrow array is
    built from (None for null), or raising TypeError/ValueError."""
    name, t = col.name, col.type

    def bad(v: Any, why: str = "") -> Exception:
        return TypeError(f"column {name} ({t.value}): cannot log {type(v).__name__} {v!r}{why}")

    if t in (ColumnType.BYTE, ColumnType.SHORT, ColumnType.INT, ColumnType.LONG):
        bits = t.width * 8
        lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1

        def norm_int(v: Any) -> Any:
            if v is None:
                return None
            if type(v) is not int:
                if not isinstance(v, (int, np.integer)):
                    raise bad(v)
                v = int(v)
            if lo <= v <= hi:
                return v
            raise ValueError(f"column {name} ({t.value}): {v} is out of range [{lo}, {hi}]")

        return norm_int

    if t in (ColumnType.FLOAT, ColumnType.DOUBLE):

        def norm_float(v: Any) -> Any:
            if v is None or type(v) is float:
                return v
            if isinstance(v, (float, int, np.floating, np.integer)):
                return float(v)
            raise bad(v)

        return norm_float

    if t is ColumnType.BOOL:

        def norm_bool(v: Any) -> Any:
            if v is None or v is True or v is False:
                return v
            if isinstance(v, np.bool_):
                return bool(v)
            if isinstance(v, (int, np.integer)) and v in (0, 1):
                return bool(v)
            raise bad(v)

        return norm_bool

    if t is ColumnType.CHAR:

        def norm_char(v: Any) -> Any:
            if v is None:
                return None
            if isinstance(v, str):
                if len(v) == 1 and ord(v) <= 0xFFFF:
                    return ord(v)
                raise bad(v, ": a char is one UTF-16 code unit")
            if isinstance(v, (int, np.integer)) and not isinstance(v, bool) and 0 <= v <= 0xFFFF:
                return int(v)
            raise bad(v)

        return norm_char

    if t is ColumnType.STRING:
        limit = MAX_FRAME_PAYLOAD - row_size

        def norm_str(v: Any) -> Any:
            if v is None:
                return None
            if type(v) is not str:
                if not isinstance(v, str):
                    raise bad(v)
                v = str(v)
            if not v.isascii() or len(v) > limit:
                try:
                    n = len(v.encode())
                except UnicodeEncodeError as e:
                    raise ValueError(f"column {name}: not encodable as UTF-8: {e}") from None
                if n > limit:
                    raise ValueError(f"column {name}: a {n}-byte string exceeds the frame limit")
            return v

        return norm_str

    if t is ColumnType.TIMESTAMP:

        def norm_ts(v: Any) -> Any:
            if v is None:
                return None
            if type(v) is int:
                pass
            elif isinstance(v, dt.datetime):
                ns = getattr(v, "value", None)  # pandas.Timestamp: exact nanoseconds
                if isinstance(ns, (int, np.integer)) and hasattr(v, "nanosecond"):
                    return None if ns == _I64_MIN else int(ns)
                return _dt_to_ns(v)
            elif isinstance(v, np.datetime64):
                if np.isnat(v):
                    return None
                return int(v.astype("datetime64[ns]").astype(np.int64))
            elif isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
                v = int(v)
            else:
                raise bad(v, " (use int ns since the epoch, datetime or numpy.datetime64)")
            if not _I64_MIN <= v < 2**63:
                raise ValueError(f"column {name}: timestamp {v} does not fit in 64 bits")
            return v

        return norm_ts

    raise AssertionError(t)  # pragma: no cover


def _python_values(arr: pa.Array) -> list:
    """An Arrow column's values as the Python values a partition function receives."""
    if pa.types.is_timestamp(arr.type):
        arr = arr.view(pa.int64())
    return arr.to_pylist()


def _owned(value: Any) -> Any:
    """Column input that shares no memory with the caller's mutable buffers."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if hasattr(value, "__array__") and not isinstance(value, (pa.Array, pa.ChunkedArray, list, tuple)):
        return np.array(value, copy=True)
    return value


# --------------------------------------------------------------------------------------------
# Column partitions


class _PartitionFunction:
    def __init__(self, fn: Callable, schema: TableSchema, columns: Sequence[str] | None, vectorized: bool) -> None:
        self.fn = fn
        self.vectorized = vectorized
        names = schema.column_names
        if columns is not None:
            columns = [columns] if isinstance(columns, str) else list(columns)
            for c in columns:
                schema.column(c)  # KeyError for an unknown column
        self.columns: list[str] | None = columns
        self.indices = [names.index(c) for c in (columns or names)]
        self.names = [names[i] for i in self.indices]
        self.types = [schema.columns[i].type.arrow_type for i in self.indices]
        self._valid: set[str] = set()

    def check(self, value: Any) -> str:
        if value in self._valid:
            return value
        validate_name(NameKind.COLUMN_PARTITION, value)
        if len(self._valid) < 4096:
            self._valid.add(value)
        return value

    def for_row(self, row: tuple) -> str:
        """Partition of one normalized row (schema order)."""
        if self.vectorized:
            table = pa.table([pa.array([row[i]], t) for i, t in zip(self.indices, self.types)], names=self.names)
            out = self.fn(table)
            if not isinstance(out, str):
                out = pa.array(out) if not isinstance(out, (pa.Array, pa.ChunkedArray)) else out
                if len(out) != 1:
                    raise ValueError(f"partition function returned {len(out)} values for 1 row")
                out = out[0].as_py()
            return self.check(out)
        return self.check(self.fn({n: row[i] for n, i in zip(self.names, self.indices)}))

    def for_batch(self, cols: list[pa.Array]) -> tuple[list[str], np.ndarray | None]:
        """(partition names in order of first appearance, per-row index into them or None when
        every row is in the first)."""
        n = len(cols[0])
        sub = [cols[i] for i in self.indices]
        if self.vectorized:
            out = self.fn(pa.Table.from_arrays(sub, names=self.names))
            if isinstance(out, str):
                return [self.check(out)], None
            if isinstance(out, pa.ChunkedArray):
                out = out.combine_chunks()
            elif not isinstance(out, pa.Array):
                out = pa.array(out, pa.string())
            if len(out) != n:
                raise ValueError(f"partition function returned {len(out)} values for {n} rows")
            if out.null_count:
                raise ValueError("partition function returned a null partition")
            enc = out.dictionary_encode()
            codes = np.asarray(enc.indices).astype(np.int64, copy=False)
            labels = [self.check(v) for v in enc.dictionary.to_pylist()]
            return _first_appearance(labels, codes)
        if self.columns is None:
            rows = zip(*[_python_values(c) for c in sub])
            labels: list[str] = []
            index: dict[str, int] = {}
            codes = np.empty(n, np.int64)
            for k, vals in enumerate(rows):
                p = self.fn(dict(zip(self.names, vals)))
                j = index.get(p)
                if j is None:
                    j = index[p] = len(labels)
                    labels.append(self.check(p))
                codes[k] = j
            return _first_appearance(labels, codes)
        # One call per distinct combination of the named columns.
        key = np.zeros(n, np.int64)
        dicts = []
        codes_per_col = []
        radix_ok = True
        span = 1
        for c in sub:
            enc = c.dictionary_encode(null_encoding="encode")
            codes = np.asarray(enc.indices).astype(np.int64, copy=False)
            size = max(len(enc.dictionary), 1)
            dicts.append(_python_values(enc.dictionary))
            codes_per_col.append(codes)
            span *= size
            if span >= 2**62:
                radix_ok = False
            else:
                key = key * size + codes
        if radix_ok:
            _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        else:
            _, first, inverse = np.unique(np.stack(codes_per_col, axis=1), axis=0, return_index=True,
                                          return_inverse=True)
        inverse = inverse.reshape(-1)
        labels = []
        index = {}
        combo_to_label = np.empty(len(first), np.int64)
        for u, r in enumerate(first.tolist()):
            row = {nm: d[cc[r]] for nm, d, cc in zip(self.names, dicts, codes_per_col)}
            p = self.fn(row)
            j = index.get(p)
            if j is None:
                j = index[p] = len(labels)
                labels.append(self.check(p))
            combo_to_label[u] = j
        return _first_appearance(labels, combo_to_label[inverse])


def _first_appearance(labels: list[str], codes: np.ndarray) -> tuple[list[str], np.ndarray | None]:
    """Renumber ``codes`` so that partitions number in the order their first row appears."""
    if len(labels) == 1:
        return labels, None
    present, first = np.unique(codes, return_index=True)
    order = present[np.argsort(first, kind="stable")]
    remap = np.empty(len(labels), np.int64)
    remap[order] = np.arange(len(order))
    return [labels[i] for i in order.tolist()], remap[codes]


# --------------------------------------------------------------------------------------------
# Work items and the bounded queue


class _Item:
    """Rows for the writer: ``rows`` (normalized tuples) and/or ``cols`` (Arrow columns),
    ``txn``: one transaction rather than SingleRows, ``partition`` None for "by write time"."""

    __slots__ = ("rows", "cols", "n", "txn", "partition")

    def __init__(self, rows: list | None, cols: list[pa.Array] | None, n: int, txn: bool, partition: str | None):
        self.rows = rows
        self.cols = cols
        self.n = n
        self.txn = txn
        self.partition = partition


class _Flush:
    __slots__ = ("event", "fsync")

    def __init__(self, fsync: bool) -> None:
        self.event = threading.Event()
        self.fsync = fsync


_BREAK = object()  # end the writer's current batch: the next rows start a new frame
_STOP = object()


class _RowQueue:
    """A FIFO bounded by the number of rows waiting in it."""

    def __init__(self, capacity: int) -> None:
        self._lock = threading.Lock()
        self._not_empty = threading.Condition(self._lock)
        self._not_full = threading.Condition(self._lock)
        self._items: list = []
        self._rows = 0
        self.capacity = capacity
        self.closed = False
        self.error: BaseException | None = None

    def put(self, item: Any, rows: int = 0, internal: bool = False) -> None:
        with self._lock:
            while True:
                if self.error is not None:
                    raise LoggerWriterError(f"log writer failed: {self.error!r}") from self.error
                if self.closed and not internal:
                    raise LoggerClosedError("logger is closed")
                if rows == 0 or self._rows == 0 or self._rows + rows <= self.capacity:
                    break
                self._not_full.wait()  # backpressure
            self._items.append(item)
            self._rows += rows
            if len(self._items) == 1:
                self._not_empty.notify()

    def take(self, linger: float = 0.0) -> list:
        """Everything queued; when it has to wait for the first item, it then waits ``linger``
        seconds more, so that rows logged one by one are written in batches."""
        with self._lock:
            if not self._items:
                while not self._items:
                    self._not_empty.wait()
                if linger > 0 and self._rows < self.capacity:
                    self._lock.release()
                    try:
                        time.sleep(linger)
                    finally:
                        self._lock.acquire()
            items, self._items = self._items, []
            self._rows = 0
            self._not_full.notify_all()
            return items

    def close(self) -> bool:
        """Refuse further puts; True the first time."""
        with self._lock:
            first = not self.closed
            self.closed = True
            return first

    def fail(self, error: BaseException) -> list:
        """Record the writer's failure, wake every waiting caller, return what was queued."""
        with self._lock:
            if self.error is None:
                self.error = error
            items, self._items = self._items, []
            self._rows = 0
            self._not_full.notify_all()
            return items


class _Txn:
    __slots__ = ("rows", "chunks", "n", "partition")

    def __init__(self) -> None:
        self.rows: list[tuple] = []
        self.chunks: list[list[pa.Array]] = []
        self.n = 0
        self.partition: str | None = None


# --------------------------------------------------------------------------------------------
# The builder


class IntradayLoggerBuilder:
    """Configures and builds an IntradayLogger; every setter returns the builder."""

    def __init__(self, schema: TableSchema | str | os.PathLike[str]) -> None:
        self._schema = coerce_schema(schema if isinstance(schema, TableSchema) else pathlib.Path(schema))
        self._process_name: str | None = None
        self._log_dir: pathlib.Path = pathlib.Path("var/logs")
        self._namespace_set = NamespaceSet.SYSTEM
        self._partition_value: str | None = None
        self._partition_fn: _PartitionFunction | None = None
        self._tz: dt.tzinfo = dt.timezone.utc
        self._internal_partition: str | None = None
        self._suffix: str | None = None
        self._format_suffix: str | None = None
        self._rollover = Rollover.HOURLY
        self._fixed_stamp: dt.datetime | None = None
        self._queue_rows = _DEFAULT_QUEUE_ROWS
        self._max_open = _DEFAULT_MAX_OPEN_FILES
        self._linger = _DEFAULT_WRITE_DELAY
        self._clock: Callable[[], dt.datetime] = _system_clock
        self._host_name: Callable[[], str] = socket.gethostname

    def set_process_name(self, name: str) -> "IntradayLoggerBuilder":
        """Names the writing process; prefixes an internal partition taken from the host name."""
        if not isinstance(name, str) or not name:
            raise ValueError("process name must be a non-empty string")
        self._process_name = name
        return self

    def set_log_dir(self, path: str | os.PathLike[str]) -> "IntradayLoggerBuilder":
        self._log_dir = pathlib.Path(path)
        return self

    def set_namespace_set(self, value: str | NamespaceSet) -> "IntradayLoggerBuilder":
        """``"System"`` (default) or ``"User"``."""
        try:
            self._namespace_set = NamespaceSet(value)
        except ValueError:
            raise ValueError(f"namespace set must be 'System' or 'User', not {value!r}") from None
        return self

    def set_column_partition_value(self, value: str) -> "IntradayLoggerBuilder":
        """Every row goes to this column partition (takes precedence over everything else)."""
        self._partition_value = validate_name(NameKind.COLUMN_PARTITION, value)
        return self

    def set_column_partition_function(
        self, fn: Callable[[Any], Any], *, columns: Sequence[str] | str | None = None, vectorized: bool = False
    ) -> "IntradayLoggerBuilder":
        """Compute each row's column partition.

        By default ``fn(row) -> str`` gets a dict of column name to value (timestamps as int ns,
        chars as int, nulls None); with ``columns`` only those columns, and ``log_batch`` calls it
        once per distinct combination of their values.  With ``vectorized=True``,
        ``fn(table) -> str | array of str`` gets a pyarrow Table (of ``columns`` or all columns)
        and returns one partition for all rows or one per row.
        """
        if not callable(fn):
            raise TypeError("the column partition function must be callable")
        self._partition_fn = _PartitionFunction(fn, self._schema, columns, vectorized)
        return self

    def set_time_zone_name(self, name: str) -> "IntradayLoggerBuilder":
        """Time zone of the write-time date partition, of hourly rollover and of file names."""
        try:
            self._tz = zoneinfo.ZoneInfo(name)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {name!r}") from None
        return self

    def set_internal_partition(self, name: str) -> "IntradayLoggerBuilder":
        """Use this internal partition instead of one derived from the host name."""
        self._internal_partition = validate_name(NameKind.INTERNAL_PARTITION, name)
        return self

    def set_internal_partition_suffix(self, suffix: str | None) -> "IntradayLoggerBuilder":
        self._suffix = suffix or None
        return self

    def set_log_format_suffix(self, suffix: str | int | None) -> "IntradayLoggerBuilder":
        """Appended last to the internal partition (an int is written in decimal)."""
        self._format_suffix = None if suffix is None or suffix == "" else str(suffix)
        return self

    def set_rollover(self, mode: Rollover | str, fixed_timestamp: dt.datetime | None = None) -> "IntradayLoggerBuilder":
        """``hourly`` (default), ``daily`` or ``fixed``; ``fixed_timestamp`` names the fixed files
        (default: the time the logger is built)."""
        self._rollover = Rollover(mode)
        if fixed_timestamp is not None and fixed_timestamp.tzinfo is None:
            fixed_timestamp = fixed_timestamp.replace(tzinfo=dt.timezone.utc)
        self._fixed_stamp = fixed_timestamp
        return self

    def set_queue_size(self, rows: int) -> "IntradayLoggerBuilder":
        """At most this many rows wait for the writer; callers block beyond it."""
        if int(rows) < 1:
            raise ValueError("queue size must be at least 1 row")
        self._queue_rows = int(rows)
        return self

    def set_max_write_delay(self, seconds: float) -> "IntradayLoggerBuilder":
        """How long the writer, woken by a row, waits for more to write with it (default 2 ms;
        0 writes at once).  Bounds how late a row reaches the OS under light load."""
        if not 0 <= float(seconds) <= 1:
            raise ValueError("write delay must be between 0 and 1 second")
        self._linger = float(seconds)
        return self

    def set_max_open_files(self, n: int) -> "IntradayLoggerBuilder":
        """Files kept open at once (least recently written ones are closed, and reopened to
        append if written again)."""
        if int(n) < 1:
            raise ValueError("max open files must be at least 1")
        self._max_open = int(n)
        return self

    def set_clock(self, clock: Callable[[], dt.datetime]) -> "IntradayLoggerBuilder":
        """The source of "now" (a datetime; naive means UTC), read by the writer thread; for
        tests of rollover and partitions."""
        if not callable(clock):
            raise TypeError("clock must be callable")
        self._clock = clock
        return self

    def internal_partition(self) -> str:
        """The internal partition this configuration writes to."""
        if self._internal_partition is not None:
            base = self._internal_partition
        else:
            base = legalize(self._host_name())
            if self._process_name:
                base = legalize(f"{self._process_name}_{base}")
        parts = [base] + [p for p in (self._suffix, self._format_suffix) if p]
        return validate_name(NameKind.INTERNAL_PARTITION, "_".join(parts))

    def build(self) -> "IntradayLogger":
        return IntradayLogger(self)


# --------------------------------------------------------------------------------------------
# The logger


_LIVE: "weakref.WeakSet[IntradayLogger]" = weakref.WeakSet()


@atexit.register
def _close_all_at_exit() -> None:
    for log in list(_LIVE):
        with contextlib.suppress(Exception):
            log.close()


class IntradayLogger:
    """Writes rows of one table to binary logs; see the module docstring.  Thread-safe."""

    def __init__(self, b: IntradayLoggerBuilder) -> None:
        self.schema: TableSchema = b._schema
        self.process_name = b._process_name
        self.namespace_set: NamespaceSet = b._namespace_set
        self.internal_partition: str = b.internal_partition()
        self.rollover: Rollover = b._rollover
        self.log_dir = b._log_dir
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._partition_value = b._partition_value
        self._partition_fn = None if b._partition_value is not None else b._partition_fn
        self._tz = b._tz
        self._clock = b._clock
        self._last_now: dt.datetime | None = None
        fixed = b._fixed_stamp
        if self.rollover is Rollover.FIXED and fixed is None:
            fixed = self._now()
        self._fixed_stamp = fixed
        self._max_open = b._max_open
        self._linger = b._linger

        lay = layout_for(self.schema)
        self._row_size = lay.row_size
        self._names = self.schema.column_names
        self._name_set = frozenset(self._names)
        self._norms = [(c.name, _value_normalizer(c, lay.row_size)) for c in self.schema.columns]
        self._types = [c.type.arrow_type for c in self.schema.columns]
        self._string_idx = [i for i, c in enumerate(self.schema.columns) if c.type is ColumnType.STRING]
        self._long_string = (MAX_FRAME_PAYLOAD - lay.row_size) // 4  # chars; beyond, check bytes

        self._queue = _RowQueue(b._queue_rows)
        self._local = threading.local()
        self._files_lock = threading.Lock()
        self._files: list[pathlib.Path] = []
        self._open: "collections.OrderedDict[tuple, BinlogWriter]" = collections.OrderedDict()
        self._paths: dict[tuple, pathlib.Path] = {}
        self._last_stamp: dict[str, dt.datetime] = {}
        self._period: Any = None
        self._time_partition: str | None = None
        self._close_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"dis-logger-{self.schema.key}", daemon=True)
        self._thread.start()
        _LIVE.add(self)

    # -- public API ----------------------------------------------------------------------------

    @property
    def files(self) -> list[pathlib.Path]:
        """Every file this logger has written to, in the order it first opened them."""
        with self._files_lock:
            return list(self._files)

    @property
    def closed(self) -> bool:
        return self._queue.closed

    def log(self, row: Mapping[str, Any] | None = None, /, **values: Any) -> None:
        """Log one row given as keyword arguments and/or a mapping; missing columns are null.
        Outside a transaction it is a SingleRow; inside, part of this thread's transaction."""
        if row is not None:
            values = {**row, **values} if values else row
        if not self._name_set.issuperset(values):
            unknown = sorted(set(values) - self._name_set)
            raise ValueError(f"{self.schema.key} has no column {unknown[0]!r}")
        get = values.get
        tup = tuple([norm(get(name)) for name, norm in self._norms])
        if self._string_idx:
            self._check_row_size(tup)
        fn = self._partition_fn
        txn = getattr(self._local, "txn", None)
        if txn is not None:
            self._check_open()
            part = fn.for_row(tup) if fn is not None else self._partition_value
            self._txn_partition(txn, part)
            txn.rows.append(tup)
            txn.n += 1
            if len(txn.rows) >= _TXN_COMPACT_ROWS:
                txn.chunks.append(self._rows_to_columns(txn.rows))
                txn.rows = []
            return
        part = fn.for_row(tup) if fn is not None else self._partition_value
        self._queue.put(_Item([tup], None, 1, False, part), 1)

    @contextlib.contextmanager
    def transaction(self) -> Iterator["IntradayLogger"]:
        """Rows logged by this thread inside the block are written as one transaction when it
        ends normally, and never written when it raises."""
        if getattr(self._local, "txn", None) is not None:
            raise RuntimeError("transactions do not nest")
        self._check_open()
        txn = self._local.txn = _Txn()
        try:
            yield self
        except BaseException:
            self._local.txn = None
            if txn.n:
                with contextlib.suppress(LoggerError):
                    self._queue.put(_BREAK)
            raise
        self._local.txn = None
        if not txn.n:
            return
        if txn.chunks:
            if txn.rows:
                txn.chunks.append(self._rows_to_columns(txn.rows))
            cols = txn.chunks[0] if len(txn.chunks) == 1 else [
                pa.concat_arrays([ch[i] for ch in txn.chunks]) for i in range(len(self._names))
            ]
            item = _Item(None, cols, txn.n, True, txn.partition)
        else:
            item = _Item(txn.rows, None, txn.n, True, txn.partition)
        self._queue.put(item, txn.n)

    def log_batch(self, data: pa.Table | pa.RecordBatch | Mapping[str, Any], atomic: bool = False) -> None:
        """Log many rows at once: a pyarrow Table or RecordBatch, or a dict of column name to
        values (lists, numpy arrays, pyarrow arrays); missing columns are null.  Each row is a
        SingleRow, or with ``atomic=True`` the batch is one transaction (which must then fall
        in one column partition).  Inside ``transaction()`` the rows join that transaction."""
        if isinstance(data, Mapping):
            data = {k: _owned(v) for k, v in data.items()}
        cols = normalize_columns(self.schema, data)
        n = len(cols[0])
        if n == 0:
            return
        self._check_batch_row_sizes(cols, n)
        txn = getattr(self._local, "txn", None)
        self._check_open()
        fn = self._partition_fn
        if fn is None:
            labels, codes = [self._partition_value], None
        else:
            labels, codes = fn.for_batch(cols)
        if txn is not None or atomic:
            if len(labels) > 1:
                raise ValueError(
                    f"a transaction must fall in one column partition; this batch spans {labels[:5]}")
            if txn is not None:
                self._txn_partition(txn, labels[0])
                if txn.rows:
                    txn.chunks.append(self._rows_to_columns(txn.rows))
                    txn.rows = []
                txn.chunks.append(cols)
                txn.n += n
                return
            self._queue.put(_Item(None, cols, n, True, labels[0]), n)
            return
        if codes is None:
            self._queue.put(_Item(None, cols, n, False, labels[0]), n)
            return
        order = np.argsort(codes, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=len(labels)))]).tolist()
        take = pa.array(order)
        taken = [c.take(take) for c in cols]
        for j, label in enumerate(labels):
            a, b = bounds[j], bounds[j + 1]
            self._queue.put(_Item(None, [c.slice(a, b - a) for c in taken], b - a, False, label), b - a)

    def flush(self, timeout: float | None = None, fsync: bool = False) -> None:
        """Block until everything logged so far is written to the OS (and fsynced with
        ``fsync=True``)."""
        f = _Flush(fsync)
        self._queue.put(f)
        if not f.event.wait(timeout):
            raise TimeoutError("logger flush timed out")
        self._check_error()

    def close(self) -> None:
        """Write everything queued, fsync and close the files, stop the writer thread.  Raises
        LoggerWriterError if the writer failed.  Idempotent."""
        with self._close_lock:
            if self._queue.close():
                self._local.txn = None
                with contextlib.suppress(LoggerError):
                    self._queue.put(_STOP, internal=True)
            if self._thread is not threading.current_thread():
                self._thread.join()
        _LIVE.discard(self)
        self._check_error()

    def __enter__(self) -> "IntradayLogger":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"IntradayLogger({self.schema.key}, {self.namespace_set.value}, {self.internal_partition}, "
                f"dir={str(self.log_dir)!r}, {self.rollover.value})")

    # -- caller-side helpers ---------------------------------------------------------------------

    def _check_error(self) -> None:
        e = self._queue.error
        if e is not None:
            raise LoggerWriterError(f"log writer failed: {e!r}") from e

    def _check_open(self) -> None:
        self._check_error()
        if self._queue.closed:
            raise LoggerClosedError("logger is closed")

    def _check_row_size(self, tup: tuple) -> None:
        total = 0
        for i in self._string_idx:
            s = tup[i]
            if s is not None:
                total += len(s)
        if total > self._long_string:
            size = self._row_size + sum(len(tup[i].encode()) for i in self._string_idx if tup[i] is not None)
            if size > MAX_FRAME_PAYLOAD:
                raise ValueError(f"a row of {size} bytes exceeds the frame limit of {MAX_FRAME_PAYLOAD}")

    def _check_batch_row_sizes(self, cols: list[pa.Array], n: int) -> None:
        if not self._string_idx:
            return
        strings = [cols[i] for i in self._string_idx]
        if n * self._row_size + sum(_string_bytes(s) for s in strings) <= MAX_FRAME_PAYLOAD:
            return
        if int(_row_sizes(strings, self._row_size).max()) > MAX_FRAME_PAYLOAD:
            raise ValueError(f"a row exceeds the frame limit of {MAX_FRAME_PAYLOAD} bytes")

    def _txn_partition(self, txn: _Txn, part: str | None) -> None:
        if txn.n == 0:
            txn.partition = part
        elif part != txn.partition:
            raise ValueError(
                f"a transaction must fall in one column partition: {part!r} after {txn.partition!r}")

    def _rows_to_columns(self, rows: list[tuple]) -> list[pa.Array]:
        return [pa.array(col, t) for col, t in zip(zip(*rows), self._types)]

    # -- writer thread ---------------------------------------------------------------------------

    def _now(self) -> dt.datetime:
        t = self._clock()
        if not isinstance(t, dt.datetime):
            raise TypeError(f"clock returned {type(t).__name__}, not a datetime")
        if t.tzinfo is None:
            t = t.replace(tzinfo=dt.timezone.utc)
        if self._last_now is not None and t < self._last_now:
            t = self._last_now  # never backwards: files and partitions follow in order
        self._last_now = t
        return t

    def _run(self) -> None:
        items: list = []
        try:
            while True:
                items = self._queue.take(self._linger)
                if self._process(items):
                    break
        except BaseException as e:  # noqa: BLE001 - surfaced to callers on their next call
            self._stop_files(e)
            for it in items + self._queue.fail(e):
                if isinstance(it, _Flush):
                    it.event.set()  # its flush() then raises the error
            return
        self._stop_files(None)

    def _stop_files(self, error: BaseException | None) -> None:
        first: BaseException | None = None
        for w in list(self._open.values()):
            try:
                self._close_writer(w, fsync=error is None)
            except BaseException as e:  # noqa: BLE001
                first = first or e
        self._open.clear()
        if first is None and error is None:
            with contextlib.suppress(OSError):
                fd = os.open(self.log_dir, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        if first is not None and error is None:
            self._queue.fail(first)

    def _process(self, items: list) -> bool:
        """Write a list of queued items in order; True when the logger is to stop."""
        now = self._now()
        group: list[_Item] = []
        group_part: str | None = None
        group_rows = 0
        stop = False
        for it in items:
            if type(it) is _Item:
                part = it.partition if it.partition is not None else self._time_partition_for(now)
                if group and (part != group_part or group_rows + it.n > _COALESCE_ROWS):
                    self._write_group(group_part, group, now)
                    group, group_rows = [], 0
                if it.n >= _COALESCE_ROWS:
                    self._write_group(part, [it], now)
                    continue
                group.append(it)
                group_part = part
                group_rows += it.n
                continue
            if group:
                self._write_group(group_part, group, now)
                group, group_rows = [], 0
            if it is _BREAK:
                continue
            if isinstance(it, _Flush):
                if it.fsync:
                    for w in self._open.values():
                        w.fsync()
                it.event.set()
            elif it is _STOP:
                stop = True
        if group:
            self._write_group(group_part, group, now)
        return stop

    def _time_partition_for(self, now: dt.datetime) -> str:
        return now.astimezone(self._tz).date().isoformat()

    def _write_group(self, part: str, items: list[_Item], now: dt.datetime) -> None:
        pieces: list[list[pa.Array]] = []
        pending_rows: list[tuple] = []
        txns: list[tuple[int, int]] = []  # (first row, row count) of each multi-row transaction
        pos = 0
        for it in items:
            if it.rows is not None:
                pending_rows.extend(it.rows)
            else:
                if pending_rows:
                    pieces.append(self._rows_to_columns(pending_rows))
                    pending_rows = []
                pieces.append(it.cols)
            if it.txn and it.n > 1:
                txns.append((pos, it.n))
            pos += it.n
        if pending_rows:
            pieces.append(self._rows_to_columns(pending_rows))
        if len(pieces) == 1:
            cols = pieces[0]
        else:
            cols = [pa.concat_arrays([p[i] for p in pieces]) for i in range(len(self._names))]
        flags = np.full(pos, _SINGLE, np.uint8)
        for a, k in txns:
            flags[a] = _START
            flags[a + 1 : a + k - 1] = _NONE
            flags[a + k - 1] = _END
        writer = self._writer_for(part, now)
        n = len(flags)
        strings = [cols[i] for i in self._string_idx]
        if not strings or n * self._row_size + sum(_string_bytes(s) for s in strings) <= MAX_FRAME_PAYLOAD:
            writer.write_rows(cols, flags)
            return
        # Big strings: cut so that no frame payload exceeds the format's limit.
        cum = np.zeros(n + 1, np.int64)
        np.cumsum(_row_sizes(strings, self._row_size), out=cum[1:])
        a = 0
        while a < n:
            b = int(np.searchsorted(cum, cum[a] + MAX_FRAME_PAYLOAD, side="right")) - 1
            b = min(max(b, a + 1), n)
            writer.write_rows([c.slice(a, b - a) for c in cols], flags[a:b])
            a = b

    # -- files -------------------------------------------------------------------------------------

    def _writer_for(self, part: str, now: dt.datetime) -> BinlogWriter:
        local = now.astimezone(self._tz)
        if self.rollover is Rollover.HOURLY:
            period = (local.date(), local.hour)
            if period != self._period:
                for key in [k for k in self._open if k[1] != period]:
                    self._close_writer(self._open.pop(key), fsync=True)
                self._paths = {k: v for k, v in self._paths.items() if k[1] == period}
                self._period = period
        else:
            period = None
            if self._partition_value is None and self._partition_fn is None:
                tp = self._time_partition_for(now)
                if tp != self._time_partition:
                    for key in [k for k in self._open if k[0] != tp]:
                        self._close_writer(self._open.pop(key), fsync=True)
                    self._time_partition = tp
        key = (part, period)
        w = self._open.get(key)
        if w is not None:
            self._open.move_to_end(key)
            return w
        path = self._paths.get(key)
        if path is None:
            path = self._new_path(part, local)
            self._paths[key] = path
        w = BinlogWriter(path, self.schema)
        self._open[key] = w
        with self._files_lock:
            if path not in self._files:
                self._files.append(path)
        while len(self._open) > self._max_open:
            _, old = self._open.popitem(last=False)
            self._close_writer(old, fsync=True)
        return w

    def _close_writer(self, w: BinlogWriter, fsync: bool) -> None:
        try:
            if fsync:
                w.fsync()
        finally:
            w.close()

    def _file_name(self, part: str, stamp: dt.datetime) -> LogFileName:
        return LogFileName(self.schema.namespace, self.schema.table, self.namespace_set,
                           self.internal_partition, part, stamp)

    def _new_path(self, part: str, local: dt.datetime) -> pathlib.Path:
        if self.rollover is Rollover.FIXED:
            stamp = self._fixed_stamp.astimezone(self._tz)
            stamp = stamp.replace(microsecond=stamp.microsecond // 1000 * 1000)
            return self.log_dir / self._file_name(part, stamp).format()
        stamp = local.replace(microsecond=local.microsecond // 1000 * 1000)
        latest = self._last_stamp.get(part)
        for existing in self._existing_stamps(part):
            if latest is None or existing > latest:
                latest = existing
        if latest is not None and stamp <= latest:
            stamp = (latest + dt.timedelta(milliseconds=1)).astimezone(self._tz)
        while True:
            path = self.log_dir / self._file_name(part, stamp).format()
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            except FileExistsError:
                stamp = stamp + dt.timedelta(milliseconds=1)
                continue
            self._last_stamp[part] = stamp
            return path

    def _existing_stamps(self, part: str) -> Iterator[dt.datetime]:
        """Time stamps of the files of this location already in the directory."""
        prefix = f"{self.schema.namespace}.{self.schema.table}."
        try:
            entries = os.listdir(self.log_dir)
        except OSError:
            return
        for name in entries:
            if not name.startswith(prefix):
                continue
            parsed = LogFileName.try_parse(name)
            if (parsed is not None and parsed.internal_partition == self.internal_partition
                    and parsed.column_partition == part):
                yield parsed.timestamp


def _string_offsets(arr: pa.Array) -> np.ndarray:
    offs = arr.buffers()[1]
    return np.frombuffer(offs, dtype=np.int32, count=arr.offset + len(arr) + 1)[arr.offset:]


def _string_bytes(arr: pa.Array) -> int:
    """Bytes of string data an Arrow string array spans (an upper bound of what it encodes to)."""
    if len(arr) == 0 or arr.buffers()[1] is None:
        return 0
    offs = _string_offsets(arr)
    return int(offs[-1] - offs[0])


def _row_sizes(strings: list[pa.Array], row_size: int) -> np.ndarray:
    sizes = np.full(len(strings[0]), row_size, np.int64)
    for s in strings:
        if s.buffers()[1] is not None:
            sizes += np.diff(_string_offsets(s))
    return sizes
