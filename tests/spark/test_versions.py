"""Spark reads of a table whose locations are written in two schema versions
(tests/versioned_db.py): every read presents the newest version, each task decoding its
location in the location's own version."""

from __future__ import annotations

import pickle
import shutil

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

import versioned_db
from disd.spark.options import parse_options
from disd.spark.read import read_partition
from disd.spark.source import DisDataSource, DisStreamReader
from support import Feeder, running_dis, start_dis_server

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def evolved(tmp_path_factory):
    base = tmp_path_factory.mktemp("spark-versions")
    db = versioned_db.build(base / "db")
    schemas = versioned_db.write_schema_dir(base / "schemas", versioned_db.V2_DICT)
    return db, schemas


def python_read(spark, **opts):
    r = spark.read.format("dis").option("reader", "python").option("namespace", "Test").option("table", "Evolve")
    for k, v in opts.items():
        r = r.option(k, str(v))
    return r.load()


def sorted_rows(t: pa.Table) -> list[tuple]:
    """The rows of ``t`` as tuples, in one order whatever order they were read in (nulls last)."""
    return sorted(zip(*(t.column(c).to_pylist() for c in t.column_names)),
                  key=lambda r: tuple((v is None, v if v is not None else 0) for v in r))


def same_rows(df, want: pa.Table) -> None:
    got = df.select(*want.column_names).toArrow()
    assert got.num_rows == want.num_rows
    assert sorted_rows(got) == sorted_rows(want)


def test_batch_from_column_files_presents_the_newest_version(spark_session, evolved):
    db, schemas = evolved
    df = python_read(spark_session, dbRoot=db, schemas=schemas, minPartitions=3)
    assert df.columns == ["Id", "Sym", "Price", "Qty", "New", "Date"]
    assert dict(df.dtypes) == {"Id": "bigint", "Sym": "string", "Price": "double", "Qty": "int", "New": "string",
                               "Date": "string"}
    want = versioned_db.expected()
    same_rows(df, want)
    assert df.where("Price IS NULL").count() == want.column("Price").null_count > 0
    # column pruning (option and select) and partition pruning still work across versions
    day2 = python_read(spark_session, dbRoot=db, schemas=schemas, columns="Price,New,Date",
                       partitions=versioned_db.DAY2)
    assert day2.columns == ["Price", "New", "Date"]
    same_rows(day2.drop("Date"), versioned_db.expected(day=versioned_db.DAY2, columns=["Price", "New"]))
    assert day2.where("New IS NULL").count() == 5_000 + 2_000 // 5  # all of version 1's, every 5th of version 2's
    assert df.where(f"Date = '{versioned_db.DAY1}'").count() == 73_000
    assert df.where("New IS NOT NULL").count() == 2_000 - 2_000 // 5


def test_batch_through_a_dis_presents_the_newest_version(spark_session, evolved, tmp_path):
    """Planned by a DIS started with version 2's YAML over both versions' locations (its
    ListTables carries the versions, its ListLocations each location's version); tasks read
    over gRPC, then from the column files (option dbRoot)."""
    db, schemas = evolved
    copy = tmp_path / "db"
    shutil.copytree(db, copy)
    want = versioned_db.expected()
    with running_dis(copy, schemas=schemas) as srv:
        address = f"127.0.0.1:{srv.port}"
        for opts in ({}, {"dbRoot": copy}):
            df = python_read(spark_session, address=address, **opts)
            assert df.columns == ["Id", "Sym", "Price", "Qty", "New", "Date"]
            same_rows(df, want)


def test_a_stream_keeps_its_schema_when_a_newer_version_appears(tmp_path):
    """A streaming query started in version 1 goes on after the DIS restarts with version 2 and a
    location of version 2 appears: those rows are not lost, and read as the query's version
    (renamed back, widened values cast back exactly, dropped columns null).  Checked on the
    reader's contract (offsets, partitions, tasks) without a Spark query, as test_stream does."""
    db = versioned_db.build(tmp_path / "db", versions=(1,))
    s1 = versioned_db.write_schema_dir(tmp_path / "schemas-v1", versioned_db.V1_DICT)
    s2 = versioned_db.write_schema_dir(tmp_path / "schemas-v2", versioned_db.V2_DICT)
    srv = start_dis_server(db, schemas=s1)
    port = srv.port
    o = {"address": f"127.0.0.1:{port}", "namespace": "Test", "table": "Evolve"}
    r = DisStreamReader(parse_options(o), DisDataSource(o).schema())
    try:
        o1 = r.latestOffset({}, ReadAllAvailable())
        first = read_all(r, {}, o1)
        assert first.schema.names == ["Id", "Px", "Sym", "Gone", "Qty", "Date"] and first.num_rows == 78_000
        srv.stop(0.5)
        srv = start_dis_server(db, schemas=s2, port=port)
        Feeder(srv).append(versioned_db.V2_LOC, versioned_db.rows(2, 78_000, 2_000))
        o2 = r.latestOffset(o1, ReadAllAvailable())
        assert o2 == {**o1, "feed1-2/" + versioned_db.DAY2: 2_000}
        new = read_all(r, o1, o2)
        assert new.schema == first.schema
        v2 = versioned_db.rows(2, 78_000, 2_000)
        assert sorted_rows(new.drop_columns(["Date"])) == sorted_rows(pa.table({
            "Id": v2["Id"].cast(pa.int32()), "Px": v2["Price"].cast(pa.float32()), "Sym": v2["Sym"],
            "Gone": pa.nulls(2_000, pa.string()), "Qty": v2["Qty"]}))
    finally:
        r.stop()
        srv.stop(0.5)


def read_all(r, start: dict, end: dict) -> pa.Table:
    batches = []
    for p in r.partitions(start, end):
        batches += list(read_partition(pickle.loads(pickle.dumps(p))))  # as a task gets it
    return pa.Table.from_batches(batches)
