"""The ``dis`` PySpark data source: batch (``spark.read``) and streaming (``spark.readStream``).

Where each method runs (Spark 4.x Python Data Source API):

* ``DisDataSource.schema()`` — a Python worker at ``load()``: connects, checks the table, returns
  the table's columns plus the partition column (or only the ``columns`` option's).
* ``DisDataSource.reader()`` / ``streamReader()`` — a Python worker at planning: lists the
  locations once (their published sizes fix what the scan reads) and plans input partitions.
* ``read(partition)`` — a Python worker per task, on a *pickled* reader: it uses only the
  partition, which carries the DIS address, location key, row range, file sizes, columns, table
  schema JSON and security settings.  No client or channel is ever pickled.

Filters: the source takes over none of Spark's WHERE filters; Spark applies them to the rows it
reads, and the ``partitions`` option prunes locations explicitly.  Taking over partition filters
would prune per query only in appearance: Spark 4.x keeps the read a Python source planned for a
filtered query on the loaded DataFrame (``PythonDataSourceV2.setReadInfo``) and reuses it for the
next query on that DataFrame that has no pushable filter, so ``df.where("Date = 'x'").count()``
followed by ``df.count()`` would count day x twice.  A Python source has no hook that tells it a
plan is being reused, so it must not prune by filters at all.

Schema versions: a read presents the table's newest version as the DIS lists it when the read is
loaded (``TableInfo.versions_json``); every input partition carries each location's version
(``Slice.schema_version``) and every known version (``Projection.versions_json``), and a task
decodes each location in its own version and projects it (``disd.blocks.read_location``).
``DisStreamReader`` keeps its schema for the life of the query: locations in a version newer
than the query's are projected onto the query's columns (``_ReaderBase.spec_for``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from disd.client import Client, DisClientError
from disd.spark.arrow import projection, spark_schema
from disd.spark.errors import DisSourceError
from disd.spark.filters import PartitionFilter
from disd.spark.locations import connect, explain, list_locations, table_schema
from disd.spark.ondisk import OnDiskSource
from disd.spark.options import SourceOptions, parse_options
from disd.spark.plan import Range, ReadSpec, plan_partitions
from disd.spark.read import read_partition


def offset_key(key) -> str:  # noqa: ANN001 - LocationKey
    """A location's name in streaming offsets: ``<internal partition>/<column partition>``."""
    return f"{key.internal_partition}/{key.column_partition}"


# -- the data source ----------------------------------------------------------------------------
class DisDataSource(DataSource):
    """``spark.read.format("dis")`` and ``spark.readStream.format("dis")``; see docs/spark.md."""

    @classmethod
    def name(cls) -> str:
        return "dis"

    def schema(self) -> StructType:
        o = parse_options(self.options)
        if o.from_storage:  # historical/all, or column files without a DIS
            return OnDiskSource(o).schema()
        client = connect(o)
        try:
            table = table_schema(client, o)
        finally:
            client.close()
        return spark_schema(table, o.columns)

    def reader(self, schema: StructType) -> DataSourceReader:
        o = parse_options(self.options)
        if o.from_storage:
            return OnDiskSource(o).reader(schema)
        if o.view == "lastby":
            from disd.spark.lastbyview import LastByBatchReader

            return LastByBatchReader(o, schema)
        return DisBatchReader(o, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802 - PySpark's DataSource method
        o = parse_options(self.options)
        if o.from_storage:
            raise DisSourceError("streaming reads a DIS: give option 'address' or 'routing' (and source 'intraday')")
        if o.view == "lastby":
            from disd.spark.lastbyview import LastByStreamReader

            return LastByStreamReader(o, schema)
        return DisStreamReader(o, schema)


class _ReaderBase:
    """What the batch and stream readers share: options, table, projection, a lazy client."""

    def _setup(self, o: SourceOptions, schema: StructType) -> None:
        self.opts = o
        self.output_schema = schema
        self._client: Client | None = None
        try:
            table = table_schema(self.client, o)
        finally:
            # Planning workers are reused: hold no channel between calls (reopened when needed).
            self.close_client()
        self.table_json = table.to_json()
        self.partition_column = table.partition_column
        self.projection = projection(table, schema)
        if o.columns is not None:
            asked = [c.lower() for c in o.columns]
            got = [c.name.lower() for c in self.projection.columns]
            if asked != got:
                raise DisSourceError(
                    f"option 'columns' ({', '.join(o.columns)}) differs from the schema given with "
                    f".schema(...) ({', '.join(c.name for c in self.projection.columns)}); give one of them")
        self.spec = ReadSpec(self.projection, o.security, o.timeout_s, o.batch_rows, o.db_root, o.retry_s,
                             None if o.db_root else o.routing_value())

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = connect(self.opts)
        return self._client

    def close_client(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def spec_for(self, snaps: Sequence) -> ReadSpec:
        """The read spec for tasks over ``snaps`` (``LocationSnapshot``).  A location written in a
        schema version the read does not know — the DIS was restarted with a newer version of the
        table after the read (or the streaming query) started — makes the planner ask the DIS for
        the table's versions again: the read keeps presenting its own version, and the tasks
        project the newer rows onto it (docs/spark.md, "Schema versions")."""
        table = self.projection.table()
        unknown = sorted({s.schema_version for s in snaps if s.schema_version and s.schema_version not in table.versions})
        if not unknown:
            return self.spec
        o = self.opts
        try:
            fresh = self.client.schema(o.namespace, o.table, refresh=True)
        except DisClientError as e:
            raise explain(e, o) from None
        mine = fresh.versions.get(table.version)
        if mine is None or mine.fingerprint != table.fingerprint:
            raise DisSourceError(
                f"{table.key}: the DIS no longer holds version {table.version} of the table as this read knows it "
                f"(it holds versions {', '.join(str(v) for v in fresh.versions)}); start the read again")
        missing = [v for v in unknown if v not in fresh.versions]
        if missing:
            raise DisSourceError(f"{table.key}: a location is written in schema version {missing[0]}, which the DIS "
                                 f"does not list (versions {', '.join(str(v) for v in fresh.versions)})")
        self.projection = dataclasses.replace(self.projection, versions_json=fresh.history_json())
        self.spec = dataclasses.replace(self.spec, projection=self.projection)
        return self.spec

    def filter_column(self) -> str:
        """The partition column's name as the reader's schema spells it."""
        for c in self.projection.columns:
            if c.is_partition:
                return c.name
        return self.partition_column

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_client"] = None  # channels are never pickled; read() opens its own
        return state


class DisBatchReader(_ReaderBase, DataSourceReader):
    """A batch scan, pruned only by the ``partitions`` option (no ``pushFilters``: see the module
    docstring)."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self._setup(options, schema)
        self.partition_filter = PartitionFilter(self.filter_column(), options.partitions)

    def partitions(self) -> Sequence[InputPartition]:
        try:
            snaps = list_locations(self.client, self.opts, self.partition_filter)
            spec = self.spec_for(snaps)
        finally:
            self.close_client()
        ranges = [Range(s, 0, s.rows) for s in snaps]
        return plan_partitions(ranges, spec, self.opts.rows_per_partition, self.opts.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition)


# -- streaming ----------------------------------------------------------------------------------
def admit(start: dict, available: dict, limit: ReadLimit) -> dict:
    """The end offset of the next micro-batch: every location's rows up to ``available`` (never
    below ``start``), at most ``limit.max_rows`` new rows in all, shared evenly."""
    pending = {k: max(0, int(v) - int(start.get(k, 0))) for k, v in available.items()}
    if isinstance(limit, ReadMinRows) and sum(pending.values()) < limit.min_rows:
        pending = {}
    if isinstance(limit, ReadMaxRows):
        pending = water_fill(pending, limit.max_rows)
    end = {k: int(v) for k, v in start.items()}
    for k, n in pending.items():
        if n > 0:
            end[k] = end.get(k, 0) + n
    return {k: end[k] for k in sorted(end) if end[k] > 0}


def water_fill(pending: dict, budget: int) -> dict:
    """Share ``budget`` rows among locations: each gets an equal share, and what a location
    cannot use goes to the others."""
    alloc = {k: 0 for k in pending}
    keys = sorted(k for k, v in pending.items() if v > 0)
    remaining = max(0, int(budget))
    while keys and remaining > 0:
        share = max(1, remaining // len(keys))
        nxt = []
        for k in keys:
            if remaining == 0:
                break
            give = min(share, pending[k] - alloc[k], remaining)
            alloc[k] += give
            remaining -= give
            if alloc[k] < pending[k]:
                nxt.append(k)
        keys = nxt
    return alloc


class DisStreamReader(_ReaderBase, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of new rows.  An offset is ``{"<internal>/<column partition>": rows}``: the
    published row count of each location (absent means 0).  A micro-batch from offset A to B
    reads rows ``[A[k], B[k])`` of each location k, so batches neither overlap nor leave gaps, and
    a query restarted from its checkpoint replays exactly the batch it had planned."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self._setup(options, schema)
        self._target: dict | None = None
        self._seen: dict[str, int] = {}  # the most rows listed for each location so far

    def _snapshots(self) -> dict:
        o = self.opts
        return {offset_key(s.key): s for s in list_locations(self.client, o)
                if o.partitions is None or s.key.column_partition in o.partitions}

    def _available(self) -> dict:
        """Each location's published rows: the most any listing has shown.  A listing may come
        from a replica behind the one listed before (that one went down); offsets mean the same
        on every replica, so the rows already seen stay available, and ``partitions`` waits for a
        replica that has published them."""
        for k, s in self._snapshots().items():
            if s.rows > self._seen.get(k, 0):
                self._seen[k] = s.rows
        return {k: v for k, v in self._seen.items() if v > 0}

    def initialOffset(self) -> dict:  # noqa: N802
        if self.opts.starting_offsets == "latest":
            return dict(sorted(self._available().items()))
        return {}

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        if self.opts.max_rows_per_trigger:
            return ReadMaxRows(self.opts.max_rows_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self._target = self._available()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:  # noqa: N802
        available = self._available()
        if self._target is not None:
            available = {k: min(v, self._target.get(k, 0)) for k, v in available.items()}
        end = admit(start or {}, available, limit)
        return start if end == start else end

    def reportLatestOffset(self) -> dict:  # noqa: N802
        return dict(sorted(self._available().items()))

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        start = start or {}
        wanted = {k: (int(start.get(k, 0)), int(v)) for k, v in end.items() if int(v) > int(start.get(k, 0))}
        if not wanted:
            return []
        # A DIS that crashed republishes what it lost once its tailer resends it, and a replica
        # behind a dead one catches up: wait as long as a restart may take (option
        # retrySeconds), at least the call timeout.
        deadline = time.monotonic() + max(self.opts.timeout_s, self.opts.retry_s)
        while True:
            snaps = self._snapshots()
            short = {k: (snaps[k].rows if k in snaps else 0, b) for k, (a, b) in wanted.items()
                     if k not in snaps or snaps[k].rows < b}
            if not short:
                break
            if time.monotonic() > deadline:
                k, (have, need) = sorted(short.items())[0]
                raise DisSourceError(
                    f"location {self.opts.namespace}.{self.opts.table} {k} has {have} published rows but the "
                    f"offset being read needs {need} (did the DIS lose unflushed rows and not yet re-ingest "
                    "them?); waited as long as options 'retrySeconds' and 'timeout' allow")
            time.sleep(0.2)
        ranges = [Range(snaps[k], a, b) for k, (a, b) in sorted(wanted.items())]
        spec = self.spec_for([r.snap for r in ranges])
        return plan_partitions(ranges, spec, self.opts.rows_per_partition, self.opts.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition)

    def commit(self, end: dict) -> None:
        pass

    def stop(self) -> None:
        self.close_client()
