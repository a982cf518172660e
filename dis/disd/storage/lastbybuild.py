"""A last-by update's new state, column by column (``new_columns``): the old state's rows with
the touched slots' last rows of the batch written over them, read where they lie.

Split from ``disd.storage.lastby`` (the state and its rules): this is how one update's table is
built once the key index has said which slots the batch touched and with which rows.  No per-row
Python; O(keys) plus the touched slots' reads, and no fresh memory the size of the batch (joining
a large publish's columns was a fresh mapping, page faults and zeroed pages, at every publish)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from disd.schema import Column, ColumnType, TableSchema
from disd.storage import columns as colfmt
from disd.storage.lastbykeys import POOL, stored


def indices(values: np.ndarray) -> pa.Array:
    """An int64 numpy array as an Arrow array without a copy.  Not ``pa.array``: its first call
    imports pandas (when installed), 0.25-0.45 s with the GIL held on a DIS that never needs it."""
    values = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


def _joined(state: pa.Array | pa.ChunkedArray, batch: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One column of the state followed by the batch's rows, as one array (a copy of the batch's
    pieces, a memcpy each), for a take of a string column that is not a key (``new_columns``)."""
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


def new_columns(schema: TableSchema, string_keys: frozenset[int], state: pa.Table, cols: Sequence[pa.Array | pa.ChunkedArray],
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
                out.append(stored(c, pc.take(_joined(old, arr), indices(idx), memory_pool=POOL)))
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
            parts.append(stored(column, pc.take(pieces[j], indices(at), memory_pool=POOL)))
            order.append(sel_slots)
        new = parts[0] if len(parts) == 1 else pa.concat_arrays(parts, memory_pool=POOL)
        if len(parts) > 1:
            new = pc.take(new, indices(np.argsort(np.concatenate(order), kind="stable")), memory_pool=POOL)
        chunks.append(new)
    if len(chunks) == 1:
        return chunks[0]
    chunks = [c if c.type == chunks[0].type else c.cast(chunks[0].type) for c in chunks]
    return pa.concat_arrays(chunks, memory_pool=POOL)
