"""IntradayLogger: the calls applications make, run on the caller's thread (values are checked
and converted here, transactions collected here, then work is queued for the writer thread)."""

from __future__ import annotations

import atexit
import contextlib
import pathlib
import threading
import weakref
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa

from disd.binlog import normalize_columns
from disd.binlog.format import layout_for
from disd.logger.config import LoggerConfig, Rollover
from disd.logger.convert import RowSizeCheck, owned, rows_to_columns, value_normalizer
from disd.logger.errors import LoggerClosedError, LoggerError, LoggerFlushTimeout, LoggerValueError, LoggerWriterError
from disd.logger.files import LogFiles, MonotonicClock
from disd.logger.rowqueue import BREAK, STOP, Flush, Item, RowQueue
from disd.logger.writer import LogWriter
from disd.ownerlock import HeldLock
from disd.schema import TableSchema

#: A transaction collected on the caller is compacted to Arrow columns every this many rows.
TXN_COMPACT_ROWS = 65536


class Txn:
    """The rows of one thread's open transaction."""

    __slots__ = ("rows", "chunks", "n", "partition")

    def __init__(self) -> None:
        self.rows: list[tuple] = []
        self.chunks: list[list[pa.Array]] = []
        self.n = 0
        self.partition: str | None = None


_LIVE: "weakref.WeakSet[IntradayLogger]" = weakref.WeakSet()


@atexit.register
def _close_all_at_exit() -> None:
    for log in list(_LIVE):
        with contextlib.suppress(Exception):
            log.close()


class IntradayLogger:
    """Writes rows of one table to binary logs; see ``disd.logger``.  Thread-safe.  Built by
    ``IntradayLoggerBuilder.build``, which hands it the lock of its location
    (``disd.logger.ownership``), released by ``close()``."""

    def __init__(self, config: LoggerConfig, lock: HeldLock) -> None:
        self._location_lock = lock
        self.schema: TableSchema = config.schema
        self.process_name = config.process_name
        self.namespace_set = config.namespace_set
        self.internal_partition: str = config.internal_partition
        self.rollover: Rollover = config.rollover
        self.log_dir = config.log_dir
        self._partition_value = config.partition_value
        self._partition_fn = config.partition_fn
        clock = MonotonicClock(config.clock)
        fixed = config.fixed_stamp
        if self.rollover is Rollover.FIXED and fixed is None:
            fixed = clock()

        lay = layout_for(self.schema)
        self._names = self.schema.column_names
        self._name_set = frozenset(self._names)
        key = self.schema.key
        self._norms = [(c.name, value_normalizer(key, c, lay.row_size)) for c in self.schema.columns]
        self._types = [c.type.arrow_type for c in self.schema.columns]
        self._sizes = RowSizeCheck(lay)

        self._queue = RowQueue(config.queue_rows)
        self._local = threading.local()
        self._files = LogFiles(config, fixed)
        self._writer = LogWriter(self._queue, self._files, clock, self._types, config.write_delay,
                                 name=f"dis-logger-{self.schema.key}")
        self._close_lock = threading.Lock()
        self._writer.start()
        _LIVE.add(self)

    @property
    def files(self) -> list[pathlib.Path]:
        """Every file this logger has written to, in the order it first opened them."""
        return self._files.paths

    @property
    def closed(self) -> bool:
        return self._queue.closed

    def log(self, row: Mapping[str, Any] | None = None, /, **values: Any) -> None:
        """Log one row given as keyword arguments and/or a mapping; missing columns are null.
        Outside a transaction it is a SingleRow; inside, part of this thread's transaction."""
        given: Mapping[str, Any] = values
        if row is not None:
            given = {**row, **values} if values else row
        if not self._name_set.issuperset(given):
            unknown = sorted(set(given) - self._name_set)
            raise LoggerValueError(f"{self.schema.key} has no column {unknown[0]!r}")
        get = given.get
        tup = tuple([norm(get(name)) for name, norm in self._norms])
        if self._sizes.string_columns:
            self._sizes.check_row(tup)
        fn = self._partition_fn
        txn = getattr(self._local, "txn", None)
        if txn is not None:
            self._check_open()
            part = fn.for_row(tup) if fn is not None else self._partition_value
            self._txn_partition(txn, part)
            txn.rows.append(tup)
            txn.n += 1
            if len(txn.rows) >= TXN_COMPACT_ROWS:
                txn.chunks.append(rows_to_columns(txn.rows, self._types))
                txn.rows = []
            return
        part = fn.for_row(tup) if fn is not None else self._partition_value
        self._queue.put(Item([tup], None, 1, False, part), 1)

    @contextlib.contextmanager
    def transaction(self) -> Iterator["IntradayLogger"]:
        """Rows logged by this thread inside the block are written as one transaction when it
        ends normally, and never written when it raises."""
        if getattr(self._local, "txn", None) is not None:
            raise LoggerError("transactions do not nest")
        self._check_open()
        txn = self._local.txn = Txn()
        try:
            yield self
        except BaseException:
            self._local.txn = None
            if txn.n:
                with contextlib.suppress(LoggerError):
                    self._queue.put(BREAK)
            raise
        self._local.txn = None
        if not txn.n:
            return
        if txn.chunks:
            if txn.rows:
                txn.chunks.append(rows_to_columns(txn.rows, self._types))
            cols = txn.chunks[0] if len(txn.chunks) == 1 else [
                pa.concat_arrays([ch[i] for ch in txn.chunks]) for i in range(len(self._names))
            ]
            item = Item(None, cols, txn.n, True, txn.partition)
        else:
            item = Item(txn.rows, None, txn.n, True, txn.partition)
        self._queue.put(item, txn.n)

    def log_batch(self, data: pa.Table | pa.RecordBatch | Mapping[str, Any], atomic: bool = False) -> None:
        """Log many rows at once: a pyarrow Table or RecordBatch, or a dict of column name to
        values (lists, numpy arrays, pyarrow arrays); missing columns are null.  Each row is a
        SingleRow, or with ``atomic=True`` the batch is one transaction (which must then fall
        in one column partition).  Inside ``transaction()`` the rows join that transaction."""
        if isinstance(data, Mapping):
            data = {k: owned(v) for k, v in data.items()}
        cols = normalize_columns(self.schema, data)
        n = len(cols[0])
        if n == 0:
            return
        self._sizes.check_batch(cols)
        txn = getattr(self._local, "txn", None)
        self._check_open()
        fn = self._partition_fn
        labels: Sequence[str | None]
        codes: np.ndarray | None
        if fn is None:
            labels, codes = [self._partition_value], None
        else:
            labels, codes = fn.for_batch(cols)
        if txn is not None or atomic:
            if len(labels) > 1:
                raise LoggerValueError(
                    f"a transaction must fall in one column partition; this batch spans {labels[:5]}")
            if txn is not None:
                self._txn_partition(txn, labels[0])
                if txn.rows:
                    txn.chunks.append(rows_to_columns(txn.rows, self._types))
                    txn.rows = []
                txn.chunks.append(cols)
                txn.n += n
                return
            self._queue.put(Item(None, cols, n, True, labels[0]), n)
            return
        if codes is None:
            self._queue.put(Item(None, cols, n, False, labels[0]), n)
            return
        order = np.argsort(codes, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=len(labels)))]).tolist()
        take = pa.array(order)
        taken = [c.take(take) for c in cols]
        for j, label in enumerate(labels):
            a, b = bounds[j], bounds[j + 1]
            self._queue.put(Item(None, [c.slice(a, b - a) for c in taken], b - a, False, label), b - a)

    def flush(self, timeout: float | None = None, fsync: bool = False) -> None:
        """Block until everything logged so far is written to the OS (and fsynced with
        ``fsync=True``)."""
        f = Flush(fsync)
        self._queue.put(f)
        if not f.event.wait(timeout):
            raise LoggerFlushTimeout("logger flush timed out")
        self._check_error()

    def close(self) -> None:
        """Write everything queued, fsync and close the files, stop the writer thread.  Raises
        LoggerWriterError if the writer failed.  Idempotent."""
        with self._close_lock:
            if self._queue.close():
                self._local.txn = None
                with contextlib.suppress(LoggerError):
                    self._queue.put(STOP, internal=True)
            if self._writer.thread is not threading.current_thread():
                self._writer.thread.join()
                self._location_lock.release()  # the files are closed: another logger may take it
        _LIVE.discard(self)
        self._check_error()

    def __enter__(self) -> "IntradayLogger":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"IntradayLogger({self.schema.key}, {self.namespace_set.value}, {self.internal_partition}, "
                f"dir={str(self.log_dir)!r}, {self.rollover.value})")

    def _check_error(self) -> None:
        e = self._queue.error
        if e is not None:
            raise LoggerWriterError(f"log writer failed: {e!r}") from e

    def _check_open(self) -> None:
        self._check_error()
        if self._queue.closed:
            raise LoggerClosedError("logger is closed")

    def _txn_partition(self, txn: Txn, part: str | None) -> None:
        if txn.n == 0:
            txn.partition = part
        elif part != txn.partition:
            raise LoggerValueError(
                f"a transaction must fall in one column partition: {part!r} after {txn.partition!r}")
