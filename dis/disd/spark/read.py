"""What a Spark task runs: read the slices of one input partition as Arrow RecordBatches.

Runs in a Python worker on an executor with nothing but the pickled input partition: it opens
its own channels (one per DIS address) — or, with option ``dbRoot``, reads the column files
directly (``disd.spark.direct``) — reads each slice ``batch_rows`` rows at a time — the
64 KiB blocks of the columns it needs, many in flight — converts them to the exact Arrow schema
Spark expects and closes the channels when the partition is done.
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
    from disd.client import Client, DisClientError
    from disd.routing import Routing
    from disd.schema import TableSchema
    from disd.storage.columns import read_rows

    spec = part.spec
    proj = spec.projection
    table = TableSchema.from_json(proj.table_json, "the planned scan")
    target = proj.arrow_schema()
    fetch_cols = proj.fetch
    if spec.db_root is not None:
        from disd.spark.direct import DirectFiles

        client = DirectFiles(spec.db_root)
    else:
        client = Client(Routing.single(part.slices[0].address), spec.security.client_security(), spec.timeout_s)
    try:
        for sl in part.slices:
            snap = sl.snapshot()

            def fetch(name: str, a: int, b: int, snap=snap) -> bytes:
                return client.read_range(snap, name, a, b)

            for a, b in chunks(sl, spec.batch_rows):
                try:
                    t = read_rows(table, fetch_cols, a, b, fetch) if fetch_cols else None
                except DisClientError as e:
                    raise DisSourceError(f"reading {snap.key} rows [{a}, {b}): {e}") from None
                yield to_batch(proj, target, t, b - a, sl.column_partition)
    finally:
        client.close()
