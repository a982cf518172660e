"""Side by side with what Spark users run today: dis against Structured Streaming's file source.

One program writes the same Market.Trade rows, in the same batches at the same pace (``--rate``
rows/s in ``--batch``-row batches for ``--seconds``), to each contender in turn; each contender
ends in a Spark streaming query (one local session, the fastest trigger: the next micro-batch
starts as soon as the last one ends) whose ``foreachBatch`` notes when each written batch has
become visible:

(a) **dis**: the Python logger writes binary logs; ``dis-tailer`` and ``dis serve`` (separate
    processes, loopback) ingest them; ``spark.readStream.format("dis")`` reads the table.  A row
    is visible when a micro-batch of that query has it: published rows are what every Spark query
    of the table reads.
(b) **Spark's file source**: the program writes each batch as a CSV file (temp name, then an
    atomic rename into the watched directory, as the file source requires);
    ``spark.readStream.csv`` reads them and each micro-batch is appended to a Parquet directory.
    A row is visible when the micro-batch that holds it has been written as Parquet, so that a
    Spark query of that directory reads it.

Each row's ``Size`` is its batch's number, so the query counts every batch's rows; a batch is
visible when all of its rows have been seen.  Per contender: ingest rows/s = rows / (time of the
last batch's visibility - time of the first write), and p50/p99 of each batch's time from its
write to its visibility.  The rows/s cannot exceed the offered rate: a contender that keeps up
shows the rate, one that falls behind shows less, with its latency growing.

Last line: JSON with ``dis_rows_per_s``, ``spark_rows_per_s``, ``dis_p99_visible_ms``,
``spark_p99_visible_ms``.

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python bench/vs_spark_streaming.py [--rate 500000] [--seconds 10]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from _common import TRADE_SCHEMA, emit, trade_table
from e2e_helpers import free_port, start_dis, start_tailer, write_dis_config, write_tailer_config

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


class Visibility:
    """Which written batches a streaming query has seen in full, and when."""

    def __init__(self, batch_rows: int) -> None:
        self.batch_rows = batch_rows
        self.written: dict[int, float] = {}
        self.seen_rows: dict[int, int] = {}
        self.visible: dict[int, float] = {}
        self.lock = threading.Lock()

    def wrote(self, batch: int) -> None:
        with self.lock:
            self.written[batch] = time.perf_counter()

    def saw(self, counts: list[tuple[int, int]], now: float) -> None:
        with self.lock:
            for batch, n in counts:
                self.seen_rows[batch] = self.seen_rows.get(batch, 0) + n
                if self.seen_rows[batch] >= self.batch_rows and batch not in self.visible:
                    self.visible[batch] = now

    def wait_all(self, batches: int, timeout: float) -> bool:
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            with self.lock:
                if len(self.visible) >= batches:
                    return True
            time.sleep(0.01)
        return False

    def figures(self, batches: int) -> tuple[float, float, float]:
        lat = np.array([self.visible[b] - self.written[b] for b in range(batches)]) * 1000
        rows_per_s = batches * self.batch_rows / (max(self.visible.values()) - min(self.written.values()))
        return rows_per_s, float(np.percentile(lat, 50)), float(np.percentile(lat, 99))


def report_progress(name: str, query) -> None:  # noqa: ANN001
    """Where a micro-batch's time goes (Spark's own progress reports, median per phase)."""
    phases: dict[str, list[int]] = {}
    for p in query.recentProgress:
        if p.get("numInputRows", 0) <= 0:
            continue
        for k, v in (p.get("durationMs") or {}).items():
            phases.setdefault(k, []).append(v)
    if phases:
        print(f"{name}: micro-batches with rows: {len(phases.get('triggerExecution', []))}; median ms per phase: "
              + ", ".join(f"{k} {int(np.median(v))}" for k, v in sorted(phases.items())))


def batch_counts(df) -> list[tuple[int, int]]:  # noqa: ANN001 - a micro-batch's DataFrame
    """Rows per written batch in a micro-batch: its ``Size`` column brought over as Arrow (one
    job, no shuffle), counted with numpy."""
    sizes = df.select("Size").toArrow().column(0).to_numpy() + 1  # the warm-up batch is -1
    counts = np.bincount(sizes)
    return [(int(b) - 1, int(counts[b])) for b in np.nonzero(counts)[0]]


def paced(batches: int, period: float, write) -> None:  # noqa: ANN001
    t0 = time.perf_counter()
    for i in range(batches):
        due = t0 + i * period
        now = time.perf_counter()
        if due > now:
            time.sleep(due - now)
        write(i)


def numbered(base: pa.Table, batch: int) -> pa.Table:
    return base.set_column(3, "Size", pa.array(np.full(base.num_rows, batch, np.int32)))


def run_dis(spark, work: pathlib.Path, base: pa.Table, batches: int, period: float, vis: Visibility) -> None:  # noqa: ANN001
    from disd.logger import IntradayLoggerBuilder

    logs = work / "dis-logs"
    logs.mkdir()
    port = free_port()
    procs = [start_dis(work, write_dis_config(work, port))]
    procs.append(start_tailer(work, write_tailer_config(work, port, logs)))
    log = (IntradayLoggerBuilder(str(TRADE_SCHEMA)).set_log_dir(str(logs)).set_internal_partition("vs")
           .set_column_partition_value("2026-11-22").build())
    log.log_batch(numbered(base, -1))  # the location exists before the query starts
    log.flush()

    def each(df, _id) -> None:  # noqa: ANN001
        vis.saw(batch_counts(df), time.perf_counter())

    query = None
    try:
        df = (spark.readStream.format("dis").option("address", f"127.0.0.1:{port}")
              .option("httpAddress", f"127.0.0.1:{port + 1}").option("namespace", "Market")
              .option("table", "Trade").load())
        query = df.writeStream.foreachBatch(each).option("checkpointLocation", str(work / "dis-ckpt")).start()
        time.sleep(2)  # the query's first batch (the warm-up row batch) is behind it

        def write(i: int) -> None:
            log.log_batch(numbered(base, i))
            vis.wrote(i)

        paced(batches, period, write)
        log.close()
        if not vis.wait_all(batches, 120):
            raise SystemExit(f"dis: only {len(vis.visible)} of {batches} batches visible after 120 s")
        report_progress("dis", query)
    finally:
        if query is not None:
            query.stop()
        for p in procs:
            if p.alive():
                p.terminate()


def run_spark_files(spark, work: pathlib.Path, base: pa.Table, batches: int, period: float,  # noqa: ANN001
                    vis: Visibility) -> None:
    incoming = work / "csv"
    staging = work / "csv-staging"
    out = work / "parquet"
    incoming.mkdir()
    staging.mkdir()
    schema = "Timestamp long, Sym string, Price double, Size int"
    plain = base.set_column(0, "Timestamp", base.column("Timestamp").cast(pa.int64()))

    def put(i: int) -> None:
        tmp = staging / f"batch-{i:06d}.csv"
        pacsv.write_csv(numbered(plain, i), tmp)
        os.rename(tmp, incoming / tmp.name)

    def each(df, _id) -> None:  # noqa: ANN001
        df.persist()
        df.write.mode("append").parquet(str(out))
        counts = batch_counts(df)
        df.unpersist()
        vis.saw(counts, time.perf_counter())

    put(-1)  # the first file, so that the query starts with a batch behind it
    query = None
    try:
        df = spark.readStream.schema(schema).option("header", "true").csv(str(incoming))
        query = df.writeStream.foreachBatch(each).option("checkpointLocation", str(work / "csv-ckpt")).start()
        time.sleep(2)

        def write(i: int) -> None:
            put(i)
            vis.wrote(i)

        paced(batches, period, write)
        if not vis.wait_all(batches, 300):
            raise SystemExit(f"Spark file source: only {len(vis.visible)} of {batches} batches visible after 300 s")
        report_progress("Spark file source", query)
    finally:
        if query is not None:
            query.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=int, default=500_000, help="rows per second written to each contender")
    ap.add_argument("--batch", type=int, default=50_000, help="rows per written batch")
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    batches = int(args.seconds * args.rate / args.batch)
    period = args.batch / args.rate

    import disd.spark

    work = pathlib.Path(tempfile.mkdtemp(prefix="vs-spark-", dir=os.environ.get("BENCH_DIR")))
    spark = disd.spark.session("local[2]", app_name="vs_spark_streaming", conf={
        "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2", "spark.driver.memory": "2g",
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    })
    spark.sparkContext.setLogLevel("ERROR")
    base = trade_table(args.batch, seed=3)
    try:
        dis_vis = Visibility(args.batch)
        run_dis(spark, work, base, batches, period, dis_vis)
        spark_vis = Visibility(args.batch)
        run_spark_files(spark, work, base, batches, period, spark_vis)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)

    d_rows, d_p50, d_p99 = dis_vis.figures(batches)
    s_rows, s_p50, s_p99 = spark_vis.figures(batches)
    print(f"{batches} batches of {args.batch} rows offered at {args.rate / 1e3:.0f} k rows/s to each")
    print(f"dis (logger -> tailer -> DIS -> Spark stream): {d_rows / 1e3:.0f} k rows/s; write -> visible "
          f"p50 {d_p50:.0f} ms, p99 {d_p99:.0f} ms")
    print(f"Spark file source (CSV -> Parquet): {s_rows / 1e3:.0f} k rows/s; write -> visible "
          f"p50 {s_p50:.0f} ms, p99 {s_p99:.0f} ms")
    emit("vs_spark_streaming", d_rows, "rows/s", s_rows, dis_rows_per_s=d_rows, spark_rows_per_s=s_rows,
         dis_p50_visible_ms=d_p50, dis_p99_visible_ms=d_p99, spark_p50_visible_ms=s_p50,
         spark_p99_visible_ms=s_p99, offered_rows_per_s=args.rate, batch_rows=args.batch)


if __name__ == "__main__":
    main()
