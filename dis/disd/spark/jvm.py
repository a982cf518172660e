"""The JVM Spark reader: finding ``dis-spark.jar``, putting it on a session's classpath, and which
reader a ``format("dis")`` read uses.

The jar (built from ``jvm/`` by ``jvm/build.py``: ``make jar``, ``make test``, or ``pip install``
where a JDK is present) lives inside this package, ``disd/spark/jars/dis-spark.jar``.  With it on
the classpath, ``format("dis")`` is the JVM Data Source V2 reader: Spark looks a short name up
among the JVM's ``DataSourceRegister``s before the sources registered from Python, and refuses to
register a Python source under a name the JVM already has.  So the Python source is then
registered as ``dis_python``; the JVM reader hands it the reads it does not do itself (option
``reader`` or the session setting ``spark.dis.reader`` set to ``python``, ``source`` historical or
all, column files without a DIS, a schema that asks for a cast).  Without the jar (or without a
JDK to build it), the Python source is ``dis`` as before and says once, in the log, why.
"""

from __future__ import annotations

import json
import logging
import pathlib
import zipfile

from disd.spark.source import DisDataSource

log = logging.getLogger(__name__)

JAR = pathlib.Path(__file__).resolve().parent / "jars" / "dis-spark.jar"
STAMP_ENTRY = "disd/spark/build.json"
JVM_CLASS = "disd.spark.DisSource"
#: The session setting that picks the reader of ``format("dis")``: ``jvm`` (default) or ``python``.
READER_CONF = "spark.dis.reader"
#: The Python source's name when the JVM reader has ``dis``.
PYTHON_NAME = "dis_python"

_told: set[str] = set()


class DisPythonDataSource(DisDataSource):
    """The Python source under the name ``dis_python`` (when the JVM reader is ``dis``)."""

    @classmethod
    def name(cls) -> str:
        return PYTHON_NAME


def jar_status() -> tuple[pathlib.Path | None, str]:
    """(the jar to load, "") or (None, why there is none usable)."""
    if not JAR.is_file():
        return None, (f"{JAR} is missing: build it with `make jar` (needs a JDK 17: javac), or reinstall the "
                      "project where javac is on the PATH")
    try:
        with zipfile.ZipFile(JAR) as z:
            stamp = json.loads(z.read(STAMP_ENTRY))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as e:
        return None, f"{JAR} is unreadable ({e}): rebuild it with `make jar`"
    import pyspark

    if stamp.get("pyspark") != pyspark.__version__:
        return None, (f"{JAR} was built for pyspark {stamp.get('pyspark')}, this is pyspark {pyspark.__version__}: "
                      "rebuild it with `make jar`")
    return JAR, ""


def stamp() -> dict:
    """What the jar was built from: ``{"pyspark": version, "sources": digest, "release": "17"}``."""
    try:
        with zipfile.ZipFile(JAR) as z:
            return json.loads(z.read(STAMP_ENTRY))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return {}


def tell_once(why: str) -> None:
    if why not in _told:
        _told.add(why)
        log.warning("dis: format('dis') uses the Python reader (1.5-3x slower than Spark's Parquet reader for "
                    "a full scan; the JVM reader is faster than Parquet): %s", why)


def session_conf(conf: dict[str, str]) -> dict[str, str]:
    """``conf`` with the jar added to ``spark.jars`` (for a session about to be created)."""
    jar, why = jar_status()
    if jar is None:
        tell_once(why)
        return conf
    jars = [j for j in (conf.get("spark.jars") or "").split(",") if j]
    if str(jar) not in jars:
        jars.append(str(jar))
    return {**conf, "spark.jars": ",".join(jars)}


def jvm_source_loaded(spark) -> bool:  # noqa: ANN001 - pyspark.sql.SparkSession
    """Whether ``format("dis")`` resolves to the JVM reader in this session."""
    try:
        loader = spark._jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader()
        spark._jvm.java.lang.Class.forName(JVM_CLASS, False, loader)
        return True
    except Exception:  # noqa: BLE001 - py4j raises its own error for ClassNotFoundException
        return False


def attach(spark) -> bool:  # noqa: ANN001
    """Put the jar on a running session's classpath (``ADD JAR``) unless it is there already;
    True when the JVM reader is then loaded."""
    if jvm_source_loaded(spark):
        return True
    jar, why = jar_status()
    if jar is None:
        tell_once(why)
        return False
    spark.sql(f"ADD JAR '{jar}'")
    loaded = jvm_source_loaded(spark)
    if not loaded:
        tell_once(f"ADD JAR {jar} did not make {JVM_CLASS} loadable in this session")
    return loaded


def register(spark) -> str:  # noqa: ANN001
    """Make ``format("dis")`` known to ``spark``: the JVM reader when its jar loads (the Python
    source then as ``dis_python``), else the Python source.  Returns which: "jvm" or "python"."""
    if attach(spark):
        if not _registered(spark, PYTHON_NAME):
            spark.dataSource.register(DisPythonDataSource)
        return "jvm"
    if not _registered(spark, DisDataSource.name()):
        spark.dataSource.register(DisDataSource)
    return "python"


def _registered(spark, name: str) -> bool:  # noqa: ANN001
    try:
        return bool(spark._jsparkSession.sessionState().dataSourceManager().dataSourceExists(name))
    except Exception:  # noqa: BLE001 - an API this Spark lacks: register again (Spark only warns)
        return False
