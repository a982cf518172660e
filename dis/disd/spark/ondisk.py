"""``dis`` reads that start from the database root: historical tables, intraday column files, both.

Option ``source`` says which rows a read takes:

* ``intraday`` (the default) — with ``address``/``routing``, the DIS serves them
  (``disd.spark.source``).  Without a DIS but with ``dbRoot``, the column files under
  ``<dbRoot>/Intraday`` are read at their checkpoints (``table.size``, through the block seam's
  ``disd.blocks.LocalColumnFiles``): on the DIS host, whether or not the DIS runs.
* ``historical`` — the table's Parquet files under ``dbRoot`` (``Systems/`` or ``Users/``), in
  whatever layout its definition names (``disd.historical.discover``).
* ``all`` — historical rows, plus intraday rows (from the DIS when ``address``/``routing`` is
  given, else from the column files) of every partition value that has no historical location:
  intraday wins for partitions not yet merged, historical for those merged.  One query spans both.

The table's columns come from its historical definition when it has one, else from the DIS (or
the ``schemas`` directory for column files); in ``all`` mode both must describe the same rows.
Partition pruning (the ``partitions`` option) works on both kinds of rows.  The options are
parsed by ``disd.spark.options.parse_options`` (``SourceOptions.from_storage`` sends a read here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from disd.spark.arrow import projection, spark_schema
from disd.spark.errors import DisSourceError
from disd.spark.filters import PartitionFilter
from disd.spark.locations import connect, file_locations, list_locations, table_schema
from disd.spark.options import SourceOptions
from disd.spark.plan import Range, ReadSpec, plan_partitions
from disd.spark.read import read_partition
from disd.spark.readparquet import HistoricalInputPartition, HistoricalSpec, plan_files, read_historical


# -- what the table is --------------------------------------------------------------------------
@dataclass(frozen=True)
class Resolved:
    """The table as the read sees it: its rows' schema, default columns and where rows come from."""

    table_json: str
    default_columns: tuple[str, ...]
    partitioned: bool
    historical: bool  # a definition was found (historical rows are read)
    intraday: str | None  # "dis", "files" or None
    versions_json: str = ""  # every known version of the table (empty: one version)

    def table(self):  # noqa: ANN201 - disd.schema.TableSchema
        """The table's newest known version, carrying the others."""
        from disd.schema import TableSchema

        if self.versions_json:
            return TableSchema.from_history_json(self.versions_json, "the resolved table")
        return TableSchema.from_json(self.table_json, "the resolved table")


def _resolved(table, default, partitioned: bool, historical: bool, intraday: str | None) -> Resolved:  # noqa: ANN001
    return Resolved(table.to_json(), tuple(default), partitioned, historical, intraday,
                    table.history_json() if len(table.versions) > 1 else "")


def _with_versions(o: SourceOptions, schema):  # noqa: ANN001, ANN202
    """``schema`` with the versions the database under option ``dbRoot`` stores for its table."""
    from disd.blocks import ColumnFileError, table_versions

    if not o.db_root:
        return schema
    try:
        return table_versions(o.db_root, schema)
    except ColumnFileError as e:
        raise DisSourceError(f"option 'dbRoot': {e}") from None


def _definition(o: SourceOptions, required: bool):  # noqa: ANN202
    from disd.historical.definitions import DefinitionError, find_definition

    assert o.db_root is not None  # a read from the database root (``parse_options`` requires dbRoot)
    try:
        return find_definition(o.db_root, o.namespace, o.table)
    except DefinitionError as e:
        if required or "no historical table" not in str(e):
            raise DisSourceError(f"{e}; check options 'dbRoot', 'namespace' and 'table'") from None
        return None


def _intraday_schema(o: SourceOptions, defn):  # noqa: ANN001, ANN202
    if o.has_dis:
        client = connect(o)
        try:
            return table_schema(client, o)
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
        return _with_versions(o, s)
    if defn is not None and defn.partitioned:
        return _with_versions(o, defn.table_schema())
    raise DisSourceError(f"{o.namespace}.{o.table}: no schema to read its column files with; give option 'schemas' "
                         "(the DIS's schemas directory)")


def resolve(o: SourceOptions) -> Resolved:
    found = None
    if o.source != "intraday" or (not o.has_dis and not o.schemas):
        found = _definition(o, required=o.source == "historical")
    if o.source == "intraday":
        # Column files alone: the definition, if any, lends its columns; no historical rows.
        ischema = _intraday_schema(o, found[1] if found else None)
        return _resolved(ischema, ischema.column_names + [ischema.partition_column], True, False, "files")
    defn = found[1] if found else None
    intraday = None
    ischema = None
    if o.source == "all":
        intraday = "dis" if o.has_dis else "files"
        ischema = _intraday_schema(o, defn)
        if defn is not None:
            if not defn.partitioned:
                raise DisSourceError(f"source 'all': {defn.key} is an unpartitioned historical table; "
                                     "read it with source 'historical'")
            if not _same_table(defn, ischema):
                raise DisSourceError(
                    f"source 'all': the historical definition of {defn.key} ({_describe(defn.columns, defn.partition_column)}) "
                    f"differs from its intraday schema ({_describe(ischema.columns, ischema.partition_column)})")
    if defn is not None:
        # The definition is the last merge's version; the table's newest known version (the
        # intraday schema's, or the newest stored under dbRoot) may be later: historical files
        # are then projected onto it by their recorded version (disd.spark.readparquet).
        table = _historical_schema(o, defn, ischema)
        default = defn.output_columns() if table.version == defn.schema_version else \
            tuple(table.column_names + [table.partition_column])
        partitioned = defn.partitioned
    else:
        table = ischema
        default = tuple(ischema.column_names + [ischema.partition_column])
        partitioned = True
    return _resolved(table, default, partitioned, defn is not None, intraday)


def _same_table(defn, ischema) -> bool:  # noqa: ANN001
    """Whether a historical definition describes the rows of some version of the intraday
    schema (the newest, or an older one the merged files were written in)."""
    if defn.partition_column != ischema.partition_column:
        return False
    return any(tuple(defn.columns) == tuple(s.columns) for s in ischema.versions.values())


def _historical_schema(o: SourceOptions, defn, ischema):  # noqa: ANN001, ANN202
    """The definition's schema with the table's known versions: those of the intraday schema (a
    DIS's or the schemas directory's) in ``all`` mode, else those stored under ``dbRoot``."""
    from disd.historical.definitions import DefinitionError, with_versions

    try:
        return with_versions(defn, ischema.versions.values() if ischema is not None else None, o.db_root)
    except DefinitionError as e:
        raise DisSourceError(f"{e}; check option 'dbRoot'") from None


def _describe(columns, partition_column) -> str:  # noqa: ANN001
    return ", ".join(f"{c.name}:{c.type.value}" for c in columns) + f"; partitioned by {partition_column}"


class OnDiskSource:
    def __init__(self, options: SourceOptions) -> None:
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

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
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
        pc = defn.partition_column  # None: unpartitioned
        merged = {v for f in files if (v := f.value_of(pc)) is not None} if pc is not None else set()
        spec = HistoricalSpec(self.projection, o.batch_rows)
        return plan_files(files, spec, o.rows_per_partition, o.min_partitions), merged

    def _intraday(self, merged: set[str]) -> list:
        o = self.opts

        def wanted(value: str) -> bool:
            return value not in merged and self.partition_filter(value)

        if self.resolved.intraday == "dis":
            client = connect(o)
            try:
                snaps = list_locations(client, o, wanted)
            finally:
                client.close()
            # dbRoot names the historical root here, not that DIS's: its tasks read over gRPC.
            spec = ReadSpec(self.projection, o.security, o.timeout_s, o.batch_rows, retry_s=o.retry_s,
                            routing=o.routing_value())
        else:
            snaps = file_locations(o, self.resolved.table(), wanted)
            spec = ReadSpec(self.projection, o.security, o.timeout_s, o.batch_rows, o.db_root)
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
