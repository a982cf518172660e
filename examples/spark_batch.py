"""A batch Spark job over a live DIS: per-symbol trade statistics for one day.

    .venv/bin/pip install -e ".[spark]"                # PySpark (the venv of `make test` has it)
    make jar                                           # the JVM reader's jar (needs a JDK 17)
    .venv/bin/dis serve --config config/dis.yaml &    # a DIS on 127.0.0.1:22021, fed by dis-tailer
    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python examples/spark_batch.py \
        --address 127.0.0.1:22021 --date 2026-11-22 [--explain]

Copy it and change the query.  Notes (docs/spark.md has the rest):
* ``format("dis")`` is the JVM reader when its jar is there; without it (no JDK where the project
  was installed) it is the slower Python reader, with the same rows, and ``disd.spark`` logs a
  warning saying why.  ``--explain`` prints Spark's plan: ``BatchScan dis`` is the JVM reader.
* The JVM reader reads only the columns a query uses (here Timestamp, Sym, Price, Size and the
  partition column Date).  The Python reader reads every column unless
  ``.option("columns", "Sym,Price,Size,Timestamp,Date")`` lists the ones to read.
* ``.option("partitions", "2026-11-22")`` reads only that day's locations, with either reader.
  The JVM reader also skips other days' locations for ``.where("Date = '2026-11-22'")``; the
  Python reader applies such a WHERE to every row of every day.
* The JVM reader computes the partial aggregates of a ``groupBy(...).agg(...)`` of plain columns
  in its tasks (docs/spark.md, "Aggregate pushdown"), but not for a query with a WHERE clause
  (hence the ``partitions`` option) nor one with an aggregate of an expression: the
  ``sum(Price * Size)`` of ``vwap`` leaves this query's aggregation to Spark.  Without ``vwap``,
  ``--explain`` shows ``pushed aggregation [COUNT(*), SUM(Size), MIN(Timestamp), MAX(Timestamp)]
  group by [Date, Sym]``.
* A loaded DataFrame may be queried again: the JVM reader plans each query afresh and sees the
  rows published since; the Python reader keeps the sizes its first query listed (call ``load()``
  again to see newer rows).
"""

from __future__ import annotations

import argparse

from pyspark.sql import functions as F

import disd.spark


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--address", default="127.0.0.1:22021", help="host:port of a DIS")
    where.add_argument("--routing", help="routing YAML of a sharded DIS (instead of --address)")
    ap.add_argument("--namespace", default="Market")
    ap.add_argument("--table", default="Trade")
    ap.add_argument("--date", help="one column partition (e.g. 2026-11-22); default: every day")
    ap.add_argument("--explain", action="store_true", help="print Spark's plan of the query first")
    args = ap.parse_args()

    spark = disd.spark.session(app_name="dis-batch-example")
    disd.spark.register(spark)  # session() already did; needed for a session you build yourself

    reader = spark.read.format("dis").option("namespace", args.namespace).option("table", args.table)
    reader = reader.option("routing", args.routing) if args.routing else reader.option("address", args.address)
    if args.date:
        reader = reader.option("partitions", args.date)  # other days' locations are never read
    trades = reader.load()

    stats = (trades.groupBy("Date", "Sym")
             .agg(F.count("*").alias("trades"),
                  F.sum("Size").alias("volume"),
                  (F.sum(F.col("Price") * F.col("Size")) / F.sum("Size")).alias("vwap"),
                  F.min("Timestamp").alias("first"),
                  F.max("Timestamp").alias("last"))
             .orderBy("Date", F.desc("volume")))
    if args.explain:
        stats.explain()
    stats.show(50, truncate=False)
    spark.stop()


if __name__ == "__main__":
    main()
