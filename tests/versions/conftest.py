"""A local Spark session for the end-to-end tests of schema versions (one per module, or the
session tests/spark already started)."""

from __future__ import annotations

import os
import shutil
import sys

import pytest


@pytest.fixture(scope="module")
def spark_session():
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Java is not installed: the Spark tests need Java 17")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import disd.spark

    existing = SparkSession.getActiveSession()  # tests/spark's, when run in the same process
    s = disd.spark.session("local[2]", app_name="dis-version-tests", conf={
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.driver.memory": "1g",
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    })
    s.sparkContext.setLogLevel("ERROR")
    from disd.spark import jvm

    assert jvm.jvm_source_loaded(s), "the JVM reader is not on the session's classpath: run `make jar`"
    yield s
    if existing is None:
        s.stop()
