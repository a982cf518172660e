"""The Python ``dis`` Spark source over a replica set: a batch scan with a replica killed (-9)
while its tasks run returns the exact count and sum, and a streaming query keeps going across a
replica's kill with every row exactly once.  Real ``dis serve`` and ``dis-tailer`` processes."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from disd.client import connect
from support import trade_rows, wait_for
from spark.conftest import spark_session  # noqa: F401 - the shared local session
from support.sinks import SizeSink

from .readers_support import logger, published, replica_set, write_logs

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture
def spark(spark_session):  # noqa: F811 - the run's one local session (tests/spark/conftest.py)
    return spark_session


def test_a_batch_scan_with_a_replica_killed_during_it_is_exact(spark, tmp_path):
    rs = replica_set(tmp_path)
    try:
        total = write_logs(rs.logs, 8, 2000)
        for r in rs.replicas:
            wait_for(lambda r=r: published(r.address) == total, 60, 0.1, f"{total} rows at {r.name}")
        with connect(routing=str(rs.routing)) as c:
            listed = [s.address for s in c.locations("Market", "Trade")]
        victim = rs.by_address(max(set(listed), key=listed.count))  # the replica most slices read from
        marker = tmp_path / "killed"
        pid = victim.proc.p.pid

        def kill_in_first_task(batches):
            # The first task to run kills the replica; the scan's other tasks (8 input
            # partitions, 2 at a time) read after it, their slices listed at the dead replica.
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.close(fd)
                os.kill(pid, signal.SIGKILL)
            yield from batches

        df = (spark.read.format("dis").option("reader", "python").option("routing", str(rs.routing))
              .option("table", "Market.Trade").option("minPartitions", "8").option("retrySeconds", "30").load())
        df = df.select("Size").mapInArrow(kill_in_first_task, "Size int")
        t0 = time.monotonic()
        row = df.selectExpr("count(*) AS n", "sum(CAST(Size AS BIGINT)) AS s").collect()[0]
        assert marker.exists()
        victim.proc.p.wait(10)
        assert not victim.proc.alive()
        assert row["n"] == total and row["s"] == total * (total - 1) // 2
        assert time.monotonic() - t0 < 60
    finally:
        rs.stop()


def test_a_stream_keeps_going_across_a_replica_kill(spark, tmp_path):
    rs = replica_set(tmp_path)
    lg = logger(rs.logs, "feed1", "2026-11-22")
    sink = SizeSink()
    q = None
    n = 0
    try:
        df = (spark.readStream.format("dis").option("reader", "python").option("routing", str(rs.routing))
              .option("table", "Market.Trade").option("maxRowsPerTrigger", "3000").option("retrySeconds", "60")
              .load())
        q = (df.writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(processingTime="200 milliseconds").start())
        for rnd in range(2):
            for _ in range(10):
                lg.log_batch(trade_rows(n, 500), atomic=True)
                n += 500
                time.sleep(0.05)
            lg.flush()
            wait_for(lambda: sink.count() > n // 2, 90, 0.1, "the query reading")
            if rnd == 0:
                rs.replicas[0].proc.kill9()  # and the stream reads on from the other
                time.sleep(1.0)
                assert q.isActive and q.exception() is None
        lg.close()
        wait_for(lambda: sink.count() >= n, 120, 0.2, f"{n} rows in the sink")
        time.sleep(1.0)  # any duplicate would arrive now
        assert q.exception() is None
        sizes = sink.sizes()
        assert len(sizes) == n and (sizes == np.arange(n)).all()  # every row, exactly once
    finally:
        if q is not None:
            q.stop()
        rs.stop()
