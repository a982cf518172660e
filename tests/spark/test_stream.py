"""``spark.readStream.format("dis")``: offsets, admission control, restarts, and a live pipeline.

The reader's own contract is checked first without Spark (fast); then real streaming queries:
Trigger.AvailableNow with maxRowsPerTrigger and a restart from the checkpoint, and a query that
runs while the logger keeps writing through the real tailer and DIS daemons.
"""

from __future__ import annotations

import pickle
import threading
import time

import numpy as np
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from disd.binlog import LocationKey
from disd.spark.options import parse_options
from disd.spark.read import read_partition
from disd.spark.source import DisDataSource, DisStreamReader
from support import (ROOT, free_port_pair, start_dis_process, start_tailer, trade_rows, wait_for, write_dis_config,
                     write_tailer_config)
from support.sinks import SizeSink


K1 = LocationKey("Market", "Trade", "feed1", "2026-11-22")
K2 = LocationKey("Market", "Trade", "feed2", "2026-11-23")


def stream_reader(address, **opts) -> DisStreamReader:
    o = {"address": address, "namespace": "Market", "table": "Trade", **opts}
    return DisStreamReader(parse_options(o), DisDataSource(o).schema())


def read_sizes(r: DisStreamReader, start: dict, end: dict) -> list[int]:
    out = []
    for p in r.partitions(start, end):
        p = pickle.loads(pickle.dumps(p))  # as a task gets it
        for b in read_partition(p):
            out += b.column("Size").to_pylist()
    return sorted(out)


def test_offsets_are_row_counts_and_batches_are_exact(fresh_dis):
    srv, feeder = fresh_dis
    r = stream_reader(f"127.0.0.1:{srv.port}", maxRowsPerTrigger="700")
    assert r.initialOffset() == {}
    assert r.getDefaultReadLimit() == ReadMaxRows(700)
    assert r.latestOffset({}, ReadMaxRows(700)) == {}
    feeder.append(K1, trade_rows(0, 1000))
    o1 = r.latestOffset({}, ReadMaxRows(700))
    assert o1 == {"feed1/2026-11-22": 700}
    assert read_sizes(r, {}, o1) == list(range(700))
    feeder.append(K2, trade_rows(1000, 400))  # a new location appears
    o2 = r.latestOffset(o1, ReadMaxRows(700))
    assert o2 == {"feed1/2026-11-22": 1000, "feed2/2026-11-23": 400}
    assert read_sizes(r, o1, o2) == list(range(700, 1400))
    assert r.latestOffset(o2, ReadMaxRows(700)) is o2  # nothing new: the same offset
    # a restart with the same offsets reads the same rows (plans are a function of the offsets)
    r2 = stream_reader(f"127.0.0.1:{srv.port}")
    assert read_sizes(r2, o1, o2) == list(range(700, 1400))
    assert r2.partitions(o2, o2) == []
    assert r2.initialOffset() == {}
    assert stream_reader(f"127.0.0.1:{srv.port}", startingOffsets="latest").initialOffset() == o2
    assert pickle.loads(pickle.dumps(r))._client is None  # never a channel in a pickle  # noqa: SLF001 - the test checks the pickled reader holds no channel
    r.stop()


def test_available_now_stops_at_the_target(fresh_dis):
    srv, feeder = fresh_dis
    feeder.append(K1, trade_rows(0, 100))
    r = stream_reader(f"127.0.0.1:{srv.port}")
    r.prepareForTriggerAvailableNow()
    feeder.append(K1, trade_rows(100, 50))
    feeder.append(K2, trade_rows(150, 50))
    end = r.latestOffset({}, ReadMaxRows(60))
    assert end == {"feed1/2026-11-22": 60}
    end = r.latestOffset(end, ReadAllAvailable())
    assert end == {"feed1/2026-11-22": 100}
    assert r.latestOffset(end, ReadAllAvailable()) is end


def test_partition_option_limits_the_stream(fresh_dis):
    srv, feeder = fresh_dis
    feeder.append(K1, trade_rows(0, 10))
    feeder.append(K2, trade_rows(10, 10))
    r = stream_reader(f"127.0.0.1:{srv.port}", partitions="2026-11-23")
    assert r.latestOffset({}, ReadAllAvailable()) == {"feed2/2026-11-23": 10}


# -- real streaming queries ---------------------------------------------------------------------
def sink_sizes(spark, path) -> list[int]:
    return sorted(r.Size for r in spark.read.parquet(str(path)).select("Size").collect())


@pytest.mark.spark
def test_available_now_with_max_rows_and_restart_from_checkpoint(spark, fresh_dis, tmp_path):
    srv, feeder = fresh_dis
    address = f"127.0.0.1:{srv.port}"
    feeder.append(K1, trade_rows(0, 2500))
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"

    def run() -> list:
        df = (spark.readStream.format("dis").option("address", address).option("table", "Market.Trade")
              .option("maxRowsPerTrigger", "1000").load())
        q = (df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(ckpt))
             .trigger(availableNow=True).start())
        q.awaitTermination(120)
        assert q.exception() is None, q.exception()
        return [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]

    assert run() == [1000, 1000, 500]
    assert sink_sizes(spark, out) == list(range(2500))
    feeder.append(K1, trade_rows(2500, 300))
    feeder.append(K2, trade_rows(2800, 200))
    batches = run()  # restarted from the checkpoint: only the new rows
    assert sum(batches) == 500 and max(batches) <= 1000
    assert sink_sizes(spark, out) == list(range(3000))
    assert run() == []


@pytest.mark.spark
@pytest.mark.slow
def test_streaming_query_receives_exactly_the_rows_logged_while_logging(spark, tmp_path):
    """Logger -> binary logs -> dis-tailer -> dis serve -> Spark streaming query, all live."""
    from disd.logger import IntradayLoggerBuilder

    port = free_port_pair()
    logs = tmp_path / "logs"
    logs.mkdir()
    dis = start_dis_process(tmp_path, write_dis_config(tmp_path, port))
    tailer = start_tailer(tmp_path, write_tailer_config(tmp_path, port, logs))
    loggers = [
        (IntradayLoggerBuilder(str(ROOT / "config" / "schemas" / "Market.Trade.yaml")).set_process_name("feed")
         .set_log_dir(str(logs)).set_namespace_set("System").set_column_partition_value(day)
         .set_internal_partition(ip).build())
        for ip, day in (("feed1", "2026-11-22"), ("feed2", "2026-11-23"))
    ]
    logged: list[int] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        try:
            n = 0
            for i in range(60):
                rows = trade_rows(n, 200 + 37 * (i % 5))
                loggers[i % 2].log_batch(rows, atomic=True)
                logged.extend(range(n, n + rows.num_rows))
                n += rows.num_rows
                if stop.wait(0.05):
                    break
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    sink = SizeSink()
    writer = threading.Thread(target=write, daemon=True)
    q = None
    try:
        df = (spark.readStream.format("dis").option("address", f"127.0.0.1:{port}")
              .option("table", "Market.Trade").option("maxRowsPerTrigger", "2000").load())
        q = (df.writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(processingTime="300 milliseconds").start())
        writer.start()
        writer.join(120)
        for lg in loggers:
            lg.close()
        assert not errors, errors
        total = len(logged)
        wait_for(lambda: sink.count() >= total, 120, 0.2, f"{total} rows in the sink")
        time.sleep(1.0)  # any duplicate would arrive now
        assert q.exception() is None
        sizes = sink.sizes()
        assert len(sizes) == total  # no duplicates
        assert (sizes == np.arange(total)).all()  # no gaps: every logged row, once
        assert sum(1 for p in q.recentProgress if p["numInputRows"]) >= 2  # arrived over several batches
    finally:
        stop.set()
        if q is not None:
            q.stop()
        tailer.terminate()
        dis.terminate()


@pytest.mark.spark
@pytest.mark.slow
def test_streaming_query_rides_out_a_dis_kill_and_restart(spark_session, tmp_path):
    """A streaming query of the Python reader over a live table keeps going while its DIS is
    killed with -9 and restarted (and while it is down), and reads every logged row exactly once.
    (The JVM reader's stream across a restart: tests/spark/test_jvm.py.)"""
    spark = spark_session
    from disd.logger import IntradayLoggerBuilder

    from support import start_tailer, wait_for, write_dis_config, write_tailer_config
    from support import start_dis_process as start_dis

    port = free_port_pair()
    logs = tmp_path / "logs"
    logs.mkdir()
    cfg = write_dis_config(tmp_path, port)
    procs = [start_dis(tmp_path, cfg)]
    tailer = start_tailer(tmp_path, write_tailer_config(tmp_path, port, logs))
    logger = (IntradayLoggerBuilder(str(ROOT / "config" / "schemas" / "Market.Trade.yaml")).set_process_name("feed")
              .set_log_dir(str(logs)).set_column_partition_value("2026-11-22").set_internal_partition("feed1")
              .build())
    sink = SizeSink()
    q = None
    n = 0
    try:
        df = (spark.readStream.format("dis").option("reader", "python").option("address", f"127.0.0.1:{port}")
              .option("table", "Market.Trade").option("maxRowsPerTrigger", "3000").load())
        q = (df.writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(processingTime="200 milliseconds").start())
        for rnd in range(3):
            for _ in range(10):
                rows = trade_rows(n, 500)
                logger.log_batch(rows, atomic=True)
                n += rows.num_rows
                time.sleep(0.05)
            logger.flush()
            wait_for(lambda: sink.count() > n // 2, 60, 0.1, "the query reading")
            procs[-1].kill9()  # published rows not yet checkpointed are lost until the tailer resends them
            time.sleep(1.5)    # the query keeps asking a DIS that is down
            assert q.isActive and q.exception() is None
            procs.append(start_dis(tmp_path, cfg))
        logger.close()
        wait_for(lambda: sink.count() >= n, 120, 0.2, f"{n} rows in the sink")
        time.sleep(1.0)  # any duplicate would arrive now
        assert q.exception() is None
        sizes = sink.sizes()
        assert len(sizes) == n  # no duplicates
        assert (sizes == np.arange(n)).all()  # no gaps
    finally:
        if q is not None:
            q.stop()
        tailer.terminate()
        for p in procs:
            if p.alive():
                p.terminate()
