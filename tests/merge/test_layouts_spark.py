"""The seeds' other layouts through ``spark.read.format("dis")``: the extended Parquet layouts
(``parquet:flat``, ``parquet:kv``, ``coreplus:hive``, ``parquet:metadata``) written by another
tool (pyarrow here), and user tables written from Spark (``disd.spark.write_user_table``)."""

from __future__ import annotations

import os
import pathlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import disd.spark
from disd.historical.definitions import TableDefinition, read_definition, write_definition
from disd.historical.index import read_index
from disd.historical.layout import Layout, NamespaceRoot, NamespaceType
from disd.schema import Column, ColumnType
from disd.spark.usertables import SparkUserTableError
from support import TRADE, trade_rows

from .helpers import D1, D2, location_table

pytestmark = pytest.mark.spark


def read(spark, db, table, **opts):
    r = spark.read.format("dis").option("source", "historical").option("dbRoot", str(db)).option("table", table)
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


def other_tool_rows(start: int, n: int) -> pa.Table:
    """Trade rows as another tool might write them: nanosecond timestamps, Size as int64."""
    t = trade_rows(start, n, nulls=True)
    return t.set_column(3, "Size", t.column("Size").cast(pa.int64()))


def define(db, table: str, layout: Layout, pc: str | None = "Date", extra=()) -> None:
    ns = NamespaceRoot.system(db, "Ext")
    write_definition(ns, TableDefinition("Ext", table, NamespaceType.SYSTEM, tuple(TRADE.columns) + tuple(extra),
                                         pc, layout))


def sizes(df) -> list[int]:
    return [r[0] for r in df.select("Size").orderBy("Size").collect()]


def test_extended_layouts_read_equal_to_what_was_written(spark, tmp_path):
    db = tmp_path / "db"
    ext = NamespaceRoot.system(db, "Ext")
    venue = (Column("Venue", ColumnType.STRING),)
    parts = {(D1, "X"): (0, 1200), (D1, "Y"): (1200, 800), (D2, "X"): (2000, 500)}
    for layout, table in ((Layout.PARQUET_KV, "Kv"), (Layout.COREPLUS_HIVE, "Hive")):
        for (date, v), (start, n) in parts.items():
            d = ext.extended_path(table) / f"Date={date}" / f"Venue={v}"
            d.mkdir(parents=True)
            pq.write_table(other_tool_rows(start, n), d / "part-0.parquet", row_group_size=300)
        define(db, table, layout, extra=venue)
        df = read(spark, db, f"Ext.{table}")
        if layout is Layout.COREPLUS_HIVE:  # the same directories, read the same way: one check
            assert {(r["Date"], r["Venue"]): r["count"] for r in df.groupBy("Date", "Venue").count().collect()} \
                == {k: n for k, (_, n) in parts.items()}
            continue
        assert df.columns == ["Timestamp", "Sym", "Price", "Size", "Venue", "Date"]
        got = df.orderBy("Size").toArrow()
        assert got.column("Size").to_pylist() == list(range(2500))
        exp = trade_rows(0, 2500, nulls=True)
        assert got.column("Sym").to_pylist() == exp.column("Sym").to_pylist()
        assert (got.column("Timestamp").cast(pa.int64()).to_numpy()
                == exp.column("Timestamp").cast(pa.int64()).to_numpy() // 1000).all()
        assert {(r["Date"], r["Venue"]): r["count"] for r in df.groupBy("Date", "Venue").count().collect()} == {
            k: n for k, (_, n) in parts.items()}
        assert sizes(read(spark, db, f"Ext.{table}").where(f"Date = '{D2}'")) == list(range(2000, 2500))
        assert read(spark, db, f"Ext.{table}", partitions=D1, columns="Date").count() == 2000

    # parquet:flat: a directory of files, no partitioning column
    flat = ext.extended_path("Flat")
    flat.mkdir(parents=True)
    for i in range(3):
        pq.write_table(other_tool_rows(i * 100, 100), flat / f"f{i}.parquet")
    define(db, "Flat", Layout.PARQUET_FLAT, pc=None)
    df = read(spark, db, "Ext.Flat")
    assert df.columns == ["Timestamp", "Sym", "Price", "Size"] and sizes(df) == list(range(300))

    # parquet:metadata: _metadata names every row group's file; _common_metadata the schema
    meta = ext.extended_path("Meta")
    collected = []
    for date, start in ((D1, 0), (D2, 700)):
        d = meta / f"Date={date}"
        d.mkdir(parents=True)
        pq.write_table(other_tool_rows(start, 700), d / "data.parquet", row_group_size=256,
                       metadata_collector=collected)
        collected[-1].set_file_path(f"Date={date}/data.parquet")
    schema = other_tool_rows(0, 1).schema
    pq.write_metadata(schema, meta / "_common_metadata")
    pq.write_metadata(schema, meta / "_metadata", metadata_collector=collected)
    define(db, "Meta", Layout.PARQUET_METADATA)
    df = read(spark, db, "Ext.Meta", rowsPerPartition="300")
    assert sizes(df) == list(range(1400))
    assert df.rdd.getNumPartitions() >= 4  # row groups of one file spread over several tasks
    assert sizes(read(spark, db, "Ext.Meta").where(f"Date = '{D1}'")) == list(range(700))

    # a definition naming a column the files lack is an error, not nulls
    define(db, "Flat", Layout.PARQUET_FLAT, pc=None, extra=(Column("Missing", ColumnType.INT),))
    with pytest.raises(Exception, match="has no column 'Missing'"):
        read(spark, db, "Ext.Flat").collect()


def test_user_tables_splayed_and_partitioned(spark, tmp_path):
    db = tmp_path / "db"
    df = spark.range(0, 5000).selectExpr(
        "id as Id", "cast(id % 7 as int) as K", "if(id % 5 = 0, null, concat('s', id)) as S",
        "timestamp_seconds(1763800000 + id) as T", "cast(id as double) / 4 as P", "id % 2 = 0 as B")
    recs = disd.spark.write_user_table(df, "Research", "Signals", db_root=str(db))
    users = NamespaceRoot.user(db, "Research")
    assert users.splayed_path("Signals").is_symlink() and recs[0].rows == 5000
    defn = read_definition(users, "Signals")
    assert (defn.layout, defn.partition_column) == (Layout.SPLAYED, None)
    assert [(c.name, c.type.value) for c in defn.columns] == [
        ("Id", "long"), ("K", "int"), ("S", "string"), ("T", "timestamp"), ("P", "double"), ("B", "bool")]
    back = read(spark, db, "Research.Signals")
    assert back.columns == ["Id", "K", "S", "T", "P", "B"]
    assert sorted(map(tuple, back.collect())) == sorted(map(tuple, df.collect()))

    with pytest.raises(SparkUserTableError, match="mode='replace'"):
        disd.spark.write_user_table(df, "Research", "Signals", db_root=str(db))
    old = users.splayed_path("Signals") / "part-00000.parquet"
    held = open(old, "rb")
    disd.spark.write_user_table(df.where("Id < 10"), "Research", "Signals", db_root=str(db), mode="replace")
    assert read(spark, db, "Research.Signals").count() == 10
    assert pq.read_table(held).num_rows > 0  # the replaced version's file is still there for its reader
    held.close()

    # partitioned by a string column: one location per value, in the index
    daily = df.selectExpr("Id", "S", f"if(Id < 3000, '{D1}', '{D2}') as Date")
    recs = disd.spark.write_user_table(daily, "Research", "Daily", db_root=str(db), partition_column="Date",
                                       sort_by=["Id"])
    assert sorted((r.value, r.rows) for r in recs) == [(D1, 3000), (D2, 2000)]
    assert (users.location_path("0", D1, "Daily")).is_symlink()
    ids = location_table(users.location_path("0", D1, "Daily")).column("Id").to_pylist()
    assert ids == list(range(3000))  # sort_by: in order across the location's files
    assert [loc.value for loc in read_index(users.index_path("Daily")).locations] == [D1, D2]
    back = read(spark, db, "Research.Daily")
    assert back.columns == ["Id", "S", "Date"]
    assert sorted(map(tuple, back.collect())) == sorted(map(tuple, daily.collect()))
    assert read(spark, db, "Research.Daily").where(f"Date = '{D2}'").count() == 2000
    with pytest.raises(SparkUserTableError, match="already has partitions"):
        disd.spark.write_user_table(daily, "Research", "Daily", db_root=str(db), partition_column="Date")
    more = spark.range(0, 10).selectExpr("id as Id", "'x' as S", "'2026-11-21' as Date")
    disd.spark.write_user_table(more, "Research", "Daily", db_root=str(db), partition_column="Date")
    assert read(spark, db, "Research.Daily").count() == 5010
    leftovers = [n for _, dirs, files in os.walk(users.path) for n in dirs + files if ".tmp-" in n]
    assert leftovers == []

    spark.conf.set("spark.dis.dbRoot", str(db))  # write_user_table(df, ns, table): the root from the session
    try:
        disd.spark.write_user_table(spark.range(3).selectExpr("id as Id"), "Research", "Tiny")
    finally:
        spark.conf.unset("spark.dis.dbRoot")
    assert read(spark, db, "Research.Tiny").count() == 3

    with pytest.raises(SparkUserTableError, match="decimal"):
        disd.spark.write_user_table(spark.range(3).selectExpr("cast(id as decimal(10,2)) as D"), "Research", "Bad",
                                    db_root=str(db))
    pathlib.Path(db, "Systems", "Market").mkdir(parents=True)
    with pytest.raises(SparkUserTableError, match="system namespace"):
        disd.spark.write_user_table(df, "Market", "Mine", db_root=str(db))
