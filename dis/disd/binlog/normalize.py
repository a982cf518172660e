"""User input to the Arrow columns of a schema: ``normalize_columns``."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pyarrow as pa

from disd.schema import ColumnType, TableSchema
from disd.values import timestamp_ns


def _as_arrow_column(values: Any, ctype: ColumnType, n: int | None) -> pa.Array:
    """Normalise user input for one column to an Arrow array of the column's Arrow type."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    target = ctype.arrow_type
    if isinstance(values, pa.Array):
        arr = values
    elif ctype is ColumnType.CHAR:
        arr = pa.array([None if v is None else (ord(v) if isinstance(v, str) else int(v)) for v in values], pa.uint16()) if not isinstance(values, np.ndarray) else pa.array(values.astype(np.uint16))
    elif ctype is ColumnType.TIMESTAMP and isinstance(values, np.ndarray) and values.dtype.kind in "iu":
        arr = pa.array(values.astype(np.int64)).view(pa.int64())
    elif ctype is ColumnType.TIMESTAMP and not isinstance(values, np.ndarray):
        arr = pa.array([timestamp_ns(v) for v in values], pa.int64())
    else:
        arr = pa.array(values)
    if ctype is ColumnType.TIMESTAMP:
        if pa.types.is_integer(arr.type):
            arr = arr.cast(pa.int64()).view(pa.timestamp("ns", tz="UTC"))
        elif pa.types.is_timestamp(arr.type):
            if arr.type.tz is None:
                arr = arr.cast(pa.timestamp(arr.type.unit, tz="UTC"))
            arr = arr.cast(target)
    elif ctype is ColumnType.STRING:
        if not pa.types.is_string(arr.type):
            arr = arr.cast(pa.string())
    elif arr.type != target:
        arr = arr.cast(target)
    if n is not None and len(arr) != n:
        raise ValueError(f"column has {len(arr)} values, expected {n}")
    return arr


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
        raise TypeError("rows must be a pyarrow.Table, RecordBatch or a dict of columns")
    unknown = names - set(schema.column_names)
    if unknown:
        raise ValueError(f"{schema.key} has no column {sorted(unknown)[0]!r}")
    if n is None:
        raise ValueError("no columns given")
    out = []
    for c in schema.columns:
        if c.name in names:
            arr = _as_arrow_column(get(c.name), c.type, n)
        else:
            arr = pa.nulls(n, c.type.arrow_type)
        out.append(arr)
    return out
