"""``.option("view", "lastBy")`` of the ``dis`` source, batch and streaming, through both readers
of ``format("dis")`` (the JVM reader hands the option to the Python source): the batch read
equals the DIS's state, and upserting every micro-batch of the stream by key equals it too."""

from __future__ import annotations

import threading

import pytest

from disd.config import parse_dis_config
from disd.names import LocationKey
from disd.server.daemon import DisServer
from disd.storage.lastby import last_by
from support import Feeder, dis_settings

from .support_lastby import random_updates, with_last_by

pytestmark = pytest.mark.spark

DAY1 = LocationKey("Market", "Trade", "A", "2026-11-22")
DAY2 = LocationKey("Market", "Trade", "A", "2026-11-23")


@pytest.fixture(scope="module")
def lastby_dis(tmp_path_factory):
    db = tmp_path_factory.mktemp("lastby-spark") / "db"
    srv = DisServer(parse_dis_config(with_last_by(dis_settings(db)), "<t>"))
    srv.start()
    feeder = Feeder(srv)
    feeder.append(DAY1, random_updates(0, 4000, 1500, seed=11))
    feeder.append(DAY2, random_updates(4000, 2000, 800, seed=12))
    yield srv, feeder
    srv.stop(0.5)


class UpsertSink:
    """Applies every micro-batch to a dict keyed by (Date, Sym), as a consumer of the view would."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: dict = {}

    def __call__(self, batch_df, batch_id) -> None:  # noqa: ARG002 - foreachBatch's signature
        t = batch_df.toArrow()
        with self.lock:
            for r in t.to_pylist():
                self.rows[(r["Date"], r["Sym"])] = r["Size"]


def _expected(srv, key) -> dict:
    t = last_by(srv.engine.location(key).read_table(), ["Sym"])
    return {(key.column_partition, s): z for s, z in zip(t["Sym"].to_pylist(), t["Size"].to_pylist())}


@pytest.mark.parametrize("reader", ["jvm", "python"])
def test_batch_view_is_the_dis_state(spark_session, lastby_dis, reader):
    srv, _ = lastby_dis
    df = (spark_session.read.format("dis").option("reader", reader).option("address", f"127.0.0.1:{srv.port}")
          .option("table", "Market.Trade").option("view", "lastBy").load())
    got = df.toArrow()
    assert got.column_names == ["Timestamp", "Sym", "Price", "Size", "Date"]
    # across column partitions a key's row is the later day's
    day2 = _expected(srv, DAY2)
    later = {s for _, s in day2}
    combined = {k: v for k, v in _expected(srv, DAY1).items() if k[1] not in later} | day2
    assert {(r["Date"], r["Sym"]): r["Size"] for r in got.select(["Date", "Sym", "Size"]).to_pylist()} == combined
    one = (spark_session.read.format("dis").option("reader", reader).option("address", f"127.0.0.1:{srv.port}")
           .option("table", "Market.Trade").option("view", "lastBy").option("partitions", "2026-11-22").load())
    assert {(r["Date"], r["Sym"]): r["Size"] for r in one.select("Date", "Sym", "Size").toArrow().to_pylist()} == \
        _expected(srv, DAY1)

def test_stream_upserted_by_key_equals_the_state(spark_session, lastby_dis, tmp_path):
    srv, feeder = lastby_dis
    sink = UpsertSink()
    df = (spark_session.readStream.format("dis").option("address", f"127.0.0.1:{srv.port}")
          .option("table", "Market.Trade").option("view", "lastBy").load())
    q = df.writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ck")) \
        .trigger(availableNow=True).start()
    q.awaitTermination(120)
    assert sink.rows == _expected(srv, DAY1) | _expected(srv, DAY2)
    feeder.append(DAY1, random_updates(6000, 700, 1500, seed=13))
    q = df.writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ck")) \
        .trigger(availableNow=True).start()
    q.awaitTermination(120)
    assert sink.rows == _expected(srv, DAY1) | _expected(srv, DAY2)
