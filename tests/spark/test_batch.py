"""``spark.read.format("dis")`` on a real local Spark session against in-process DIS instances."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from disd.binlog import LocationKey
from disd.client import connect
from support import SCHEMAS, Feeder, start_dis_server, trade_rows

from .conftest import TOTAL
from .test_units import all_types_table

pytestmark = pytest.mark.spark


def reader(spark, address, **opts):
    r = spark.read.format("dis").option("address", address).option("namespace", "Market").option("table", "Trade")
    for k, v in opts.items():
        r = r.option(k, v)
    return r


def expected_trade(address) -> pa.Table:
    with connect(address) as c:
        return c.read_table("Market", "Trade")


def rows_of(df, order="Size"):
    return [tuple(r) for r in df.orderBy(order).collect()]


def test_full_scan_equals_the_client_and_keeps_nulls(spark, trade_address):
    df = reader(spark, trade_address).load()
    assert df.columns == ["Timestamp", "Sym", "Price", "Size", "Date"]
    assert dict(df.dtypes) == {"Timestamp": "timestamp", "Sym": "string", "Price": "double", "Size": "int",
                               "Date": "string"}
    got = df.orderBy("Size").toArrow()
    exp = expected_trade(trade_address).sort_by("Size")
    assert got.num_rows == TOTAL
    assert got.column("Size").to_pylist() == list(range(TOTAL))
    assert got.column("Sym").to_pylist() == exp.column("Sym").to_pylist()
    assert got.column("Price").to_pylist() == exp.column("Price").to_pylist()
    assert got.column("Sym").null_count == exp.column("Sym").null_count > 0
    ts = got.column("Timestamp").cast(pa.int64()).to_numpy()
    assert (ts == exp.column("Timestamp").cast(pa.int64()).to_numpy() // 1000).all()
    by_date = {r["Date"]: r["count"] for r in df.groupBy("Date").count().collect()}
    assert by_date == {"2026-11-22": 50_000, "2026-11-23": 7_000}


def test_internal_partitions_are_hidden(spark, trade_address):
    df = reader(spark, trade_address).load()
    assert "feed1" not in str(df.schema) and len(df.columns) == 5


def test_large_locations_are_split_across_tasks(spark, trade_address):
    df = reader(spark, trade_address, rowsPerPartition="8000", batchRows="4096").load()
    assert df.rdd.getNumPartitions() >= 6
    assert df.agg(F.count("*"), F.sum("Size")).collect()[0] == (TOTAL, TOTAL * (TOTAL - 1) // 2)
    assert reader(spark, trade_address).load().rdd.getNumPartitions() == 1  # small: one task


def plan_text(df) -> str:
    return df._jdf.queryExecution().executedPlan().toString()  # noqa: SLF001 - the plan has no Python API


def test_partition_filters_give_exact_counts_with_spark_filtering_the_rows(spark, trade_address):
    cases = {
        "Date = '2026-11-23'": 7_000,
        "Date IN ('2026-11-23', '2030-01-01')": 7_000,
        "Date > '2026-11-22'": 7_000,
        "Date >= '2026-11-22'": TOTAL,
        "Date < '2026-11-23'": 50_000,
        "Date <= '2026-11-22'": 50_000,
        "Date <> '2026-11-22'": 7_000,
        "Date = '2030-01-01'": 0,
    }
    for pushdown in ("true", "false"):
        spark.conf.set("spark.sql.python.filterPushdown.enabled", pushdown)
        try:
            for cond, n in cases.items():
                df = reader(spark, trade_address).load().where(cond)
                assert df.count() == n, (pushdown, cond)
                assert " Filter " in plan_text(df), (pushdown, cond)  # Spark filters: no plan to reuse wrongly
        finally:
            spark.conf.unset("spark.sql.python.filterPushdown.enabled")
    mixed = reader(spark, trade_address).load().where("Date = '2026-11-22' AND Size % 2 = 0 AND Sym = 'AAPL'")
    assert mixed.count() == sum(1 for i in range(50_000) if i % 2 == 0 and i % 5 == 0 and i % 7 != 3)


def test_pruning_by_the_partitions_option(spark, trade_address):
    df = reader(spark, trade_address, partitions="2026-11-23,2030-01-01").load()
    assert df.count() == 7_000
    assert {r.Date for r in df.select("Date").distinct().collect()} == {"2026-11-23"}


def test_a_plain_session_without_pushdown_still_works(spark, trade_address):
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")
    try:
        df = reader(spark, trade_address).load().where("Date = '2026-11-23'")
        assert df.count() == 7_000
        assert "Filter (" in plan_text(df)  # Spark filters; nothing failed at planning
        assert reader(spark, trade_address, partitions="2026-11-23").load().count() == 7_000
    finally:
        spark.conf.unset("spark.sql.python.filterPushdown.enabled")


def test_column_pruning_by_option_and_by_schema(spark, trade_address):
    df = reader(spark, trade_address, columns="Size,Date").load()
    assert df.columns == ["Size", "Date"]
    assert df.agg(F.sum("Size")).collect()[0][0] == TOTAL * (TOTAL - 1) // 2
    df = reader(spark, trade_address).schema("size long, SYM string").load()
    assert df.dtypes == [("size", "bigint"), ("SYM", "string")]
    got = df.orderBy("size").limit(4).collect()
    assert [tuple(r) for r in got] == [(0, "AAPL"), (1, "MSFT"), (2, "IBM"), (3, None)]
    assert reader(spark, trade_address, columns="Date").load().count() == TOTAL


def test_errors_name_the_cause(spark, trade_address, dis_reader):
    cases = [
        (lambda: reader(spark, "127.0.0.1:1", retrySeconds="0").load(), "DIS at 127.0.0.1:1 is unreachable"),
        (lambda: reader(spark, trade_address, retrySeconds="soon").load(), "option 'retrySeconds' must be seconds"),
        (lambda: reader(spark, trade_address).option("table", "Nope").load(), "unknown table Market.Nope"),
        (lambda: reader(spark, trade_address, colums="Sym").load(), "unknown option 'colums'"),
        (lambda: reader(spark, trade_address, columns="Sym,Nope").load(), "has no column 'Nope'"),
        (lambda: reader(spark, trade_address).schema("Nope string").load().collect(), "is not a column"),
        (lambda: spark.read.format("dis").option("table", "Market.Trade").load(), "option 'address'"),
        (lambda: reader(spark, "127.0.0.1:1", retrySeconds="1").load(), "(tried for 1 s)"),
    ]
    for run, words in cases:
        with pytest.raises(Exception) as e:
            run()
        assert "DisSourceError: dis source:" in str(e.value) and words in str(e.value), str(e.value)[:2000]


def test_a_scan_is_fixed_when_planned_and_a_new_load_sees_new_rows(spark, fresh_dis):
    srv, feeder = fresh_dis
    address = f"127.0.0.1:{srv.port}"
    key = LocationKey("Market", "Trade", "feed1", "2026-11-22")
    feeder.append(key, trade_rows(0, 1000))
    assert reader(spark, address).load().count() == 1000
    feeder.append(key, trade_rows(1000, 500))
    feeder.append(LocationKey("Market", "Trade", "feed9", "2026-11-24"), trade_rows(1500, 10))
    df = reader(spark, address).load()
    assert df.count() == 1510
    assert rows_of(df.select("Size"), "Size") == [(i,) for i in range(1510)]


def test_all_column_types(spark, tmp_path):
    schemas = tmp_path / "schemas"
    shutil.copytree(SCHEMAS, schemas)
    (schemas / "Test.AllTypes.yaml").write_text(
        "namespace: Test\ntable: AllTypes\npartition_column: Day\ncolumns:\n"
        + "".join(f"  - {{name: {n}, type: {n.lower()}}}\n" for n in
                  ["Bool", "Byte", "Short", "Int", "Long", "Float", "Double", "Char", "String", "Timestamp"]))
    srv = start_dis_server(tmp_path / "db", schemas=schemas)
    try:
        t = all_types_table(3000)
        Feeder(srv).append(LocationKey("Test", "AllTypes", "p", "2026-11-22"), t)
        df = (spark.read.format("dis").option("address", f"127.0.0.1:{srv.port}")
              .option("table", "Test.AllTypes").load())
        assert df.dtypes == [("Bool", "boolean"), ("Byte", "tinyint"), ("Short", "smallint"), ("Int", "int"),
                             ("Long", "bigint"), ("Float", "float"), ("Double", "double"), ("Char", "string"),
                             ("String", "string"), ("Timestamp", "timestamp"), ("Day", "string")]
        got = df.toArrow()
        for name in ["Bool", "Byte", "Short", "Int", "Long", "Float", "Double", "String"]:
            assert got.column(name).to_pylist() == t.column(name).to_pylist(), name
        assert got.column("Char").to_pylist() == [None if c is None else chr(c) for c in t.column("Char").to_pylist()]
        ns = t.column("Timestamp").cast(pa.int64()).to_pylist()
        assert got.column("Timestamp").cast(pa.int64()).to_pylist() == [None if v is None else v // 1000 for v in ns]
        assert got.column("Timestamp").null_count == t.column("Timestamp").null_count == 600
        assert set(got.column("Day").to_pylist()) == {"2026-11-22"}
    finally:
        srv.stop(0.5)


def test_sharded_dis_reads_each_table_from_its_owner(spark, tmp_path):
    a = start_dis_server(tmp_path / "a")
    b = start_dis_server(tmp_path / "b")
    try:
        routing = tmp_path / "routing.yaml"
        routing.write_text(
            "instances:\n"
            f"  - {{name: dis-a, address: 127.0.0.1:{a.port}, tables: [\"Market.Quote\"]}}\n"
            f"  - {{name: dis-b, address: 127.0.0.1:{b.port}, tables: [\"*\"]}}\n")
        Feeder(b).append(LocationKey("Market", "Trade", "feed1", "2026-11-22"), trade_rows(0, 300))
        # a stray Trade location on dis-a, which does not own Market.Trade: never read
        Feeder(a).append(LocationKey("Market", "Trade", "stray", "2026-11-22"), trade_rows(0, 7))
        quotes = pa.table({"Sym": ["A", "B"], "Exchange": pa.array([ord("N"), ord("Q")], pa.uint16()),
                           "Bid": [1.0, 2.0]})
        Feeder(a).append(LocationKey("Market", "Quote", "q", "2026-11-22"), quotes)
        trade = (spark.read.format("dis").option("routing", str(routing))
                 .option("namespace", "Market").option("table", "Trade").load())
        assert trade.count() == 300
        q = (spark.read.format("dis").option("routing", str(routing)).option("table", "Market.Quote")
             .load().orderBy("Sym").select("Sym", "Exchange", "Bid", "Halted").collect())
        assert [tuple(r) for r in q] == [("A", "N", 1.0, None), ("B", "Q", 2.0, None)]
    finally:
        a.stop(0.5)
        b.stop(0.5)


def test_reusing_a_dataframe_after_a_pruned_query(spark, trade_address):
    for pushdown in ("true", "false"):
        spark.conf.set("spark.sql.python.filterPushdown.enabled", pushdown)
        try:
            df = reader(spark, trade_address).load()
            assert df.where("Date = '2026-11-23'").count() == 7_000
            assert df.count() == TOTAL, pushdown
            assert df.where("Date = '2026-11-22'").count() == 50_000
            assert df.count() == TOTAL, pushdown
        finally:
            spark.conf.unset("spark.sql.python.filterPushdown.enabled")


def test_token_protected_dis(spark, tmp_path):
    token = tmp_path / "token"
    token.write_text("t0ken-for-tests\n")
    srv = start_dis_server(tmp_path / "db", token_file=str(token))
    try:
        Feeder(srv).append(LocationKey("Market", "Trade", "feed1", "2026-11-22"), trade_rows(0, 100))
        address = f"127.0.0.1:{srv.port}"
        assert reader(spark, address, tokenFile=str(token)).load().count() == 100
        assert reader(spark, address, token="t0ken-for-tests", columns="Size").load().count() == 100
        with pytest.raises(Exception) as e:
            reader(spark, address, token="wrong").load()
        assert "refused the credentials" in str(e.value) and "'token'" in str(e.value)
    finally:
        srv.stop(0.5)


def test_db_root_reads_the_column_files_directly(spark, trade_dis, trade_address):
    from prometheus_client import REGISTRY

    db_root = trade_dis.config.db_root
    expected = rows_of(reader(spark, trade_address).load())
    served = REGISTRY.get_sample_value("dis_block_reads_total")
    assert served is not None and served > 0
    got = rows_of(reader(spark, trade_address, dbRoot=db_root).load())
    assert got == expected and len(got) == TOTAL
    # planned through the DIS, but not one block was fetched from it
    assert REGISTRY.get_sample_value("dis_block_reads_total") == served
    one = reader(spark, trade_address, dbRoot=db_root, columns="Sym,Date").load()
    assert one.where("Date = '2026-11-23'").count() == 7_000
    assert one.where("Sym IS NULL").count() == reader(spark, trade_address).load().where("Sym IS NULL").count() > 0


def test_db_root_errors_name_the_cause(spark, trade_address, tmp_path):
    with pytest.raises(Exception) as e:
        reader(spark, trade_address, dbRoot=str(tmp_path)).load()
    assert "option 'dbRoot'" in str(e.value) and "not a DIS database root" in str(e.value)
    (tmp_path / "Intraday").mkdir()  # a database root, but not this DIS's: its files are elsewhere
    with pytest.raises(Exception) as e:
        reader(spark, trade_address, dbRoot=str(tmp_path)).load().count()
    assert "option 'dbRoot': cannot open" in str(e.value), str(e.value)[:2000]
