"""A batch Spark job over a live DIS: per-symbol trade statistics for one day.

    .venv/bin/pip install -e ".[spark]"                # PySpark (the venv of `make test` has it)
    .venv/bin/dis serve --config config/dis.yaml &    # a DIS on 127.0.0.1:22021, fed by dis-tailer
    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python examples/spark_batch.py \
        --address 127.0.0.1:22021 --date 2026-11-22

Copy it and change the query.  Notes (docs/spark.md has the rest):
* ``.option("partitions", "2026-11-22")`` skips every other day's locations; a WHERE on ``Date``
  gives the same rows but reads every location first (docs/spark.md, Partition pruning).
* ``.option("columns", ...)`` fetches only the listed columns (Spark does not tell Python sources
  which columns a query uses).
* Call ``load()`` for each query: a loaded DataFrame keeps the scan Spark planned first.
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
    args = ap.parse_args()

    spark = disd.spark.session(app_name="dis-batch-example")
    disd.spark.register(spark)  # session() already did; needed for a session you build yourself

    reader = (spark.read.format("dis")
              .option("namespace", args.namespace).option("table", args.table)
              .option("columns", "Sym,Price,Size,Timestamp,Date"))
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
    stats.show(50, truncate=False)
    spark.stop()


if __name__ == "__main__":
    main()
