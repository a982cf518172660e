"""Reading and writing whole binary log files (the byte layout itself is in ``format``)."""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from disd.binlog.format import (
    HEADER_FIXED,
    MAX_FRAME_PAYLOAD,
    MAX_SCHEMA_JSON,
    CorruptLogError,
    FrameRun,
    LogHeader,
    RowFlag,
    RowLayout,
    SchemaMismatchError,
    decode_frames,
    decode_header,
    encode_frame,
    encode_header,
    encode_rows,
    layout_for,
    scan_frames,
)
from disd.schema import TableSchema

#: Rows per frame at most; bigger batches are split.  Small enough that a frame is a modest
#: unit of work for the tailer and the DIS, big enough that per-frame costs vanish.
MAX_ROWS_PER_FRAME = 65536


@dataclass
class LogContents:
    """Every complete row of a log file (with ``read_file(..., intact_only=True)``: every row
    before its first corrupt frame, and that frame's error in ``corrupt``)."""

    header: LogHeader
    table: pa.Table
    flags: np.ndarray
    end_offset: int  # just past the last complete frame: a valid resume point
    torn: bool  # bytes after end_offset form an incomplete frame
    frame_ends: list[int]
    frame_row_counts: list[int]
    corrupt: CorruptLogError | None = None

    @property
    def schema(self) -> TableSchema:
        return self.header.schema


def read_file(path: str | os.PathLike[str], schema: TableSchema | None = None,
              intact_only: bool = False) -> LogContents:
    """Decode every complete row of a binary log.

    With ``schema`` the log's fingerprint must match it (SchemaMismatchError otherwise).  A torn
    tail is not an error: reading stops at the last complete frame and ``torn`` is set.  A
    complete frame that fails its checks raises CorruptLogError naming the byte offset; with
    ``intact_only`` it ends the contents instead (``end_offset`` is its start) and the error is
    returned in ``corrupt``.  A bad header always raises.
    """
    path = str(path)
    with open(path, "rb") as f:
        data = f.read()
    header = decode_header(data, path)
    if header is None:
        raise CorruptLogError(len(data), "file shorter than its header", path)
    if schema is not None and schema.fingerprint != header.fingerprint:
        raise SchemaMismatchError(
            f"{path}: written for schema {header.fingerprint} ({header.schema.key}: "
            f"{', '.join(f'{c.name}:{c.type.value}' for c in header.schema.columns)}), "
            f"expected {schema.fingerprint} ({schema.key})"
        )
    use = schema or header.schema
    corrupt = None
    try:
        run = scan_frames(data, 0, use, start=header.size, path=path)
    except CorruptLogError as e:
        if not intact_only:
            raise
        corrupt = e
        run = scan_frames(memoryview(data)[: e.offset], 0, use, start=header.size, path=path)
    try:
        rows = decode_frames(data, 0, run, use) if run.starts else None
    except CorruptLogError:
        if not intact_only:
            raise
        run, corrupt = _before_undecodable(data, run, use, header.size, path)
        rows = decode_frames(data, 0, run, use) if run.starts else None
    if rows is not None:
        table, flags = rows.to_table(), rows.flags
    else:
        table = use.arrow_schema().empty_table()
        flags = np.zeros(0, np.uint8)
    return LogContents(header, table, flags, run.end_offset, run.torn, run.ends, run.row_counts, corrupt)


def _before_undecodable(data: bytes, run: FrameRun, schema: TableSchema, first: int,
                        path: str) -> tuple[FrameRun, CorruptLogError | None]:
    """The frames of ``run`` before the first one that does not decode, and its error."""
    for k, (s, e, r) in enumerate(zip(run.starts, run.ends, run.row_counts)):
        try:
            decode_frames(data, 0, FrameRun(0, [s], [e], [r], e), schema)
        except CorruptLogError as err:
            good = FrameRun(0, run.starts[:k], run.ends[:k], run.row_counts[:k], s if k else first)
            return good, CorruptLogError(err.offset, err.problem, path)
    return run, None  # pragma: no cover - a run that fails whole fails in one of its frames


def read_header(path: str | os.PathLike[str]) -> LogHeader | None:
    """The header of the log at ``path`` without reading its frames; None while the header is
    incomplete (a file just created).  CorruptLogError for a header that is wrong."""
    with open(path, "rb") as f:
        head = f.read(HEADER_FIXED.size)
        if len(head) < HEADER_FIXED.size:
            return decode_header(head, str(path))
        schema_len = HEADER_FIXED.unpack_from(head, 0)[3]
        rest = f.read(min(schema_len, MAX_SCHEMA_JSON + 1) + 4)
    return decode_header(head + rest, str(path))


def split_points(flags: np.ndarray, max_rows: int = MAX_ROWS_PER_FRAME) -> list[int]:
    """Frame boundaries for a batch of rows: before every StartTransaction and every
    ``max_rows``.  Starting a frame at every StartTransaction means the last commit point
    (EndTransaction or SingleRow) of a frame is always the frame's end, so the offset just past
    the last committed row of a well-formed log is always a frame boundary."""
    n = len(flags)
    tx_starts = np.flatnonzero(flags == RowFlag.START_TRANSACTION).tolist()
    out: list[int] = []
    prev = 0
    for cut in [*tx_starts, n]:
        while cut - prev > max_rows:
            prev += max_rows
            out.append(prev)
        if 0 < cut < n and cut != prev:
            out.append(cut)
        prev = cut
    return out


def size_points(row_bytes: np.ndarray, limit: int = MAX_FRAME_PAYLOAD) -> list[int]:
    """Frame boundaries that keep every frame's payload within ``limit`` bytes, given each
    row's payload bytes: each frame takes as many rows as fit (at least one)."""
    n = len(row_bytes)
    cum = np.zeros(n + 1, np.int64)
    np.cumsum(row_bytes, out=cum[1:])
    out: list[int] = []
    a = 0
    while a < n:
        b = int(np.searchsorted(cum, cum[a] + limit, side="right")) - 1
        a = min(max(b, a + 1), n)
        if a < n:
            out.append(a)
    return out


def frame_points(layout: RowLayout, columns: Sequence[pa.Array], flags: np.ndarray,
                 max_rows: int = MAX_ROWS_PER_FRAME) -> list[int]:
    """Every frame boundary of a batch: where its payload would pass ``MAX_FRAME_PAYLOAD``
    bytes (``size_points``), and within those pieces ``split_points``."""
    if layout.payload_bytes(columns) <= MAX_FRAME_PAYLOAD:
        return split_points(flags, max_rows)
    bounds = [0, *size_points(layout.row_bytes(columns)), len(flags)]
    out: list[int] = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        if a:
            out.append(a)
        out.extend(a + p for p in split_points(flags[a:b], max_rows))
    return out


class BinlogWriter:
    """Appends frames to one log file.

    Opening an existing file checks its header against the schema and cuts off a torn tail left
    by a writer that died mid-frame, so new frames follow the last complete one.
    """

    def __init__(self, path: str | os.PathLike[str], schema: TableSchema) -> None:
        self.path = pathlib.Path(path)
        self.schema = schema
        self._layout = layout_for(schema)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self._file = os.fdopen(fd, "r+b", buffering=0)
        size = os.fstat(fd).st_size
        if size == 0:
            self._file.write(encode_header(schema))
            self.offset = self._file.tell()
        else:
            data = self._file.read()
            header = decode_header(data, str(self.path))
            if header is None:  # a header torn by a crash: start the file afresh
                self._file.seek(0)
                self._file.truncate(0)
                self._file.write(encode_header(schema))
                self.offset = self._file.tell()
            else:
                if header.fingerprint != schema.fingerprint:
                    self._file.close()
                    raise SchemaMismatchError(f"{self.path}: existing log has another schema")
                if header.schema.version != schema.version:
                    # a file holds rows of one schema version (its header's): same columns or not
                    self._file.close()
                    raise SchemaMismatchError(
                        f"{self.path}: existing log is written in version {header.schema.version} of "
                        f"{schema.key}, not version {schema.version}")
                run = scan_frames(data, 0, schema, start=header.size, path=str(self.path))
                self.offset = run.end_offset
                if run.end_offset != size:
                    self._file.truncate(run.end_offset)
                self._file.seek(self.offset)
        self.rows_written = 0

    def write_rows(self, columns: Sequence[pa.Array], flags: np.ndarray) -> int:
        """Encode and append rows; returns the file offset after them.  One ``write`` call per
        batch, so a reader never sees a frame before its header is complete... except through a
        torn write, which the frame checksums expose.  The batch is cut into frames by
        ``frame_points``; a single row whose payload passes ``MAX_FRAME_PAYLOAD`` raises
        ValueError."""
        flags = np.asarray(flags, dtype=np.uint8)
        n = len(flags)
        if n == 0:
            return self.offset
        cuts = [0, *frame_points(self._layout, columns, flags), n]
        parts = []
        for a, b in zip(cuts[:-1], cuts[1:]):
            cols = [c.slice(a, b - a) for c in columns]
            payload, rows = encode_rows(self.schema, cols, flags[a:b])
            parts.append(encode_frame(payload, rows))
        data = b"".join(parts)
        self._file.write(data)
        self.offset += len(data)
        self.rows_written += n
        return self.offset

    def fsync(self) -> None:
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> "BinlogWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
