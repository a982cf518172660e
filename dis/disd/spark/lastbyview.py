"""Option ``view`` ``lastBy`` of the ``dis`` source: a table's last-by view (docs/lastby.md).

* Batch (``spark.read``): the DIS's last-by state of every location (``LastBy``), combined
  across locations (a later column partition wins), in one input partition: no rows are
  scanned.  ``partitions`` selects column partitions, ``columns`` (or ``.schema``) the columns.
* Streaming (``spark.readStream``): offsets are the locations' published row counts, as for the
  rows; the micro-batch from offset A to B holds, per location, the latest row of each key among
  its rows ``[A, B)``: the keys that changed, each once.  The first micro-batch (from
  ``earliest``) is therefore the state itself, and upserting every micro-batch by key keeps a
  copy equal to the DIS's state.  One input partition per location (a key's rows must meet in
  one task).

Spark's JVM reader hands option ``view`` to this Python source (``disd.spark.jvm``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from disd.blocks import BlockSourceError, read_location
from disd.spark.arrow import Projection, projection, to_batch
from disd.spark.errors import DisSourceError
from disd.spark.locations import connect, explain, list_locations, table_schema
from disd.spark.options import SourceOptions
from disd.storage.lastby import last_by


@dataclasses.dataclass(frozen=True)
class LastByPartition(InputPartition):
    """Plain values only (pickled into the task): ``location`` and ``start``/``stop`` for a
    streaming micro-batch of one location; None for the batch read of the DIS's state."""

    opts: SourceOptions
    projection: Projection
    keys: tuple[str, ...]
    location: tuple[str, str] | None = None  # (internal partition, column partition)
    start: int = 0
    stop: int = 0


def _keys(client, o: SourceOptions) -> tuple[str, ...]:  # noqa: ANN001
    """The table's last-by keys as its DIS declares them; a clear error when it declares none."""
    try:
        states = client.last_by_states(o.namespace, o.table)
    except BlockSourceError as e:
        raise DisSourceError(f"option 'view' 'lastBy': {explain(e, o)}") from None
    return tuple(states[0].keys) if states else ()


def _batches(proj: Projection, view: pa.Table, partition_column: str) -> Iterator[pa.RecordBatch]:
    """``view`` (with the partition column) as batches of the projection, one per partition value."""
    target = proj.arrow_schema()
    dates = view.column(partition_column)
    for date in pc.unique(dates).to_pylist():
        part = view.filter(pc.equal(dates, date))
        yield to_batch(proj, target, part, len(part), date)


class _LastByReaderBase:
    """What the last-by batch and stream readers share: options, keys, partition column, projection."""

    def _setup(self, o: SourceOptions, schema: StructType) -> None:
        self.opts = o
        client = connect(o)
        try:
            table = table_schema(client, o)
            self.keys = _keys(client, o)
        finally:
            client.close()
        self.partition_column = table.partition_column
        self.projection = projection(table, schema)


class LastByBatchReader(_LastByReaderBase, DataSourceReader):
    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self._setup(options, schema)

    def partitions(self) -> Sequence[InputPartition]:
        return [LastByPartition(self.opts, self.projection, self.keys)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_last_by(partition)


class LastByStreamReader(_LastByReaderBase, DataSourceStreamReader):
    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self._setup(options, schema)
        self._seen: dict[str, int] = {}

    def _available(self) -> dict:
        client = connect(self.opts)
        try:
            for s in list_locations(client, self.opts):
                if self.opts.partitions is None or s.key.column_partition in self.opts.partitions:
                    k = f"{s.key.internal_partition}/{s.key.column_partition}"
                    self._seen[k] = max(self._seen.get(k, 0), s.rows)
        finally:
            client.close()
        return {k: v for k, v in sorted(self._seen.items()) if v > 0}

    def initialOffset(self) -> dict:  # noqa: N802
        return self._available() if self.opts.starting_offsets == "latest" else {}

    def latestOffset(self) -> dict:  # type: ignore[override]  # noqa: N802 - pyspark types only (start, limit); Spark calls this form too
        return self._available()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        start = start or {}
        if not self.keys:
            self.keys = _setup_keys(self.opts)
        return [LastByPartition(self.opts, self.projection, self.keys, tuple(k.split("/", 1)), int(start.get(k, 0)),
                                int(v))
                for k, v in sorted(end.items()) if int(v) > int(start.get(k, 0))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_last_by(partition)

    def commit(self, end: dict) -> None:
        pass


def _setup_keys(o: SourceOptions) -> tuple[str, ...]:
    client = connect(o)
    try:
        return _keys(client, o)
    finally:
        client.close()


def read_last_by(part: object) -> Iterator[pa.RecordBatch]:
    """The task: the DIS's combined state (batch), or the last-by of one location's new rows."""
    if not isinstance(part, LastByPartition):
        return
    o, proj = part.opts, part.projection
    table = proj.table()
    client = connect(o)
    try:
        if part.location is None:
            view = client.last_by(o.namespace, o.table, partitions=o.partitions)
            yield from _batches(proj, view, table.partition_column)
            return
        internal, column = part.location
        deadline = time.monotonic() + max(o.timeout_s, o.retry_s)
        while True:  # a restarted DIS republishes what it lost once its tailer resends it
            snaps = [s for s in list_locations(client, o, {column}.__contains__)
                     if s.key.internal_partition == internal]
            if snaps and snaps[0].rows >= part.stop:
                break
            if time.monotonic() > deadline:
                raise DisSourceError(f"location {o.namespace}.{o.table} {internal}/{column} has not published "
                                     f"{part.stop} rows; waited as long as options 'retrySeconds' and 'timeout' allow")
            time.sleep(0.2)
        # decoded as the DIS holds them, keys included (a char key a code unit, as in its state);
        # to_batch converts them as the client does
        rows = read_location(client, client.schema(o.namespace, o.table), snaps[0], None, part.start, part.stop)
        view = last_by(rows, part.keys)
        view = view.append_column(pa.field(table.partition_column, pa.string()),
                                  pa.array([column] * len(view), pa.string()))
        yield from _batches(proj, view, table.partition_column)
    except BlockSourceError as e:
        raise explain(e, o) from None
    finally:
        client.close()
