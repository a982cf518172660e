"""A streaming Spark job over a live DIS: per-minute trade volume, written as Parquet.

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python examples/spark_stream.py \
        --address 127.0.0.1:22021 --out var/volume --checkpoint var/volume-ckpt [--available-now]

Each micro-batch reads exactly the rows published since the previous one (offsets are the
published row count of every location), at most ``--max-rows`` rows per batch.  Stop it and start
it again with the same ``--checkpoint``: it goes on where it stopped, no row twice, none missed.
``--available-now`` processes what is published now (in batches of ``--max-rows``) and exits.
"""

from __future__ import annotations

import argparse

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import disd.spark


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--address", default="127.0.0.1:22021")
    ap.add_argument("--table", default="Market.Trade")
    ap.add_argument("--out", default="var/spark/volume")
    ap.add_argument("--checkpoint", default="var/spark/volume-checkpoint")
    ap.add_argument("--max-rows", default="1000000", help="maxRowsPerTrigger")
    ap.add_argument("--available-now", action="store_true")
    args = ap.parse_args()

    spark = disd.spark.session(app_name="dis-stream-example")
    trades = (spark.readStream.format("dis")
              .option("address", args.address).option("table", args.table)
              .option("columns", "Timestamp,Sym,Size,Date")
              .option("maxRowsPerTrigger", args.max_rows)
              .option("startingOffsets", "earliest")  # or "latest": only rows published from now on
              .load())

    def write(batch: DataFrame, batch_id: int) -> None:
        # Aggregated per micro-batch (no streaming state): sum the "volume" of a minute over its
        # batches when reading the output.  A batch re-run after a failure has the same batch id.
        per_minute = (batch.withColumn("minute", F.date_trunc("minute", "Timestamp"))
                      .groupBy("Date", "minute", "Sym")
                      .agg(F.sum("Size").alias("volume"), F.count("*").alias("trades"))
                      .withColumn("batch", F.lit(batch_id)))
        per_minute.write.mode("append").partitionBy("Date").parquet(args.out)

    writer = trades.writeStream.foreachBatch(write).option("checkpointLocation", args.checkpoint)
    writer = writer.trigger(availableNow=True) if args.available_now else writer.trigger(processingTime="5 seconds")
    query = writer.start()
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    spark.stop()


if __name__ == "__main__":
    main()
