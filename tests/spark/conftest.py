"""One local Spark session for the whole test run, and DIS instances with known rows.

Spark tests are marked ``spark`` (select them with ``-m spark``, skip them with
``-m "not spark"``); they are skipped when Java is missing.

Every test that uses the ``spark`` fixture runs twice, once per reader of ``format("dis")``
(``dis_reader``): ``jvm``, the JVM Data Source V2 reader (``jvm/``, its jar built by ``make jar``),
and ``python``, the Python source (through the session setting ``spark.dis.reader``).  Select one
with ``-k jvm`` or ``-k python``.  The JVM runs need the jar: a missing or stale jar fails them.
"""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from disd.binlog import LocationKey

from support import ROOT, Feeder, loaded_dis, start_dis_server

# Rows of the shared DIS (fixture ``trade_dis``): two feeds on 2026-11-22, one on 2026-11-23.
LOCS = {
    LocationKey("Market", "Trade", "feed1", "2026-11-22"): (0, 30_000),
    LocationKey("Market", "Trade", "feed2", "2026-11-22"): (30_000, 20_000),
    LocationKey("Market", "Trade", "feed1", "2026-11-23"): (50_000, 7_000),
}
TOTAL = sum(n for _, n in LOCS.values())


READERS = ("jvm", "python")


def pytest_generate_tests(metafunc):
    if "dis_reader" in metafunc.fixturenames:
        metafunc.parametrize("dis_reader", READERS)


@pytest.fixture
def spark(spark_session, dis_reader):
    """The shared session, with ``format("dis")`` reading through ``dis_reader``."""
    if dis_reader == "jvm":
        from disd.spark import jvm

        jar, why = jvm.jar_status()
        assert jar is not None, why
        assert jvm.jvm_source_loaded(spark_session), "the JVM reader is not on the session's classpath"
        stamp = jvm.stamp()
        assert stamp.get("sources") == jvm_sources_digest(), "dis-spark.jar is older than jvm/src: run `make jar`"
    spark_session.conf.set("spark.dis.reader", dis_reader)
    yield spark_session
    spark_session.conf.unset("spark.dis.reader")


def jvm_sources_digest() -> str:
    import importlib.util

    spec = importlib.util.spec_from_file_location("dis_jvm_build", ROOT / "jvm" / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.sources_digest()


@pytest.fixture(scope="session")
def spark_session():
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Java is not installed: the Spark tests need Java 17")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import disd.spark

    s = disd.spark.session("local[2]", app_name="dis-tests", conf={
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.driver.memory": "1g",
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    })
    s.sparkContext.setLogLevel("ERROR")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def trade_dis(tmp_path_factory):
    """A DIS with LOCS published (Size = row number; every 7th row has null Sym and Price)."""
    srv = loaded_dis(tmp_path_factory.mktemp("trade-dis") / "db", LOCS)
    yield srv
    srv.stop(0.5)


@pytest.fixture(scope="module")
def trade_address(trade_dis) -> str:
    return f"127.0.0.1:{trade_dis.port}"


@pytest.fixture
def fresh_dis(tmp_path):
    """An empty DIS of its own (for tests that append rows)."""
    srv = start_dis_server(tmp_path / "db")
    yield srv, Feeder(srv)
    srv.stop(0.5)
