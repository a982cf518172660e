"""The binary log format: file header, frames, row records.  See docs/binlog-format.md.

This module is the only code that knows the byte layout.  It encodes batches of rows into
frames and decodes runs of frames back into per-column Arrow arrays, both with whole-batch
numpy operations: a frame is a block of fixed-width row records that numpy views as a
structured array, so "transposing" rows to columns is one strided copy per column.

Layout (all integers little-endian)::

    file    := header frame*
    header  := magic "DISBLOG\\0" | u16 version | u16 reserved | u32 schema_len
               | 16-byte fingerprint | schema JSON (schema_len bytes) | u32 crc32c(header so far)
    frame   := u32 payload_len | u32 row_count | u32 crc32c(payload) | u32 crc32c(first 12 bytes)
               | payload
    payload := row_record{row_count} | heap
    row_record := u8 flag | null bitmap (ceil(ncols/8) bytes, bit i = column i is null)
               | one fixed-width field per column, in schema order; a string column stores the
                 u32 byte length of its UTF-8 value
    heap    := the UTF-8 bytes of every string value, row by row, columns in schema order
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Sequence

import crc32c as _crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from disd.errors import DisError
from disd.schema import ColumnType, TableSchema
from disd.values import string_offsets

try:  # the product's C encoder (setup.py); without it the numpy one encodes
    from disd.binlog import rowencode
except ImportError:  # pragma: no cover - a build without a C compiler
    rowencode = None

MAGIC = b"DISBLOG\x00"
VERSION = 1
HEADER_FIXED = struct.Struct("<8sHHI16s")  # magic, version, reserved, schema_len, fingerprint
FRAME_HEADER = struct.Struct("<IIII")  # payload_len, row_count, payload_crc, header_crc
FRAME_HEADER_SIZE = FRAME_HEADER.size
MAX_FRAME_PAYLOAD = 32 << 20  # a frame larger than this is corrupt by definition
MAX_SCHEMA_JSON = 1 << 20


def crc32c(data: Any) -> int:
    return _crc32c.crc32c(data)


class RowFlag(IntEnum):
    """Per-row transaction flag, as in the seeds' Row.Flags."""

    NONE = 0
    START_TRANSACTION = 1
    END_TRANSACTION = 2
    SINGLE_ROW = 3


class BinlogError(DisError):
    """Base of every error reading a binary log."""


class CorruptLogError(BinlogError):
    """Bytes that are complete but wrong: a checksum mismatch or an impossible field."""

    def __init__(self, offset: int, problem: str, path: str | None = None) -> None:
        where = f"{path}: " if path else ""
        super().__init__(f"{where}corrupt binary log at byte {offset}: {problem}")
        self.offset = offset
        self.problem = problem
        self.path = path


class SchemaMismatchError(BinlogError):
    """The log was written for a different column layout than the one expected."""


# --------------------------------------------------------------------------------------------
# Header


@dataclass(frozen=True)
class LogHeader:
    version: int
    fingerprint: str
    schema: TableSchema
    size: int  # bytes; the first frame starts here


def encode_header(schema: TableSchema) -> bytes:
    body = schema.to_json().encode()
    head = HEADER_FIXED.pack(MAGIC, VERSION, 0, len(body), bytes.fromhex(schema.fingerprint))
    data = head + body
    return data + struct.pack("<I", crc32c(data))


@functools.lru_cache(maxsize=256)
def _header_schema(text: str) -> TableSchema:
    """A header's schema, parsed once per distinct text: every log of a table carries the same
    one, and a burst over hundreds of new locations decoded it once per location (a schema is
    immutable, so one object serves them all; a text that fails to parse is not cached)."""
    return TableSchema.from_json(text, "<log header>")


def decode_header(buf: bytes | memoryview, path: str | None = None) -> LogHeader | None:
    """Parse the header at the start of ``buf``; None if ``buf`` is too short to hold it."""
    if len(buf) < HEADER_FIXED.size:
        if bytes(buf[: len(MAGIC)]) != MAGIC[: len(buf[: len(MAGIC)])]:
            raise CorruptLogError(0, "not a binary log (bad magic)", path)
        return None
    magic, version, _reserved, schema_len, fp = HEADER_FIXED.unpack_from(buf, 0)
    if magic != MAGIC:
        raise CorruptLogError(0, "not a binary log (bad magic)", path)
    if version != VERSION:
        raise CorruptLogError(0, f"unsupported format version {version}", path)
    if schema_len > MAX_SCHEMA_JSON:
        raise CorruptLogError(0, f"schema length {schema_len} is absurd", path)
    end = HEADER_FIXED.size + schema_len
    if len(buf) < end + 4:
        return None
    (stored,) = struct.unpack_from("<I", buf, end)
    if crc32c(buf[:end]) != stored:
        raise CorruptLogError(0, "header checksum mismatch", path)
    try:
        schema = _header_schema(bytes(buf[HEADER_FIXED.size : end]).decode())
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptLogError(0, f"header schema unreadable: {e}", path) from None
    if schema.fingerprint != fp.hex():
        raise CorruptLogError(0, "header fingerprint does not match its schema", path)
    return LogHeader(VERSION, fp.hex(), schema, end + 4)


# --------------------------------------------------------------------------------------------
# Row records


@dataclass(frozen=True)
class RowLayout:
    """The numpy structured dtype of one row record for a schema."""

    schema: TableSchema
    dtype: np.dtype
    null_bytes: int
    string_columns: tuple[int, ...]

    @classmethod
    def for_schema(cls, schema: TableSchema) -> "RowLayout":
        null_bytes = (len(schema.columns) + 7) // 8
        fields: list[tuple[str, Any, Any]] = [("_flag", np.uint8), ("_nulls", np.uint8, (null_bytes,))]
        for i, c in enumerate(schema.columns):
            fields.append((f"c{i}", c.type.numpy_dtype))
        strings = tuple(i for i, c in enumerate(schema.columns) if c.type is ColumnType.STRING)
        return cls(schema, np.dtype(fields), null_bytes, strings)

    @property
    def row_size(self) -> int:
        return self.dtype.itemsize

    def payload_bytes(self, columns: Sequence[pa.Array]) -> int:
        """At most how many payload bytes these rows encode to: their row records and the
        string bytes their Arrow arrays span (a null that spans bytes counts them)."""
        total = len(columns[0]) * self.row_size
        for i in self.string_columns:
            offs = string_offsets(columns[i])
            total += int(offs[-1] - offs[0])
        return total

    def row_bytes(self, columns: Sequence[pa.Array]) -> np.ndarray:
        """At most how many payload bytes each row encodes to (int64, one per row)."""
        sizes = np.full(len(columns[0]), self.row_size, np.int64)
        for i in self.string_columns:
            sizes += np.diff(string_offsets(columns[i]))
        return sizes


_LAYOUTS: dict[str, RowLayout] = {}


def layout_for(schema: TableSchema) -> RowLayout:
    key = schema.to_json()
    lay = _LAYOUTS.get(key)
    if lay is None:
        lay = _LAYOUTS[key] = RowLayout.for_schema(schema)
    return lay


# --------------------------------------------------------------------------------------------
# Encoding


def _string_parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(lengths as uint32, the UTF-8 bytes in row order) of a string array; nulls are empty."""
    offs = string_offsets(arr)
    buf = arr.buffers()[2]
    data = np.frombuffer(buf, dtype=np.uint8) if buf is not None else np.zeros(0, np.uint8)
    lens = np.diff(offs).astype(np.uint32)
    if arr.null_count:
        lens[~np.asarray(arr.is_valid())] = 0
        # null slots may still cover bytes; take only the bytes of valid values
        keep = np.repeat(lens > 0, np.diff(offs)) if len(offs) > 1 else np.zeros(0, bool)
        body = data[offs[0] : offs[-1]][keep] if len(keep) else data[:0]
    else:
        body = data[offs[0] : offs[-1]]
    return lens, body


def encode_rows(schema: TableSchema, columns: Sequence[pa.Array], flags: np.ndarray) -> tuple[bytes, int]:
    """Encode rows as one frame payload; returns (payload, row_count).  In C when it is built
    (``disd.binlog.rowencode``: each byte written once, outside the interpreter's lock), else
    ``encode_rows_numpy``; the two write the same bytes (tests/test_binlog.py)."""
    if rowencode is not None:
        flags = np.ascontiguousarray(flags, dtype=np.uint8)
        parts = _c_columns(schema, columns, len(flags))
        if parts is not None:
            return rowencode.encode(flags, parts, layout_for(schema).row_size), len(flags)
    return encode_rows_numpy(schema, columns, flags)


_C_KIND = {ColumnType.BOOL: 1, ColumnType.STRING: 2}


def _c_columns(schema: TableSchema, columns: Sequence[pa.Array], n: int) -> list[tuple] | None:
    """Each column's buffers for the C encoder; None when one is not in the form it reads (an
    Arrow array of the column's own type with its values buffer): the numpy encoder takes it."""
    if len(columns) != len(schema.columns):
        return None
    out = []
    for c, arr in zip(schema.columns, columns):
        if len(arr) != n:
            raise ValueError(f"column {c.name} has {len(arr)} values for {n} flags")
        if not isinstance(arr, pa.Array) or arr.type != c.type.arrow_type:
            return None
        bufs = arr.buffers()
        if bufs[1] is None:
            return None
        kind = _C_KIND.get(c.type, 0)
        out.append((kind, c.type.width if kind == 0 else 0, bufs[0] if arr.null_count else None, bufs[1],
                    bufs[2] if kind == 2 else None, arr.offset))
    return out


def encode_rows_numpy(schema: TableSchema, columns: Sequence[pa.Array], flags: np.ndarray) -> tuple[bytes, int]:
    """``encode_rows`` with numpy and Arrow only: the reference the C encoder is held to, and
    the encoder of a build without it."""
    lay = layout_for(schema)
    n = len(flags)
    rec = np.zeros(n, dtype=lay.dtype)
    rec["_flag"] = flags
    nulls = np.zeros((n, len(schema.columns)), dtype=bool)
    heaps: list[tuple[int, np.ndarray, np.ndarray]] = []
    for i, (c, arr) in enumerate(zip(schema.columns, columns)):
        if len(arr) != n:
            raise ValueError(f"column {c.name} has {len(arr)} values for {n} flags")
        if arr.null_count:
            nulls[:, i] = ~np.asarray(arr.is_valid())
        if c.type is ColumnType.STRING:
            lens, body = _string_parts(arr)
            rec[f"c{i}"] = lens
            heaps.append((i, lens, body))
            continue
        if arr.null_count:
            arr = pc.fill_null(arr, False if c.type is ColumnType.BOOL else 0)
        if c.type is ColumnType.TIMESTAMP:
            vals = arr.view(pa.int64()).to_numpy(zero_copy_only=False)
        elif c.type is ColumnType.BOOL:
            vals = arr.to_numpy(zero_copy_only=False).astype(np.int8)
        else:
            vals = arr.to_numpy(zero_copy_only=False)
        rec[f"c{i}"] = vals
    if nulls.any():
        rec["_nulls"] = np.packbits(nulls, axis=1, bitorder="little")
    if not heaps:
        heap = b""
    elif len(heaps) == 1:
        heap = heaps[0][2].tobytes()
    else:
        # Row-major order (a row's strings in schema order, then the next row's): the columns
        # laid end to end, then one C++ take that interleaves them.
        parts = []
        for _, lens, body in heaps:
            offs = np.zeros(n + 1, np.int64)
            np.cumsum(lens, out=offs[1:])
            parts.append(pa.LargeStringArray.from_buffers(n, pa.py_buffer(offs), pa.py_buffer(body)))
        order = (np.arange(n, dtype=np.int64)[:, None] + np.arange(len(heaps), dtype=np.int64)[None, :] * n).ravel()
        rows = pa.concat_arrays(parts).take(pa.array(order))
        offs = np.frombuffer(rows.buffers()[1], np.int64, len(rows) + 1, rows.offset * 8)
        data = rows.buffers()[2]
        heap = data[int(offs[0]):int(offs[-1])].to_pybytes() if data is not None else b""
    return rec.tobytes() + heap, n


def encode_frame(payload: bytes, row_count: int) -> bytes:
    if len(payload) > MAX_FRAME_PAYLOAD:
        raise ValueError(f"frame payload of {len(payload)} bytes exceeds {MAX_FRAME_PAYLOAD}")
    head = struct.pack("<III", len(payload), row_count, crc32c(payload))
    return head + struct.pack("<I", crc32c(head)) + payload


# --------------------------------------------------------------------------------------------
# Scanning and decoding


@dataclass
class FrameRun:
    """Complete, checksum-verified frames found in a buffer.

    ``starts``/``ends`` are absolute byte offsets of each frame, ``row_counts`` its rows.
    ``end_offset`` is the offset just past the last complete frame; ``torn`` tells whether
    bytes after it form the beginning of an incomplete frame (a torn or still-growing tail).
    """

    base: int
    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    row_counts: list[int] = field(default_factory=list)
    end_offset: int = 0
    torn: bool = False

    @property
    def rows(self) -> int:
        return sum(self.row_counts)


def scan_frames(
    buf: bytes | bytearray | memoryview,
    base: int,
    schema: TableSchema,
    start: int = 0,
    path: str | None = None,
    max_frames: int | None = None,
) -> FrameRun:
    """Find and verify the complete frames in ``buf[start:]``; ``base`` is the absolute file
    offset of ``buf[0]``.  Stops at the first incomplete frame (torn tail).  Raises
    CorruptLogError at the first complete frame that fails its checks."""
    lay = layout_for(schema)
    mv = memoryview(buf)
    n = len(mv)
    p = start
    run = FrameRun(base=base)
    unpack = FRAME_HEADER.unpack_from
    while max_frames is None or len(run.starts) < max_frames:
        if n - p < FRAME_HEADER_SIZE:
            run.torn = n > p
            break
        plen, rows, pcrc, hcrc = unpack(mv, p)
        if crc32c(mv[p : p + 12]) != hcrc:
            if not any(mv[p:]):  # a zero-filled tail: space allocated, data never written
                run.torn = True
                break
            raise CorruptLogError(base + p, "frame header checksum mismatch", path)
        if plen > MAX_FRAME_PAYLOAD:
            raise CorruptLogError(base + p, f"frame length {plen} exceeds the maximum", path)
        if rows * lay.row_size > plen:
            raise CorruptLogError(base + p, f"{rows} rows do not fit in {plen} bytes", path)
        end = p + FRAME_HEADER_SIZE + plen
        if end > n:
            run.torn = True
            break
        if crc32c(mv[p + FRAME_HEADER_SIZE : end]) != pcrc:
            raise CorruptLogError(base + p, "frame payload checksum mismatch", path)
        run.starts.append(base + p)
        run.ends.append(base + end)
        run.row_counts.append(rows)
        p = end
    run.end_offset = base + p
    return run


@dataclass
class DecodedRows:
    """Rows decoded from a run of frames: one Arrow array per schema column and the flags."""

    schema: TableSchema
    columns: list[pa.Array]
    flags: np.ndarray  # uint8

    @property
    def num_rows(self) -> int:
        return len(self.flags)

    def to_table(self) -> pa.Table:
        return pa.Table.from_arrays(self.columns, schema=self.schema.arrow_schema())


def decode_frames(
    buf: bytes | bytearray | memoryview, base: int, run: FrameRun, schema: TableSchema
) -> DecodedRows:
    """Decode the frames of ``run`` (found in ``buf`` by scan_frames) in one vectorized pass.

    Row records of all frames are concatenated into one structured array and the heaps into
    one byte array; since each heap holds its frame's strings in row order, the joined heap is
    the heap of the joined rows.
    """
    lay = layout_for(schema)
    mv = memoryview(buf)
    rs = lay.row_size
    rec_parts = []
    heap_parts = []
    for s, e, r in zip(run.starts, run.ends, run.row_counts):
        ps = s - base + FRAME_HEADER_SIZE
        rec_parts.append(mv[ps : ps + r * rs])
        heap_parts.append(mv[ps + r * rs : e - base])
    rec_bytes = rec_parts[0] if len(rec_parts) == 1 else b"".join(rec_parts)
    heap_bytes = heap_parts[0] if len(heap_parts) == 1 else b"".join(heap_parts)
    n = run.rows
    rec = np.frombuffer(rec_bytes, dtype=lay.dtype, count=n)
    heap = np.frombuffer(heap_bytes, dtype=np.uint8)
    return _decode_records(schema, lay, rec, heap, run.starts[0] if run.starts else base)


def _strings_by_row(str_lens: np.ndarray, str_starts: np.ndarray, heap: np.ndarray) -> pa.StringArray | None:
    """Every string of a batch as one Arrow array in the heap's own order (row by row, the
    string columns of a row in schema order), over the heap without a copy and validated as
    UTF-8 once; None when that fails, so that the column-by-column path names the bad column."""
    total = int(str_lens.sum())
    if total >= 2**31:
        return None
    offs = np.empty(str_lens.size + 1, np.int32)
    offs[:-1] = str_starts.ravel()
    offs[-1] = total
    arr = pa.StringArray.from_buffers(str_lens.size, pa.py_buffer(offs), pa.py_buffer(heap))
    try:
        arr.validate(full=True)
    except pa.ArrowInvalid:
        return None
    return arr


def _string_lengths(lay: RowLayout, rec: np.ndarray) -> np.ndarray:
    """Every string column's lengths, (rows, string columns) as int64.  When the length fields
    are adjacent in the record (string columns next to each other in the schema), one strided
    view casts them all in one pass, 10x faster than a pass per column (each pass reads every
    record's cache lines again)."""
    n, k = len(rec), len(lay.string_columns)
    first = lay.dtype.fields[f"c{lay.string_columns[0]}"][1]
    if all(lay.dtype.fields[f"c{i}"][1] == first + 4 * j for j, i in enumerate(lay.string_columns)):
        rows = rec.view(np.uint8).reshape(n, lay.row_size)
        return rows[:, first:first + 4 * k].view("<u4").astype(np.int64)
    out = np.empty((n, k), np.int64)  # one pass per column: no stack, no cast
    for j, i in enumerate(lay.string_columns):
        out[:, j] = rec[f"c{i}"]
    return out


def _decode_records(
    schema: TableSchema, lay: RowLayout, rec: np.ndarray, heap: np.ndarray, offset: int
) -> DecodedRows:
    n = len(rec)
    flags = rec["_flag"].copy()
    if n and int(flags.max()) > RowFlag.SINGLE_ROW:
        raise CorruptLogError(offset, f"row flag {int(flags.max())} is not a known flag")
    null_bytes = rec["_nulls"]
    any_nulls = bool(null_bytes.any()) if n else False
    nulls = (
        np.unpackbits(null_bytes, axis=1, count=len(schema.columns), bitorder="little").view(bool)
        if any_nulls
        else None
    )
    columns: list[pa.Array] = []
    str_lens = None
    if len(lay.string_columns) > 1:
        str_lens = _string_lengths(lay, rec)
        flat_starts = np.zeros(str_lens.size, np.int64)
        np.cumsum(str_lens.ravel()[:-1], out=flat_starts[1:])
        str_starts = flat_starts.reshape(str_lens.shape)
        if n and str_lens.sum() != len(heap):
            raise CorruptLogError(offset, "string lengths do not match the heap size")
    by_row = _strings_by_row(str_lens, str_starts, heap) if str_lens is not None else None
    for i, c in enumerate(schema.columns):
        col_nulls = nulls[:, i] if nulls is not None else None
        validity = None
        if col_nulls is not None and col_nulls.any():
            validity = pa.py_buffer(np.packbits(~col_nulls, bitorder="little"))
        null_count = int(col_nulls.sum()) if validity is not None else 0
        if c.type is ColumnType.STRING and by_row is not None:
            # The column's strings out of the row-major run of every string (one C++ take;
            # already checked as UTF-8 as a whole), its validity laid over them.
            j = lay.string_columns.index(i)
            if validity is not None and str_lens[:, j][col_nulls].any():
                raise CorruptLogError(offset, f"null {c.name} value with a non-zero length")
            taken = by_row.take(pa.array(np.arange(j, len(by_row), len(lay.string_columns))))
            columns.append(pa.StringArray.from_buffers(n, taken.buffers()[1], taken.buffers()[2], validity,
                                                       null_count))
            continue
        if c.type is ColumnType.STRING:
            lens = rec[f"c{i}"].astype(np.int64)
            if validity is not None and lens[col_nulls].any():
                raise CorruptLogError(offset, f"null {c.name} value with a non-zero length")
            offs = np.zeros(n + 1, np.int64)
            np.cumsum(lens, out=offs[1:])
            if str_lens is None:
                if offs[-1] != len(heap):
                    raise CorruptLogError(offset, "string lengths do not match the heap size")
                data = heap
            else:
                j = lay.string_columns.index(i)
                total = int(offs[-1])
                idx = np.repeat(str_starts[:, j] - offs[:-1], lens) + np.arange(total)
                data = heap[idx]
            if offs[-1] >= 2**31:
                raise CorruptLogError(offset, "string data of one batch exceeds 2 GiB")
            arr = pa.StringArray.from_buffers(
                n, pa.py_buffer(offs.astype(np.int32)), pa.py_buffer(data), validity, null_count
            )
            try:
                arr.validate(full=True)
            except pa.ArrowInvalid as e:
                raise CorruptLogError(offset, f"column {c.name}: {e}") from None
        else:
            vals = rec[f"c{i}"]
            if c.type is ColumnType.BOOL:
                data = pa.py_buffer(np.packbits(vals != 0, bitorder="little"))
            else:
                data = pa.py_buffer(np.ascontiguousarray(vals))
            arr = pa.Array.from_buffers(c.type.arrow_type, n, [validity, data], null_count)
        columns.append(arr)
    return DecodedRows(schema, columns, flags)
