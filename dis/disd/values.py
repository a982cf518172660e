"""How column values are held in memory, shared by the logger, the binary log and column files.

* Timestamps are int nanoseconds since the epoch, UTC: ``datetime_to_ns`` and ``timestamp_ns``
  are the one conversion of Python and numpy time values to them.
* Strings are Arrow string arrays: ``string_offsets`` is the one reader of their offsets buffer.
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
    raise TypeError(f"cannot use {type(v).__name__} as a timestamp")


def string_offsets(arr: pa.Array) -> np.ndarray:
    """The ``len(arr) + 1`` int32 offsets of a (possibly sliced) Arrow string array into its
    data buffer; value i spans ``[offs[i], offs[i + 1])`` (a null may span bytes too)."""
    buf = arr.buffers()[1]
    if buf is None:
        return np.zeros(len(arr) + 1, np.int32)
    return np.frombuffer(buf, dtype=np.int32, count=arr.offset + len(arr) + 1)[arr.offset :]
