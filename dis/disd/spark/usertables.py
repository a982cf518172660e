"""User tables from Spark: a DataFrame written into ``<db>/Users/<Namespace>/``, as the seeds keep them.

    disd.spark.write_user_table(df, "Research", "Signals")                        # splayed
    disd.spark.write_user_table(df, "Research", "Daily", partition_column="Date")  # partitioned
    spark.read.format("dis").option("source", "historical").option("dbRoot", db)
         .option("table", "Research.Daily").load()

The Spark half: the database root from the arguments or the session, the DataFrame's columns
mapped from Spark types, and Spark writing the Parquet files.  Layout, definition, locking and
publishing are ``disd.historical.usertables``.
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

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

from disd.historical import usertables
from disd.historical.index import LocationRecord
from disd.historical.parquet import ParquetSettings, write_parquet
from disd.schema import Column, ColumnType
from disd.spark.errors import DisSourceError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

DB_ROOT_CONF = "spark.dis.dbRoot"
MODES = usertables.MODES

_TYPES = {
    BooleanType: ColumnType.BOOL, ByteType: ColumnType.BYTE, ShortType: ColumnType.SHORT,
    IntegerType: ColumnType.INT, LongType: ColumnType.LONG, FloatType: ColumnType.FLOAT,
    DoubleType: ColumnType.DOUBLE, StringType: ColumnType.STRING, TimestampType: ColumnType.TIMESTAMP,
}


class SparkUserTableError(DisSourceError, usertables.UserTableError):
    """A user table that ``write_user_table`` cannot write as asked; nothing was made visible.
    Both a ``UserTableError`` and an error of the ``dis`` source (``DisSourceError``), so either
    ``except`` catches it."""


def column_type(name: str, spark_type) -> ColumnType:  # noqa: ANN001
    t = _TYPES.get(type(spark_type))
    if t is None:
        raise SparkUserTableError(f"column {name!r} is {spark_type.simpleString()}; user tables take boolean, tinyint, "
                             "smallint, int, bigint, float, double, string and timestamp (cast it first)")
    return t


def _db_root(df, db_root: str | None) -> str:  # noqa: ANN001
    root = db_root or df.sparkSession.conf.get(DB_ROOT_CONF, None) or os.environ.get("DIS_DB_ROOT")
    if not root:
        raise SparkUserTableError(f"no database root: pass db_root=..., or set the Spark conf {DB_ROOT_CONF} "
                             "or the environment variable DIS_DB_ROOT")
    return os.path.abspath(root)


@dataclass(frozen=True)
class _DataFrameRows:
    """A DataFrame as the ``disd.historical.usertables.RowWriter`` of a user table."""

    data: DataFrame
    settings: ParquetSettings

    def values(self, column: str) -> list[str | None]:
        return sorted(r[0] for r in self.data.select(column).distinct().collect())

    def write(self, directory: pathlib.Path, partition_by: Sequence[str] = ()) -> None:
        write_parquet(self.data, directory, self.settings, partition_by=partition_by)


def write_user_table(df, namespace: str, table: str, db_root: str | None = None,  # noqa: ANN001
                     partition_column: str | None = None, mode: str = "error",
                     internal_partition: str = "0", sort_by: Sequence[str] = (),
                     settings: ParquetSettings | None = None) -> list[LocationRecord]:
    """Write ``df`` as the user table ``namespace.table``; returns the records of the locations
    written.  ``mode="error"`` refuses to touch a location that exists, ``"replace"`` publishes a
    new version of it (readers of the old one keep their files)."""
    try:
        usertables.check_mode(mode)
        ns = usertables.user_namespace(_db_root(df, db_root), namespace, table, internal_partition)
        fields = {f.name: f for f in df.schema.fields}
        if partition_column is not None and partition_column not in fields:
            raise SparkUserTableError(f"partition column {partition_column!r} is not a column of the DataFrame")
        if partition_column is not None and not isinstance(fields[partition_column].dataType, StringType):
            raise SparkUserTableError(f"partition column {partition_column!r} must be a string column")
        columns = tuple(Column(f.name, column_type(f.name, f.dataType)) for f in df.schema.fields
                        if f.name != partition_column)
        defn = usertables.user_definition(namespace, table, columns, partition_column, sort_by)
        data = df.select(*[c.name for c in columns], *([partition_column] if partition_column else []))
        if sort_by:
            # The rows of each location in sort order across its files (partition column first, so
            # Spark's partitioned writer keeps the order instead of sorting again).
            data = data.orderBy(*([partition_column] if partition_column else []), *sort_by)
        rows = _DataFrameRows(data, settings or ParquetSettings())
        return usertables.publish_user_table(ns, defn, rows, mode, internal_partition)
    except usertables.UserTableError as e:
        if isinstance(e, SparkUserTableError):
            raise
        raise SparkUserTableError(str(e)) from None
