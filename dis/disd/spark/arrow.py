"""Spark types of DIS columns, and turning what the client reads into the RecordBatches Spark takes.

Spark 4.x checks that every RecordBatch a Python source yields equals
``to_arrow_schema(schema, timezone="UTC")`` exactly: types, order, names and nullability.  So:

=========  ====================  ========================================================
DIS type   Spark type            conversion
=========  ====================  ========================================================
bool       BooleanType           none
byte       ByteType              none
short      ShortType             none
int        IntegerType           none
long       LongType              none
float      FloatType             none
double     DoubleType            none
char       StringType            the UTF-16 code unit as a one-character string (a lone
                                 surrogate becomes U+FFFD); null stays null
                                 (``disd.values.char_strings``, as the client reads it)
string     StringType            none
timestamp  TimestampType         nanoseconds truncated to microseconds (Spark's precision)
partition  StringType, non-null  the location's column partition, e.g. ``2026-11-22``
=========  ====================  ========================================================

A user-given ``.schema(...)`` may name any subset of the columns in any order (matched without
regard to case) and may ask for another type Arrow can cast to (e.g. ``Size long``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.types import (
    BooleanType,
    ByteType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from disd.schema import ColumnType, TableSchema
from disd.spark.errors import DisSourceError
from disd.values import char_strings

SPARK_TYPES: dict[ColumnType, DataType] = {
    ColumnType.BOOL: BooleanType(),
    ColumnType.BYTE: ByteType(),
    ColumnType.SHORT: ShortType(),
    ColumnType.INT: IntegerType(),
    ColumnType.LONG: LongType(),
    ColumnType.FLOAT: FloatType(),
    ColumnType.DOUBLE: DoubleType(),
    ColumnType.CHAR: StringType(),
    ColumnType.STRING: StringType(),
    ColumnType.TIMESTAMP: TimestampType(),
}

TS_US = pa.timestamp("us", tz="UTC")


def spark_schema(table: TableSchema, columns: tuple[str, ...] | None = None) -> StructType:
    """The table's columns then its partition column; or only ``columns`` (any of them, the
    partition column included), in that order."""
    fields = {c.name: StructField(c.name, SPARK_TYPES[c.type], True) for c in table.columns}
    fields[table.partition_column] = StructField(table.partition_column, StringType(), False)
    if columns is None:
        return StructType(list(fields.values()))
    out = []
    for name in columns:
        match = _lookup(list(fields), name)
        if match is None:
            raise DisSourceError(
                f"option 'columns': {table.key} has no column {name!r} "
                f"(columns: {', '.join(fields)})")
        out.append(fields[match])
    return StructType(out)


def _lookup(names: list[str], name: str) -> str | None:
    if name in names:
        return name
    lowered = [n for n in names if n.lower() == name.lower()]
    return lowered[0] if len(lowered) == 1 else None


@dataclass(frozen=True)
class OutputColumn:
    """One column of the batches: where it comes from and what Spark wants."""

    name: str  # the name Spark asked for (the field name of the reader's schema)
    source: str  # the DIS column, or the partition column
    is_partition: bool
    kind: ColumnType | None  # the DIS type (None for the partition column)
    spark_type_json: str
    nullable: bool


@dataclass(frozen=True)
class Projection:
    """The reader's output: the DIS columns to fetch and how to build each output column.
    Plain values only, so it pickles into every input partition.

    ``table_json`` is the version of the table the read presents (its newest when the read was
    planned); ``versions_json`` every version known (``TableSchema.history_json()`` of the newest
    one; empty for a table of one version), so a task decodes a location or a historical file
    written in another version and projects its rows (``disd.blocks.read_location``)."""

    table_json: str
    columns: tuple[OutputColumn, ...]
    versions_json: str = ""

    def table(self) -> TableSchema:
        """The presented version, carrying every other known one (older or, for a streaming
        query that started before a schema change, newer)."""
        t = TableSchema.from_json(self.table_json, "the planned scan")
        if self.versions_json:
            t = t.with_history(TableSchema.from_history_json(self.versions_json, "the planned scan").versions.values())
        return t

    @property
    def fetch(self) -> list[str]:
        """DIS data columns to read, each once, in output order."""
        out: list[str] = []
        for c in self.columns:
            if not c.is_partition and c.source not in out:
                out.append(c.source)
        return out

    def spark_schema(self) -> StructType:
        return StructType.fromJson({"type": "struct", "fields": [
            {"name": c.name, "type": json.loads(c.spark_type_json), "nullable": c.nullable, "metadata": {}}
            for c in self.columns]})

    def arrow_schema(self) -> pa.Schema:
        from pyspark.sql.pandas.types import to_arrow_schema

        return to_arrow_schema(self.spark_schema(), timezone="UTC")

    def partition_source(self, name: str) -> bool:
        return any(c.is_partition and c.name == name for c in self.columns)


def projection(table: TableSchema, schema: StructType) -> Projection:
    """Match the schema Spark gives the reader (the source's own or the user's) to the table."""
    names = table.column_names + [table.partition_column]
    out = []
    natural: DataType
    for f in schema.fields:
        source = _lookup(names, f.name)
        if source is None:
            raise DisSourceError(
                f"schema field {f.name!r} is not a column of {table.key} "
                f"(columns: {', '.join(names)})")
        if source == table.partition_column:
            kind, natural = None, StringType()
        else:
            kind = table.column(source).type
            natural = SPARK_TYPES[kind]
        if f.dataType != natural:
            _check_cast(table, source, natural, f.dataType)
        out.append(OutputColumn(f.name, source, kind is None, kind, f.dataType.json(), f.nullable))
    if not out:
        raise DisSourceError("the schema has no fields")
    return Projection(table.to_json(), tuple(out), table.history_json() if len(table.versions) > 1 else "")


def _check_cast(table: TableSchema, source: str, natural: DataType, wanted: DataType) -> None:
    from pyspark.sql.pandas.types import to_arrow_type

    try:
        src, dst = to_arrow_type(natural, timezone="UTC"), to_arrow_type(wanted, timezone="UTC")
        pa.array([], src).cast(dst)
    except Exception:  # noqa: BLE001 - any failure means "cannot give this type"
        raise DisSourceError(
            f"schema field {source!r}: {table.key}.{source} is {natural.simpleString()}, "
            f"cannot read it as {wanted.simpleString()}") from None


# -- batches ------------------------------------------------------------------------------------
def _natural(kind: ColumnType, arr: pa.Array) -> pa.Array:
    """A column as a read returns it (decoded as held by ``disd.blocks.read_location``, or as the
    client gives it) -> its natural Spark Arrow type."""
    if kind is ColumnType.TIMESTAMP:
        return arr.cast(TS_US, safe=False)
    if kind is ColumnType.CHAR:
        return char_strings(arr)  # the client's one conversion, as the JVM reader's
    return arr


def to_batch(proj: Projection, target: pa.Schema, table: pa.Table | None, n: int,
             partition_value: str) -> pa.RecordBatch:
    """A RecordBatch of exactly ``target`` (``n`` rows) from a client table of the
    ``proj.fetch`` columns (None when only the partition column is read)."""
    arrays = []
    for col, field in zip(proj.columns, target):
        if col.is_partition:
            arr: pa.Array = pa.repeat(pa.scalar(partition_value, pa.string()), n)
        else:
            # a data column: fetched (``table`` is None only when the partition column alone is read)
            assert table is not None and col.kind is not None
            chunked = table.column(col.source)
            raw = chunked.chunk(0) if chunked.num_chunks == 1 else chunked.combine_chunks()
            arr = _natural(col.kind, raw)
        if arr.type != field.type:
            arr = arr.cast(field.type)
        arrays.append(arr)
    return pa.RecordBatch.from_arrays(arrays, schema=target)
