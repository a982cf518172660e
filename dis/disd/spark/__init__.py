"""Spark reads live DIS partitions: the ``dis`` data source (batch and streaming), the JVM reader
(``jvm/``, put on the classpath by ``disd.spark.jvm``) when its jar is there, else this package's
Python reader (``disd.spark.source``).

    import disd.spark
    spark = disd.spark.session()          # local[*] with the settings below; or bring your own
    disd.spark.register(spark)            # once per session (session() already does it)
    df = (spark.read.format("dis").option("address", "127.0.0.1:22021")
          .option("namespace", "Market").option("table", "Trade").load())
    # historical Parquet (and both at once) under a database root, user tables: docs/historical.md

Everything about options, types, pruning and streaming is in docs/spark.md.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping

from disd.spark.errors import DisSourceError
from disd.spark.source import DisDataSource

__all__ = ["DisDataSource", "DisSourceError", "SESSION_CONF", "register", "session", "write_user_table"]


def write_user_table(df, namespace: str, table: str, **kwargs):  # noqa: ANN001, ANN003, ANN201
    """Write a DataFrame as a user table under ``<db>/Users/<namespace>/`` (see
    ``disd.spark.usertables.write_user_table`` and docs/historical.md)."""
    from disd.spark.usertables import write_user_table as write

    return write(df, namespace, table, **kwargs)


#: The settings ``session()`` applies.
SESSION_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",  # show DIS timestamps (UTC) as they are
}


def register(spark) -> str:  # noqa: ANN001 - pyspark.sql.SparkSession
    """Make ``format("dis")`` known to ``spark`` (idempotent): the JVM reader when its jar is
    there (``ADD JAR`` on a running session), else the Python source; returns "jvm" or "python"
    (``disd.spark.jvm``)."""
    from disd.spark import jvm

    return jvm.register(spark)


def session(master: str | None = None, app_name: str = "dis", conf: Mapping[str, str] | None = None):  # noqa: ANN201
    """A SparkSession (``local[*]`` unless ``master`` or an existing session says otherwise)
    with UTC session time, the worker Python set to this interpreter, and the
    ``dis`` source registered.  ``conf`` adds or overrides settings."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    elif "spark.master" not in (conf or {}) and not os.environ.get("MASTER"):
        builder = builder.master("local[*]")
    from disd.spark import jvm

    for k, v in jvm.session_conf({**SESSION_CONF, **(conf or {})}).items():  # + spark.jars: the JVM reader
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    for k, v in {**SESSION_CONF, **(conf or {})}.items():
        # getOrCreate() may return a running session: apply the SQL settings to it too
        if k.startswith("spark.sql."):
            spark.conf.set(k, v)
    register(spark)
    return spark
