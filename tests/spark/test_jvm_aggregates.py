"""Aggregate pushdown in the JVM reader (docs/spark.md, "Aggregate pushdown"): every pushed
query gives what the same query gives with ``pushAggregates=false`` (Spark aggregating the
scanned rows), what the Python source gives, and what the rows themselves say; the plan shows the
pushed aggregation, so these tests fail if pushdown silently stops."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import functions as F

from disd.binlog import LocationKey

from .conftest import TOTAL
from support import SCHEMAS, Feeder, start_dis_server

pytestmark = pytest.mark.spark

COLS = ["Bool", "Byte", "Short", "Int", "Long", "Float", "Double", "Char", "String", "Timestamp"]
# Test.AllTypes locations: (internal partition, day) -> rows; the last is all nulls but the keys.
LOCS = {("p1", "2026-11-22"): 2500, ("p2", "2026-11-22"): 1800, ("p1", "2026-11-23"): 1300,
        ("p3", "2026-11-24"): 400}
ALL_NULL = ("p3", "2026-11-24")
NAN_LOC = ("p2", "2026-11-22")


def all_types(n: int, seed: int, all_null: bool = False, specials: bool = False) -> pa.Table:
    """Every type, with nulls in keys and values (1 row in 6), few distinct String/Int/Byte/Char
    values (group keys); with ``specials``, NaN, -0.0, 0.0 and infinities among the floats."""
    rng = np.random.default_rng(seed)
    dbl = rng.random(n) * 100 - 50
    flt = (rng.random(n) * 10 - 5).astype(np.float32)
    if specials:
        for arr in (dbl, flt):
            arr[5::97] = np.nan
            arr[7::89] = -0.0
            arr[9::83] = 0.0
            arr[11::301] = np.inf
            arr[13::307] = -np.inf
    cols = {
        "Bool": pa.array(rng.random(n) < 0.5),
        "Byte": pa.array(rng.integers(-3, 3, n).astype(np.int8)),
        "Short": pa.array(rng.integers(-30000, 30000, n).astype(np.int16)),
        "Int": pa.array(rng.integers(-5, 5, n).astype(np.int32)),
        "Long": pa.array(rng.integers(-10**15, 10**15, n)),
        "Float": pa.array(flt),
        "Double": pa.array(dbl),
        "Char": pa.array(rng.choice([ord("A"), ord("B"), 0x263A], n).astype(np.uint16)),
        "String": pa.array(np.array(["AAPL", "", "żółć", "x" * 40], dtype=object)[rng.integers(0, 4, n)].tolist()),
        "Timestamp": pa.array(1_700_000_000_000_000_999 + rng.integers(-10**15, 10**15, n)).cast(
            pa.timestamp("ns", tz="UTC")),
    }
    out = {}
    for i, (k, v) in enumerate(cols.items()):
        m = np.ones(n, bool) if all_null else (np.arange(n) + i) % 6 == 1  # each column its own null rows
        out[k] = pc.if_else(pa.array(m), pa.nulls(n, v.type), v)
    return pa.table(out)


@pytest.fixture(scope="module")
def agg_dis(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("agg-dis")
    schemas = tmp / "schemas"
    shutil.copytree(SCHEMAS, schemas)
    (schemas / "Test.AllTypes.yaml").write_text(
        "namespace: Test\ntable: AllTypes\npartition_column: Day\ncolumns:\n"
        + "".join(f"  - {{name: {n}, type: {n.lower()}}}\n" for n in COLS))
    srv = start_dis_server(tmp / "db", schemas=schemas)
    tables = {}
    try:
        feeder = Feeder(srv)
        for i, ((ip, day), n) in enumerate(LOCS.items()):
            t = all_types(n, i, all_null=(ip, day) == ALL_NULL, specials=(ip, day) == NAN_LOC)
            feeder.append(LocationKey("Test", "AllTypes", ip, day), t)
            tables[(ip, day)] = t
        yield srv, tmp / "db", tables
    finally:
        srv.stop(0.5)


@pytest.fixture
def jvm_spark(spark_session):
    from disd.spark import jvm

    from .conftest import jvm_sources_digest

    assert jvm.jvm_source_loaded(spark_session), "the JVM reader is not on the session's classpath"
    assert jvm.stamp().get("sources") == jvm_sources_digest(), "dis-spark.jar is older than jvm/src: run `make jar`"
    return spark_session


def load(spark, address, table, mode="network", reader="jvm", push=True, **opts):
    r = (spark.read.format("dis").option("reader", reader).option("address", address).option("table", table)
         .option("pushAggregates", "true" if push else "false"))
    if mode == "dbroot":
        r = r.option("dbRoot", opts.pop("db"))
    opts.pop("db", None)
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


def plan_of(df) -> str:
    return df._jdf.queryExecution().executedPlan().toString()  # noqa: SLF001 - the plan has no Python API


def pushed(df) -> bool:
    return "pushed aggregation" in plan_of(df)


def norm(v):
    if isinstance(v, float):
        return "nan" if math.isnan(v) else round(v, 6) if math.isfinite(v) else v
    return v


def rows(df, keys) -> list[tuple]:
    got = [tuple(norm(x) for x in r) for r in df.collect()]
    return sorted(got, key=lambda t: tuple((x is None, str(x)) for x in t[:keys]))


def close(a: list[tuple], b: list[tuple]) -> bool:
    """Equal, floats to 1e-9 relative (sums in another order)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        for u, v in zip(x, y):
            if isinstance(u, float) and isinstance(v, float):
                if not math.isclose(u, v, rel_tol=1e-9, abs_tol=1e-9):
                    return False
            elif u != v:
                return False
    return True


def check(make, query, keys: int, python: bool = True, push: bool = True) -> list[tuple]:
    """``query`` over ``make(push=...)``: pushed (the plan says so; with ``push`` false, that it
    is not) equals not pushed and the Python source."""
    df = query(make(push=True))
    assert pushed(df) == push, plan_of(df)
    got = rows(df, keys)
    plain = query(make(push=False))
    assert not pushed(plain)
    want = rows(plain, keys)
    assert close(got, want), (got[:5], want[:5])
    if python:
        assert close(got, rows(query(make(reader="python")), keys))
    return got


MODES = ["network", "dbroot"]


@pytest.mark.parametrize("mode", MODES)
def test_the_grouped_trade_query_is_pushed_and_exact(jvm_spark, trade_dis, trade_address, mode):
    def make(push=True, reader="jvm"):
        return load(jvm_spark, trade_address, "Market.Trade", mode, reader, push, db=trade_dis.config.db_root,
                    batchRows="3000", minPartitions="3", rowsPerPartition="20000")

    def q(df):
        return df.groupBy("Sym", "Date").agg(F.count("*"), F.sum("Size"), F.avg("Price"), F.max("Timestamp"),
                                             F.min("Price"), F.count("Sym"))

    got = check(make, q, 2)
    assert sum(r[2] for r in got) == TOTAL
    assert any(r[0] is None for r in got)  # null Sym: its own group
    # against the rows themselves: Size is the row number, every 7th row (i % 7 == 3) has no Sym/Price
    by = {}
    for r in got:
        by.setdefault(r[1], []).append(r)
    assert sum(r[3] for r in by["2026-11-23"]) == sum(range(50_000, 57_000))
    (null_23,) = [r for r in by["2026-11-23"] if r[0] is None]
    assert null_23[2] == len([i for i in range(50_000, 57_000) if i % 7 == 3])
    assert null_23[4] is None and null_23[6] is None and null_23[7] == 0  # avg, min of only nulls; count(Sym)


@pytest.mark.parametrize("mode", MODES)
def test_every_type_grouped_by_string_integral_and_partition_keys(jvm_spark, agg_dis, mode):
    srv, db, _ = agg_dis

    def make(push=True, reader="jvm"):
        return load(jvm_spark, f"127.0.0.1:{srv.port}", "Test.AllTypes", mode, reader, push, db=str(db),
                    batchRows="500", minPartitions="3", rowsPerPartition="1000")

    def q(df):
        return df.groupBy("String", "Int", "Day").agg(
            F.count("*"), F.count("Double"), F.count("Bool"), F.sum("Long"), F.sum("Int"), F.sum("Double"),
            F.avg("Int"), F.avg("Double"), *[f(c) for c in ["Byte", "Short", "Int", "Long", "Float", "Double",
                                                              "Timestamp"] for f in (F.min, F.max)])

    check(make, q, 3)
    for key in ["Char", "Byte", "Short", "Day", "String"]:
        check(make, lambda df: df.groupBy(key).agg(F.count("*"), F.sum("Long"), F.max("Float"), F.min("Double")), 1)


def test_against_the_rows_themselves(jvm_spark, agg_dis):
    srv, db, tables = agg_dis
    df = load(jvm_spark, f"127.0.0.1:{srv.port}", "Test.AllTypes", batchRows="300")
    q = df.groupBy("Day", "String").agg(F.count("*").alias("n"), F.sum("Long").alias("s"),
                                        F.count("Short").alias("c"), F.min("Short").alias("lo"))
    assert pushed(q)
    got = {(r.Day, r.String): (r.n, r.s, r.c, r.lo) for r in q.collect()}
    want = {}
    for (_, day), t in tables.items():
        for s, lng, sh in zip(t.column("String").to_pylist(), t.column("Long").to_pylist(),
                              t.column("Short").to_pylist()):
            n, tot, c, lo = want.get((day, s), (0, None, 0, None))
            if lng is not None:
                tot = (tot or 0) + lng
            if sh is not None:
                lo, c = sh if lo is None else min(lo, sh), c + 1
            want[(day, s)] = (n + 1, tot, c, lo)
    assert got == want
    assert got[(ALL_NULL[1], None)][1:] == (None, 0, None)  # only nulls: SUM, MIN null, COUNT 0


def test_float_min_max_follow_sparks_order(jvm_spark, agg_dis):
    srv, db, tables = agg_dis
    day = [t for (_, d), t in tables.items() if d == NAN_LOC[1]]

    def make(push=True, reader="jvm"):
        return load(jvm_spark, f"127.0.0.1:{srv.port}", "Test.AllTypes", "network", reader, push,
                    partitions=NAN_LOC[1], batchRows="128")

    got = check(make, lambda df: df.groupBy("Int").agg(F.max("Double"), F.min("Double"), F.max("Float"),
                                                     F.min("Float"), F.sum("Double")), 1)
    values = {}
    for k, x in ((k, x) for t in day for k, x in zip(t.column("Int").to_pylist(), t.column("Double").to_pylist())):
        if x is not None:
            values.setdefault(k, []).append(x)
    for r in got:  # NaN above everything; -inf below
        xs = values[r[0]]
        assert (r[1] == "nan") == any(math.isnan(x) for x in xs), r
        assert r[2] == norm(min(x for x in xs if not math.isnan(x))), r
    assert any(r[1] == "nan" for r in got) and any(r[2] == -math.inf for r in got)


def test_global_aggregates_and_empty_reads(jvm_spark, agg_dis):
    srv, db, _ = agg_dis
    address = f"127.0.0.1:{srv.port}"

    def make(push=True, reader="jvm", **o):
        return load(jvm_spark, address, "Test.AllTypes", "network", reader, push, **o)

    # a global aggregate is left to Spark (nothing to gain), and its answers are the same
    got = check(make, lambda df: df.agg(F.count("*"), F.sum("Int"), F.max("Timestamp"), F.avg("Double")), 0,
                push=False)
    assert got[0][0] == sum(LOCS.values())
    # no location at all: one row, COUNT(*) 0 and SUM null, as Spark gives over no rows
    empty = lambda push=True, reader="jvm": make(push, reader, partitions="2031-01-01")  # noqa: E731
    assert check(empty, lambda df: df.agg(F.count("*"), F.sum("Int"), F.min("Long")), 0,
                 push=False) == [(0, None, None)]
    assert check(empty, lambda df: df.groupBy("String").agg(F.count("*")), 1) == []
    # one location of only nulls but the keys
    nulls = lambda push=True, reader="jvm": make(push, reader, partitions=ALL_NULL[1])  # noqa: E731
    got = check(nulls, lambda df: df.agg(F.count("*"), F.count("Short"), F.sum("Long"), F.max("Double")), 0,
                push=False)
    assert got == [(LOCS[ALL_NULL], 0, None, None)]


def test_partition_filter_and_pruned_columns(jvm_spark, trade_dis, trade_address):
    def make(push=True, reader="jvm", **o):
        return load(jvm_spark, trade_address, "Market.Trade", "network", reader, push, **o)

    # a WHERE on the partition column stays a filter for Spark after the scan: Spark then does not
    # offer the aggregate, and the answer is the plain scan's
    df = make().where("Date = '2026-11-23'").groupBy("Sym").agg(F.count("*"), F.sum("Size"))
    assert not pushed(df)
    assert sum(r[1] for r in df.collect()) == 7_000
    # the `partitions` option prunes at planning, and the aggregate is still pushed
    got = check(lambda push=True, reader="jvm": make(push, reader, partitions="2026-11-23"),
                lambda df: df.groupBy("Sym").agg(F.count("*"), F.sum("Size")), 1)
    assert sum(r[1] for r in got) == 7_000
    # option `columns`: the aggregate over the columns it keeps
    pruned = lambda push=True, reader="jvm": make(push, reader, columns="Size,Sym,Date")  # noqa: E731
    got = check(pruned, lambda df: df.groupBy("Date", "Sym").agg(F.sum("Size"), F.max("Size")), 2)
    assert sum(r[2] for r in got) == sum(range(TOTAL))
    # what is not computed exactly here is left to Spark: AVG of a string cast, DISTINCT, expressions
    for q in (lambda d: d.groupBy("Sym").agg(F.countDistinct("Size")),
              lambda d: d.groupBy(F.col("Size") % 3).agg(F.count("*")),
              lambda d: d.groupBy("Sym").agg(F.sum(F.col("Size") + 1)),
              lambda d: d.groupBy("Sym").agg(F.min("Sym"))):
        assert not pushed(q(make()))
        assert q(make()).collect() and sorted(map(tuple, q(make()).collect()), key=str) == sorted(
            map(tuple, q(make(push=False)).collect()), key=str)


def test_int_sums_beyond_int_range_and_long_overflow(jvm_spark, fresh_dis):
    srv, feeder = fresh_dis
    address = f"127.0.0.1:{srv.port}"
    n = 3000
    big = pa.table({"Sym": pa.array(["A", "B"] * (n // 2)),
                    "Size": pa.array(np.full(n, 2_000_000_000, np.int32)),
                    "Price": pa.array(np.ones(n))})
    feeder.append(LocationKey("Market", "Trade", "f", "2026-11-22"), big)

    def make(push=True, reader="jvm"):
        return load(jvm_spark, address, "Market.Trade", "network", reader, push, batchRows="1000")

    # each group's int sum is 3e12, sent as int-sized pieces Spark casts to int and sums exactly
    got = check(make, lambda df: df.groupBy("Sym").agg(F.sum("Size"), F.count("*"), F.min("Size")), 1)
    assert got == [("A", 3 * 10**12, n // 2, 2_000_000_000), ("B", 3 * 10**12, n // 2, 2_000_000_000)]
    assert check(make, lambda df: df.agg(F.sum("Size"), F.avg("Size")), 0, push=False) == [(6 * 10**12, 2e9)]


def test_long_sum_overflow_is_sparks(jvm_spark, tmp_path):
    schemas = tmp_path / "schemas"
    shutil.copytree(SCHEMAS, schemas)
    (schemas / "Test.Longs.yaml").write_text(
        "namespace: Test\ntable: Longs\ncolumns:\n  - {name: K, type: string}\n  - {name: V, type: long}\n")
    srv = start_dis_server(tmp_path / "db", schemas=schemas)
    try:
        big = 2**62
        Feeder(srv).append(LocationKey("Test", "Longs", "p", "2026-11-22"),
                           pa.table({"K": ["a", "a", "a", "b"], "V": pa.array([big, big, big, 5], pa.int64())}))
        address = f"127.0.0.1:{srv.port}"
        df = load(jvm_spark, address, "Test.Longs").groupBy("K").agg(F.sum("V"))
        assert pushed(df)
        with pytest.raises(Exception) as e:
            df.collect()
        assert "SUM(V)" in str(e.value) and "overflows" in str(e.value)
        with pytest.raises(Exception) as plain:
            load(jvm_spark, address, "Test.Longs", push=False).groupBy("K").agg(F.sum("V")).collect()
        assert "overflow" in str(plain.value).lower()
        # AVG of a long column is a double sum in Spark: never pushed (Spark would split it into a
        # long SUM and a COUNT), so it does not overflow
        avg = load(jvm_spark, address, "Test.Longs").groupBy("K").agg(F.avg("V"))
        assert not pushed(avg)
        assert sorted(map(tuple, avg.collect())) == [("a", float(big)), ("b", 5.0)]
        jvm_spark.conf.set("spark.sql.ansi.enabled", "false")
        try:  # without ANSI mode Spark's long sum wraps; so does the pushed one
            def make(push=True, reader="jvm"):
                return load(jvm_spark, address, "Test.Longs", "network", reader, push)

            got = check(make, lambda d: d.groupBy("K").agg(F.sum("V")), 1, python=False)
            assert got == [("a", 3 * big - 2**64), ("b", 5)]
        finally:
            jvm_spark.conf.unset("spark.sql.ansi.enabled")
    finally:
        srv.stop(0.5)


def test_option_turns_pushdown_off_and_is_checked(jvm_spark, trade_address):
    df = load(jvm_spark, trade_address, "Market.Trade", push=False).groupBy("Sym").count()
    assert not pushed(df)
    assert pushed(load(jvm_spark, trade_address, "Market.Trade").groupBy("Sym").count())
    with pytest.raises(Exception) as e:
        (jvm_spark.read.format("dis").option("reader", "jvm").option("address", trade_address)
         .option("table", "Market.Trade").option("pushAggregates", "maybe").load().count())
    assert "option 'pushAggregates' must be true or false" in str(e.value)


def test_a_streaming_aggregation_is_not_pushed(jvm_spark, trade_dis, trade_address, tmp_path):
    """Spark pushes aggregates into batch scans only: a stream's aggregation runs in Spark over
    the rows of each micro-batch, and gives the batch answer."""
    df = (jvm_spark.readStream.format("dis").option("reader", "jvm").option("address", trade_address)
          .option("table", "Market.Trade").load().groupBy("Date").agg(F.count("*").alias("n"),
                                                                         F.sum("Size").alias("s")))
    q = (df.writeStream.format("memory").queryName("dis_agg_stream").outputMode("complete")
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    try:
        q.awaitTermination(120)
        plan = q._jsq.streamingQuery().lastExecution().executedPlan().toString()  # noqa: SLF001 - the plan has no Python API
        assert "dis Market.Trade" in plan and "pushed aggregation" not in plan, plan
        got = {r.Date: (r.n, r.s) for r in jvm_spark.sql("select * from dis_agg_stream").collect()}
    finally:
        q.stop()
    batch = load(jvm_spark, trade_address, "Market.Trade").groupBy("Date").agg(F.count("*"), F.sum("Size"))
    assert pushed(batch)
    assert got == {r[0]: (r[1], r[2]) for r in batch.collect()}
    assert sum(n for n, _ in got.values()) == TOTAL
