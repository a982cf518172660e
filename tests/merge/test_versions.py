"""Merges across schema versions: a partition whose locations are written in two versions is
merged in the newest; Parquet merged before the change reads in the newest version."""

from __future__ import annotations

import pathlib
import shutil

import pyarrow.parquet as pq
import pytest

import versioned_db
from disd.historical.definitions import read_definition
from disd.historical.layout import NamespaceRoot
from disd.historical.merge import IntradaySource, MergeRequest, merge
from disd.storage.versionstore import FILE_NAME
from support import running_dis

pytestmark = pytest.mark.spark


@pytest.fixture
def python_spark(spark_session):
    spark_session.conf.set("spark.dis.reader", "python")
    yield spark_session
    spark_session.conf.unset("spark.dis.reader")


def historical(spark, db, source="historical", **opts):
    r = (spark.read.format("dis").option("source", source).option("dbRoot", str(db))
         .option("namespace", "Test").option("table", "Evolve"))
    for k, v in opts.items():
        r = r.option(k, str(v))
    return r.load()


def sorted_rows(t) -> list[tuple]:
    return sorted(zip(*(t.column(c).to_pylist() for c in t.column_names)),
                  key=lambda r: tuple((v is None, v if v is not None else 0) for v in r))


def same_rows(df, want) -> None:
    got = df.select(*want.column_names).toArrow()
    assert got.num_rows == want.num_rows
    assert sorted_rows(got) == sorted_rows(want)


def files_of(path) -> list:
    return sorted(p for p in path.iterdir() if p.suffix == ".parquet" and not p.name.startswith((".", "_")))


def test_merge_of_a_mixed_version_partition_and_old_parquet_in_the_new_version(python_spark, tmp_path):
    spark = python_spark
    db = tmp_path / "db"
    s1 = versioned_db.write_schema_dir(tmp_path / "schemas-v1", versioned_db.V1_DICT)
    s2 = versioned_db.write_schema_dir(tmp_path / "schemas-v2", versioned_db.V2_DICT)
    ns = NamespaceRoot.system(str(db), "Test")

    # day 1 merged while the table has one version: its files record version 1
    versioned_db.build(db, versions=(1,))
    r1 = merge(spark, MergeRequest("Test", "Evolve", versioned_db.DAY1, str(db), IntradaySource(schemas=str(s1)),
                                   force=True))
    assert (r1.status, r1.rows) == ("merged", 73_000)
    day1_files = files_of(pathlib.Path(r1.path))
    meta = pq.read_schema(day1_files[0]).metadata
    assert meta[b"dis.schema_version"] == b"1"
    assert read_definition(ns, "Evolve").schema_version == 1

    # version 2 arrives; day 2 holds locations of both versions and is merged in version 2
    versioned_db.build(db, versions=(2,))
    r2 = merge(spark, MergeRequest("Test", "Evolve", versioned_db.DAY2, str(db), IntradaySource(schemas=str(s2)),
                                   force=True))
    assert (r2.status, r2.rows) == ("merged", 7_000)
    defn = read_definition(ns, "Evolve")
    assert defn.schema_version == 2 and defn.column_names == ["Id", "Sym", "Price", "Qty", "New"]
    day2 = pq.read_table(files_of(pathlib.Path(r2.path)))
    assert pq.read_schema(files_of(pathlib.Path(r2.path))[0]).metadata[b"dis.schema_version"] == b"2"
    assert sorted_rows(day2.select(["Id", "Sym", "Price", "Qty", "New"])) == sorted_rows(
        versioned_db.expected(day=versioned_db.DAY2))

    # every historical row in version 2: day 1's files are projected by their recorded version
    df = historical(spark, db)
    assert df.columns == ["Id", "Sym", "Price", "Qty", "New", "Date"]
    same_rows(df, versioned_db.expected())
    same_rows(historical(spark, db, columns="Price,New", partitions=versioned_db.DAY1),
              versioned_db.expected(day=versioned_db.DAY1, columns=["Price", "New"]))
    # historical and intraday together (all merged: the historical rows)
    same_rows(historical(spark, db, "all", schemas=s2), versioned_db.expected())

    # without the database's versions record the files' own metadata carries the history
    (db / "Intraday" / "Test" / "Evolve" / FILE_NAME).rename(tmp_path / "versions.saved")
    same_rows(historical(spark, db), versioned_db.expected())
    (tmp_path / "versions.saved").rename(db / "Intraday" / "Test" / "Evolve" / FILE_NAME)
    assert (db / "Intraday" / "Test" / "Evolve" / FILE_NAME).exists()

    # a file merged before versions were recorded (no dis.* metadata) is read by its columns' names
    for f in day1_files:
        t = pq.read_table(f)
        pq.write_table(t.replace_schema_metadata(None), f)
        assert b"dis.schema_version" not in (pq.read_schema(f).metadata or {})
    same_rows(historical(spark, db), versioned_db.expected())


def test_merge_through_a_dis_of_a_mixed_version_partition(python_spark, tmp_path):
    """The DIS started with version 2's YAML serves a partition whose locations are in both
    versions; the merge reads it through the dis source in version 2."""
    db = versioned_db.build(tmp_path / "intraday")
    s2 = versioned_db.write_schema_dir(tmp_path / "schemas-v2", versioned_db.V2_DICT)
    out = tmp_path / "db"
    with running_dis(db, schemas=s2) as srv:
        r = merge(python_spark, MergeRequest("Test", "Evolve", versioned_db.DAY2, str(out),
                                             IntradaySource(address=f"127.0.0.1:{srv.port}"), force=True))
    assert (r.status, r.rows, r.source) == ("merged", 7_000, "dis")
    files = files_of(pathlib.Path(r.path))
    assert pq.read_schema(files[0]).metadata[b"dis.schema_version"] == b"2"
    same_rows(historical(python_spark, out), versioned_db.expected(day=versioned_db.DAY2))
    shutil.rmtree(out)
