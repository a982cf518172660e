"""One local Spark session for the whole test run, and DIS instances with known rows.

Spark tests are marked ``spark`` (select them with ``-m spark``, skip them with
``-m "not spark"``); they are skipped when Java is missing.
"""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from disd.binlog import LocationKey
from support import Feeder, loaded_dis, start_dis_server

# Rows of the shared DIS (fixture ``trade_dis``): two feeds on 2026-11-22, one on 2026-11-23.
LOCS = {
    LocationKey("Market", "Trade", "feed1", "2026-11-22"): (0, 30_000),
    LocationKey("Market", "Trade", "feed2", "2026-11-22"): (30_000, 20_000),
    LocationKey("Market", "Trade", "feed1", "2026-11-23"): (50_000, 7_000),
}
TOTAL = sum(n for _, n in LOCS.values())


@pytest.fixture(scope="session")
def spark():
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
