"""Values on the caller's thread: one user value to what its Arrow array is built from, rows to
Arrow columns, and the refusal of rows too big for a frame.  Bad values raise here, from
``log``/``log_batch`` itself, and never reach the writer."""

from __future__ import annotations

import datetime as dt
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from disd.logger.errors import LoggerTypeError, LoggerValueError
from disd.binlog.format import MAX_FRAME_PAYLOAD, RowLayout
from disd.binlog.normalize import show_value
from disd.schema import Column, ColumnType
from disd.values import I64_MIN, string_offsets, timestamp_ns


def value_normalizer(table: str, col: Column, row_size: int) -> Callable[[Any], Any]:
    """A function turning one user value of ``col`` of ``table`` into the Python value its Arrow
    array is built from (None for null), or raising TypeError/ValueError naming both."""
    name, t = col.name, col.type
    where = f"{table}: column {name} ({t.value})"

    def bad(v: Any, why: str = "") -> Exception:
        return LoggerTypeError(f"{where}: cannot log {type(v).__name__} {show_value(v)}{why}")

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
            raise LoggerValueError(f"{where}: {v} is out of range [{lo}, {hi}]")

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
                    raise LoggerValueError(f"{where}: not encodable as UTF-8: {e}") from None
                if n > limit:
                    raise LoggerValueError(f"{where}: a {n}-byte string passes the frame limit of "
                                     f"{MAX_FRAME_PAYLOAD} bytes a row ({limit} for its strings)")
            return v

        return norm_str

    if t is ColumnType.TIMESTAMP:

        def norm_ts(v: Any) -> Any:
            if v is None:
                return None
            if type(v) is int:
                ns = v
            elif isinstance(v, (dt.datetime, np.datetime64)):
                return timestamp_ns(v)
            elif isinstance(v, (int, np.integer)) and not isinstance(v, bool):
                ns = int(v)
            else:
                raise bad(v, " (use int ns since the epoch, datetime or numpy.datetime64)")
            if not I64_MIN <= ns < 2**63:
                raise LoggerValueError(f"{where}: timestamp {ns} does not fit in 64 bits")
            return ns

        return norm_ts

    raise AssertionError(t)  # pragma: no cover


def owned(value: Any) -> Any:
    """Column input that shares no memory with the caller's mutable buffers."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if hasattr(value, "__array__") and not isinstance(value, (pa.Array, pa.ChunkedArray, list, tuple)):
        return np.array(value, copy=True)
    return value


def rows_to_columns(rows: list[tuple], types: Sequence[pa.DataType]) -> list[pa.Array]:
    """Normalized rows (tuples in schema order) as one Arrow array per column."""
    return [pa.array(col, t) for col, t in zip(zip(*rows), types)]


class RowSizeCheck:
    """Refuses, on the caller, rows whose payload would pass the frame limit, naming the row's
    largest string column."""

    def __init__(self, layout: RowLayout) -> None:
        self.layout = layout
        self.table = layout.schema.key
        self.names = layout.schema.column_names
        self.row_size = layout.row_size
        self.string_columns = layout.string_columns
        self.long_string = (MAX_FRAME_PAYLOAD - layout.row_size) // 4  # chars; beyond, count bytes

    def _error(self, column: int, size: int, row: int | None) -> LoggerValueError:
        at = "" if row is None else f", row {row}"
        return LoggerValueError(f"{self.table}: column {self.names[column]} (string){at}: the row is {size} bytes, "
                          f"over the frame limit of {MAX_FRAME_PAYLOAD} bytes")

    def check_row(self, tup: tuple) -> None:
        total = 0
        for i in self.string_columns:
            s = tup[i]
            if s is not None:
                total += len(s)
        if total > self.long_string:
            sizes = {i: len(tup[i].encode()) for i in self.string_columns if tup[i] is not None}
            size = self.row_size + sum(sizes.values())
            if size > MAX_FRAME_PAYLOAD:
                raise self._error(max(sizes, key=sizes.__getitem__), size, None)

    def check_batch(self, cols: list[pa.Array]) -> None:
        if not self.string_columns or self.layout.payload_bytes(cols) <= MAX_FRAME_PAYLOAD:
            return
        sizes = self.layout.row_bytes(cols)
        over = np.flatnonzero(sizes > MAX_FRAME_PAYLOAD)
        if len(over):
            row = int(over[0])
            lens = [int(np.diff(string_offsets(cols[i].slice(row, 1)))[0]) for i in self.string_columns]
            raise self._error(self.string_columns[int(np.argmax(lens))], int(sizes[row]), row)
