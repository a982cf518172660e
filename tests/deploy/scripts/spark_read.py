"""A PySpark job of the spark image: ``format("dis")`` over a live DIS, as one JSON line.

    python spark_read.py HOST:PORT

{"reader": "jvm"|"python", "table_class": the plan's table class, "rows": n, "sum": sum of Size}"""

import json
import sys

from pyspark.sql import functions as F

import disd.spark

spark = disd.spark.session("local[2]", app_name="dis-image", conf={"spark.ui.enabled": "false"})
spark.sparkContext.setLogLevel("ERROR")
df = (spark.read.format("dis").option("address", sys.argv[1]).option("namespace", "Market")
      .option("table", "Trade").load())
table = df._jdf.queryExecution().optimizedPlan().collectLeaves().head().relation().table()  # noqa: SLF001 - the plan has no Python API
row = df.agg(F.count("*").alias("rows"), F.sum("Size").alias("sum")).collect()[0]
print(json.dumps({"reader": disd.spark.register(spark), "table_class": table.getClass().getName(),
                  "rows": row["rows"], "sum": row["sum"]}))
spark.stop()
