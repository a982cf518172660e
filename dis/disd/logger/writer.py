"""The writer thread: takes everything queued at once, turns consecutive small items of one file
into one batch of columns with its row flags, and hands it to the file's ``BinlogWriter`` (one
``write`` per batch, cut into frames there)."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa

from disd.binlog import RowFlag
from disd.logger.convert import rows_to_columns
from disd.logger.files import LogFiles
from disd.logger.rowqueue import BREAK, STOP, Flush, Item, RowQueue

#: Items smaller than this are merged with their neighbours into one batch by the writer;
#: larger ones are written as they are.
COALESCE_ROWS = 65536
_SINGLE, _START, _NONE, _END = (int(f) for f in (RowFlag.SINGLE_ROW, RowFlag.START_TRANSACTION, RowFlag.NONE,
                                                 RowFlag.END_TRANSACTION))


class LogWriter:
    """The one thread that writes a logger's files.  If it fails it records the error in the
    queue (every later call raises it), releases waiting flushes and closes the files."""

    def __init__(self, queue: RowQueue, files: LogFiles, clock: Callable[[], dt.datetime],
                 types: Sequence[pa.DataType], linger: float, name: str) -> None:
        self._queue = queue
        self._files = files
        self._clock = clock
        self._types = list(types)
        self._linger = linger
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        items: list = []
        try:
            while True:
                items = self._queue.take(self._linger)
                if self._process(items):
                    break
        except BaseException as e:  # noqa: BLE001 - surfaced to callers on their next call
            self._files.close_all(fsync=False)
            for it in items + self._queue.fail(e):
                if isinstance(it, Flush):
                    it.event.set()  # its flush() then raises the error
            return
        first = self._files.close_all(fsync=True)
        if first is not None:
            self._queue.fail(first)

    def _process(self, items: list) -> bool:
        """Write a list of queued items in order; True when the logger is to stop."""
        now = self._clock()
        group: list[Item] = []
        group_part = ""  # the partition of ``group`` (set with its first item)
        group_rows = 0
        stop = False
        for it in items:
            if type(it) is Item:
                part = it.partition if it.partition is not None else self._files.time_partition(now)
                if group and (part != group_part or group_rows + it.n > COALESCE_ROWS):
                    self._write_group(group_part, group, now)
                    group, group_rows = [], 0
                if it.n >= COALESCE_ROWS:
                    self._write_group(part, [it], now)
                    continue
                group.append(it)
                group_part = part
                group_rows += it.n
                continue
            if group:
                self._write_group(group_part, group, now)
                group, group_rows = [], 0
            if it is BREAK:
                continue
            if isinstance(it, Flush):
                if it.fsync:
                    self._files.fsync()
                it.event.set()
            elif it is STOP:
                stop = True
        if group:
            self._write_group(group_part, group, now)
        return stop

    def _write_group(self, part: str, items: list[Item], now: dt.datetime) -> None:
        pieces: list[list[pa.Array]] = []
        pending_rows: list[tuple] = []
        txns: list[tuple[int, int]] = []  # (first row, row count) of each multi-row transaction
        pos = 0
        for it in items:
            if it.rows is not None:
                pending_rows.extend(it.rows)
            else:
                if pending_rows:
                    pieces.append(rows_to_columns(pending_rows, self._types))
                    pending_rows = []
                assert it.cols is not None  # an item holds rows or columns
                pieces.append(it.cols)
            if it.txn and it.n > 1:
                txns.append((pos, it.n))
            pos += it.n
        if pending_rows:
            pieces.append(rows_to_columns(pending_rows, self._types))
        if len(pieces) == 1:
            cols = pieces[0]
        else:
            cols = [pa.concat_arrays([p[i] for p in pieces]) for i in range(len(self._types))]
        flags = np.full(pos, _SINGLE, np.uint8)
        for a, k in txns:
            flags[a] = _START
            flags[a + 1 : a + k - 1] = _NONE
            flags[a + k - 1] = _END
        self._files.writer_for(part, now).write_rows(cols, flags)
