"""``dis`` reads that start from the database root: historical tables, intraday column files, both.

Option ``source`` says which rows a read takes:

* ``intraday`` (the default) — with ``address``/``routing``, the DIS serves them (``disd.spark.source``,
  unchanged).  Without a DIS but with ``dbRoot``, the column files under ``<dbRoot>/Intraday``
  are read at their checkpoints (``table.size``): on the DIS host, whether or not the DIS runs.
* ``historical`` — the table's Parquet files under ``dbRoot`` (``Systems/`` or ``Users/``), in
  whatever layout its definition names (``disd.historical.discover``).
* ``all`` — historical rows, plus intraday rows (from the DIS when ``address``/``routing`` is
  given, else from the column files) of every partition value that has no historical location:
  intraday wins for partitions not yet merged, historical for those merged.  One query spans both.

The table's columns come from its historical definition when it has one, else from the DIS (or
the ``schemas`` directory for column files); in ``all`` mode both must describe the same rows.
Partition pruning (the ``partitions`` option, pushed WHERE clauses) works on both kinds of rows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, Filter, InputPartition
from pyspark.sql.types import StructType

from disd.security import ClientSecurity
from disd.spark.arrow import projection, spark_schema
from disd.spark.errors import DisSourceError
from disd.spark.filters import PartitionFilter
from disd.spark.historical import HistoricalInputPartition, HistoricalSpec, plan_files, read_historical
from disd.spark.options import (
    DEFAULT_BATCH_ROWS,
    DEFAULT_ROWS_PER_PARTITION,
    KNOWN,
    SourceOptions,
    _int,
    _list,
    parse_options,
)
from disd.spark.plan import Range, ReadSpec, plan_partitions
from disd.spark.read import read_partition

SOURCES = ("intraday", "historical", "all")
OWN = {"source", "schemas"}


def source_of(options: Mapping[str, str]) -> str:
    opts = {str(k).lower(): v for k, v in dict(options).items()}
    source = str(opts.get("source") or "intraday").strip().lower()
    if source not in SOURCES:
        raise DisSourceError(f"option 'source' must be one of {', '.join(SOURCES)}; got {opts.get('source')!r}")
    return source


def storage_source(options: Mapping[str, str]) -> "OnDiskSource | None":
    """The on-disk source for these options, or None when the DIS alone serves the read."""
    opts = {str(k).lower(): v for k, v in dict(options).items()}
    source = source_of(opts)
    has_dis = bool((opts.get("address") or "").strip() or (opts.get("routing") or "").strip())
    has_root = bool((opts.get("dbroot") or "").strip())
    if source == "intraday" and (has_dis or not has_root):
        # The DIS serves it (with dbRoot, its tasks read the column files directly); without
        # either, disd.spark.source says that 'address' is missing.
        if (opts.get("schemas") or "").strip():
            raise DisSourceError("option 'schemas' is for reading column files without a DIS; "
                                 "the DIS at 'address'/'routing' knows the schema")
        return None
    return OnDiskSource(parse_ondisk_options(opts))


@dataclass(frozen=True)
class OnDiskOptions:
    source: str
    db_root: str
    namespace: str
    table: str
    schemas: str | None = None
    columns: tuple[str, ...] | None = None
    partitions: frozenset[str] | None = None
    rows_per_partition: int = DEFAULT_ROWS_PER_PARTITION
    min_partitions: int = 2
    batch_rows: int = DEFAULT_BATCH_ROWS
    dis: SourceOptions | None = None  # the DIS serving intraday rows in 'all' mode


def parse_ondisk_options(opts: Mapping[str, str]) -> OnDiskOptions:
    unknown = sorted(set(opts) - KNOWN - OWN)
    if unknown:
        raise DisSourceError(f"unknown option {unknown[0]!r}; with 'source' historical or all, or dbRoot without a "
                             "DIS, the options are: source, dbRoot, schemas, namespace, table, columns, partitions, "
                             "rowsPerPartition, minPartitions, batchRows, and for the DIS of 'all': address or "
                             "routing, timeout, ca, cert, key, token, tokenFile, serverName")
    source = source_of(opts)
    db_root = (opts.get("dbroot") or "").strip()
    if not db_root:
        what = "the historical tables" if source != "intraday" else "the column files (no 'address' or 'routing' given)"
        raise DisSourceError(f"option 'dbRoot' (the database root holding {what}) is required")
    if not os.path.isdir(db_root):
        raise DisSourceError(f"option 'dbRoot': no such directory {db_root!r}")
    dis = None
    has_dis = (opts.get("address") or "").strip() or (opts.get("routing") or "").strip()
    if source == "all" and has_dis:
        # Intraday rows of 'all' come over gRPC: dbRoot here names the historical root, which
        # need not be that DIS's own root, so it is not used for direct column-file reads.
        dis = parse_options({k: v for k, v in opts.items() if k not in OWN and k != "dbroot"})
    schemas = (opts.get("schemas") or "").strip() or None
    if schemas and not os.path.isdir(schemas):
        raise DisSourceError(f"option 'schemas': no such directory {schemas!r}")
    namespace = (opts.get("namespace") or "").strip()
    table = (opts.get("table") or "").strip()
    path = (opts.get("path") or "").strip()
    if path and not table:
        table = path
    if table and not namespace and "." in table:
        namespace, table = table.split(".", 1)
    if not namespace or not table:
        raise DisSourceError("options 'namespace' and 'table' are required (or table '<Namespace>.<Table>')")
    columns = _list(opts.get("columns"))
    if columns is not None and not columns:
        raise DisSourceError("option 'columns' is empty; list column names separated by commas")
    partitions = _list(opts.get("partitions"))
    if partitions is not None and not partitions:
        raise DisSourceError("option 'partitions' is empty; list partition values (e.g. dates) separated by commas")
    return OnDiskOptions(
        source=source, db_root=str(os.path.abspath(db_root)), namespace=namespace, table=table, schemas=schemas,
        columns=tuple(columns) if columns is not None else None,
        partitions=frozenset(partitions) if partitions is not None else None,
        rows_per_partition=_int(opts, "rowsPerPartition", DEFAULT_ROWS_PER_PARTITION),
        min_partitions=_int(opts, "minPartitions", os.cpu_count() or 2),
        batch_rows=_int(opts, "batchRows", DEFAULT_BATCH_ROWS), dis=dis,
    )


# -- what the table is --------------------------------------------------------------------------
@dataclass(frozen=True)
class Resolved:
    """The table as the read sees it: its rows' schema, default columns and where rows come from."""

    table_json: str
    default_columns: tuple[str, ...]
    partitioned: bool
    historical: bool  # a definition was found (historical rows are read)
    intraday: str | None  # "dis", "files" or None

    def table(self):  # noqa: ANN201 - disd.schema.TableSchema
        from disd.schema import TableSchema

        return TableSchema.from_json(self.table_json, "the resolved table")


def _definition(o: OnDiskOptions, required: bool):  # noqa: ANN202
    from disd.historical.definitions import DefinitionError, find_definition

    try:
        return find_definition(o.db_root, o.namespace, o.table)
    except DefinitionError as e:
        if required or "no historical table" not in str(e):
            raise DisSourceError(f"{e}; check options 'dbRoot', 'namespace' and 'table'") from None
        return None


def _intraday_schema(o: OnDiskOptions, defn):  # noqa: ANN001, ANN202
    if o.dis is not None:
        from disd.spark.source import _connect, table_schema

        client = _connect(o.dis)
        try:
            return table_schema(client, o.dis)
        finally:
            client.close()
    if o.schemas:
        from disd.schema import SchemaError, SchemaRegistry

        try:
            s = SchemaRegistry.load_dir(o.schemas).get(o.namespace, o.table)
        except SchemaError as e:
            raise DisSourceError(f"option 'schemas': {e}") from None
        if s is None:
            raise DisSourceError(f"option 'schemas': no schema for {o.namespace}.{o.table} in {o.schemas}")
        return s
    if defn is not None and defn.partitioned:
        return defn.table_schema()
    raise DisSourceError(f"{o.namespace}.{o.table}: no schema to read its column files with; give option 'schemas' "
                         "(the DIS's schemas directory)")


def resolve(o: OnDiskOptions) -> Resolved:
    found = None
    if o.source != "intraday" or (o.dis is None and not o.schemas):
        found = _definition(o, required=o.source == "historical")
    if o.source == "intraday":
        # Column files alone: the definition, if any, lends its columns; no historical rows.
        ischema = _intraday_schema(o, found[1] if found else None)
        return Resolved(ischema.to_json(), tuple(ischema.column_names + [ischema.partition_column]), True,
                        False, "files")
    defn = found[1] if found else None
    intraday = None
    ischema = None
    if o.source == "all":
        intraday = "dis" if o.dis is not None else "files"
        ischema = _intraday_schema(o, defn)
        if defn is not None:
            if not defn.partitioned:
                raise DisSourceError(f"source 'all': {defn.key} is an unpartitioned historical table; "
                                     "read it with source 'historical'")
            if (tuple(defn.columns), defn.partition_column) != (tuple(ischema.columns), ischema.partition_column):
                raise DisSourceError(
                    f"source 'all': the historical definition of {defn.key} ({_describe(defn.columns, defn.partition_column)}) "
                    f"differs from its intraday schema ({_describe(ischema.columns, ischema.partition_column)})")
    if defn is not None:
        table = defn.table_schema()
        default = defn.output_columns()
        partitioned = defn.partitioned
    else:
        table = ischema
        default = tuple(ischema.column_names + [ischema.partition_column])
        partitioned = True
    return Resolved(table.to_json(), default, partitioned, defn is not None, intraday)


def _describe(columns, partition_column) -> str:  # noqa: ANN001
    return ", ".join(f"{c.name}:{c.type.value}" for c in columns) + f"; partitioned by {partition_column}"


class OnDiskSource:
    def __init__(self, options: OnDiskOptions) -> None:
        self.o = options

    def schema(self) -> StructType:
        r = resolve(self.o)
        cols = self.o.columns or r.default_columns
        allowed = set(r.default_columns)
        for c in cols:
            if c not in allowed and c.lower() not in {a.lower() for a in allowed}:
                raise DisSourceError(f"option 'columns': {self.o.namespace}.{self.o.table} has no column {c!r} "
                                     f"(columns: {', '.join(r.default_columns)})")
        return spark_schema(r.table(), tuple(cols))

    def reader(self, schema: StructType) -> DataSourceReader:
        return OnDiskReader(self.o, schema)


# -- reading ------------------------------------------------------------------------------------
class OnDiskReader(DataSourceReader):
    """A batch scan of historical files and/or intraday locations (see the module docstring)."""

    def __init__(self, options: OnDiskOptions, schema: StructType) -> None:
        self.opts = options
        self.resolved = resolve(options)
        table = self.resolved.table()
        self.projection = projection(table, schema)
        pc = next((c.name for c in self.projection.columns if c.is_partition), table.partition_column)
        self.partition_filter = PartitionFilter(pc if self.resolved.partitioned else "", options.partitions)

    def _historical(self) -> tuple[list[HistoricalInputPartition], set[str]]:
        from disd.historical.definitions import DefinitionError
        from disd.historical.discover import table_files

        o = self.opts
        ns, defn = _definition(o, required=True)
        wanted = self.partition_filter if defn.partitioned else None
        try:
            files = table_files(ns, defn, wanted)
        except (DefinitionError, OSError) as e:
            raise DisSourceError(str(e)) from None
        merged = {f.value_of(defn.partition_column) for f in files} if defn.partitioned else set()
        spec = HistoricalSpec(self.projection, o.batch_rows)
        return plan_files(files, spec, o.rows_per_partition, o.min_partitions), merged

    def _intraday(self, merged: set[str]) -> list:
        o = self.opts

        def wanted(value: str) -> bool:
            return value not in merged and self.partition_filter(value)

        if self.resolved.intraday == "dis":
            from disd.spark.source import _connect, list_locations

            client = _connect(o.dis)
            try:
                snaps = [s for s in list_locations(client, o.dis) if wanted(s.key.column_partition)]
            finally:
                client.close()
            spec = ReadSpec(self.projection, o.dis.security, o.dis.timeout_s, o.batch_rows)
        else:
            snaps = file_snapshots(o.db_root, self.resolved.table(), wanted)
            spec = ReadSpec(self.projection, ClientSecurity(), 30.0, o.batch_rows, o.db_root)
        ranges = [Range(s, 0, s.rows) for s in snaps]
        return plan_partitions(ranges, spec, o.rows_per_partition, o.min_partitions)

    def partitions(self) -> Sequence[InputPartition]:
        parts: list = []
        merged: set[str] = set()
        if self.resolved.historical:
            parts, merged = self._historical()
        if self.resolved.intraday is not None:
            parts += self._intraday(merged)
        for i, p in enumerate(parts):
            p.index = i
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, HistoricalInputPartition):
            return read_historical(partition)
        return read_partition(partition)


def file_snapshots(db_root: str, table, wanted=None) -> list:  # noqa: ANN001
    """The checkpointed intraday locations under ``db_root`` as ``disd.blocks.LocationSnapshot``
    values (the planner's input; tasks then read the files directly: ``ReadSpec.db_root``)."""
    from disd.blocks import BlockSourceError, open_block_source

    source = open_block_source(db_root=db_root, tables=[table])
    try:
        return source.locations(table.namespace, table.table, wanted)
    except BlockSourceError as e:
        raise DisSourceError(str(e)) from None
    finally:
        source.close()
