"""The JVM reader presents a table whose locations were written in different schema versions
exactly as ``disd.schemaversions`` says (docs/schema-versions.md): the newest version's columns;
a location of an older version read in its own version and projected (a renamed column from its
old name's file, a column added since all null, a dropped one absent, a widened one converted
exactly with the old type's null sentinels still null).  Both ways the reader gets its bytes are
covered: the DIS's block endpoint, and the column files themselves (option ``dbRoot``).

The database is written by the storage engine itself: two locations in version 1 (one
``table.size`` recording ``schema_version``, one only the fingerprint, as records written before
versions do), one in version 2 through a real in-process DIS, and the table's ``schema.versions``.
The expected rows are the Python rules' own projection (``schemaversions.projection(...).apply``).

A streaming query keeps the version it started with: a location of a version admitted while it
runs is read back onto the query's columns (tests/versioned_db.py's table, through a DIS restarted
with the newer version).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import types
import urllib.request

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import yaml

from disd.binlog import LocationKey
from disd.schema import SchemaRegistry, TableSchema
from disd.schemaversions import projection
from disd.storage import checkpoint, versionstore
from disd.storage.engine import StorageEngine, location_path

import versioned_db
from support import Feeder, start_dis_server, wait_for

pytestmark = pytest.mark.spark

NS, TABLE = "Versioned", "Quote"
V1 = TableSchema.from_dict({
    "namespace": NS, "table": TABLE, "partition_column": "Date", "version": 1,
    "columns": [{"name": "Ts", "type": "timestamp"}, {"name": "Sym", "type": "string"},
                {"name": "Px", "type": "float"}, {"name": "Qty", "type": "int"}, {"name": "Flag", "type": "byte"},
                {"name": "Lots", "type": "short"}, {"name": "Old", "type": "long"}],
})
V2_DICT = {
    "namespace": NS, "table": TABLE, "partition_column": "Date", "version": 2,
    "columns": [{"name": "Time", "type": "timestamp", "renamed_from": "Ts"}, {"name": "Sym", "type": "string"},
                {"name": "Price", "type": "double", "renamed_from": "Px"}, {"name": "Qty", "type": "long"},
                {"name": "Venue", "type": "string"}, {"name": "Flag", "type": "short"},
                {"name": "Lots", "type": "int"}, {"name": "Bid", "type": "int"}],
}
V2 = TableSchema.from_dict(V2_DICT)
NEWEST = V2.with_history([V1])

OLD_FP = LocationKey(NS, TABLE, "feed1", "2026-11-20")        # table.size: fingerprint only
OLD_VERSIONED = LocationKey(NS, TABLE, "feed2", "2026-11-20")  # table.size: schema_version 1
NEW = LocationKey(NS, TABLE, "feed1", "2026-11-21")
ROWS = {OLD_FP: (0, 3000), OLD_VERSIONED: (3000, 1000), NEW: (4000, 2000)}
T0 = 1_763_800_000_000_000_000


def v1_rows(start: int, n: int) -> pa.Table:
    """Every 5th row null in Sym, Px, Qty, Flag and Lots; the extremes of each old type next to
    its null sentinel (which must stay null when widened)."""
    i = np.arange(start, start + n, dtype=np.int64)
    null = pa.array(i % 5 == 2)
    qty = np.where(i % 7 == 0, 2**31 - 1, np.where(i % 7 == 1, -(2**31) + 1, i * 3 - 5000)).astype(np.int32)
    flag = np.where(i % 3 == 0, 127, np.where(i % 3 == 1, -127, i % 100)).astype(np.int8)
    lots = np.where(i % 4 == 0, 32767, np.where(i % 4 == 1, -32767, i % 1000)).astype(np.int16)

    def nulled(a: pa.Array) -> pa.Array:
        return pc.if_else(null, pa.nulls(n, a.type), a)

    return pa.table({
        "Ts": pa.array(T0 + i * 1000).cast(pa.timestamp("ns", tz="UTC")),
        "Sym": nulled(pa.array([f"S{x % 11}" for x in i], pa.string())),
        "Px": nulled(pa.array((i * 0.25 + 0.1).astype(np.float32))),
        "Qty": nulled(pa.array(qty)),
        "Flag": nulled(pa.array(flag)),
        "Lots": nulled(pa.array(lots)),
        "Old": pa.array(i * 11),
    })


def v2_rows(start: int, n: int) -> pa.Table:
    i = np.arange(start, start + n, dtype=np.int64)
    null = pa.array(i % 6 == 1)
    return pa.table({
        "Time": pa.array(T0 + i * 1000).cast(pa.timestamp("ns", tz="UTC")),
        "Sym": pa.array([f"S{x % 11}" for x in i], pa.string()),
        "Price": pa.array(i * 0.5),
        "Qty": pa.array(i * 10_000_000_000),
        "Venue": pc.if_else(null, pa.nulls(n, pa.string()), pa.array([f"V{x % 3}" for x in i], pa.string())),
        "Flag": pa.array((i % 30000).astype(np.int16)),
        "Lots": pa.array(i.astype(np.int32) * 1000),
        "Bid": pc.if_else(null, pa.nulls(n, pa.int32()), pa.array(i.astype(np.int32))),
    })


def expected_rows() -> list[dict]:
    """What a read presents: the Python rules' projection of each location's rows."""
    out = []
    for key, (start, n) in ROWS.items():
        if key == NEW:
            t = v2_rows(start, n)
        else:
            t = projection(NEWEST, 1).apply(v1_rows(start, n))
        t = t.append_column("Date", pa.array([key.column_partition] * n))
        out.extend(t.to_pylist())
    return [_comparable(r) for r in out]


def _comparable(r: dict) -> dict:
    r = dict(r)
    t = r.pop("Time")
    r["TimeUs"] = None if t is None else (t.value // 1000 if hasattr(t, "value") else
                                          int(t.timestamp()) * 1_000_000 + t.microsecond)
    return r


def _sorted_rows(t: pa.Table) -> list[tuple]:
    """The rows of ``t`` as tuples, in one order whatever order they were read in (nulls last)."""
    return sorted(zip(*(t.column(c).to_pylist() for c in t.column_names)),
                  key=lambda r: tuple((v is None, v if v is not None else 0) for v in r))


def _write_old_locations(db_root) -> None:
    """Version 1 locations as the storage engine writes them, and the table's versions record."""
    reg = SchemaRegistry([V1])
    eng = StorageEngine(str(db_root), reg)
    try:
        feeder = Feeder(types.SimpleNamespace(engine=eng, schemas=reg))
        for key in (OLD_FP, OLD_VERSIONED):
            start, n = ROWS[key]
            feeder.append(key, v1_rows(start, n))
            eng.location(key).checkpoint()
    finally:
        eng.close()
    for key, version in ((OLD_FP, 0), (OLD_VERSIONED, 1)):
        path = location_path(str(db_root), key)
        rec = checkpoint.read_record(path)
        assert rec is not None and rec.rows == ROWS[key][1]
        checkpoint.write_record(path, dataclasses.replace(rec, schema_version=version))
    versionstore.save(str(db_root), [V1, V2])


@pytest.fixture(scope="module")
def versioned(tmp_path_factory):
    """A DIS serving Versioned.Quote: version 1 locations written before it started, a version 2
    location written through it."""
    tmp = tmp_path_factory.mktemp("versions")
    db, schemas = tmp / "db", tmp / "schemas"
    schemas.mkdir()
    (schemas / f"{NS}.{TABLE}.yaml").write_text(yaml.safe_dump(V2_DICT, sort_keys=False))
    _write_old_locations(db)
    srv = start_dis_server(db, schemas=schemas)
    try:
        for key in (OLD_FP, OLD_VERSIONED):
            old = srv.engine.location(key, create=False)
            assert not old.in_error and old.schema_version == 1, f"the DIS did not open a version 1 location: {old}"
        Feeder(srv).append(NEW, v2_rows(*ROWS[NEW]))
        yield srv, db
    finally:
        srv.stop(0.5)


@pytest.fixture
def jvm_spark(spark_session):
    from disd.spark import jvm

    from .conftest import jvm_sources_digest

    jar, why = jvm.jar_status()
    assert jar is not None, why
    assert jvm.jvm_source_loaded(spark_session), "the JVM reader is not on the session's classpath"
    assert jvm.stamp().get("sources") == jvm_sources_digest(), "dis-spark.jar is older than jvm/src: run `make jar`"
    return spark_session


def _reader(spark, srv, db, mode: str):
    r = (spark.read.format("dis").option("reader", "jvm").option("address", f"127.0.0.1:{srv.port}")
         .option("namespace", NS).option("table", TABLE).option("batchRows", "700"))
    return r.option("dbRoot", str(db)) if mode == "dbroot" else r


def _collect(df) -> list[dict]:
    from pyspark.sql import functions as F

    rows = df.withColumn("TimeUs", F.unix_micros("Time")).drop("Time").collect()
    return [r.asDict() for r in rows]


def _key(r: dict):
    return (r["Date"], r["TimeUs"])


def test_block_endpoint_says_versions(versioned):
    srv, _ = versioned
    base = f"http://127.0.0.1:{srv.http_port}"
    tables = json.load(urllib.request.urlopen(f"{base}/v1/tables"))["tables"]
    t = next(t for t in tables if (t["namespace"], t["table"]) == (NS, TABLE))
    assert [s["version"] for s in json.loads(t["versions_json"])] == [1, 2]
    locs = json.load(urllib.request.urlopen(f"{base}/v1/locations?namespace={NS}&table={TABLE}"))["locations"]
    # 0: not said, the newest (a location the engine created before it recorded versions)
    got = {(x["internal_partition"], x["column_partition"]): (x["schema_version"], x["rows"])
           for x in locs}
    assert got == {("feed1", "2026-11-20"): (1, 3000), ("feed2", "2026-11-20"): (1, 1000),
                   ("feed1", "2026-11-21"): (2, 2000)}


@pytest.mark.parametrize("mode", ["http", "dbroot"])
def test_jvm_reader_presents_every_location_in_the_newest_version(jvm_spark, versioned, mode):
    srv, db = versioned
    df = _reader(jvm_spark, srv, db, mode).load()
    assert df.columns == ["Time", "Sym", "Price", "Qty", "Venue", "Flag", "Lots", "Bid", "Date"]
    assert [f.dataType.simpleString() for f in df.schema.fields] == [
        "timestamp", "string", "double", "bigint", "string", "smallint", "int", "int", "string"]
    got = sorted(_collect(df), key=_key)
    want = sorted(expected_rows(), key=_key)
    assert len(got) == len(want) == sum(n for _, n in ROWS.values())
    for g, w in zip(got, want):
        assert g == w
    old = [r for r in got if r["Date"] == "2026-11-20"]
    # spelled out: the added columns are null, the dropped one absent, old nulls still null,
    # the renamed and widened values exact (the sentinels of the old types are not values)
    assert all(r["Venue"] is None and r["Bid"] is None for r in old)
    assert "Old" not in got[0] and "Px" not in got[0] and "Ts" not in got[0]
    nulls = [r for r in old if (r["TimeUs"] * 1000 - T0) // 1000 % 5 == 2]
    assert nulls and all(r["Qty"] is None and r["Flag"] is None and r["Lots"] is None and r["Price"] is None
                         for r in nulls)
    assert {2**31 - 1, -(2**31) + 1} <= {r["Qty"] for r in old}
    assert {127, -127} <= {r["Flag"] for r in old} and {32767, -32767} <= {r["Lots"] for r in old}
    assert any(r["Price"] == float(np.float32(0.1)) for r in old)  # float -> double: the float's value


@pytest.mark.parametrize("mode", ["http", "dbroot"])
def test_jvm_reader_prunes_filters_and_widens_further_across_versions(jvm_spark, versioned, mode):
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    srv, db = versioned
    df = _reader(jvm_spark, srv, db, mode).load()
    only_new = df.where(F.col("Venue").isNotNull()).count()
    assert only_new == sum(1 for i in range(4000, 6000) if i % 6 != 1)
    assert df.where("Date = '2026-11-20'").select("Bid", "Venue").distinct().collect() == [(None, None)]
    assert df.count() == 6000
    # a user schema asking for Flag as long: byte (version 1) and short (version 2) both widen to it
    user = StructType([StructField("Flag", LongType()), StructField("Date", StringType())])
    r = _reader(jvm_spark, srv, db, mode).schema(user).load()
    got = sorted((x.Date, x.Flag) for x in r.collect() if x.Flag is not None)
    want = sorted((x["Date"], x["Flag"]) for x in expected_rows() if x["Flag"] is not None)
    assert got == want


def test_a_jvm_stream_keeps_its_schema_when_a_newer_version_appears(jvm_spark, tmp_path):
    """A streaming query of the JVM reader started in version 1 keeps going after the DIS restarts
    with version 2 (Id widened int -> long, Px renamed Price and widened, Gone dropped, New added)
    and a location of version 2 appears: every row arrives once, in version 1's columns (renamed
    back, widened values cast back exactly, the dropped column null, the added one not shown).
    A version 2 value that version 1's type cannot hold then fails the query with an error that
    says to restart it, rather than presenting a wrong number."""
    db = versioned_db.build(tmp_path / "db", versions=(1,))
    s1 = versioned_db.write_schema_dir(tmp_path / "schemas-v1", versioned_db.V1_DICT)
    s2 = versioned_db.write_schema_dir(tmp_path / "schemas-v2", versioned_db.V2_DICT)
    srv = start_dis_server(db, schemas=s1)
    port = srv.port
    received: list[pa.Table] = []
    lock = threading.Lock()

    def sink(batch_df, batch_id) -> None:
        t = batch_df.toArrow()
        with lock:
            received.append(t)

    def count() -> int:
        with lock:
            return sum(t.num_rows for t in received)

    q = None
    try:
        df = (jvm_spark.readStream.format("dis").option("reader", "jvm").option("address", f"127.0.0.1:{port}")
              .option("namespace", "Test").option("table", "Evolve").option("batchRows", "700").load())
        assert df.columns == ["Id", "Px", "Sym", "Gone", "Qty", "Date"]
        q = (df.writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(processingTime="200 milliseconds").start())
        wait_for(lambda: count() >= 78_000, 120, 0.2, "the version 1 rows")
        srv.stop(0.5)
        srv = start_dis_server(db, schemas=s2, port=port)
        feeder = Feeder(srv)
        v2 = versioned_db.rows(2, 78_000, 2_000)
        feeder.append(versioned_db.V2_LOC, v2)
        wait_for(lambda: count() >= 80_000 or q.exception() is not None, 120, 0.2, "the version 2 rows")
        time.sleep(1.0)  # a duplicate would arrive now
        assert q.exception() is None, q.exception()
        with lock:
            got = pa.concat_tables(received)
        assert got.schema.names == ["Id", "Px", "Sym", "Gone", "Qty", "Date"]
        assert got.num_rows == 80_000
        v1 = [versioned_db.rows(1, start, n) for version, start, n in versioned_db.LOCS.values() if version == 1]
        want = pa.concat_tables([*v1, pa.table({
            "Id": v2["Id"].cast(pa.int32()), "Px": v2["Price"].cast(pa.float32()), "Sym": v2["Sym"],
            "Gone": pa.nulls(2_000, pa.string()), "Qty": v2["Qty"]})])
        assert _sorted_rows(got.drop_columns(["Date"])) == _sorted_rows(want)
        new = got.filter(pc.and_(pc.equal(got["Date"], versioned_db.DAY2), pc.greater_equal(got["Id"], 78_000)))
        assert new.num_rows == 2_000 - 2_000 // 5 and new["Gone"].null_count == new.num_rows

        # Id beyond int in version 2: version 1's type cannot present it
        big = versioned_db.rows(2, 80_000, 10)
        big = big.set_column(0, "Id", pa.array([2**40 + i for i in range(10)], pa.int64()))
        feeder.append(versioned_db.V2_LOC, big)
        wait_for(lambda: q.exception() is not None, 120, 0.2, "the query to fail on a value int cannot hold")
        msg = str(q.exception())
        assert "restart the query" in msg and "cannot hold" in msg and str(2**40) in msg, msg
        assert "Test.Evolve column 'Id'" in msg and "feed1-2/" + versioned_db.DAY2 in msg, msg
        assert count() == 80_000
    finally:
        if q is not None:
            q.stop()
        srv.stop(0.5)
