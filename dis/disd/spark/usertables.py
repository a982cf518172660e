"""User tables: a Spark DataFrame written into ``<db>/Users/<Namespace>/``, as the seeds keep them.

    disd.spark.write_user_table(df, "Research", "Signals")                        # splayed
    disd.spark.write_user_table(df, "Research", "Daily", partition_column="Date")  # partitioned
    spark.read.format("dis").option("source", "historical").option("dbRoot", db)
         .option("table", "Research.Daily").load()

* unpartitioned ("splayed"): ``Users/<Namespace>/Tables/<Table>/`` — one location;
* partitioned: ``Users/<Namespace>/Partitions/<InternalPartition>/<Value>/<Table>/`` — one location
  per value of the partition column (a string column, each value a valid name, e.g. a date),
  recorded in ``Users/<Namespace>/MetadataIndex/<Table>.tlmi``;
* the definition ``Users/<Namespace>/Definitions/<Table>.tbl`` (columns mapped from the Spark types).

Each location is published like a merged one (``disd.historical.publish``): staged, fsynced, and
made visible by one atomic link switch; ``mode="replace"`` publishes a new version and leaves
the old files to readers that hold them.  Locations of a partitioned write appear one by one
(each whole).  A user namespace may not share its name with a system namespace.
"""

from __future__ import annotations

import os
import pathlib
import shutil
from typing import Sequence
from urllib.parse import unquote

from pyspark.sql.types import (
    BooleanType,
    ByteType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    TimestampType,
)

from disd.historical.definitions import TableDefinition, read_definition, write_definition
from disd.historical.durable import TableLock, current_version, stage_dir, sweep_staging
from disd.historical.index import LocationRecord
from disd.historical.layout import Layout, NamespaceRoot, NamespaceType, TABLES, nested_locations
from disd.historical.publish import publish_location
from disd.names import InvalidNameError, NameKind, validate_name
from disd.schema import Column, ColumnType
from disd.spark.errors import DisSourceError
from disd.spark.parquet import ParquetSettings, write_parquet

DB_ROOT_CONF = "spark.dis.dbRoot"
MODES = ("error", "replace")

_TYPES = {
    BooleanType: ColumnType.BOOL, ByteType: ColumnType.BYTE, ShortType: ColumnType.SHORT,
    IntegerType: ColumnType.INT, LongType: ColumnType.LONG, FloatType: ColumnType.FLOAT,
    DoubleType: ColumnType.DOUBLE, StringType: ColumnType.STRING, TimestampType: ColumnType.TIMESTAMP,
}


class UserTableError(DisSourceError):
    """A user table that cannot be written as asked; nothing was made visible."""


def column_type(name: str, spark_type) -> ColumnType:  # noqa: ANN001
    t = _TYPES.get(type(spark_type))
    if t is None:
        raise UserTableError(f"column {name!r} is {spark_type.simpleString()}; user tables take boolean, tinyint, "
                             "smallint, int, bigint, float, double, string and timestamp (cast it first)")
    return t


def _db_root(df, db_root: str | None) -> str:  # noqa: ANN001
    root = db_root or df.sparkSession.conf.get(DB_ROOT_CONF, None) or os.environ.get("DIS_DB_ROOT")
    if not root:
        raise UserTableError(f"no database root: pass db_root=..., or set the Spark conf {DB_ROOT_CONF} "
                             "or the environment variable DIS_DB_ROOT")
    return os.path.abspath(root)


def write_user_table(df, namespace: str, table: str, db_root: str | None = None,  # noqa: ANN001
                     partition_column: str | None = None, mode: str = "error",
                     internal_partition: str = "0", sort_by: Sequence[str] = (),
                     settings: ParquetSettings | None = None) -> list[LocationRecord]:
    """Write ``df`` as the user table ``namespace.table``; returns the records of the locations
    written.  ``mode="error"`` refuses to touch a location that exists, ``"replace"`` publishes a
    new version of it (readers of the old one keep their files)."""
    if mode not in MODES:
        raise UserTableError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    try:
        ns = NamespaceRoot.user(_db_root(df, db_root), namespace)
        validate_name(NameKind.TABLE, table)
        validate_name(NameKind.INTERNAL_PARTITION, internal_partition)
    except InvalidNameError as e:
        raise UserTableError(str(e)) from None
    system = NamespaceRoot.system(ns.db_root, namespace)
    if system.path.exists():
        raise UserTableError(f"{namespace} is a system namespace ({system.path}): user tables go elsewhere")
    fields = {f.name: f for f in df.schema.fields}
    if partition_column is not None and partition_column not in fields:
        raise UserTableError(f"partition column {partition_column!r} is not a column of the DataFrame")
    if partition_column is not None and not isinstance(fields[partition_column].dataType, StringType):
        raise UserTableError(f"partition column {partition_column!r} must be a string column")
    columns = tuple(Column(f.name, column_type(f.name, f.dataType)) for f in df.schema.fields
                    if f.name != partition_column)
    try:
        defn = TableDefinition(namespace, table, NamespaceType.USER, columns, partition_column,
                               Layout.NESTED if partition_column else Layout.SPLAYED, tuple(sort_by))
    except Exception as e:  # noqa: BLE001 - DefinitionError, with the reason
        raise UserTableError(str(e)) from None
    settings = settings or ParquetSettings()
    data = df.select(*[c.name for c in columns], *([partition_column] if partition_column else []))
    if sort_by:
        # The rows of each location in sort order across its files (partition column first, so
        # Spark's partitioned writer keeps the order instead of sorting again).
        data = data.orderBy(*([partition_column] if partition_column else []), *sort_by)
    with TableLock(ns.lock_path(table)):
        old = read_definition(ns, table)
        if old is not None and not old.same_rows_as(defn) and (partition_column is not None or mode != "replace"):
            raise UserTableError(f"user table {defn.key} exists with other columns or partitioning "
                                 f"({ns.definition_path(table)}); "
                                 + ("replace it whole (mode='replace')" if partition_column is None
                                    else "write it with the same columns"))
        if partition_column is None:
            return [_write_splayed(ns, defn, old, data, mode, settings)]
        return _write_partitioned(ns, defn, old, data, mode, internal_partition, settings)


def _write_splayed(ns: NamespaceRoot, defn: TableDefinition, old, data, mode: str,  # noqa: ANN001
                   settings: ParquetSettings) -> LocationRecord:
    parent = ns.path / TABLES
    sweep_staging(parent, defn.table)
    if current_version(parent, defn.table) is not None and mode == "error":
        raise UserTableError(f"user table {defn.key} exists ({parent / defn.table}); use mode='replace'")
    staging = stage_dir(parent, defn.table)
    try:
        write_parquet(data, staging, settings)
    except Exception:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if old != defn:
        write_definition(ns, defn)
    return publish_location(ns, defn.table, None, parent, staging, "", "", "", {"kind": "spark"},
                            {"sort_by": list(defn.sort_by)}, index=False)


def _write_partitioned(ns: NamespaceRoot, defn: TableDefinition, old, data, mode: str,  # noqa: ANN001
                       internal_partition: str, settings: ParquetSettings) -> list[LocationRecord]:
    pc = defn.partition_column
    values = sorted(r[0] for r in data.select(pc).distinct().collect())
    if not values:
        raise UserTableError(f"no rows to write to {defn.key}")
    for v in values:
        if v is None:
            raise UserTableError(f"partition column {pc} has nulls; every row needs a partition value")
        try:
            validate_name(NameKind.COLUMN_PARTITION, v)
        except InvalidNameError as e:
            raise UserTableError(f"partition column {pc}: {e}") from None
    existing = {l.value: l for l in nested_locations(ns, defn.table, set(values).__contains__)}
    elsewhere = [f"{v} (in {l.internal_partition})" for v, l in existing.items() if l.internal_partition != internal_partition]
    if elsewhere:
        raise UserTableError(f"{defn.key}: partitions {', '.join(elsewhere)} live in another internal partition")
    if existing and mode == "error":
        raise UserTableError(f"{defn.key} already has partitions {', '.join(sorted(existing))}; use mode='replace'")
    ip_dir = ns.partitions_dir / internal_partition
    sweep_staging(ip_dir, defn.table)
    staging = stage_dir(ip_dir, defn.table)
    try:
        write_parquet(data, staging, settings, partition_by=[pc])
        by_value = {}
        for e in os.scandir(staging):
            if e.is_dir() and e.name.startswith(pc + "="):
                by_value[unquote(e.name[len(pc) + 1:])] = e.path
        if sorted(by_value) != values:
            raise UserTableError(f"Spark wrote partitions {sorted(by_value)}, expected {values}")
        if old != defn:
            write_definition(ns, defn)
        out = []
        for v in values:
            parent = ns.location_parent(internal_partition, v)
            sweep_staging(parent, defn.table)
            out.append(publish_location(ns, defn.table, pc, parent, pathlib.Path(by_value[v]), internal_partition, v, "",
                                        {"kind": "spark"}, {"sort_by": list(defn.sort_by)}))
        return out
    finally:
        shutil.rmtree(staging, ignore_errors=True)

