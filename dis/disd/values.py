"""How column values are held in memory, shared by the logger, the binary log and column files.

* Timestamps are int nanoseconds since the epoch, UTC: ``datetime_to_ns`` and ``timestamp_ns``
  are the one conversion of Python and numpy time values to them.
* Strings are Arrow string arrays: ``string_offsets`` is the one reader of their offsets buffer.
* A char is one UTF-16 code unit, held as uint16 (0xFFFF its null) by the binary log, the column
  files and the DIS's own state; a reader gets a one-character string: ``char_strings`` is the
  one conversion, the same the JVM reader makes, so the client, Spark and merged Parquet agree.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import pyarrow as pa

from disd.errors import DisError

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
I64_MIN = -(2**63)


class ColumnValueError(DisError, ValueError):
    """Values that do not fit their column; the message names the table, the column and the row
    where there is one."""


class ColumnTypeError(DisError, TypeError):
    """Values of a kind no column takes (rows that are not a table or a mapping of columns)."""


def datetime_to_ns(v: dt.datetime) -> int:
    """Nanoseconds since the epoch of a datetime (naive means UTC), exact to the microsecond."""
    if v.tzinfo is None:
        v = v.replace(tzinfo=dt.timezone.utc)
    d = v - EPOCH
    return (d.days * 86400 + d.seconds) * 1_000_000_000 + d.microseconds * 1000


def timestamp_ns(v: Any) -> int | None:
    """Nanoseconds since the epoch of an int (taken as nanoseconds), a datetime (naive means
    UTC), a pandas.Timestamp (exact nanoseconds) or a numpy.datetime64; None for None and NaT.
    TypeError for anything else.  The range of the result is not checked."""
    if v is None:
        return None
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, dt.datetime):
        ns = getattr(v, "value", None)  # pandas.Timestamp (and NaT): exact nanoseconds
        if isinstance(ns, (int, np.integer)) and hasattr(v, "nanosecond"):
            return None if ns == I64_MIN else int(ns)
        return datetime_to_ns(v)
    if isinstance(v, np.datetime64):
        if np.isnat(v):
            return None
        return int(v.astype("datetime64[ns]").astype(np.int64))
    raise ColumnTypeError(f"cannot use {type(v).__name__} as a timestamp")


def string_offsets(arr: pa.Array) -> np.ndarray:
    """The ``len(arr) + 1`` int32 offsets of a (possibly sliced) Arrow string array into its
    data buffer; value i spans ``[offs[i], offs[i + 1])`` (a null may span bytes too)."""
    buf = arr.buffers()[1]
    if buf is None:
        return np.zeros(len(arr) + 1, np.int32)
    return np.frombuffer(buf, dtype=np.int32, count=arr.offset + len(arr) + 1)[arr.offset :]


#: The stored char that means null (``disd.schema``'s sentinel of a char column).
CHAR_NULL = 0xFFFF
_REPLACEMENT = 0xFFFD  # what half of a surrogate pair reads as: no one-character string holds it


def char_strings(arr: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A char column's values as readers get them: each UTF-16 code unit (uint16) as its
    one-character string, UTF-8 in an Arrow string array; null and the null sentinel 0xFFFF as
    null; half of a surrogate pair (0xD800..0xDFFF) as U+FFFD.  Strings are returned as they are
    (already converted).  Vectorized: numpy over the code units, no per-row Python."""
    if isinstance(arr, pa.ChunkedArray):
        return pa.chunked_array([char_strings(c) for c in arr.chunks], pa.string())
    if pa.types.is_string(arr.type):
        return arr
    n = len(arr)
    buf = arr.buffers()[1]
    if n == 0 or buf is None:
        return pa.nulls(n, pa.string()) if n else pa.array([], pa.string())
    vals = np.frombuffer(buf, dtype="<u2", count=arr.offset + n)[arr.offset:].astype(np.uint32)
    valid = vals != CHAR_NULL
    if arr.null_count:
        valid &= np.asarray(arr.is_valid())
    surrogate = (vals >= 0xD800) & (vals <= 0xDFFF)
    if surrogate.any():
        vals = np.where(surrogate, np.uint32(_REPLACEMENT), vals)
    lens = np.where(vals < 0x80, 1, np.where(vals < 0x800, 2, 3)).astype(np.int32)
    lens[~valid] = 0
    offs = np.zeros(n + 1, np.int32)
    np.cumsum(lens, out=offs[1:])
    data = np.zeros(int(offs[-1]), np.uint8)
    start = offs[:-1]
    one, two, three = lens == 1, lens == 2, lens == 3
    data[start[one]] = vals[one]
    v2, s2 = vals[two], start[two]
    data[s2] = 0xC0 | (v2 >> 6)
    data[s2 + 1] = 0x80 | (v2 & 0x3F)
    v3, s3 = vals[three], start[three]
    data[s3] = 0xE0 | (v3 >> 12)
    data[s3 + 1] = 0x80 | ((v3 >> 6) & 0x3F)
    data[s3 + 2] = 0x80 | (v3 & 0x3F)
    nulls = n - int(np.count_nonzero(valid))
    validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    return pa.StringArray.from_buffers(n, pa.py_buffer(offs), pa.py_buffer(data), validity, nulls)
