"""What a Spark task runs: read the slices of one input partition as Arrow RecordBatches.

Runs in a Python worker on an executor with nothing but the pickled input partition: it opens
its own block source (``disd.blocks.open_block_source``: channels to the DIS that listed the
slices, failing over to the other replicas of its routing entry, or, with option ``dbRoot``, the
column files read directly), reads each slice
``batch_rows`` rows at a time — the byte ranges of the columns it needs, decoded by
``disd.storage.columns`` — converts them to the exact Arrow schema Spark expects and closes the
source when the partition is done.  A slice written in another schema version than the scan
presents (``Slice.schema_version``) is decoded in its version and projected onto the scan's
columns (``disd.blocks.read_location``).
"""

from __future__ import annotations

from typing import Iterator

import pyarrow as pa

from disd.spark.arrow import to_batch
from disd.spark.errors import DisSourceError
from disd.spark.plan import DisInputPartition, Slice


def chunks(sl: Slice, batch_rows: int) -> Iterator[tuple[int, int]]:
    """[start, stop) of a slice cut at multiples of ``batch_rows`` (block-aligned chunks)."""
    a = sl.start
    while a < sl.stop:
        b = min(sl.stop, (a // batch_rows + 1) * batch_rows)
        yield a, b
        a = b


def read_partition(part: object) -> Iterator[pa.RecordBatch]:
    if not isinstance(part, DisInputPartition) or not part.slices:
        return  # Spark's placeholder partition of an empty scan
    from disd.blocks import BlockSourceError, open_block_source, read_location

    spec = part.spec
    proj = spec.projection
    table = proj.table()  # the scan's version, carrying the others its slices may be written in
    target = proj.arrow_schema()
    fetch_cols = proj.fetch
    # The one choice of where the bytes come from: the column files (option dbRoot, or a scan
    # planned from them) or the DIS that listed the slices.
    source = open_block_source(db_root=spec.db_root, address=None if spec.routing else part.slices[0].address,
                               routing=spec.routing, security=spec.security, timeout_s=spec.timeout_s,
                               origin="option 'dbRoot'", retry_s=spec.retry_s)
    try:
        for sl in part.slices:
            snap = sl.snapshot()
            for a, b in chunks(sl, spec.batch_rows):
                try:
                    t = read_location(source, table, snap, fetch_cols, a, b) if fetch_cols else None
                except BlockSourceError as e:
                    raise DisSourceError(f"reading {snap.key} rows [{a}, {b}): {e}") from None
                yield to_batch(proj, target, t, b - a, sl.column_partition)
    finally:
        source.close()
