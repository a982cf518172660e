"""A Kafka-fed table is read like a tailed one: the Spark source (both readers of
``format("dis")``) and ``dis merge`` read its locations, column files and checkpoints."""

from __future__ import annotations

import time

import pyarrow.compute as pc
import pytest
from pyspark.sql import functions as F

from disd.historical.liveness import LivePartitionError
from disd.historical.merge import IntradaySource, MergeRequest, merge
from spark.conftest import spark_session  # noqa: F401 - the run's one local Spark session
from support import free_port_pair, start_dis_process, wait_for

from .test_kafka_exactly_once import produce, read_sizes, write_config

pytestmark = pytest.mark.spark

N = 600  # messages 0..299 on 2026-11-23, 300..599 on 2026-11-24 (tests/kafka/produce.py)
DAYS = [("2026-11-23", N // 2, sum(range(N // 2))), ("2026-11-24", N // 2, sum(range(N // 2, N)))]


def test_spark_and_merge_read_a_kafka_fed_table(tmp_path, mock_kafka, spark_session):  # noqa: F811
    port = free_port_pair()
    cfg = write_config(tmp_path, port, mock_kafka.bootstrap)
    assert produce(mock_kafka.bootstrap, "trades", N, 3, N, 0).wait(30) == 0
    dis = start_dis_process(tmp_path, cfg)
    address = f"127.0.0.1:{port}"
    try:
        wait_for(lambda: len(read_sizes(port)) == N, 30, 0.2, "the messages in the table")
        for reader in ("jvm", "python"):
            df = (spark_session.read.format("dis").option("reader", reader).option("address", address)
                  .option("table", "Market.Trade").load())
            got = df.groupBy("Date").agg(F.count("*"), F.sum("Size")).orderBy("Date").collect()
            assert [tuple(r) for r in got] == DAYS, reader
            # the locations are the Kafka partitions': one internal partition each, per date
            assert df.select("Size").where(F.col("Size") == 301).count() == 1, reader

        hist = tmp_path / "historical"
        request = MergeRequest("Market", "Trade", DAYS[0][0], str(hist), IntradaySource(address=address))
        deadline = time.monotonic() + 20
        while True:  # the finished day: live only until its checkpoint (checkpoint_ms 200) holds every row
            try:
                result = merge(spark_session, request)
                break
            except LivePartitionError:
                assert time.monotonic() < deadline, "2026-11-23 still live 20 s after its last message"
                time.sleep(0.5)
        assert (result.status, result.rows) == ("merged", DAYS[0][1])
        merged = (spark_session.read.format("dis").option("source", "historical").option("dbRoot", str(hist))
                  .option("table", "Market.Trade").load().toArrow())
        assert merged.num_rows == DAYS[0][1]
        assert pc.sum(merged.column("Size")).as_py() == DAYS[0][2]
        assert sorted(merged.column("Size").to_pylist()) == list(range(N // 2))
    finally:
        dis.terminate()
