"""A source that has caught up with its topic publishes its rows at once, not at the flusher's
next tick: with ``flush_interval_ms`` and ``checkpoint_interval_ms`` of a minute, the rows of a
real ``dis serve`` consuming the mock cluster are visible (``Status`` rows) within seconds, for
a first burst, for messages that come after it, and after a batch of exactly ``batch_size``
that the next ``consume`` finds nothing after."""

from __future__ import annotations

import yaml

from disd.client import connect
from support import free_port_pair, start_dis_process, wait_for, write_dis_config

from .test_kafka_exactly_once import kafka_section, produce


def visible(port: int) -> int:
    with connect(f"127.0.0.1:{port}") as c:
        return sum(loc.rows for loc in c.status().locations)


def test_caught_up_source_publishes_without_waiting_for_the_flusher(tmp_path, mock_kafka):
    port = free_port_pair()
    cfg = write_dis_config(tmp_path, port, flush_ms=60_000, checkpoint_ms=60_000)
    data = yaml.safe_load(cfg.read_text())
    data["import"]["kafka"] = kafka_section(mock_kafka.bootstrap, topic="one", column_partition="2026-11-23")
    cfg.write_text(yaml.safe_dump(data))
    assert produce(mock_kafka.bootstrap, "one", 600, 1, 600, 0).wait(30) == 0
    dis = start_dis_process(tmp_path, cfg)
    try:
        wait_for(lambda: visible(port) == 600, 10, 0.1, "the first 600 rows visible")
        assert produce(mock_kafka.bootstrap, "one", 605, 1, 5, 0, first=600).wait(30) == 0
        wait_for(lambda: visible(port) == 605, 10, 0.1, "5 later rows visible")
        # exactly batch_size (500) more: the consume that takes them is full, the next one empty
        assert produce(mock_kafka.bootstrap, "one", 1105, 1, 500, 0, first=605).wait(30) == 0
        wait_for(lambda: visible(port) == 1105, 10, 0.1, "500 later rows visible")
    finally:
        dis.terminate()
