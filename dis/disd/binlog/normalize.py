"""User input to the Arrow columns of a schema: ``normalize_columns``.

The conversion is whole-column (numpy/Arrow).  A value that cannot be converted raises
ValueError or TypeError naming the table, the column and the first offending row (its index in
the input, from 0); that row is found only after the conversion failed, by converting prefixes.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from disd.schema import Column, ColumnType, TableSchema
from disd.values import ColumnTypeError, ColumnValueError, string_offsets, timestamp_ns

_CONVERSION_ERRORS = (ValueError, TypeError, OverflowError, pa.ArrowException)


class _BadRow(ValueError):
    """A value found bad by a vectorized check, with its row."""

    def __init__(self, row: int, problem: str) -> None:
        super().__init__(problem)
        self.row = row
        self.problem = problem


def normalize_columns(schema: TableSchema, data: Any) -> list[pa.Array]:
    """Turn a pyarrow Table/RecordBatch or a mapping of column name to values into one Arrow
    array per schema column (missing columns are all null)."""
    if isinstance(data, (pa.Table, pa.RecordBatch)):
        names = set(data.schema.names)
        get = lambda name: data.column(name)  # noqa: E731
        n = data.num_rows
    elif isinstance(data, Mapping):
        names = set(data)
        get = data.__getitem__
        n = None
        for name in data:
            n = len(data[name])
            break
    else:
        raise ColumnTypeError("rows must be a pyarrow.Table, RecordBatch or a dict of columns")
    unknown = names - set(schema.column_names)
    if unknown:
        raise ColumnValueError(f"{schema.key} has no column {sorted(unknown)[0]!r}")
    if n is None:
        raise ColumnValueError("no columns given")
    out = []
    for c in schema.columns:
        if c.name in names:
            values = get(c.name)
            try:
                arr = column_array(values, c.type)
            except _CONVERSION_ERRORS as e:
                raise _named_error(schema, c, values, e) from None
            if len(arr) != n:
                raise ColumnValueError(f"{schema.key}: column {c.name} has {len(arr)} values, expected {n}")
        else:
            arr = pa.nulls(n, c.type.arrow_type)
        out.append(arr)
    return out


def column_array(values: Any, ctype: ColumnType) -> pa.Array:
    """User input for one column as an Arrow array of the column's Arrow type.

    Beyond Arrow's safe casts: a char column takes strings of one character (one UTF-16 code
    unit) as well as code units, a bool column numbers only when they are 0 or 1."""
    if isinstance(values, pa.ChunkedArray):  # (a table's column: one chunk is used as it is, not copied)
        values = values.chunk(0) if values.num_chunks == 1 else values.combine_chunks()
    target = ctype.arrow_type
    if isinstance(values, pa.Array):
        arr = values
    elif ctype is ColumnType.CHAR and not isinstance(values, np.ndarray):
        try:
            arr = pa.array(values)  # all strings or all numbers
        except _CONVERSION_ERRORS:
            arr = pa.array([None if v is None else (ord(v) if isinstance(v, str) else int(v)) for v in values],
                           pa.uint16())
    elif ctype is ColumnType.TIMESTAMP and isinstance(values, np.ndarray) and values.dtype.kind in "iu":
        arr = pa.array(values.astype(np.int64)).view(pa.int64())
    elif ctype is ColumnType.TIMESTAMP and not isinstance(values, np.ndarray):
        arr = pa.array([timestamp_ns(v) for v in values], pa.int64())
    else:
        arr = pa.array(values)
    if ctype is ColumnType.TIMESTAMP:
        if pa.types.is_integer(arr.type):
            arr = arr.cast(pa.int64()).view(pa.timestamp("ns", tz="UTC"))
        elif pa.types.is_timestamp(arr.type) and arr.type.tz is None:
            arr = arr.cast(pa.timestamp(arr.type.unit, tz="UTC"))
    elif ctype is ColumnType.CHAR and (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        arr = _chars(arr.cast(pa.string()))
    elif ctype is ColumnType.BOOL and (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type)):
        _check_zero_one(arr)
    if arr.type != target:
        arr = arr.cast(target)
    return arr


def _chars(arr: pa.Array) -> pa.Array:
    """Strings of one character each (nulls stay null) as UTF-16 code units (uint16)."""
    n = len(arr)
    offs = string_offsets(arr).astype(np.int64)
    lens = np.diff(offs)
    buf = arr.buffers()[2]
    data = np.frombuffer(buf, np.uint8) if buf is not None else np.zeros(0, np.uint8)
    padded = np.zeros(int(offs[-1] - offs[0]) + 3, np.uint8)  # the bytes, then room to read 3 past
    padded[: len(padded) - 3] = data[offs[0] : offs[-1]]
    starts = offs[:-1] - offs[0]
    b0, b1, b2 = (padded[starts + k].astype(np.uint32) for k in range(3))
    expect = np.where(b0 < 0x80, 1, np.where(b0 >> 5 == 6, 2, np.where(b0 >> 4 == 14, 3, 4)))
    valid = np.ones(n, bool) if arr.null_count == 0 else arr.is_valid().to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(valid & ((lens != expect) | (lens > 3)))  # empty, longer, or past U+FFFF
    if len(bad):
        raise _BadRow(int(bad[0]), "a char is one character (one UTF-16 code unit)")
    code = np.where(lens == 1, b0, np.where(lens == 2, (b0 & 0x1F) << 6 | (b1 & 0x3F),
                                            (b0 & 0x0F) << 12 | (b1 & 0x3F) << 6 | (b2 & 0x3F)))
    return pa.array(code.astype(np.uint16), mask=None if arr.null_count == 0 else ~valid)


def _check_zero_one(arr: pa.Array) -> None:
    """Numbers for a bool column: only 0 and 1 (as ``log`` takes them)."""
    wrong = pc.fill_null(pc.and_(pc.not_equal(arr, 0), pc.not_equal(arr, 1)), False)
    bad = np.flatnonzero(wrong.to_numpy(zero_copy_only=False))
    if len(bad):
        raise _BadRow(int(bad[0]), "a bool is true or false (or the number 0 or 1)")


def _sequence(values: Any) -> Any:
    """Column input that can be sliced and indexed by position."""
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks()
    if isinstance(values, (pa.Array, np.ndarray, list, tuple)):
        return values
    return np.asarray(values) if hasattr(values, "__array__") else list(values)


def _prefix(values: Any, m: int) -> Any:
    return values.slice(0, m) if isinstance(values, pa.Array) else values[:m]


def _first_bad_row(values: Any, ctype: ColumnType) -> int | None:
    """The first row whose value the conversion refuses: the end of the shortest prefix that
    fails (the conversion goes value by value, so a prefix fails once it holds a bad value)."""
    lo, hi = 0, len(values)  # the first lo rows convert, the first hi rows do not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            column_array(_prefix(values, mid), ctype)
            lo = mid
        except _BadRow as e:
            return e.row
        except _CONVERSION_ERRORS:
            hi = mid
    return hi - 1 if hi > 0 else None


def _kind(e: BaseException) -> type[Exception]:
    return TypeError if isinstance(e, (TypeError, pa.ArrowNotImplementedError)) else ValueError


def _why(e: BaseException) -> str:
    return e.problem if isinstance(e, _BadRow) else str(e)


def show_value(v: Any) -> str:
    """A value as an error message shows it: its repr, cut to 80 characters."""
    r = repr(v.item() if isinstance(v, np.generic) else v)
    return r if len(r) <= 80 else r[:77] + "..."


def _named_error(schema: TableSchema, col: Column, values: Any, e: BaseException) -> Exception:
    """The error of a column that did not convert, naming the table, the column and the row."""
    where = f"{schema.key}: column {col.name} ({col.type.value})"
    try:
        values = _sequence(values)
        row = e.row if isinstance(e, _BadRow) else _first_bad_row(values, col.type)
    except _CONVERSION_ERRORS:
        row = None
    if row is None:
        return _kind(e)(f"{where}: {_why(e)}")
    value = values[row]
    if isinstance(value, pa.Scalar):
        value = value.as_py()
    if not isinstance(e, _BadRow):
        try:
            column_array([value], col.type)  # the value's own reason, apart from its neighbours
        except _CONVERSION_ERRORS as one:
            e = one
    return _kind(e)(f"{where}, row {row}: cannot log {type(value).__name__} {show_value(value)}: {_why(e)}")
