"""Merge tests share the one local Spark session of the test run (tests/spark/conftest.py) and a
DIS serving two dates of Market.Trade, each in two internal partitions, all checkpointed."""

from __future__ import annotations

import contextlib

import pytest

from spark.conftest import pytest_generate_tests, spark, spark_session  # noqa: F401 - the shared local
# session fixture, run once per reader of format("dis") (dis_reader: jvm, python)
from support import Feeder, start_dis_server, trade_rows

from .helpers import LOCS


class Dis:
    """An in-process DIS over its own database root, and a way to add checkpointed rows."""

    def __init__(self, db_root) -> None:
        self.db_root = db_root
        self.server = start_dis_server(db_root)
        self.feeder = Feeder(self.server)
        self.address = f"127.0.0.1:{self.server.port}"

    def append(self, key, table, checkpoint: bool = True) -> None:
        self.feeder.append(key, table)
        if checkpoint:
            self.server.engine.location(key).checkpoint()

    def stop(self) -> None:
        self.server.stop(0.5)

    @contextlib.contextmanager
    def stopped(self):
        """The DIS stopped for a while (its database lock released, as for an offline writer),
        then started again on the same root."""
        self.stop()
        try:
            yield
        finally:
            self.server = start_dis_server(self.db_root)
            self.feeder = Feeder(self.server)
            self.address = f"127.0.0.1:{self.server.port}"


@pytest.fixture(scope="module")
def merge_dis(tmp_path_factory):
    dis = Dis(tmp_path_factory.mktemp("merge-dis") / "db")
    for key, (start, n) in LOCS.items():
        dis.append(key, trade_rows(start, n, nulls=True))
    yield dis
    dis.stop()


@pytest.fixture
def fresh_dis(tmp_path):
    dis = Dis(tmp_path / "intraday-db")
    yield dis
    dis.stop()
