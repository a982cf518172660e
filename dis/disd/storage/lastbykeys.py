"""How a last-by state finds the slot of each new row's key: the state's keys, matched.

An update (``LastBy.apply``) needs, for the rows a publish adds, each key's slot in the state (its
row there; a new key gets the next slot, in order of first appearance) and the batch's last row
of each key it touched.  Two implementations answer that, with one interface (``key``,
``accept``, ``nbytes``):

* ``IndexKeys``: the state's keys in a hash table that lives between publishes
  (``disd.storage.lastbyindex``, C): a publish hashes only its own rows, outside the
  interpreter's lock, and compares each with the key its entry points at in the state's columns.
  The table holds no key bytes (4-byte entries: a slot and a tag of the hash).
* ``ArrowKeys``, the reference: one ``dictionary_encode`` over the state's keys (kept as an
  Arrow array beside the state) and the batch's.  Arrow keeps no hash table between calls, so it
  hashes the state's keys again at every publish.  Used when the C module is not built, and by
  the tests as what ``IndexKeys`` must equal.

``slot_finder`` chooses between them, in this one place.  Both are tied to the state table they
last produced (``accept``): given another one (the state was loaded from its file, rebuilt, or
an update was refused or dropped), they first rebuild from that table's key columns, so they can
never disagree with the state they are used with.

Keys are compared as the state holds them (a fixed-width value equal to its column's null
sentinel is null, ``stored``); floats by their bits in a one-column key (as Arrow's
``dictionary_encode``) and with every NaN equal in a key of several columns (as the reference's
joined string forms).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from disd.schema import Column, ColumnType
from disd.storage import columns as colfmt

#: The memory of the arrays an update makes: the C library's allocator (glibc, as the DIS tunes it,
#: ``disd.allocator``), not Arrow's default (mimalloc), which handed the pages of one update's
#: arrays back to the system before the next and took fresh transparent huge pages for it:
#: zeroing them was 18-43% of a DIS's CPU samples with last-by on (perf, ``bench/lastby.py``).
POOL = pa.system_memory_pool()

try:  # the product's C module (setup.py); without it the reference answers
    from disd.storage import lastbyindex
except ImportError:  # pragma: no cover - a build without a C compiler
    lastbyindex = None


@dataclass(frozen=True)
class Keyed:
    """The keys of one batch: ``total`` keys after it (slots ``0..total-1``); ``changed``, the
    slots it touched (ascending, int64), and ``rows``, its last row of each.  Both are None when
    ``total`` exceeds the key limit (nothing was kept)."""

    total: int
    changed: np.ndarray | None
    rows: np.ndarray | None
    token: int


def slot_finder(columns: Sequence[Column], native: bool | None = None) -> "IndexKeys | ArrowKeys":
    """The keys of a state whose key columns are ``columns``: the C index when it is built
    (``native`` None), or as asked."""
    if native is None:
        native = lastbyindex is not None
    return IndexKeys(columns) if native else ArrowKeys(columns)


def stored(column: Column, arr: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """``arr`` as a read of the column files returns it: the column's Arrow type, and for
    fixed-width types a value equal to the null sentinel as null (``columns.encode_fixed`` then
    ``decode_fixed``).  Strings are stored as given (nulls stay nulls, chunks stay chunks)."""
    if column.type is ColumnType.STRING:
        return arr if arr.type == pa.string() else arr.cast(pa.string())
    if isinstance(arr, pa.ChunkedArray):
        arr = pa.concat_arrays(arr.chunks, memory_pool=POOL) if arr.num_chunks else pa.nulls(0, arr.type)
    return colfmt.decode_fixed(column, colfmt.encode_fixed(column, arr), len(arr))


def joined_keys(columns: list[pa.Array | pa.ChunkedArray]) -> pa.Array:
    """One hashable value per row for key columns held as stored.  A single column is its own
    key; several are joined into one string, each part prefixed by its length
    (``3:abc|N|5:12345``, ``N`` for null) so no two different tuples give the same string."""
    if len(columns) == 1:
        col = columns[0]
        if isinstance(col, pa.ChunkedArray):  # (an empty one's combine_chunks imports pandas)
            col = pa.concat_arrays(col.chunks) if col.num_chunks else pa.nulls(0, col.type)
        return col
    parts = []
    for col in columns:
        s = pc.cast(col, pa.string())
        part = pc.binary_join_element_wise(pc.cast(pc.utf8_length(s), pa.string()), s, ":")
        parts.append(pc.fill_null(part, "N"))
    out = pc.binary_join_element_wise(*parts, "|")
    return out.combine_chunks() if isinstance(out, pa.ChunkedArray) else out


def _codes(arr: pa.Array) -> np.ndarray:
    """The values of an integer Arrow array without nulls (dictionary indices) as numpy, no copy."""
    dtype = np.dtype(f"<i{arr.type.bit_width // 8}")
    return np.frombuffer(arr.buffers()[1], dtype, count=len(arr), offset=arr.offset * dtype.itemsize)


class ArrowKeys:
    """The reference: the state's keys as one Arrow array (``joined_keys`` of its key columns),
    matched against a batch's by one ``dictionary_encode`` of both as chunks (no concatenation):
    the state's keys, unique and in slot order, get their slots back as codes, and the batch's
    new keys the next codes in order of first appearance; the dictionary is the new state's keys."""

    def __init__(self, columns: Sequence[Column]) -> None:
        self.columns = list(columns)
        self._lock = threading.Lock()
        self._keys: pa.Array | None = None  # the keys of ``_for``
        self._for: pa.Table | None = None
        self._next: tuple[int, pa.Array] | None = None
        self._token = 0

    def _state_keys(self, state: pa.Table) -> pa.Array:
        if self._for is not state or self._keys is None:
            self._keys = joined_keys([state.column(c.name) for c in self.columns])
            self._for = state
        return self._keys

    def key(self, state: pa.Table, batch: list[pa.Array | pa.ChunkedArray], max_keys: int) -> Keyed:
        """The slots of ``batch`` (its key columns, as appended) against ``state``'s keys."""
        with self._lock:
            skeys = self._state_keys(state)
            k, n = len(skeys), len(batch[0])
            bkey = joined_keys([stored(c, a) for c, a in zip(self.columns, batch)])
            chunks = [skeys, *(bkey.chunks if isinstance(bkey, pa.ChunkedArray) else [bkey])]
            enc = pc.dictionary_encode(pa.chunked_array(chunks, skeys.type), null_encoding="encode")
            dictionary = enc.chunks[-1].dictionary  # (every chunk's codes index the final dictionary)
            total = len(dictionary)
            self._token += 1
            if total > max_keys:
                return Keyed(total, None, None, self._token)
            codes = np.concatenate([_codes(c.indices) for c in enc.chunks])[k:]
            last = np.full(total, -1, np.int64)
            np.maximum.at(last, codes, np.arange(n, dtype=np.int64))  # each key's last row in the batch
            changed = np.flatnonzero(last >= 0)
            self._next = (self._token, dictionary)
            return Keyed(total, changed, last[changed], self._token)

    def prime(self, state: pa.Table) -> None:
        """``state`` (loaded from its file) is now the state: hold its keys."""
        with self._lock:
            self._state_keys(state)

    def accept(self, token: int, table: pa.Table) -> None:
        """``table`` is now the state: it was built from the keys ``key`` returned with ``token``."""
        with self._lock:
            if self._next is not None and self._next[0] == token:
                self._keys, self._for, self._next = self._next[1], table, None

    @property
    def nbytes(self) -> int:
        keys = self._keys
        return keys.nbytes if keys is not None else 0


_KIND_FIXED, _KIND_FLOAT, _KIND_BOOL, _KIND_STRING = 0, 1, 2, 3


def _spec(column: Column, several: bool) -> tuple[int, int, bytes | None]:
    t = column.type
    if t is ColumnType.STRING:
        return _KIND_STRING, 0, None
    if t is ColumnType.BOOL:
        return _KIND_BOOL, 0, None
    sentinel = np.array(t.null_sentinel, dtype=t.numpy_dtype).tobytes()
    kind = _KIND_FLOAT if several and t in (ColumnType.FLOAT, ColumnType.DOUBLE) else _KIND_FIXED
    return kind, t.width, sentinel


def _buffers(column: Column, arr: pa.Array | pa.ChunkedArray) -> tuple:
    """``(validity, values, data, offset)`` of one key column for the C index: one array of the
    column's Arrow type (chunks joined, a string column as 32-bit offsets)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.chunk(0) if arr.num_chunks == 1 else (
            pa.concat_arrays(arr.chunks, memory_pool=POOL) if arr.num_chunks else pa.nulls(0, arr.type))
    want = pa.string() if column.type is ColumnType.STRING else column.type.arrow_type
    if arr.type != want:
        arr = arr.cast(want)
    bufs = arr.buffers()
    validity = bufs[0] if arr.null_count else None
    values = bufs[1]
    if values is None:  # (an array of nulls may have no values at all)
        width = 4 * (len(arr) + 1) if column.type is ColumnType.STRING else (
            (len(arr) + 7) // 8 if column.type is ColumnType.BOOL else column.type.width * len(arr))
        return validity, pa.py_buffer(bytes(width + 8)), None, arr.offset
    data = bufs[2] if column.type is ColumnType.STRING else None
    return validity, values, data, arr.offset


def _chunks(columns: Sequence[Column], batch: list[pa.Array | pa.ChunkedArray]) -> list[tuple]:
    """The batch's key columns as chunks ``(rows, [buffers of each column])`` for the C index,
    read where they are (a publish's pieces are not joined): the columns' chunks cut at the same
    rows (``Table.to_batches``, slices)."""
    if all(isinstance(a, pa.Array) for a in batch):
        return [(len(batch[0]), [_buffers(c, a) for c, a in zip(columns, batch)])]
    table = pa.Table.from_arrays(batch, names=[c.name for c in columns])
    return [(rb.num_rows, [_buffers(c, a) for c, a in zip(columns, rb.columns)]) for rb in table.to_batches()]


class IndexKeys:
    """The state's keys in ``lastbyindex.KeyIndex``, a hash table kept between publishes; each
    update hands it the key columns of the state and of the batch (the keys are compared where
    they live) and it returns the touched slots and rows, computed outside the interpreter's lock."""

    def __init__(self, columns: Sequence[Column]) -> None:
        if lastbyindex is None:
            raise RuntimeError("disd.storage.lastbyindex is not built")
        self.columns = list(columns)
        several = len(self.columns) > 1
        self._index = lastbyindex.KeyIndex([_spec(c, several) for c in self.columns])
        self._lock = threading.Lock()
        self._for: pa.Table | None = None  # the state the index holds the keys of
        self._token = 0
        self._pending = 0  # the token whose keys the index holds, not yet accepted

    def key(self, state: pa.Table, batch: list[pa.Array | pa.ChunkedArray], max_keys: int) -> Keyed:
        """The slots of ``batch`` (its key columns, as appended) against ``state``'s keys."""
        with self._lock:
            if self._for is not state:
                self._index.clear()  # (it then rebuilds itself from the state's columns)
            self._for = None
            self._token += 1
            k, n = state.num_rows, len(batch[0])
            total, changed, rows = self._index.update(
                [_buffers(c, state.column(c.name)) for c in self.columns], k, _chunks(self.columns, batch), n, max_keys)
            if changed is None:
                return Keyed(total, None, None, self._token)
            self._pending = self._token
            return Keyed(total, np.frombuffer(changed, np.int64), np.frombuffer(rows, np.int64), self._token)

    def prime(self, state: pa.Table) -> None:
        """``state`` (loaded from its file) is now the state: hold its keys."""
        with self._lock:
            self._index.clear()
            self._for = None
            cols = [_buffers(c, state.column(c.name)) for c in self.columns]
            self._index.update(cols, state.num_rows, [], 0, 1 << 62)
            self._for = state

    def accept(self, token: int, table: pa.Table) -> None:
        """``table`` is now the state: it was built from the keys ``key`` returned with ``token``."""
        with self._lock:
            if self._pending == token == self._token:
                self._for = table

    @property
    def nbytes(self) -> int:
        return self._index.nbytes
