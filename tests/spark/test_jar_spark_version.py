"""The jar's manifest names the Spark and Scala it was compiled against (``jvm/build.py``), and
``disd.spark`` loads it only into that Spark: any other is refused with a message that names both,
and ``format("dis")`` is the Python reader there."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile

import pytest

from disd.spark import jvm
from support.sparkjars import pyspark_versions

pytestmark = pytest.mark.spark


def test_the_jar_s_manifest_names_the_spark_and_scala_it_was_compiled_against():
    jar, why = jvm.jar_status()
    assert jar is not None, why
    built = jvm.manifest()
    assert {k: built.get(k) for k in ("Spark-Version", "Scala-Version", "Scala-Binary-Version")} == pyspark_versions()


MISMATCH_CHILD = r"""
import json, logging, pathlib, sys
from pyspark.sql import SparkSession
import disd.spark
from disd.spark import jvm

logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
jvm.JAR = pathlib.Path(sys.argv[1])      # a jar whose manifest names another Spark
offline = jvm.jar_status()               # the Spark a new session would start
spark = (SparkSession.builder.master("local[1]").appName("mismatch").config("spark.ui.enabled", "false")
         .getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
out = {"offline": offline[1], "registered": disd.spark.register(spark), "session": jvm.jar_status(spark)[1],
       "loaded": jvm.jvm_source_loaded(spark), "spark": spark.version}
spark.stop()
print("RESULT " + json.dumps(out))
"""


def test_disd_spark_refuses_a_jar_compiled_against_another_spark(tmp_path):
    """A copy of the jar whose manifest says Spark 3.5.1 (Scala 2.12): not loaded into this
    Spark, and the message names both; the Python reader reads instead."""
    fake = tmp_path / "dis-spark.jar"
    with zipfile.ZipFile(jvm.JAR) as src, zipfile.ZipFile(fake, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename == "META-INF/MANIFEST.MF":
                data = re.sub(rb"Spark-Version: .*", b"Spark-Version: 3.5.1", data)
                data = re.sub(rb"Scala-Binary-Version: .*", b"Scala-Binary-Version: 2.12", data)
            dst.writestr(item, data)
    script = tmp_path / "child.py"
    script.write_text(MISMATCH_CHILD)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    r = subprocess.run([sys.executable, str(script), str(fake)], capture_output=True, text=True, timeout=300, env=env)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    this = pyspark_versions()
    running = f"this is Spark {this['Spark-Version']} (Scala {this['Scala-Binary-Version']})"
    for why in (out["offline"], out["session"]):
        assert "compiled against Spark 3.5.1 (Scala 2.12)" in why and running in why, why
    assert out["registered"] == "python" and out["loaded"] is False, out
    assert "compiled against Spark 3.5.1 (Scala 2.12)" in r.stderr  # said once, as a warning


def test_the_version_check_itself():
    built = {"Spark-Version": "4.1.0", "Scala-Binary-Version": "2.13", "Scala-Version": "2.13.16"}
    assert jvm.mismatch(built, jvm.SparkVersions("4.1.0", "2.13.17")) == ""  # same Scala binary version
    assert "Spark 4.1.0 (Scala 2.13), this is Spark 4.1.1 (Scala 2.13)" in \
        jvm.mismatch(built, jvm.SparkVersions("4.1.1", "2.13.16"))
    assert "this is Spark 4.1.0 (Scala 2.12)" in jvm.mismatch(built, jvm.SparkVersions("4.1.0", "2.12.18"))
    assert "names no Spark-Version" in jvm.mismatch({}, jvm.SparkVersions("4.1.0", "2.13.16"))
