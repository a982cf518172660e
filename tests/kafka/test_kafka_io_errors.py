"""I/O errors of a Kafka location (rule 4 of docs/kafka.md): a DIS in this process on a disk
that fails writes and fsyncs of the table's column files for a while, consuming from the mock
cluster while messages arrive; the location goes into error, is reopened from its checkpoint,
the partition re-seeks from the checkpointed offset, and the table ends exactly the messages."""

from __future__ import annotations

import errno
import time

import numpy as np

from disd.client import connect
from disd.config import parse_dis_config
from disd.server.daemon import DisServer
from faults.disk import FaultyDisk, engines_on
from support import dis_settings, wait_for

from .test_kafka_exactly_once import kafka_section, produce


def test_location_io_errors_lose_and_duplicate_nothing(tmp_path, monkeypatch, mock_kafka):
    disk = FaultyDisk(record=False)
    engines_on(monkeypatch, disk)
    data = dis_settings(tmp_path / "db", checkpoint_ms=100)
    data["import"]["kafka"] = kafka_section(mock_kafka.bootstrap, column_partition="2026-11-23", batch_size=50)
    srv = DisServer(parse_dis_config(data, "<test>"))
    srv.start()
    n = 3000
    try:
        producer = produce(mock_kafka.bootstrap, "trades", n, 3, 100, 0.05)
        for _ in range(3):
            time.sleep(0.3)
            f = disk.inject("pwrite", errno.EIO, path_contains="Size.dat", times=2)
            wait_for(lambda: f.hits >= 1, 10, 0.01, "a failed write")
        assert producer.wait(60) == 0
        with connect(f"127.0.0.1:{srv.port}") as c:
            wait_for(lambda: c.read_table("Market", "Trade").num_rows >= n, 30, 0.2, "every message")
            time.sleep(1.0)
            sizes = np.sort(c.read_table("Market", "Trade").column("Size").to_numpy())
        assert len(sizes) == n and (sizes == np.arange(n)).all(), "lost or duplicated messages"
        recoveries = sum(loc.import_state["io_recoveries"] for loc in srv.engine.locations())
        assert recoveries >= 1, "no location was reopened: the test did not test"
    finally:
        srv.stop(0.5)
