"""Rows that arrive decoded, as Arrow columns: a log chunk's on the reference path, and a pull
source's committed batch (Kafka).

The reference path of a chunk is this module after ``binlog.format``'s scan and decode: the
transaction flags planned in numpy (``storage.transactions``), the rows kept encoded column by
column (``storage.columns``) and appended to the location's write state.  The compiled path
(``storage.ingestcore``) does the same from the chunk's bytes; the two are held to the same
files, records and acks by tests/storage/test_ingest_differential.py.  Split from
``storage.location`` (which calls these under its lock) because what rows do to a location is a
concept apart from its life (recovery, flush, checkpoint, errors).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from disd.binlog import DecodedRows, FrameRun
from disd.schema import ColumnType
from disd.storage import columns as colfmt
from disd.storage import metrics
from disd.storage.checkpoint import SourcePosition
from disd.storage.transactions import plan_transactions
from disd.storage.errors import StorageValueError

if TYPE_CHECKING:
    from disd.storage.location import Location


def ingest(loc: "Location", file_name: str, run: FrameRun, rows: DecodedRows) -> None:
    """Under the location's lock: append the decoded rows of the frames of ``run`` (of log
    ``file_name``) and apply their transaction flags (docs/storage-format.md, "Transactions")."""
    state = loc.state
    assert state is not None
    flags = np.asarray(rows.flags, dtype=np.uint8)
    cols = list(rows.columns)
    n = len(flags)
    if len(cols) != len(loc.schema.columns):
        raise StorageValueError(f"{len(cols)} columns given, {loc.schema.key} has {len(loc.schema.columns)}")
    if any(len(c) != n for c in cols):
        raise StorageValueError("columns and flags differ in length")
    if run.starts and sum(run.row_counts) != n:
        raise StorageValueError(f"the frames of the run hold {sum(run.row_counts)} rows, {n} rows given")
    if not run.starts and n:
        raise StorageValueError("rows given without frames")
    if n == 0:
        return
    skip = 0
    source = loc.source
    if file_name == source.file_name and run.starts[0] == source.offset:
        # The sender (re)starts at the resume point: whatever was ingested past it and is not
        # committed is being resent, so abandon it; and skip the frame's rows that are already
        # committed.
        if state.txn_open or state.written_rows != state.committed_rows:
            loc.import_state["restarts"] += 1
            loc.guarded(loc.rollback_locked, "rollback")
        skip = min(source.skip_rows, n)
        if skip:
            flags = flags[skip:]
            cols = [c.slice(skip) for c in cols]
            if len(flags) == 0:
                return
    plan = plan_transactions(flags, state.txn_open)
    note_malformed(loc, plan.abandoned, plan.end_without_start)
    if plan.keep is None:
        segments = [(0, len(flags))]
    else:  # rows of abandoned transactions are dropped: append the kept ranges
        edges = np.flatnonzero(np.diff(np.concatenate(([False], plan.keep, [False])).astype(np.int8)))
        segments = list(zip(edges[0::2].tolist(), edges[1::2].tolist()))
    n_kept = sum(b - a for a, b in segments)
    if plan.rollback_open:
        loc.guarded(loc.rollback_locked, "rollback")
    before = state.written_rows
    string_ends = loc.guarded(lambda: _append(loc, cols, segments), "write")
    metrics.ROWS_INGESTED.labels(loc.schema.key).inc(n_kept)
    metrics.BYTES_INGESTED.labels(loc.schema.key).inc(run.ends[-1] - run.starts[0])
    if plan.last_commit >= 0:
        upto = (plan.last_commit + 1 if plan.keep is None
                else int(np.count_nonzero(plan.keep[: plan.last_commit + 1])))
        _commit(loc, before + upto, string_ends, upto)
        loc.set_source(_position(file_name, run, plan.last_commit + skip))
    state.txn_open = plan.open_at_end
    loc.mark_dirty()


def append_committed(loc: "Location", cols: list[pa.Array], source: SourcePosition, nbytes: int = 0) -> None:
    """Under the location's lock: rows that commit together, and the resume point moved to
    ``source`` in the same step (``Location.append_committed``)."""
    state = loc.state
    assert state is not None
    if cols and len(cols) != len(loc.schema.columns):
        raise StorageValueError(f"{len(cols)} columns given, {loc.schema.key} has {len(loc.schema.columns)}")
    n = len(cols[0]) if cols else 0
    if n:
        if state.txn_open or state.written_rows != state.committed_rows:
            loc.guarded(loc.rollback_locked, "rollback")
        before = state.written_rows
        string_ends = loc.guarded(lambda: _append(loc, cols, [(0, n)]), "write")
        metrics.ROWS_INGESTED.labels(loc.schema.key).inc(n)
        metrics.BYTES_INGESTED.labels(loc.schema.key).inc(nbytes)
        _commit(loc, before + n, string_ends, n)
        loc.mark_dirty()
    loc.set_source(source)


def note_malformed(loc: "Location", abandoned: int, end_without_start: int) -> None:
    """Count malformed flag sequences (``dis_malformed_flag_sequences_total``, import state)."""
    if abandoned:
        loc.import_state["transactions_abandoned"] += abandoned
        metrics.MALFORMED_FLAGS.labels(loc.schema.key, "abandoned_transaction").inc(abandoned)
    if end_without_start:
        loc.import_state["ends_without_start"] += end_without_start
        metrics.MALFORMED_FLAGS.labels(loc.schema.key, "end_without_start").inc(end_without_start)


def _commit(loc: "Location", rows: int, string_ends: dict[str, np.ndarray], upto: int) -> None:
    """The committed rows are now ``rows``: ``upto`` of those just appended."""
    state = loc.state
    assert state is not None
    sizes = []
    for c in loc.schema.columns:
        if c.type is ColumnType.STRING:
            sizes.append(rows * colfmt.OFFSET_WIDTH)
            sizes.append(int(string_ends[c.name][upto - 1] & colfmt.OFFSET_MASK))
        else:
            sizes.append(rows * c.type.width)
    metrics.ROWS_COMMITTED.labels(loc.schema.key).inc(rows - state.committed_rows)
    state.commit(rows, sizes)


def _append(loc: "Location", cols: list[pa.Array], segments: list[tuple[int, int]]) -> dict[str, np.ndarray]:
    """Append rows ``[a, b)`` of ``cols`` for each segment; returns each string column's new
    offsets entries."""
    state = loc.state
    assert state is not None
    string_ends: dict[str, list[np.ndarray]] = {}
    for a, b in segments:
        parts: list[object] = []
        i = 0
        for c, arr in zip(loc.schema.columns, cols):
            part = arr if (a, b) == (0, len(arr)) else arr.slice(a, b - a)
            if c.type is ColumnType.STRING:
                ends, _lens, data = colfmt.encode_string(part, state.size(i + 1))
                parts += [ends, data]
                string_ends.setdefault(c.name, []).append(ends)
                i += 2
            else:
                parts.append(colfmt.encode_fixed(c, part))
                i += 1
        state.append(parts, b - a)
    if loc.lastby is not None:  # its next update takes these arrays rather than reading the files
        loc.lastby.pending.add(state.written_rows - sum(b - a for a, b in segments), cols, segments)
    return {k: v[0] if len(v) == 1 else np.concatenate(v) for k, v in string_ends.items()}


def _position(file_name: str, run: FrameRun, row: int) -> SourcePosition:
    """The source record just past batch row ``row``: the end of its frame when it is the
    frame's last row, else the frame's start and how many of its rows are done."""
    cum = np.cumsum(run.row_counts)
    j = int(np.searchsorted(cum, row, side="right"))
    if row == cum[j] - 1:
        return SourcePosition(file_name, run.ends[j], 0)
    first = int(cum[j] - run.row_counts[j])
    return SourcePosition(file_name, run.starts[j], row - first + 1)
