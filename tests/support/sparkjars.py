"""The Spark and Scala of this environment's PySpark, read off its own jars (an oracle for what
``jvm/build.py`` writes into the JVM reader's manifest)."""

from __future__ import annotations

import pathlib
import re


def pyspark_versions() -> dict[str, str]:
    """``{"Spark-Version": "4.3.0", "Scala-Binary-Version": "2.13", "Scala-Version": "2.13.18"}``
    from ``spark-core_<scala>-<spark>.jar`` and ``scala-library-<scala>.jar``."""
    import pyspark

    jars = pathlib.Path(pyspark.__file__).parent / "jars"
    core = next(jars.glob("spark-core_*.jar")).name
    scala = next(jars.glob("scala-library-*.jar")).name
    binary, spark = re.fullmatch(r"spark-core_([\d.]+)-(.+)\.jar", core).groups()
    return {"Spark-Version": spark, "Scala-Binary-Version": binary,
            "Scala-Version": re.fullmatch(r"scala-library-(.+)\.jar", scala).group(1)}
