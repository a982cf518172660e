"""The column file format: how one column's values become bytes on disk, and back.

This module needs nothing but the bytes of the files: the DIS uses it to read its own
locations, and the table-data client and the Spark source use it to rebuild Arrow arrays from
the raw 64 KiB blocks they fetch over gRPC (``decode_column``, ``decode_table``, ``read_rows``).

See docs/storage-format.md.  In short, for a column ``C``:

* fixed-width types: ``C.dat`` holds row i at bytes [i*w, (i+1)*w), little-endian; null is the
  type's sentinel (``ColumnType.null_sentinel``, the Deephaven convention).
* string: ``C.off`` holds one u64 per row, the end offset of the row's UTF-8 bytes in ``C.dat``;
  bit 63 set means null (the offset in the low 63 bits is then equal to the previous end).

Both directions are whole-array numpy/Arrow operations.  Decoding needs only the bytes of the
rows asked for (plus one offset before them for strings), so a reader holding 64 KiB blocks of a
file can rebuild any row range without the rest.
"""

from __future__ import annotations

from typing import Callable, Mapping, Protocol, Sequence

import numpy as np
import pyarrow as pa

from disd.schema import Column, ColumnType, TableSchema
from disd.values import string_offsets
from disd.storage.errors import StorageKeyError, StorageValueError

NULL_BIT = np.uint64(1 << 63)
OFFSET_MASK = np.uint64((1 << 63) - 1)
OFFSET_WIDTH = 8


def file_names(col: Column) -> list[str]:
    """The files of a column, offsets file first for strings."""
    if col.type is ColumnType.STRING:
        return [f"{col.name}.off", f"{col.name}.dat"]
    return [f"{col.name}.dat"]


def schema_file_names(schema: TableSchema) -> list[str]:
    """Every column file of a location written in ``schema``, in column order."""
    return [n for c in schema.columns for n in file_names(c)]


def _bits(buf: pa.Buffer, offset: int, n: int) -> np.ndarray:
    """An Arrow bitmap (least significant bit first) as a bool array of ``n`` entries."""
    first, last = offset // 8, (offset + n + 7) // 8
    raw = np.frombuffer(buf, np.uint8, count=last - first, offset=first)
    return np.unpackbits(raw, bitorder="little")[offset % 8 : offset % 8 + n].view(bool)


def _validity(arr: pa.Array) -> np.ndarray | None:
    """Boolean array of valid (non-null) slots, or None when there are no nulls.  Reads the
    validity bitmap with numpy (no Arrow compute kernels: their first use costs an import)."""
    if arr.null_count == 0:
        return None
    return _bits(arr.buffers()[0], arr.offset, len(arr))


def encode_fixed(col: Column, arr: pa.Array) -> np.ndarray:
    """The stored values of a fixed-width column (nulls replaced by the sentinel)."""
    t = col.type
    n = len(arr)
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.type != t.arrow_type:
        arr = arr.cast(t.arrow_type)
    if t is ColumnType.BOOL:
        vals = _bits(arr.buffers()[1], arr.offset, n).astype(np.int8) if n else np.zeros(0, np.int8)
    else:
        dtype = t.numpy_dtype
        buf = arr.buffers()[1]
        vals = np.frombuffer(buf, dtype=dtype, count=arr.offset + n)[arr.offset :] if n else np.zeros(0, dtype)
    valid = _validity(arr)
    if valid is not None:
        vals = vals.copy()
        vals[~valid] = t.null_sentinel
    return vals


def encode_string(arr: pa.Array, data_base: int) -> tuple[np.ndarray, np.ndarray, memoryview]:
    """(ends, lengths, data) for appending a string array after ``data_base`` bytes of data.

    ``ends`` are the u64 entries of the offsets file (with the null bit), ``lengths`` the byte
    length of each row, ``data`` the UTF-8 bytes of all rows in order."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    n = len(arr)
    if n == 0:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64), memoryview(b"")
    if arr.type != pa.string():
        arr = arr.cast(pa.string())
    offs = string_offsets(arr).astype(np.int64)
    lens = np.diff(offs)
    valid = _validity(arr)
    data_buf = arr.buffers()[2]
    if valid is not None and lens[~valid].any():
        # null slots that still cover bytes: drop them (decode_frames never produces these)
        lens = lens.copy()
        keep = np.repeat(valid, np.diff(offs))
        raw = np.frombuffer(data_buf, np.uint8)[offs[0] : offs[-1]][keep]
        lens[~valid] = 0
        data = memoryview(raw.tobytes())
    else:
        data = memoryview(data_buf)[offs[0] : offs[-1]] if data_buf is not None else memoryview(b"")
    ends = (np.cumsum(lens) + data_base).astype(np.uint64)
    if valid is not None:
        ends[~valid] |= NULL_BIT
    return ends, lens, data


def decode_fixed(col: Column, data: bytes | memoryview | np.ndarray, nrows: int) -> pa.Array:
    t = col.type
    vals = np.frombuffer(data, dtype=t.numpy_dtype, count=nrows)
    sentinel = t.null_sentinel
    isnull = vals == sentinel
    has_nulls = bool(isnull.any())
    validity = pa.py_buffer(np.packbits(~isnull, bitorder="little")) if has_nulls else None
    null_count = int(isnull.sum()) if has_nulls else 0
    if t is ColumnType.BOOL:
        values = pa.py_buffer(np.packbits(vals > 0, bitorder="little"))
    else:
        values = pa.py_buffer(np.ascontiguousarray(vals))
    return pa.Array.from_buffers(t.arrow_type, nrows, [validity, values], null_count)


def decode_string(ends_raw: bytes | memoryview, prev_end: int, data: bytes | memoryview, nrows: int) -> pa.Array:
    """Rebuild a string array from the offsets entries of its rows, the end of the row before
    them (``prev_end``, 0 for row 0) and the data bytes starting at ``prev_end``.

    The offsets are checked (monotonic, within ``data``) so damaged bytes raise ValueError
    instead of producing an invalid Arrow array."""
    ends = np.frombuffer(ends_raw, dtype="<u8", count=nrows)
    isnull = (ends & NULL_BIT) != 0
    offs = np.empty(nrows + 1, np.int64)
    offs[0] = 0
    offs[1:] = (ends & OFFSET_MASK).astype(np.int64)
    offs[1:] -= prev_end
    total = int(offs[-1]) if nrows else 0
    if nrows and (total > len(data) or bool((np.diff(offs) < 0).any())):
        raise StorageValueError("string offsets are not monotonic or point past the data: damaged column file")
    has_nulls = bool(isnull.any())
    validity = pa.py_buffer(np.packbits(~isnull, bitorder="little")) if has_nulls else None
    null_count = int(isnull.sum()) if has_nulls else 0
    data_buf = pa.py_buffer(memoryview(data)[:total])
    if total < 2**31:
        return pa.StringArray.from_buffers(nrows, pa.py_buffer(offs.astype(np.int32)), data_buf, validity, null_count)
    big = pa.LargeStringArray.from_buffers(nrows, pa.py_buffer(offs), data_buf, validity, null_count)
    return big.cast(pa.string())


Fetch = Callable[[str, int, int], bytes | memoryview]
"""fetch(file_name, start, stop) -> bytes [start, stop) of a column file."""


def read_column(col: Column, start: int, stop: int, fetch: Fetch) -> pa.Array:
    """Rows [start, stop) of one column, fetching only the byte ranges they need."""
    return read_columns([col], start, stop, lambda ranges: [fetch(*r) for r in ranges])[0]


def _dict_fetch(files: Mapping[str, bytes | bytearray | memoryview]) -> Fetch:
    def fetch(name: str, start: int, stop: int) -> bytes | memoryview:
        try:
            data = files[name]
        except KeyError:
            raise StorageKeyError(f"column file {name!r} not given") from None
        if len(data) < stop:
            raise StorageValueError(f"column file {name!r} has {len(data)} bytes, rows need {stop}")
        return memoryview(data)[start:stop]

    return fetch


def decode_column(
    column: Column,
    files: Mapping[str, bytes | bytearray | memoryview],
    nrows: int,
    start: int = 0,
) -> pa.Array:
    """Rows ``[start, start + nrows)`` of ``column`` as an Arrow array of its schema type.

    ``files`` maps column file name (``file_names(column)``) to that file's bytes from offset 0
    (at least as far as the rows need; more is ignored).  A pure function of the bytes: another
    process holding only the files, or their 64 KiB blocks concatenated, can call it."""
    return read_column(column, start, start + nrows, _dict_fetch(files))


def decode_table(
    schema: TableSchema,
    files: Mapping[str, bytes | bytearray | memoryview],
    nrows: int,
    columns: Sequence[str] | None = None,
    start: int = 0,
) -> pa.Table:
    """Rows ``[start, start + nrows)`` of a location's columns from the bytes of its files."""
    return read_rows(schema, columns, start, start + nrows, _dict_fetch(files))


def read_rows(schema: TableSchema, columns: Sequence[str] | None, start: int, stop: int, fetch: Fetch) -> pa.Table:
    """Rows [start, stop) of the given columns (all when None) as a Table with the schema's
    Arrow types."""
    return read_rows_batched(schema, columns, start, stop, lambda ranges: [fetch(*r) for r in ranges])


FetchMany = Callable[[Sequence[tuple[str, int, int]]], Sequence[bytes | memoryview]]
"""fetch_many([(file_name, start, stop), ...]) -> the bytes of each range, in order."""


class DataEnds(Protocol):
    """Where a string column's data ends after a row, learnt from its offsets file: ``(offsets
    file name, row)`` -> the end (in the data file) of rows ``[0, row)``.  Column bytes never
    change below a published size, so what a reader learnt stays true for its location.  A dict
    will do; ``disd.client`` keeps one per location read."""

    def get(self, key: tuple[str, int]) -> int | None: ...

    def __setitem__(self, key: tuple[str, int], end: int) -> None: ...


def read_rows_batched(schema: TableSchema, columns: Sequence[str] | None, start: int, stop: int,
                      fetch_many: FetchMany, sizes: Mapping[str, int] | None = None,
                      ends: DataEnds | None = None) -> pa.Table:
    """``read_rows`` asking for its byte ranges together: one ``fetch_many`` for every fixed-width
    column and every offsets file, then one for the string data the offsets locate.

    ``sizes``, when given, are file sizes covering at least rows ``[0, stop)`` (a published
    snapshot's).  Reading from row 0 with them, a string column's data is ``[0, size)`` of its
    data file, so the whole read is one ``fetch_many``: what a reader over gRPC pays per call is
    paid once per location, not once per file.

    ``ends``, when given, remembers where string data ends after a row (``DataEnds``): a read
    from a row an earlier read stopped at knows its data's first byte too, so with ``sizes`` it
    is one ``fetch_many`` as well (a reader following a location's new rows)."""
    names = list(columns) if columns is not None else schema.column_names
    arrays = read_columns([schema.column(c) for c in names], start, stop, fetch_many, sizes, ends)
    arrow = schema.arrow_schema()
    return pa.Table.from_arrays(arrays, schema=pa.schema([arrow.field(c) for c in names]))


def read_columns(cols: Sequence[Column], start: int, stop: int, fetch_many: FetchMany,
                 sizes: Mapping[str, int] | None = None, ends: DataEnds | None = None) -> list[pa.Array]:
    """Rows [start, stop) of each column (``read_rows_batched``'s rounds of fetches)."""
    n = stop - start
    if n <= 0:
        return [pa.array([], c.type.arrow_type) for c in cols]
    first: list[tuple[str, int, int]] = []
    known: dict[int, int] = {}  # string column index -> where its data starts (the end of row start - 1)
    inline: set[int] = set()  # string columns whose data is asked for in the first round
    for i, col in enumerate(cols):
        if col.type is ColumnType.STRING:
            off_name, dat_name = file_names(col)
            prev = 0 if start == 0 else (ends.get((off_name, start)) if ends is not None else None)
            if prev is not None:
                known[i] = prev
            first.append((off_name, (start - 1) * OFFSET_WIDTH if prev is None else start * OFFSET_WIDTH,
                          stop * OFFSET_WIDTH))
            if prev is not None and sizes is not None and dat_name in sizes:
                inline.add(i)
                first.append((dat_name, prev, max(prev, sizes[dat_name])))
        else:
            w = col.type.width
            first.append((file_names(col)[0], start * w, stop * w))
    got = iter(fetch_many(first))
    fixed: dict[int, bytes | memoryview] = {}
    strings: dict[int, tuple[bytes | memoryview, int, int, bytes | memoryview | None]] = {}  # i -> (ends, prev_end, last_end, data)
    for i, col in enumerate(cols):
        if col.type is not ColumnType.STRING:
            fixed[i] = next(got)
            continue
        off_name = file_names(col)[0]
        raw = next(got)
        data = next(got) if i in inline else None
        if i in known:
            prev_end = known[i]
        else:
            prev_end = int(np.frombuffer(raw[:OFFSET_WIDTH], "<u8")[0] & OFFSET_MASK)
            raw = raw[OFFSET_WIDTH:]
        last_end = int(np.frombuffer(raw[(n - 1) * OFFSET_WIDTH : n * OFFSET_WIDTH], "<u8")[0] & OFFSET_MASK)
        if data is not None and len(data) < last_end - prev_end:
            data = None  # the sizes were short of the rows after all: ask for the data itself
        if ends is not None:
            ends[(off_name, stop)] = last_end
        strings[i] = (raw, prev_end, last_end, data)
    second = [(file_names(cols[i])[1], prev, last) for i, (_, prev, last, data) in strings.items() if data is None]
    more = iter(fetch_many(second) if second else [])
    arrays = []
    for i, col in enumerate(cols):
        if i in fixed:
            arrays.append(decode_fixed(col, fixed[i], n))
            continue
        raw, prev_end, last_end, data = strings[i]
        arrays.append(decode_string(raw, prev_end, next(more) if data is None else data, n))
    return arrays


def check_sizes(schema: TableSchema, rows: int, sizes: Mapping[str, int]) -> str | None:
    """Why the file sizes cannot hold exactly ``rows`` rows, or None when they can."""
    for c in schema.columns:
        names = file_names(c)
        if any(n not in sizes for n in names):
            return f"no size for {'/'.join(names)}"
        if c.type is ColumnType.STRING:
            if sizes[names[0]] != rows * OFFSET_WIDTH:
                return f"{names[0]} is {sizes[names[0]]} bytes, {rows} rows need {rows * OFFSET_WIDTH}"
            if rows == 0 and sizes[names[1]] != 0:
                return f"{names[1]} is {sizes[names[1]]} bytes with no rows"
        elif sizes[names[0]] != rows * c.type.width:
            return f"{names[0]} is {sizes[names[0]]} bytes, {rows} rows need {rows * c.type.width}"
    return None
