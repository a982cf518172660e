"""The ``dis`` Spark source reads through the proxies a routing entry lists, with no other
change, for both readers of ``format("dis")`` (``jvm``: the proxies' block endpoints, port + 1;
``python``: their gRPC), batch and streaming; and ``dis merge --routing`` merges through them.
A DIS stands in for the proxy; the entry's own DIS address is unreachable."""

from __future__ import annotations

import pytest

from spark.conftest import LOCS, TOTAL, pytest_generate_tests, spark, spark_session, trade_address, trade_dis  # noqa: F401
from support.sinks import stream_sizes

from .readers_support import check_merge, dead_address, proxied_routing

pytestmark = pytest.mark.spark


def scan(spark, routing, **opts):  # noqa: F811 - the session fixture's name
    r = spark.read.format("dis").option("routing", str(routing)).option("table", "Market.Trade") \
        .option("retrySeconds", "0")
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


def test_a_batch_scan_reads_through_the_proxy(spark, trade_address, tmp_path):  # noqa: F811 - spark.conftest's fixtures
    routing = proxied_routing(tmp_path / "routing.yaml", dead_address(), [trade_address])
    df = scan(spark, routing, minPartitions="3")
    row = df.selectExpr("count(*) AS n", "sum(CAST(Size AS BIGINT)) AS s", "count(Sym) AS syms").collect()[0]
    assert row["n"] == TOTAL and row["s"] == TOTAL * (TOTAL - 1) // 2
    assert row["syms"] == TOTAL - len(range(0, TOTAL, 7))  # every 7th row's Sym is null
    assert scan(spark, routing, partitions="2026-11-23").count() == 7_000


def test_two_proxies_one_down_the_scan_fails_over(spark, trade_address, tmp_path):  # noqa: F811 - spark.conftest's fixtures
    routing = proxied_routing(tmp_path / "routing.yaml", dead_address(), [dead_address(), trade_address])
    assert scan(spark, routing, minPartitions="2").selectExpr("count(*)").collect()[0][0] == TOTAL


def test_a_stream_reads_through_the_proxy(spark, trade_address, tmp_path):  # noqa: F811 - spark.conftest's fixtures
    routing = proxied_routing(tmp_path / "routing.yaml", dead_address(), [trade_address])
    df = (spark.readStream.format("dis").option("routing", str(routing)).option("table", "Market.Trade")
          .option("retrySeconds", "0").load())
    assert stream_sizes(df, tmp_path / "ckpt").tolist() == list(range(TOTAL))


def test_a_merge_reads_through_the_proxy(spark, trade_address, tmp_path):  # noqa: F811 - spark.conftest's fixtures
    """``dis merge`` snapshots the partition (listing and Status) and reads its rows through the
    proxy; the merged rows are the DIS's."""
    routing = proxied_routing(tmp_path / "routing.yaml", dead_address(), [trade_address])
    day = "2026-11-22"
    want = sum(n for k, (_, n) in LOCS.items() if k.column_partition == day)
    check_merge(spark, routing, day, want, tmp_path / "hist")
