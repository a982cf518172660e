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

The jar's manifest names the Spark and Scala versions it was compiled against; it is put on the
classpath only of that Spark (``jar_status``, ``mismatch``).  Any other Spark is refused, with a
message that names both versions, and reads with the Python reader.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
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


def jar_status(spark=None) -> tuple[pathlib.Path | None, str]:  # noqa: ANN001 - pyspark.sql.SparkSession
    """(the jar to load, "") or (None, why there is none usable).  The jar is usable only with
    the Spark its manifest says it was compiled against (same Spark version, same Scala binary
    version): ``spark``'s when a session is given, else the Spark a new session would start
    (PySpark's ``SPARK_HOME``)."""
    if not JAR.is_file():
        return None, (f"{JAR} is missing: build it with `make jar` (needs a JDK 17: javac), or reinstall the "
                      "project where javac is on the PATH")
    try:
        built = manifest()
    except (OSError, KeyError, zipfile.BadZipFile) as e:
        return None, f"{JAR} is unreadable ({e}): rebuild it with `make jar`"
    if spark is not None:
        running = SparkVersions(spark.version, spark._jvm.scala.util.Properties.versionNumberString())  # noqa: SLF001 - PySpark's JVM gateway: no public API reaches the JVM
    else:
        running = spark_home_versions()
    why = mismatch(built, running)
    return (None, why) if why else (JAR, "")


@dataclasses.dataclass(frozen=True)
class SparkVersions:
    """A Spark and the Scala it runs on, e.g. ``SparkVersions("4.1.0", "2.13.16")``."""

    spark: str
    scala: str

    @property
    def scala_binary(self) -> str:
        """``2.13`` of ``2.13.16``: Scala libraries are binary compatible within it."""
        return ".".join(self.scala.split(".")[:2])


def manifest(jar: pathlib.Path | None = None) -> dict[str, str]:
    """The main attributes of the jar's ``META-INF/MANIFEST.MF`` (``jvm/build.py`` writes
    ``Spark-Version``, ``Scala-Version`` and ``Scala-Binary-Version`` there)."""
    with zipfile.ZipFile(jar or JAR) as z:
        text = z.read("META-INF/MANIFEST.MF").decode("utf-8")
    out: dict[str, str] = {}
    for line in text.replace("\r\n", "\n").split("\n"):
        key, sep, value = line.partition(": ")
        if sep:
            out[key] = value
    return out


def spark_home_versions() -> SparkVersions:
    """The versions of the Spark a new session starts: the jars of PySpark's ``SPARK_HOME``
    (pip's PySpark itself unless ``SPARK_HOME`` names another Spark).  The jar names are read
    here as ``jvm/build.py`` reads them at build time (that script runs before the package is
    installed, so it cannot share this code)."""
    import pyspark

    home = os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)  # as PySpark's launcher finds it
    jars = pathlib.Path(home) / "jars"
    spark = scala = ""
    for p in jars.glob("spark-core_*-*.jar"):
        spark = p.name[len("spark-core_"):-len(".jar")].partition("-")[2]
    for p in jars.glob("scala-library-*.jar"):
        scala = p.name[len("scala-library-"):-len(".jar")]
    return SparkVersions(spark or pyspark.__version__, scala)


def mismatch(built: dict[str, str], running: SparkVersions) -> str:
    """Why a jar whose manifest is ``built`` must not be loaded into ``running`` ("" when it may):
    a class compiled against one Spark can fail at any call in another, so the JVM reader is
    refused rather than let a query fail half way.  The message names both."""
    spark, scala = built.get("Spark-Version"), built.get("Scala-Binary-Version")
    if not spark or not scala:
        return (f"{JAR} names no Spark-Version and Scala-Binary-Version in its manifest (built by an older "
                "jvm/build.py): rebuild it with `make jar`")
    if spark == running.spark and (not running.scala or scala == running.scala_binary):
        return ""
    this = f"Spark {running.spark}" + (f" (Scala {running.scala_binary})" if running.scala else "")
    return (f"{JAR} was compiled against Spark {spark} (Scala {scala}), this is {this}: the JVM reader is not "
            "loaded into a Spark it was not compiled against; rebuild it against this Spark with `make jar` (or "
            "reinstall dis where javac is on the PATH)")


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
        loader = spark._jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader()  # noqa: SLF001 - PySpark's JVM gateway: no public API reaches the JVM
        spark._jvm.java.lang.Class.forName(JVM_CLASS, False, loader)  # noqa: SLF001 - PySpark's JVM gateway: no public API reaches the JVM
        return True
    except Exception:  # noqa: BLE001 - py4j raises its own error for ClassNotFoundException
        return False


def attach(spark) -> bool:  # noqa: ANN001
    """Put the jar on a running session's classpath (``ADD JAR``) unless it is there already;
    True when the JVM reader is then loaded."""
    if jvm_source_loaded(spark):
        return True
    jar, why = jar_status(spark)
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
        return bool(spark._jsparkSession.sessionState().dataSourceManager().dataSourceExists(name))  # noqa: SLF001 - PySpark's JVM gateway: no public API reaches the JVM
    except Exception:  # noqa: BLE001 - an API this Spark lacks: register again (Spark only warns)
        return False
