"""``register()`` on a session that was created without the jar: ``ADD JAR`` puts the JVM reader
on its classpath, and ``format("dis")`` then reads with it (driver and tasks alike).

The shared test session already has the jar (``disd.spark.session`` puts it in ``spark.jars``),
so this runs a session of its own in a child process: a plain ``SparkSession.builder`` session,
as a notebook or ``pyspark`` shell starts one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .conftest import LOCS, TOTAL
from support import ROOT

pytestmark = pytest.mark.spark

CHILD = r"""
import json, sys
from pyspark.sql import SparkSession
import disd.spark
from disd.spark import jvm

address, http_address = sys.argv[1], sys.argv[2]
spark = (SparkSession.builder.master("local[2]").appName("add-jar")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
out = {"before": jvm.jvm_source_loaded(spark), "registered": disd.spark.register(spark),
       "after": jvm.jvm_source_loaded(spark)}
df = (spark.read.format("dis").option("address", address).option("httpAddress", http_address)
      .option("namespace", "Market").option("table", "Trade").load())
out["provider"] = df._jdf.queryExecution().optimizedPlan().collectLeaves().head().relation().table().getClass().getName()
out["rows"] = df.count()
out["dates"] = sorted((r.Date, r.n) for r in df.groupBy("Date").count().withColumnRenamed("count", "n").collect())
spark.stop()
print("RESULT " + json.dumps(out))
"""


def test_register_adds_the_jar_to_a_running_session_and_reads_with_it(trade_dis, tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(ROOT / "tests")}
    r = subprocess.run([sys.executable, str(script), f"127.0.0.1:{trade_dis.port}",
                        f"127.0.0.1:{trade_dis.http_port}"], capture_output=True, text=True, timeout=240, env=env)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["before"] is False  # a plain session: the jar is not there until register()
    assert out["registered"] == "jvm" and out["after"] is True
    assert out["provider"] == "disd.spark.DisTable"  # the JVM reader's table, not the Python source's
    assert out["rows"] == TOTAL
    per_date: dict[str, int] = {}
    for key, (_, n) in LOCS.items():
        per_date[key.column_partition] = per_date.get(key.column_partition, 0) + n
    assert [tuple(x) for x in out["dates"]] == sorted(per_date.items())
