"""Kafka messages to the table's Arrow columns, a batch at a time.

JSON values are joined into one buffer of JSON lines and parsed by Arrow's JSON reader against an
explicit schema (C++, one pass), then converted to the table's types by the one conversion of user
input (``binlog.normalize``).  Binary-log values (whole frames of the table's row encoding) are
joined and decoded by the binary log's vectorized decoder.  Only when a batch fails is it decoded
message by message, to find the poison messages (bad JSON, a wrong type, a value out of range, a
torn frame) and say what is wrong with each; the good messages around them are kept.

A batch comes either as confluent-kafka ``Message`` objects (``Batch.of``) or packed: the values
side by side in one buffer, keys as an Arrow array, offsets and timestamps as arrays, taken out of
librdkafka with no Python object a message (``disd.kafka.batchread``).  A packed batch's JSON
lines or binary-log frames are read from its buffer as they are; only the slow paths (a poison
message, a value holding a line break, a null value) make ``bytes`` of each value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Sequence, cast

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson

from disd.binlog import CorruptLogError, decode_frames, normalize_columns, scan_frames
from disd.errors import DisError
from disd.kafka.config import TIME_UNITS, ColumnSource, SourceConfig
from disd.schema import ColumnType, TableSchema

_JSON_TYPE = {
    ColumnType.BOOL: pa.bool_(), ColumnType.BYTE: pa.int64(), ColumnType.SHORT: pa.int64(),
    ColumnType.INT: pa.int64(), ColumnType.LONG: pa.int64(), ColumnType.FLOAT: pa.float64(),
    ColumnType.DOUBLE: pa.float64(), ColumnType.CHAR: pa.string(), ColumnType.STRING: pa.string(),
}


class PoisonMessage(DisError, ValueError):
    """A message whose value cannot be rows of the table (the reason names the column)."""


@dataclass
class Decoded:
    """The rows of a batch's good messages: ``columns`` (the table's, in schema order),
    ``row_offsets`` (each row's Kafka offset), ``ok`` (per message: decoded), ``poison`` (index
    of each bad message and why)."""

    columns: list[pa.Array]
    row_offsets: np.ndarray
    ok: np.ndarray
    poison: list[tuple[int, str]] = field(default_factory=list)

    @property
    def num_rows(self) -> int:
        return len(self.row_offsets)


@dataclass(frozen=True)
class Packed:
    """The values of one partition's messages side by side in one buffer: value ``i`` is
    ``data[starts[i]:ends[i]]``, each followed by ``sep`` (a line break for JSON values: the
    buffer from the first start to the last end is the batch's JSON lines).  ``flags``: 1 a
    null value, 2 a value holding a line break."""

    data: memoryview
    starts: np.ndarray  # int64
    ends: np.ndarray  # int64
    flags: np.ndarray  # uint8

    def __len__(self) -> int:
        return len(self.flags)

    def values(self) -> list[bytes | None]:
        """One ``bytes`` a value (None when null): the slow paths (a poison message, a take)."""
        data = self.data
        return [None if f & 1 else bytes(data[s:e])
                for s, e, f in zip(self.starts.tolist(), self.ends.tolist(), self.flags.tolist())]

    def joined(self) -> memoryview:
        """The values with their separators, the last one's left off."""
        return self.data[int(self.starts[0]):int(self.ends[-1])]

    def nbytes(self) -> int:
        return int((self.ends - self.starts).sum())

    def slice(self, a: int, b: int) -> "Packed":
        return Packed(self.data, self.starts[a:b], self.ends[a:b], self.flags[a:b])


@dataclass(frozen=True)
class Batch:
    """The parts of a batch of messages of one partition, in offset order.  ``values`` and
    ``keys`` are one object a message, or packed (``Packed``, an Arrow binary array)."""

    values: list[bytes | None] | Packed
    offsets: np.ndarray  # int64
    timestamps_ms: np.ndarray  # int64; -1 when the message has none
    partition: int
    keys: list[bytes | None] | pa.Array | None = None
    headers: list[Any] | None = None

    @classmethod
    def of(cls, messages: Sequence[Any], need_keys: bool = False, need_headers: bool = False,
           need_timestamps: bool = False) -> "Batch":
        """From confluent_kafka ``Message`` objects (one partition's, in offset order).  The
        parts are read with ``map`` over the unbound methods: C-level iteration, no Python frame
        a message."""
        from confluent_kafka import Message

        n = len(messages)
        ts = (np.fromiter((t[1] for t in map(Message.timestamp, messages)), np.int64, n) if need_timestamps
              else np.full(n, -1, np.int64))
        # a partition's offsets only grow: n of them from first to first + n - 1 are exactly those
        # (no gap from compaction or transaction markers), and only two need reading
        first = messages[0].offset() if n else 0
        if n and messages[-1].offset() - first == n - 1:
            offsets = np.arange(first, first + n, dtype=np.int64)
        else:
            offsets = np.fromiter(map(Message.offset, messages), np.int64, n)
        return cls(list(map(Message.value, messages)), offsets, ts,
                   messages[0].partition() if n else 0,
                   list(map(Message.key, messages)) if need_keys else None,
                   list(map(Message.headers, messages)) if need_headers else None)

    def take(self, idx: np.ndarray) -> "Batch":
        pick = idx.tolist()
        values = self.value_list()
        keys = (self.keys.take(pa.array(idx, pa.int64())) if isinstance(self.keys, pa.Array)
                else None if self.keys is None else [self.keys[i] for i in pick])
        return Batch([values[i] for i in pick], self.offsets[idx], self.timestamps_ms[idx], self.partition, keys,
                     None if self.headers is None else [self.headers[i] for i in pick])

    def value_list(self) -> list[bytes | None]:
        """One ``bytes`` a value (None: null); a packed batch's are made here, on a slow path."""
        return self.values.values() if isinstance(self.values, Packed) else self.values

    def value_bytes(self) -> int:
        """The values' bytes, all together."""
        if isinstance(self.values, Packed):
            return self.values.nbytes()
        return sum(map(len, filter(None, self.values)))

    def __len__(self) -> int:
        return len(self.values)


class Decoder:
    """One source's decoding: its mapping compiled once."""

    def __init__(self, src: SourceConfig) -> None:
        self.src = src
        self.schema: TableSchema = src.schema
        self.need_keys = any(c.part == "key" for c in src.columns)
        self.need_headers = any(c.part == "header" for c in src.columns)
        self.need_timestamps = any(c.part == "timestamp" for c in src.columns)
        fields = {c.name: c for c in src.columns if c.part == "value"}
        self._fields = fields
        self._json_schema = pa.schema([pa.field(f, self._json_type(c)) for f, c in fields.items()])

    def _json_type(self, c: ColumnSource) -> pa.DataType:
        ctype = self.schema.column(c.column).type
        if ctype is ColumnType.TIMESTAMP:
            return pa.timestamp("ns") if c.unit == "iso" else pa.int64()
        return _JSON_TYPE[ctype]

    def decode(self, batch: Batch) -> Decoded:
        """All of the batch's messages, or (when that fails) each message alone."""
        if not len(batch):
            return Decoded([pa.array([], c.type.arrow_type) for c in self.schema.columns], np.zeros(0, np.int64),
                           np.zeros(0, bool))
        try:
            cols, rows_per = self._decode_all(batch)
            return Decoded(cols, np.repeat(batch.offsets, rows_per), np.ones(len(batch), bool))
        except PoisonMessage:
            pass
        ok = np.zeros(len(batch), bool)
        poison: list[tuple[int, str]] = []
        for i in range(len(batch)):  # the slow path: only a batch holding a poison message
            try:
                self._decode_all(batch.take(np.array([i])))
                ok[i] = True
            except PoisonMessage as e:
                poison.append((i, str(e)))
        good = batch.take(np.flatnonzero(ok))
        if len(good):
            cols, rows_per = self._decode_all(good)
            offsets = np.repeat(good.offsets, rows_per)
        else:
            cols, offsets = self.decode(good).columns, np.zeros(0, np.int64)
        return Decoded(cols, offsets, ok, poison)

    def _decode_all(self, batch: Batch) -> tuple[list[pa.Array], np.ndarray]:
        if self.src.format == "binlog":
            return self._binlog(batch)
        return self._json(batch), np.ones(len(batch), np.int64)

    # -- binary-log values ---------------------------------------------------------------------
    def _binlog(self, batch: Batch) -> tuple[list[pa.Array], np.ndarray]:
        buf: bytes | memoryview
        if isinstance(batch.values, Packed):  # side by side already (no separator)
            lens = batch.values.ends - batch.values.starts
            if not lens.all():
                raise PoisonMessage("empty value: a binlog message holds whole frames of the table's rows")
            buf = batch.values.joined()
        else:
            if any(not v for v in batch.values):
                raise PoisonMessage("empty value: a binlog message holds whole frames of the table's rows")
            values = cast("list[bytes]", batch.values)  # none null (nor empty): checked above
            lens = np.fromiter((len(v) for v in values), np.int64, len(values))
            buf = b"".join(values)
        starts = np.concatenate(([0], np.cumsum(lens)[:-1]))
        try:
            run = scan_frames(buf, 0, self.schema, path=f"partition {batch.partition}")
            if run.end_offset != len(buf) or run.torn:
                raise PoisonMessage(f"{len(buf) - run.end_offset} bytes after the last whole frame (a torn or "
                                    "foreign value)")
            frame_starts = np.asarray(run.starts, np.int64)
            if not np.isin(starts, frame_starts).all():
                raise PoisonMessage("a frame crosses the end of a message")
            rows = decode_frames(buf, 0, run, self.schema)
        except CorruptLogError as e:
            raise PoisonMessage(f"not frames of {self.schema.key}: {e}") from None
        msg_of_frame = np.searchsorted(starts, frame_starts, side="right") - 1
        rows_per = np.bincount(msg_of_frame, weights=np.asarray(run.row_counts, np.int64),
                               minlength=len(batch)).astype(np.int64)
        return self._check_partition_column(list(rows.columns)), rows_per

    # -- JSON values ---------------------------------------------------------------------------
    def _json(self, batch: Batch) -> list[pa.Array]:
        n = len(batch)
        data: dict[str, Any] = {}
        if self._fields:
            buf: bytes | memoryview
            packed = batch.values if isinstance(batch.values, Packed) else None
            if packed is not None and not packed.flags.any():  # JSON lines already: no null, no line break
                buf = packed.joined()
            elif n == 1:
                buf = self._one_line(batch.value_list()[0])
            else:
                values = batch.value_list()
                try:
                    buf = b"\n".join(cast("list[bytes]", values))  # a null value raises TypeError
                except TypeError:  # a null value: decoded one by one to name it
                    raise PoisonMessage("a batch with a null value") from None
                if buf.count(b"\n") != n - 1 or b"\r" in buf:  # line breaks inside values: JSON whitespace
                    buf = b"\n".join(map(self._one_line, values))
            try:
                table = pajson.read_json(
                    pa.BufferReader(pa.py_buffer(buf)),
                    read_options=pajson.ReadOptions(use_threads=False, block_size=max(1 << 20, len(buf) + 1)),
                    parse_options=pajson.ParseOptions(explicit_schema=self._json_schema,
                                                      unexpected_field_behavior="ignore"))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
                raise PoisonMessage(f"bad JSON value: {_short(e)}") from None
            if table.num_rows != n:
                raise PoisonMessage(f"{table.num_rows} JSON objects in {n} messages: one object a message")
            for fname, c in self._fields.items():
                data[c.column] = self._timestamp(table.column(fname), c) if (
                    self.schema.column(c.column).type is ColumnType.TIMESTAMP) else table.column(fname)
        for c in self.src.columns:
            if c.part != "value":
                data[c.column] = self._part(batch, c)
        try:
            cols = normalize_columns(self.schema, data)
        except (ValueError, TypeError, pa.ArrowException) as e:
            raise PoisonMessage(str(e)) from None
        return self._check_partition_column(cols)

    def _check_partition_column(self, cols: list[pa.Array]) -> list[pa.Array]:
        """A row whose column-partition timestamp is null has no date: poison."""
        name = self.src.partition_column
        if name is not None and cols[self.schema.column_names.index(name)].null_count:
            raise PoisonMessage(f"column {name} is null: no date for the column partition")
        return cols

    @staticmethod
    def _one_line(v: bytes | None) -> bytes:
        if v is None:
            raise PoisonMessage("null value (a tombstone): no JSON object")
        return v.replace(b"\r", b" ").replace(b"\n", b" ")  # JSON whitespace; a string cannot hold raw ones

    @staticmethod
    def _timestamp(col: pa.ChunkedArray, c: ColumnSource) -> pa.Array:
        arr = col.combine_chunks()
        if c.unit == "iso":
            return arr
        ints = arr.to_numpy(zero_copy_only=False) if arr.null_count == 0 else None
        if ints is None:
            mask = arr.is_null().to_numpy(zero_copy_only=False)
            ints = arr.fill_null(0).to_numpy()
        else:
            mask = None
        scale = TIME_UNITS[c.unit]
        if scale != 1 and len(ints) and np.abs(ints).max() > np.iinfo(np.int64).max // scale:
            raise PoisonMessage(f"column {c.column}: a timestamp in {c.unit} out of range")
        return pa.array(ints.astype(np.int64) * scale, pa.timestamp("ns"), mask=mask)

    def _part(self, batch: Batch, c: ColumnSource) -> pa.Array:
        if c.part == "offset":
            return pa.array(batch.offsets)
        if c.part == "partition":
            return pa.array(np.full(len(batch), batch.partition, np.int64))
        if c.part == "timestamp":
            ts = batch.timestamps_ms
            ctype = self.schema.column(c.column).type
            if ctype is ColumnType.LONG:
                return pa.array(ts, mask=ts < 0)
            return pa.array(ts * 1_000_000, pa.timestamp("ns"), mask=ts < 0)
        raw = batch.keys if c.part == "key" else [_header(h, c.name) for h in batch.headers or ()]
        try:
            arr = raw if isinstance(raw, pa.Array) else pa.array(raw, pa.binary())
            return arr.cast(pa.string())  # checks UTF-8, in C
        except (pa.ArrowInvalid, TypeError) as e:
            raise PoisonMessage(f"column {c.column}: the {c.part} is not UTF-8 text ({_short(e)})") from None


def _header(headers: Any, name: str) -> bytes | None:
    for k, v in headers or ():
        if k == name:
            return v
    return None


def _short(e: Exception) -> str:
    """Arrow's message, less its row number (the message is named by its offset)."""
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return re.sub(r" in row \d+$", "", text)[:300]
