"""A checkpointed offset the topic no longer holds (deleted by retention while the DIS was down)
stops the partition with an error saying so; the DIS never jumps silently over messages.  The
mock cluster keeps about 70,000 small messages a partition, so producing 120,000 more moves the
low watermark past the checkpoint."""

from __future__ import annotations

from disd.client import connect
from support import free_port_pair, start_dis_process, wait_for

from .test_kafka_exactly_once import produce, write_config


def kafka(port):
    with connect(f"127.0.0.1:{port}") as c:
        return [loc.kafka for loc in c.status().locations if loc.HasField("kafka")]


def test_offset_deleted_by_retention_stops_the_partition(tmp_path, mock_kafka):
    port = free_port_pair()
    cfg = write_config(tmp_path, port, mock_kafka.bootstrap, topic="one", column_partition="2026-11-23")
    assert produce(mock_kafka.bootstrap, "one", 10, 1, 10, 0).wait(30) == 0
    dis = start_dis_process(tmp_path, cfg)
    try:
        wait_for(lambda: [k.checkpoint_offset for k in kafka(port)] == [10], 30, 0.2, "offset 10 checkpointed")
    finally:
        dis.terminate()
    # messages 10..120009, while the DIS is down: the mock cluster's retention drops the first ones
    assert produce(mock_kafka.bootstrap, "one", 120_010, 1, 50_000, 0, first=10).wait(120) == 0
    dis = start_dis_process(tmp_path, cfg)
    try:
        wait_for(lambda: any(k.stopped for k in kafka(port)), 30, 0.2, "the partition stopped")
        [k] = kafka(port)
        assert "offset 10 is no longer in the topic" in k.stopped, k.stopped
        with connect(f"127.0.0.1:{port}") as c:
            assert c.read_table("Market", "Trade").num_rows == 10  # nothing jumped over
    finally:
        dis.terminate()
    assert "Traceback" not in dis.log_text()
