"""The work items callers hand to the writer thread, and the queue bounded in rows between them."""

from __future__ import annotations

import threading
import time
from typing import Any

import pyarrow as pa

from disd.logger.errors import LoggerClosedError, LoggerWriterError


class Item:
    """Rows for the writer: ``rows`` (normalized tuples) and/or ``cols`` (Arrow columns),
    ``txn``: one transaction rather than SingleRows, ``partition`` None for "by write time"."""

    __slots__ = ("rows", "cols", "n", "txn", "partition")

    def __init__(self, rows: list | None, cols: list[pa.Array] | None, n: int, txn: bool, partition: str | None) -> None:
        self.rows = rows
        self.cols = cols
        self.n = n
        self.txn = txn
        self.partition = partition


class Flush:
    __slots__ = ("event", "fsync")

    def __init__(self, fsync: bool) -> None:
        self.event = threading.Event()
        self.fsync = fsync


BREAK = object()  # end the writer's current batch: the next rows start a new frame
STOP = object()


class RowQueue:
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
