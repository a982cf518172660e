"""Readers going through a real ``dis proxy`` by routing alone: one routing file lists the DIS and
the proxy, the proxy reads the DIS from it (its members) and the readers read the proxy (its
``proxies``).  The client, both Spark readers (``jvm``: the proxy's block endpoint; ``python``:
its gRPC), batch and streaming, and ``dis merge`` get the DIS's rows, and the proxy's metrics
show the reads went through it (upstream once, then from its cache).  A proxy restart is a pause
for the client; two proxies of an entry fail over as replicas do."""

from __future__ import annotations

import threading
import time

import pytest

from disd.binlog import LocationKey
from disd.client import connect
from spark.conftest import pytest_generate_tests, spark, spark_session  # noqa: F401 - the shared session
from support import free_port_pair, loaded_dis, sample, scrape
from support.sinks import stream_sizes

from .readers_support import check_merge, proxied_routing, start_proxy

LOCS = {
    LocationKey("Market", "Trade", "feed1", "2026-11-20"): (0, 20_000),
    LocationKey("Market", "Trade", "feed2", "2026-11-20"): (20_000, 5_000),
    LocationKey("Market", "Trade", "feed1", "2026-11-21"): (25_000, 7_000),
}
TOTAL = 32_000


class Front:
    def __init__(self, dis: str, routing, proc, metrics_port: int, address: str) -> None:
        self.dis, self.routing, self.proc, self.metrics_port, self.address = dis, routing, proc, metrics_port, address

    def metric(self, name: str) -> float:
        return sample(scrape(self.metrics_port), name)


@pytest.fixture(scope="module")
def front(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("proxy-e2e")
    srv = loaded_dis(tmp / "db", LOCS)
    dis = f"127.0.0.1:{srv.port}"
    port = free_port_pair()
    routing = proxied_routing(tmp / "routing.yaml", dis, [f"127.0.0.1:{port}"])
    try:
        proc, port, metrics_port = start_proxy(tmp / "proxy", routing, port)
    except BaseException:
        srv.stop(0.5)
        raise
    yield Front(dis, routing, proc, metrics_port, f"127.0.0.1:{port}")
    proc.terminate()
    srv.stop(0.5)


def test_the_client_reads_the_dis_rows_through_the_proxy(front):
    with connect(front.dis, retry_s=0) as direct:
        want = direct.read_table("Market", "Trade").sort_by("Size")
    with connect(routing=str(front.routing), retry_s=0) as c:
        assert {s.address for s in c.locations("Market", "Trade")} == {front.address}
        got = c.read_table("Market", "Trade").sort_by("Size")
        assert got.equals(want) and got.num_rows == TOTAL
        upstream = front.metric("dis_proxy_upstream_bytes_total")
        hits = front.metric("dis_proxy_cache_hits_total")
        assert upstream > 0
        again = c.read_table("Market", "Trade").sort_by("Size")  # from the proxy's cache
        assert again.equals(want)
        assert front.metric("dis_proxy_upstream_bytes_total") == upstream
        assert front.metric("dis_proxy_cache_hits_total") > hits
        sub = c.subscribe("Market", "Trade")
        assert {next(sub).key for _ in LOCS} == set(LOCS)
        sub.close()
    assert front.metric("dis_proxy_upstream_subscriptions") == 1  # Market.Trade, once


def test_spark_scans_through_the_proxy(spark, front):  # noqa: F811 - spark.conftest's fixtures
    served = front.metric("dis_proxy_cache_hits_total") + front.metric("dis_proxy_cache_misses_total")
    df = (spark.read.format("dis").option("routing", str(front.routing)).option("table", "Market.Trade")
          .option("retrySeconds", "0").option("minPartitions", "3").load())
    row = df.selectExpr("count(*) AS n", "sum(CAST(Size AS BIGINT)) AS s", "count(Sym) AS syms").collect()[0]
    assert row["n"] == TOTAL and row["s"] == TOTAL * (TOTAL - 1) // 2
    with connect(front.dis, retry_s=0) as direct:
        assert row["syms"] == direct.read_table("Market", "Trade", columns=["Sym"]).column("Sym").null_count * -1 + TOTAL
    assert front.metric("dis_proxy_cache_hits_total") + front.metric("dis_proxy_cache_misses_total") > served


def test_dis_merge_reads_through_the_proxy(spark, front, tmp_path):  # noqa: F811 - spark.conftest's fixtures
    day = "2026-11-20"
    want = sum(n for k, (_, n) in LOCS.items() if k.column_partition == day)
    check_merge(spark, front.routing, day, want, tmp_path / "hist")


def test_the_client_rides_out_a_proxy_restart(front, tmp_path):
    """A proxy killed (-9) and started again on its port is a pause for a reader, not an error:
    the client retries through it (``retry_s``) and reads the same rows, from a cold cache."""
    port = free_port_pair()
    routing = proxied_routing(tmp_path / "routing.yaml", front.dis, [f"127.0.0.1:{port}"])
    proc, _, _ = start_proxy(tmp_path / "proxy", routing, port)
    restarted = []
    try:
        with connect(routing=str(routing), retry_s=30) as c:
            want = c.read_table("Market", "Trade", columns=["Size"]).column("Size").to_pylist()
            proc.kill9()

            def restart():
                time.sleep(1.0)
                restarted.append(start_proxy(tmp_path / "proxy", routing, port)[0])

            t = threading.Thread(target=restart, daemon=True)
            t.start()
            t0 = time.monotonic()
            got = c.read_table("Market", "Trade", columns=["Size"]).column("Size").to_pylist()
            waited = time.monotonic() - t0
            t.join(60)
        assert sorted(got) == sorted(want) == list(range(TOTAL))
        assert waited >= 0.9  # it did wait for the restart
    finally:
        for p in [proc, *restarted]:
            if p.alive():
                p.terminate()


def test_spark_fails_over_between_two_proxies(spark, front, tmp_path):  # noqa: F811 - spark.conftest's fixtures
    """Two proxies of one entry are a replica set to both Spark readers: with one killed (-9)
    the scan reads everything through the other."""
    ports = [free_port_pair(), free_port_pair()]
    routing = proxied_routing(tmp_path / "routing.yaml", front.dis, [f"127.0.0.1:{p}" for p in ports])
    procs = [start_proxy(tmp_path / f"proxy{i}", routing, p)[0] for i, p in enumerate(ports)]
    try:
        procs[0].kill9()
        df = (spark.read.format("dis").option("routing", str(routing)).option("table", "Market.Trade")
              .option("retrySeconds", "10").option("minPartitions", "3").load())
        row = df.selectExpr("count(*) AS n", "sum(CAST(Size AS BIGINT)) AS s").collect()[0]
        assert row["n"] == TOTAL and row["s"] == TOTAL * (TOTAL - 1) // 2
    finally:
        for p in procs:
            if p.alive():
                p.terminate()


def test_a_stream_reads_through_the_proxy(spark, front, tmp_path):  # noqa: F811 - spark.conftest's fixtures
    df = (spark.readStream.format("dis").option("routing", str(front.routing)).option("table", "Market.Trade")
          .option("retrySeconds", "0").option("maxRowsPerTrigger", "10000").load())
    assert stream_sizes(df, tmp_path / "ckpt").tolist() == list(range(TOTAL))
