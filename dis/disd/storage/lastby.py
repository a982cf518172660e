"""Last-by state: the latest published row of each key of a location, kept as import state.

A table declares its key columns in the DIS configuration (``import.tables.<Ns>.<Table>.last_by``);
each of its locations then holds, beside its rows, one row per key: the last published row with
that key.  Why keep it in the DIS: readers (a dashboard wanting the latest quote per symbol) get
the answer without scanning the day's rows, and the DIS already sees every row as it publishes.

The state is an Arrow table in the location's columns, one row per key, keys in the order they
first appeared, plus the key of each row (``_keys``) that the next batch is matched against.  It
is never mutated: each publish builds a new one (the slot of each of the batch's keys from the
state's key index, ``disd.storage.lastbykeys``, then each column built from the old state's and
the touched slots' last rows in the batch, read where they lie, ``_new_columns``; no per-row
Python), so a reader holds a consistent snapshot
without a lock.  Invariant: ``state.rows`` is
the location's published row count and the state is exactly the last-by of rows ``[0, rows)``.

Input: the rows a publish adds are taken from ``Pending``, the Arrow arrays ingestion appended
(zero-copy slices, dropped again on rollback), not read back from the column files: decoding the
bytes just written cost more than the state update itself.  ``stored`` turns them into exactly
what a read of the files returns (a fixed-width value equal to its null sentinel reads as null),
so the state never depends on which path its rows came by; when ``Pending`` does not hold the
rows (after a restart, a reopen) they are read from the files.

Durability (docs/lastby.md): at each checkpoint the state at exactly the checkpointed row count
is written as an Arrow IPC stream to ``lastby.<rows>.arrow`` (temp, fsync, rename, directory
fsync) before ``table.size``, whose ``lastby`` entry names that file with its size and CRC32C.
Older state files are removed only after the new record is durable, so a crash anywhere leaves a
record naming a complete file.  On open the named file is loaded and checked (CRC, row count,
columns); if it is missing or damaged the state is rebuilt from the checkpointed rows and the log
says so.  A state that disagrees with the rows is never served.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import structlog

from disd.binlog.format import crc32c
from disd.errors import DisError
from disd.schema import Column, ColumnType, TableSchema
from disd.storage import columns as colfmt
from disd.storage.fsio import FileSystem, read_file, write_file
from disd.storage.lastbyfeed import Pending, join
from disd.storage.lastbykeys import POOL, joined_keys, slot_finder, stored

log = structlog.get_logger(__name__)

PREFIX = "lastby."
SUFFIX = ".arrow"
TEMP_SUFFIX = ".tmp"
DELTAS_KEPT = 256  # changes a subscriber may fall behind (at most twice the state's rows) before it gets the state
REBUILD_CHUNK_ROWS = 1 << 20  # rows read at a time when rebuilding the state from the column files


class LastByError(DisError, ValueError):
    """A table's last-by declaration does not fit its schema (names the table and the column)."""


class LastByLimitError(DisError):
    """A location would hold more keys than ``lastby_max_keys``: it stops instead of growing."""


def state_file_name(rows: int) -> str:
    return f"{PREFIX}{rows}{SUFFIX}"


def empty_table(schema: pa.Schema) -> pa.Table:
    """An empty table of ``schema``.  Not ``Schema.empty_table()``: that imports pandas, which
    cost a DIS 0.25-0.45 s of ingestion (holding the GIL) when its first last-by location opened."""
    return pa.Table.from_batches([], schema)


def _indices(values: np.ndarray) -> pa.Array:
    """An int64 numpy array as an Arrow array without a copy.  Not ``pa.array``: its first call
    imports pandas (when installed), 0.25-0.45 s with the GIL held on a DIS that never needs it."""
    values = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


def combined_key(table: pa.Table, keys: tuple[str, ...]) -> pa.Array:
    """One hashable value per row for the key columns (``lastbykeys.joined_keys``)."""
    return joined_keys([table.column(k) for k in keys])


def _joined(state: pa.Array | pa.ChunkedArray, batch: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One column of the state followed by the batch's rows, as one array (a copy of the batch's
    pieces, a memcpy each), for a take of a string column that is not a key (``_new_columns``)."""
    chunks = [*(state.chunks if isinstance(state, pa.ChunkedArray) else [state]),
              *(batch.chunks if isinstance(batch, pa.ChunkedArray) else [batch])]
    if batch.type != state.type:
        chunks = [c if c.type == state.type else c.cast(state.type) for c in chunks]
    return chunks[0] if len(chunks) == 1 else pa.concat_arrays(chunks, memory_pool=POOL)


def _pieces(arr: pa.Array | pa.ChunkedArray) -> list[pa.Array]:
    return list(arr.chunks) if isinstance(arr, pa.ChunkedArray) else [arr]


def _picks(pieces: list[pa.Array], changed: np.ndarray, rows: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """For each piece of the batch holding a touched slot's last row: ``(piece, slots, rows in
    the piece)``, slots ascending."""
    out = []
    start = 0
    for j, piece in enumerate(pieces):
        stop = start + len(piece)
        sel = np.flatnonzero((rows >= start) & (rows < stop))
        if len(sel):
            out.append((j, changed[sel], rows[sel] - start))
        start = stop
    return out


def _new_columns(schema: TableSchema, string_keys: frozenset[int], state: pa.Table, cols: Sequence[pa.Array | pa.ChunkedArray],
                 total: int, changed: np.ndarray, rows: np.ndarray) -> list[pa.Array]:
    """The new state's columns (``total`` slots; ``changed``, ascending, take the batch's ``rows``,
    the others keep their old row), each as ``stored`` makes it.  No column is joined with the
    batch (a copy of the batch, in fresh memory the size of the batch: page faults at every large
    publish): a fixed-width column is the old state's values with the touched slots' values
    written over them, read from each piece of the batch where they lie; a string key column is
    the old column with the new keys appended (a touched key's bytes are those it holds); only
    another string column is taken from the old state's rows followed by the batch's."""
    k = state.num_rows
    picks: dict[tuple[int, ...], list[tuple[int, np.ndarray, np.ndarray]]] = {}
    new_at = int(np.searchsorted(changed, k))  # (changed[new_at:] are the new keys' slots)
    out = []
    for i, (c, arr) in enumerate(zip(schema.columns, cols)):
        old = state.column(i)
        pieces = _pieces(arr)
        if c.type is ColumnType.STRING:
            if i in string_keys and k:
                out.append(_appended(c, old, pieces, changed[new_at:], rows[new_at:]))
            else:
                idx = np.arange(total, dtype=np.int64)
                idx[changed] = k + rows
                out.append(stored(c, pc.take(_joined(old, arr), _indices(idx), memory_pool=POOL)))
            continue
        layout = tuple(len(p) for p in pieces)
        if layout not in picks:
            picks[layout] = _picks(pieces, changed, rows)
        values = colfmt.encode_fixed(c, old.combine_chunks() if old.num_chunks != 1 else old.chunk(0)) if k else None
        dtype = values.dtype if values is not None else colfmt.encode_fixed(c, pieces[0][:0]).dtype
        new = np.empty(total, dtype)
        if values is not None:
            new[:k] = values
        for j, slots, at in picks[layout]:
            new[slots] = colfmt.encode_fixed(c, pieces[j])[at]
        out.append(colfmt.decode_fixed(c, new, total))
    return out


def _appended(column: Column, old: pa.ChunkedArray, pieces: list[pa.Array], slots: np.ndarray,
              rows: np.ndarray) -> pa.Array:
    """A string key column: the old state's keys, then the new keys' (``slots``, ascending,
    following the old ones), taken from the batch's ``rows``."""
    chunks = list(old.chunks)
    if len(slots):
        parts, order = [], []
        for j, sel_slots, at in _picks(pieces, slots, rows):
            parts.append(stored(column, pc.take(pieces[j], _indices(at), memory_pool=POOL)))
            order.append(sel_slots)
        new = parts[0] if len(parts) == 1 else pa.concat_arrays(parts, memory_pool=POOL)
        if len(parts) > 1:
            new = pc.take(new, _indices(np.argsort(np.concatenate(order), kind="stable")), memory_pool=POOL)
        chunks.append(new)
    if len(chunks) == 1:
        return chunks[0]
    chunks = [c if c.type == chunks[0].type else c.cast(chunks[0].type) for c in chunks]
    return pa.concat_arrays(chunks, memory_pool=POOL)


def _last_indices(key: pa.Array) -> np.ndarray:
    """Row index of the last occurrence of each distinct key, keys in order of first appearance
    (dictionary codes are assigned in that order): one hash pass and one O(n) ``maximum.at``."""
    codes = pc.dictionary_encode(key, null_encoding="encode").indices.to_numpy(zero_copy_only=False)
    if len(codes) == 0:
        return np.zeros(0, np.int64)
    last = np.full(int(codes.max()) + 1, -1, np.int64)
    np.maximum.at(last, codes, np.arange(len(codes), dtype=np.int64))
    return last


def last_by(table: pa.Table, keys: Iterable[str]) -> pa.Table:
    """The last row of each key of ``table`` (in row order), keys in order of first appearance.
    The reference the DIS's state must always equal; also the view of a historical partition."""
    keys = tuple(keys)
    missing = [k for k in keys if k not in table.column_names]
    if missing:
        raise LastByError(f"last_by column {missing[0]!r} is not a column of the table ({', '.join(table.column_names)})")
    return table.take(pa.array(_last_indices(combined_key(table, keys))))


def combine(parts: list[tuple[Any, pa.Table]], keys: Iterable[str], partition_column: str,
            schema: pa.Schema) -> pa.Table:
    """A table's last-by view from its locations' states (``(LocationKey, state)`` each, in the
    table's newest columns): each state with the partition column appended (as ``read_table``
    does), and per key the row of the location that sorts last by (column partition, internal
    partition): a later date wins, and within one date the later internal partition name."""
    out_schema = schema.append(pa.field(partition_column, pa.string()))
    tables = []
    for key, t in sorted(parts, key=lambda p: (p[0].column_partition, p[0].internal_partition)):
        tables.append(t.append_column(out_schema.field(partition_column),
                                      pa.array([key.column_partition] * len(t), pa.string())))
    if not tables:
        return empty_table(out_schema)
    both = pa.concat_tables(tables)
    return both if len(tables) == 1 else last_by(both, keys)


def parquet_last_by(files: Iterable[str], keys: Iterable[str], columns: Iterable[str] | None = None) -> pa.Table:
    """The last-by view of a merged historical partition: its Parquet files read in order (a
    merge writes a location's rows in their intraday order) and reduced as the DIS's state is;
    for a partition merged from one location it equals that location's state at the merge."""
    import pyarrow.parquet as pq

    keys = tuple(keys)
    cols = None if columns is None else list(dict.fromkeys([*keys, *columns]))
    tables = [pq.read_table(f, columns=cols) for f in files]
    if not tables:
        raise LastByError("no Parquet files given")
    return last_by(pa.concat_tables(tables), keys)


def validate_keys(schema: TableSchema, keys: tuple[str, ...]) -> None:
    names = [c.name for c in schema.columns]
    for k in keys:
        if k not in names:
            raise LastByError(f"table {schema.key}: last_by column {k!r} is not a column of the table "
                              f"(columns: {', '.join(names)})")
    if len(set(keys)) != len(keys):
        raise LastByError(f"table {schema.key}: last_by names a column twice ({', '.join(keys)})")


@dataclass(frozen=True)
class Snapshot:
    """The state at ``rows`` published rows; ``seq`` counts the publishes it has absorbed;
    ``key_bytes``: the memory its key index held when it was made (beside the table)."""

    table: pa.Table
    rows: int
    seq: int
    key_bytes: int = 0

    @property
    def nbytes(self) -> int:
        table_bytes: int = self.table.nbytes
        return table_bytes + self.key_bytes


class LastBy:
    """The last-by state of one location (see the module docstring)."""

    def __init__(self, schema: TableSchema, keys: tuple[str, ...], max_keys: int, native: bool | None = None) -> None:
        """``native``: the keys in the C index (True), in Arrow (False, the reference), or the
        C index when it is built (None)."""
        validate_keys(schema, keys)
        self.schema = schema
        self.keys = keys
        self.max_keys = max_keys
        self.arrow_schema = schema.arrow_schema()
        self._key_index = [schema.column_names.index(k) for k in keys]
        self._slots = slot_finder([schema.columns[i] for i in self._key_index], native)
        # String key columns: a touched key's bytes are the ones the state holds already, so the
        # new state keeps the old column and appends only the new keys (``_new_columns``).
        self._string_keys = frozenset(i for i in self._key_index if schema.columns[i].type is ColumnType.STRING)
        self.pending = Pending()  # appended rows not yet absorbed (fed by the location)
        self.rows_read_back = 0  # rows a publish had to read from the files (Pending did not hold them)
        self._state = Snapshot(empty_table(self.arrow_schema), 0, 0)
        self._deltas: collections.deque[tuple[int, pa.Table]] = collections.deque()
        self._lock = threading.Lock()  # guards _state's replacement and _deltas
        # Serializes updates (the flusher's, a checkpoint's); the location takes it before its
        # own lock, never after (docs/lastby.md, "Checkpoint").
        self.apply_lock = threading.Lock()
        self._generation = 0  # bumped by recover: an update computed before it is dropped
        self.subscribers = 0  # open SubscribeLastBy streams: deltas are kept only while there are some
        self._delta_rows = 0
        self.durable_ref: dict[str, Any] | None = None  # the ``lastby`` entry of the current table.size

    # -- updating --------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        return self._state

    def rows(self, start: int, stop: int, read_files: Callable[[], pa.Table]) -> pa.Table | list[pa.Array]:
        """Rows ``[start, stop)`` for an update: from ``pending`` when it holds them (copied
        here, outside every lock), else ``read_files()`` (counted in ``rows_read_back``)."""
        parts = self.pending.take(start, stop)
        held = join(parts) if parts is not None else None
        if held is not None:
            return held
        self.rows_read_back += stop - start
        return read_files()

    def catch_up(self, rows: int, read: Callable[[int, int], pa.Table | list[pa.Array]], held: bool = False) -> Snapshot:
        """Bring the state up to ``rows`` published rows, reading the rows it lacks with
        ``read(start, stop)``; ``held``: the caller holds ``apply_lock``."""
        with contextlib.nullcontext() if held else self.apply_lock:
            s, generation = self._state, self._generation
            if s.rows < rows:
                self.apply(read(s.rows, rows), rows, generation)
            return self._state

    def apply(self, batch: pa.Table | list[pa.Array], rows_after: int, generation: int | None = None) -> None:
        """Absorb newly published rows (``batch``, the rows ``[state.rows, rows_after)``: a table
        read from the files, or the columns ``Pending`` held, in schema order).  Raises
        LastByLimitError, leaving the state as it was, when the keys would exceed the limit.
        Dropped when ``recover`` ran since ``generation`` was read."""
        s = self._state
        cols = list(batch.columns) if isinstance(batch, pa.Table) else batch
        if len(cols) != len(self.schema.columns):
            raise LastByError(f"table {self.schema.key}: last-by state given {len(cols)} columns, "
                              f"the location has {len(self.schema.columns)}")
        n = len(cols[0])
        if n != rows_after - s.rows:
            raise LastByError(f"table {self.schema.key}: last-by state at {s.rows} rows given {n} rows "
                              f"to reach {rows_after}")
        if n == 0:
            return
        # Each of the batch's keys gets its slot (the state's keys keep theirs, new keys the next
        # slots in order of first appearance), and each touched slot the batch's last row.
        keyed = self._slots.key(s.table, [cols[i] for i in self._key_index], self.max_keys)
        total, changed, rows = keyed.total, keyed.changed, keyed.rows
        if changed is None or rows is None:  # (both None together: over the key limit)
            raise LastByLimitError(
                f"table {self.schema.key}: {total} last-by keys would exceed lastby_max_keys={self.max_keys} "
                f"(import.tables.{self.schema.key}.lastby_max_keys); the location stops rather than grow without bound")
        table = pa.Table.from_arrays(
            _new_columns(self.schema, self._string_keys, s.table, cols, total, changed, rows),
            schema=self.arrow_schema)
        delta = pc.take(table, _indices(changed), memory_pool=POOL) if self.subscribers else None
        with self._lock:
            if generation is not None and generation != self._generation:
                return
            self._slots.accept(keyed.token, table)
            self._state = Snapshot(table, rows_after, s.seq + 1, self._slots.nbytes)
            if delta is None:
                self._deltas.clear()
                return
            self._deltas.append((s.seq + 1, delta))
            self._delta_rows += len(delta)
            while len(self._deltas) > DELTAS_KEPT or self._delta_rows > 2 * total and len(self._deltas) > 1:
                self._delta_rows -= len(self._deltas.popleft()[1])

    def changes_since(self, seq: int) -> tuple[bool, pa.Table, int, int]:
        """What a subscriber at ``seq`` has not seen: ``(False, latest rows of changed keys, seq,
        rows)``, or ``(True, full snapshot, seq, rows)`` when it fell further behind than the
        deltas kept (or the state was reloaded since)."""
        s = self._state
        if seq == s.seq:
            return False, empty_table(self.arrow_schema), seq, s.rows
        with self._lock:
            deltas = [t for q, t in self._deltas if seq < q <= s.seq]
            complete = bool(self._deltas) and self._deltas[0][0] <= seq + 1 and len(deltas) == s.seq - seq
        if not complete or seq > s.seq:
            return True, s.table, s.seq, s.rows
        return False, last_by(pa.concat_tables(deltas), self.keys), s.seq, s.rows

    # -- durability ------------------------------------------------------------------------
    def write(self, directory: str, fs: FileSystem, state: Snapshot) -> dict[str, Any]:
        """Make ``state`` durable as ``lastby.<rows>.arrow`` (temp, fsync, rename, directory
        fsync); returns the record's ``lastby`` entry naming it."""
        data = to_ipc(state.table)
        name = state_file_name(state.rows)
        tmp = os.path.join(directory, name + TEMP_SUFFIX)
        write_file(fs, tmp, data)
        fs.rename(tmp, os.path.join(directory, name))
        fs.fsync_dir(directory)
        return {"file": name, "rows": state.rows, "keys": len(state.table), "bytes": len(data),
                "crc32c": f"{crc32c(data):08x}"}

    def committed(self, directory: str, fs: FileSystem, ref: dict[str, Any]) -> None:
        """``table.size`` now names ``ref``: older state files (and stray temps) can go."""
        self.durable_ref = ref
        remove_stale(directory, fs, keep=ref["file"])

    def recover(self, directory: str, fs: FileSystem, ref: dict[str, Any] | None, rows: int,
                read_rows: Callable[[int, int], pa.Table], where: str) -> None:
        """Set the state to the last-by of the checkpointed ``rows``: from the file ``ref`` names
        when it checks out, else rebuilt from the rows (logged)."""
        with self._lock:
            self._generation += 1
            self._state = Snapshot(empty_table(self.arrow_schema), 0, self._state.seq + 1)
            self.pending.clear()
            self._deltas.clear()
            self._delta_rows = 0
        self.durable_ref = None
        problem = None if rows == 0 and ref is None else self._load(directory, fs, ref, rows)
        if problem is None:
            self.durable_ref = ref
            remove_stale(directory, fs, keep=ref["file"] if ref else None)
            return
        log.warning("last-by state rebuilt from the checkpointed rows", location=where, reason=problem, rows=rows)
        for start in range(0, rows, REBUILD_CHUNK_ROWS):
            stop = min(rows, start + REBUILD_CHUNK_ROWS)
            self.apply(read_rows(start, stop), stop)
        remove_stale(directory, fs, keep=None)

    def _load(self, directory: str, fs: FileSystem, ref: dict[str, Any] | None, rows: int) -> str | None:
        """Load the state file ``ref`` names; the reason it cannot be trusted, or None."""
        if ref is None:
            return "table.size names no last-by state file"
        try:
            name, size, crc = str(ref["file"]), int(ref["bytes"]), str(ref["crc32c"])
            ref_rows, ref_keys = int(ref["rows"]), int(ref["keys"])
        except (KeyError, TypeError, ValueError):
            return f"table.size's lastby entry is unreadable: {ref!r}"
        if ref_rows != rows or os.sep in name or not name.startswith(PREFIX):
            return f"table.size's lastby entry names {name} at {ref_rows} rows, the checkpoint holds {rows}"
        data = read_file(fs, os.path.join(directory, name), size + 1)
        if data is None:
            return f"{name} is missing"
        if len(data) != size or f"{crc32c(data):08x}" != crc:
            return f"{name} is damaged (size or CRC32C differs from table.size's)"
        try:
            table = pa.ipc.open_stream(data).read_all()
        except pa.ArrowInvalid as e:
            return f"{name} is not an Arrow stream: {e}"
        if not table.schema.equals(self.arrow_schema) or len(table) != ref_keys:
            return f"{name} holds other columns or another number of keys than table.size says"
        if len(table) > self.max_keys:
            raise LastByLimitError(f"table {self.schema.key}: {len(table)} last-by keys exceed "
                                   f"lastby_max_keys={self.max_keys}")
        self._slots.prime(table)
        with self._lock:
            self._state = Snapshot(table, rows, self._state.seq + 1, self._slots.nbytes)
        return None


def to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(data).read_all()


def remove_stale(directory: str, fs: FileSystem, keep: str | None) -> None:
    """Remove state files other than ``keep`` (superseded, or temps a crash left)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return
    for n in names:
        if n.startswith(PREFIX) and n != keep:
            try:
                fs.unlink(os.path.join(directory, n))
            except FileNotFoundError:
                pass


def metric_columns(locations: Sequence[Any]) -> list[tuple[str, str, list[int | None]]]:
    """``dis_lastby_keys``, ``dis_lastby_state_bytes`` and ``dis_lastby_rows`` as (name, help,
    one value per location of ``locations``, None for a location without a last-by state): the
    rows say how far the state has caught up with ``dis_location_rows``.  Columns, not metric
    objects: the scrape renders every location's gauges in one pass (``disd.server.exposition``)."""
    snaps = [None if lb is None else lb.snapshot() for lb in (getattr(loc, "lastby", None) for loc in locations)]
    return [
        ("dis_lastby_keys", "Keys in the location's last-by state",
         [None if s is None else len(s.table) for s in snaps]),
        ("dis_lastby_state_bytes", "Bytes of the location's last-by state in memory",
         [None if s is None else s.nbytes for s in snaps]),
        ("dis_lastby_rows", "Published rows the location's last-by state is the last-by of",
         [None if s is None else s.rows for s in snaps]),
    ]
