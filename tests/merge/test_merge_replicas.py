"""``dis merge`` from a replica set: a merge never publishes fewer rows than its snapshot pinned,
even when the replica the snapshot came from dies and a replica behind it serves the read."""

from __future__ import annotations

import pathlib

import pytest
import yaml

from disd.binlog import LocationKey
from disd.historical.merge import IntradaySource, MergeError, MergeRequest, merge
from support import Feeder, running_dis, trade_rows

KEY = LocationKey("Market", "Trade", "feed1", "2026-11-20")


@pytest.fixture
def python_spark(spark_session):
    spark_session.conf.set("spark.dis.reader", "python")
    yield spark_session
    spark_session.conf.unset("spark.dis.reader")


def test_a_merge_refuses_a_read_that_returned_fewer_rows_than_its_snapshot(python_spark, tmp_path):
    out = tmp_path / "historical"
    with running_dis(tmp_path / "a") as ahead, running_dis(tmp_path / "b") as behind:
        Feeder(ahead).append(KEY, trade_rows(0, 3000))
        Feeder(behind).append(KEY, trade_rows(0, 1000))  # the same first rows: the same bytes
        routing = tmp_path / "routing.yaml"
        routing.write_text(yaml.safe_dump({"instances": [{"name": "market", "replicas": [
            {"name": "ahead", "address": f"127.0.0.1:{ahead.port}"},
            {"name": "behind", "address": f"127.0.0.1:{behind.port}"}]}]}))
        steps = []

        def on_step(name: str) -> None:
            steps.append(name)
            if name == "locked":  # after the snapshot (3000 rows, from the replica ahead)
                ahead.stop(0)

        req = MergeRequest("Market", "Trade", KEY.column_partition, str(out), IntradaySource(routing=str(routing)),
                           force=True)
        with pytest.raises(MergeError, match="returned 1000 rows of the 3000 the snapshot pinned"):
            merge(python_spark, req, on_step=on_step)
    assert "locked" in steps and not {"sealed", "renamed", "linked", "indexed"} & set(steps), steps
    # Only the writer's hidden staging directory holds files (removed by the next merge)
    assert not [p for p in pathlib.Path(out).rglob("*.parquet") if not any(d.startswith(".") for d in p.parts)]
