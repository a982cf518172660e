"""Pull mode against librdkafka's mock cluster (the real Kafka wire protocol, in a process of its
own), with real ``dis serve`` processes: a producer writes N messages over 3 partitions while
the DIS consumes and is killed with SIGKILL several times; the table ends with exactly the N
messages, read through ``disd.client``."""

from __future__ import annotations

import random
import subprocess
import sys
import time

import numpy as np
import yaml

from disd.client import connect
from disd.kafka.service import KAFKA_SERIES
from support import BIN, free_port_pair, sample, scrape, start_dis_process, subprocess_env, wait_for, write_dis_config

from .test_kafka_alerts import rule_series

HERE = __import__("pathlib").Path(__file__).resolve().parent


def kafka_section(bootstrap: str, **source) -> dict:
    src = {"topic": "trades", "table": "Market.Trade",
           "columns": {"Timestamp": {"from": "value.ts", "unit": "ms"}, "Sym": "key", "Price": "value.price",
                       "Size": "value.size"},
           "column_partition": {"column": "Timestamp"}, "batch_size": 500}
    src.update(source)
    return {"bootstrap_servers": bootstrap, "commit_interval_ms": 500, "sources": {"trades": src}}


def write_config(tmp, port, bootstrap, **source):
    path = write_dis_config(tmp, port, checkpoint_ms=200)
    data = yaml.safe_load(path.read_text())
    data["import"]["kafka"] = kafka_section(bootstrap, **source)
    path.write_text(yaml.safe_dump(data))
    return path


def produce(bootstrap: str, topic: str, n: int, parts: int, per_tick: int, tick_s: float,
            first: int = 0) -> subprocess.Popen:
    """tests/kafka/produce.py: messages ``first``..``n``-1 of ``topic``, as a process."""
    return subprocess.Popen([sys.executable, str(HERE / "produce.py"), bootstrap, topic, str(n), str(parts),
                             str(per_tick), str(tick_s), str(first)], env=subprocess_env())


def read_sizes(port: int) -> np.ndarray:
    with connect(f"127.0.0.1:{port}") as c:
        t = c.read_table("Market", "Trade")
    return np.sort(t.column("Size").to_numpy()) if t.num_rows else np.zeros(0, np.int32)


def test_kill9_while_consuming_leaves_exactly_the_messages(tmp_path, mock_kafka):
    n = 3000
    port = free_port_pair()
    cfg = write_config(tmp_path, port, mock_kafka.bootstrap)
    producer = produce(mock_kafka.bootstrap, "trades", n, 3, 150, 0.1)
    dis = start_dis_process(tmp_path, cfg)
    rng = random.Random(18)
    try:
        for _ in range(4):
            time.sleep(rng.uniform(0.3, 1.2))
            dis.kill9()
            dis = start_dis_process(tmp_path, cfg)
        assert producer.wait(60) == 0
        wait_for(lambda: len(read_sizes(port)) >= n, 60, 0.2, "every message in the table")
        sizes = read_sizes(port)
        assert len(sizes) == n and (sizes == np.arange(n)).all(), "lost or duplicated messages"
        # once more, with everything consumed: the checkpoint's offsets hold, nothing comes twice
        time.sleep(0.5)
        dis.kill9()
        dis = start_dis_process(tmp_path, cfg)
        time.sleep(1.5)
        sizes = read_sizes(port)
        assert len(sizes) == n and (sizes == np.arange(n)).all()

        def kafka_status():
            with connect(f"127.0.0.1:{port}") as c:
                st = c.status()
            return sorted((loc.key.internal_partition, loc.key.column_partition, loc.kafka.partition, loc.kafka.next_offset)
                          for loc in st.locations if loc.HasField("kafka"))

        # shown once the source's fetch process has started and read the topic's metadata
        wait_for(lambda: len(kafka_status()) == 6, 20, 0.2, "the Kafka status of the locations")
        kafka = kafka_status()
        # 3 partitions x 2 dates, each partition's locations at its end offset (1000 messages each)
        assert [k[:2] for k in kafka] == [(f"trades-{p}", d) for p in range(3) for d in ("2026-11-23", "2026-11-24")]
        assert {k[3] for k in kafka} == {1000}
        metrics_port = yaml.safe_load(cfg.read_text())["server"]["metrics_port"]
        wait_for(lambda: sample(scrape(metrics_port), "dis_kafka_next_offset", partition="0") == 1000, 10, 0.2,
                 "next offset metric")
        # the lag once the fetch process (started with the source) has the first watermarks
        wait_for(lambda: "dis_kafka_lag_messages" in scrape(metrics_port), 10, 0.2, "lag metric")
        samples = scrape(metrics_port)
        assert sample(samples, "dis_kafka_lag_messages", source="trades", partition="1") == 0
        assert sample(samples, "dis_kafka_partition_stopped") == 0
        assert rule_series() <= set(samples), "series of the Kafka alert rules the DIS does not serve"
        assert set(KAFKA_SERIES) <= {n.removesuffix("_total") for n in samples} | set(samples)
        out = subprocess.run([str(BIN / "dis"), "status", "--address", f"127.0.0.1:{port}"], capture_output=True,
                             text=True, timeout=30)
        assert "trades[0]@1000" in out.stdout, out.stdout + out.stderr
    finally:
        if producer.poll() is None:
            producer.kill()
        dis.terminate()
    assert "Traceback" not in dis.log_text()
