"""The rows a location appended that its last-by state has not absorbed yet (``Pending``), so
a publish's update takes them from memory instead of reading the column files back.

Split from ``disd.storage.lastby`` (the state itself): this is the location's side of the
hand-over, called under the location's lock as rows are appended and rolled back.  The rows
come as Arrow arrays from either ingest path: the reference's decoded batches
(``storage.decodedrows``), or the compiled path's appended column bytes (``tail_columns``).
"""

from __future__ import annotations

import collections
import threading
from typing import Sequence

import pyarrow as pa

from disd.schema import ColumnType, TableSchema


class Pending:
    """The rows appended to a location that its state has not absorbed yet, as the Arrow arrays
    ingestion appended (zero-copy slices of the decoded batches, each ``(first row, columns)``).

    Why: otherwise a publish's state update reads its rows back from the column files, and
    decoding them is a large share of its work.  The location calls ``add`` and ``truncate`` under its lock,
    with the same row numbers as its files (a rollback cuts back to the committed rows, never
    below the published ones).  ``take`` needs only this object's own lock, not the location's
    (whose holder may be appending for tens of ms): rows below the published count never change
    while the epoch stands, and an update that raced a reopen is dropped by ``LastBy``'s
    generation check whatever it read.  Held rows: those between the state and the written rows,
    i.e. about one flush interval of ingestion."""

    def __init__(self) -> None:
        self._pieces: collections.deque[tuple[int, list[pa.Array]]] = collections.deque()
        self._end = 0  # the row just past the last piece
        self._lock = threading.Lock()  # a leaf: taken after the location's lock or apply_lock, never before

    def add(self, first_row: int, cols: list[pa.Array], segments: list[tuple[int, int]]) -> None:
        """Rows ``[first_row, ...)`` were appended: ``cols``' rows ``[a, b)`` of each segment."""
        with self._lock:
            self._add(first_row, cols, segments)

    def _add(self, first_row: int, cols: list[pa.Array], segments: list[tuple[int, int]]) -> None:
        if self._pieces and first_row != self._end:
            self._pieces.clear()  # not contiguous with what is held: none of it can be used
        row = first_row
        n = len(cols[0]) if cols else 0
        for a, b in segments:
            if b > a:
                self._pieces.append((row, cols if (a, b) == (0, n) else [c.slice(a, b - a) for c in cols]))
                row += b - a
        self._end = row

    def put(self, first_row: int, cols: list[pa.Array]) -> None:
        """Rows ``[first_row, ...)`` are ``cols`` (the compiled path's appended rows): whatever is
        held from ``first_row`` on was rolled back."""
        with self._lock:
            self._truncate(first_row)
            self._add(first_row, cols, [(0, len(cols[0]) if cols else 0)])

    def truncate(self, rows: int) -> None:
        """The rows from ``rows`` on are gone (rolled back)."""
        with self._lock:
            self._truncate(rows)

    def _truncate(self, rows: int) -> None:
        while self._pieces and self._pieces[-1][0] >= rows:
            self._pieces.pop()
        if self._pieces and self._end > rows:
            first, cols = self._pieces.pop()
            self._pieces.append((first, [c.slice(0, rows - first) for c in cols]))
        self._end = min(self._end, rows)

    def clear(self) -> None:
        with self._lock:
            self._pieces.clear()
            self._end = 0

    def take(self, start: int, stop: int) -> list[list[pa.Array]] | None:
        """The pieces of rows ``[start, stop)`` in order (each a list of columns), forgetting
        every held row below ``stop``; None when they are not all held (the caller reads the
        files).  Only slices (``join`` makes them columns without a copy)."""
        with self._lock:
            return self._take(start, stop)

    def _take(self, start: int, stop: int) -> list[list[pa.Array]] | None:
        while self._pieces and self._pieces[0][0] + len(self._pieces[0][1][0]) <= start:
            self._pieces.popleft()
        if not self._pieces or self._pieces[0][0] > start or self._end < stop:
            return None
        parts: list[list[pa.Array]] = []
        while self._pieces and self._pieces[0][0] < stop:
            first, cols = self._pieces.popleft()
            n = len(cols[0])
            lo, hi = max(start, first) - first, min(stop, first + n) - first
            parts.append(cols if (lo, hi) == (0, n) else [c.slice(lo, hi - lo) for c in cols])
            if first + n > stop:
                self._pieces.appendleft((stop, [c.slice(hi) for c in cols]))
        return parts


def join(parts: list[list[pa.Array]]) -> list[pa.Array | pa.ChunkedArray] | None:
    """One column each from ``Pending.take``'s pieces, as a chunked array of them (no copy: an
    update hashes the key columns and takes a few rows of the others); None when pieces of one
    column differ in Arrow type (the caller reads the files instead)."""
    if len(parts) == 1:
        return parts[0]
    out = []
    for i in range(len(parts[0])):
        pieces = [c for p in parts for c in (p[i].chunks if isinstance(p[i], pa.ChunkedArray) else [p[i]])]
        if any(a.type != pieces[0].type for a in pieces):
            return None
        out.append(pa.chunked_array(pieces, pieces[0].type))
    return out


def tail_columns(schema: TableSchema, n: int,
                 parts: Sequence[tuple[bytes | None, int, bytes, bytes | None]]) -> list[pa.Array]:
    """The ``n`` rows the compiled path appended (``WriteState.take_tail``'s columns: validity,
    null count, values or offsets, string data) as Arrow arrays of the columns' types, wrapping
    the copied bytes.  A fixed-width null stays its sentinel value, as in the column file (the
    update makes it null, ``lastbykeys.stored``)."""
    out = []
    for c, (validity, nulls, values, data) in zip(schema.columns, parts):
        valid = None if validity is None else pa.py_buffer(validity)
        if c.type is ColumnType.STRING:
            out.append(pa.Array.from_buffers(pa.string(), n, [valid, pa.py_buffer(values), pa.py_buffer(data or b"")],
                                             nulls))
        else:
            out.append(pa.Array.from_buffers(c.type.arrow_type, n, [valid, pa.py_buffer(values)], nulls))
    return out
