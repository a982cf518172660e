"""Last-by state: the latest published row of each key of a location, kept as import state.

A table declares its key columns in the DIS configuration (``import.tables.<Ns>.<Table>.last_by``);
each of its locations then holds, beside its rows, one row per key: the last published row with
that key.  Why keep it in the DIS: readers (a dashboard wanting the latest quote per symbol) get
the answer without scanning the day's rows, and the DIS already sees every row as it publishes.

The state is an Arrow table in the location's columns, one row per key, keys in the order they
first appeared, plus the key of each row (``_keys``) that the next batch is matched against.  It
is never mutated: each publish builds a new one (the slot of each of the batch's keys from the
state's key index, ``disd.storage.lastbykeys``, then each column built from the old state's and
the touched slots' last rows in the batch, read where they lie, ``lastbybuild.new_columns``; no per-row
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
from disd.schema import ColumnType, TableSchema
from disd.storage.fsio import FileSystem, read_file, write_file
from disd.storage.lastbybuild import indices, new_columns
from disd.storage.lastbyfeed import Pending, join
from disd.storage.lastbykeys import POOL, joined_keys, slot_finder, stored  # noqa: F401 - (stored: readers import it from here)

log = structlog.get_logger(__name__)

PREFIX = "lastby."
SUFFIX = ".arrow"
TEMP_SUFFIX = ".tmp"
DELTAS_KEPT = 256  # changes a subscriber may fall behind (at most twice the state's rows) before it gets the state
REBUILD_CHUNK_ROWS = 1 << 20  # rows read at a time when rebuilding the state from the column files
#: the least committed rows, not yet absorbed, for which the state is built ahead of the publish
#: (``LastBy.stage``); at least twice the state's keys too, as each update costs O(keys)
STAGE_ROWS = 200_000


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


def combined_key(table: pa.Table, keys: tuple[str, ...]) -> pa.Array:
    """One hashable value per row for the key columns (``lastbykeys.joined_keys``)."""
    return joined_keys([table.column(k) for k in keys])


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
        # new state keeps the old column and appends only the new keys (``lastbybuild.new_columns``).
        self._string_keys = frozenset(i for i in self._key_index if schema.columns[i].type is ColumnType.STRING)
        self.pending = Pending()  # appended rows not yet absorbed (fed by the location)
        self.rows_read_back = 0  # rows a publish had to read from the files (Pending did not hold them)
        self._state = Snapshot(empty_table(self.arrow_schema), 0, 0)
        # The state built ahead of the published rows from committed ones (``stage``), not served
        # until a publish reaches its rows, with its subscribers' delta; the key index holds its keys.
        self._ahead: tuple[Snapshot, list[tuple[int, pa.Table]]] | None = None
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
            generation = self._generation
            self._promote(rows)
            s = self._state
            if s.rows < rows:
                self.apply(read(s.rows, rows), rows, generation)
            return self._state

    def should_stage(self, committed: int) -> bool:
        """Whether enough committed rows wait (``STAGE_ROWS``, and twice the keys) for ``stage``."""
        ahead = self._ahead
        base = ahead[0] if ahead is not None else self._state
        return committed - base.rows >= max(STAGE_ROWS, 2 * len(base.table))

    def stage(self, committed: int) -> None:
        """Build the state ahead of the publish, up to ``committed`` rows (committed rows are never
        rolled back while the location's epoch stands), from the rows ``pending`` holds; it is
        served only once a publish reaches its rows (``catch_up``).  Why: the update's work then
        runs while the rows are still arriving (on a core the flusher would leave idle until the
        publish), and a publish's own update is left with the rows since.  Nothing is built when
        ``pending`` does not hold the rows, and a failure (the key limit, a reopen) only drops
        what was built: the publish's update then makes, and reports, the same computation."""
        with self.apply_lock:
            generation = self._generation
            ahead = self._ahead
            base = ahead[0] if ahead is not None else self._state
            if committed <= base.rows:
                return
            parts = self.pending.take(base.rows, committed)
            cols = join(parts) if parts is not None else None
            if cols is None:
                return
            try:
                self._build(base, cols, committed, generation, serve=False)
            except Exception:  # noqa: BLE001 - the publish's update reads the rows back and reports it
                with self._lock:
                    self._ahead = None

    def _promote(self, rows: int) -> None:
        """Serve the state built ahead when ``rows`` reach its rows; drop it when it is past them
        (the key index then rebuilds itself from the served state)."""
        with self._lock:
            ahead, self._ahead = self._ahead, None
            if ahead is not None and ahead[0].rows <= rows:
                self._serve(*ahead)

    def apply(self, batch: pa.Table | list[pa.Array], rows_after: int, generation: int | None = None) -> None:
        """Absorb newly published rows (``batch``, the rows ``[state.rows, rows_after)``: a table
        read from the files, or the columns ``Pending`` held, in schema order).  Raises
        LastByLimitError, leaving the state as it was, when the keys would exceed the limit.
        Dropped when ``recover`` ran since ``generation`` was read."""
        with self._lock:
            self._ahead = None  # (built from the state this replaces)
        cols = list(batch.columns) if isinstance(batch, pa.Table) else batch
        self._build(self._state, cols, rows_after, generation, serve=True)

    def _build(self, s: Snapshot, cols: Sequence[pa.Array | pa.ChunkedArray], rows_after: int,
               generation: int | None, serve: bool) -> None:
        """The state ``s`` with the rows ``cols`` absorbed, served (``serve``) or held ahead."""
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
            new_columns(self.schema, self._string_keys, s.table, cols, total, changed, rows),
            schema=self.arrow_schema)
        delta = pc.take(table, indices(changed), memory_pool=POOL) if self.subscribers else None
        with self._lock:
            if generation is not None and generation != self._generation:
                return
            self._slots.accept(keyed.token, table)
            snap = Snapshot(table, rows_after, s.seq + 1, self._slots.nbytes)
            ahead = self._ahead
            deltas = [*(ahead[1] if ahead is not None and ahead[0] is s else []),
                      *([] if delta is None else [(snap.seq, delta)])]
            if serve:
                self._serve(snap, deltas if delta is not None else None)
            else:
                self._ahead = (snap, deltas)

    def _serve(self, snap: Snapshot, deltas: list[tuple[int, pa.Table]] | None) -> None:
        """Under ``_lock``: ``snap`` is now the state; ``deltas``: the changed keys' rows of each
        update since the state it replaces (None: not kept, as nobody subscribed)."""
        self._state = snap
        if not deltas or not self.subscribers:
            self._deltas.clear()
            return
        self._deltas.extend(deltas)
        self._delta_rows += sum(len(d) for _, d in deltas)
        while len(self._deltas) > DELTAS_KEPT or self._delta_rows > 2 * len(snap.table) and len(self._deltas) > 1:
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
            self._ahead = None
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
