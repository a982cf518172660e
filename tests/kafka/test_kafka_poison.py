"""Poison messages (bad JSON, a wrong type) in a real ``dis serve`` against the mock cluster:
``on_poison: stop`` stops the partition at the message with the reason in ``dis status``, the
metrics and the log, and the DIS goes on; restarted with ``skip`` it passes over them, counts
them, and ingests the good messages after them exactly once."""

from __future__ import annotations

import json

import yaml
from confluent_kafka import Producer

from disd.client import connect
from support import free_port_pair, sample, scrape, start_dis_process, wait_for, write_dis_config

GOOD = [json.dumps({"Timestamp": 1_795_392_000_000_000_000 + i, "Sym": "A", "Price": 1.5, "Size": i}).encode()
        for i in range(10)]
VALUES = GOOD[:5] + [b'{"Timestamp": 1, "Sym": "A", "Price": 1.5, "Size": ', b'{"Sym": "A", "Size": "many"}'] + GOOD[5:]


def config(tmp, port, bootstrap, policy):
    path = write_dis_config(tmp, port, checkpoint_ms=200)
    data = yaml.safe_load(path.read_text())
    data["import"]["kafka"] = {"bootstrap_servers": bootstrap, "sources": {"one": {
        "topic": "one", "table": "Market.Trade", "column_partition": "2026-11-23", "on_poison": policy}}}
    path.write_text(yaml.safe_dump(data))
    return path, data["server"]["metrics_port"]


def rows(port):
    with connect(f"127.0.0.1:{port}") as c:
        return c.read_table("Market", "Trade").column("Size").to_pylist()


def kafka_status(port):
    with connect(f"127.0.0.1:{port}") as c:
        return [loc.kafka for loc in c.status().locations if loc.HasField("kafka")]


def test_poison_stops_then_skip_passes_over(tmp_path, mock_kafka):
    p = Producer({"bootstrap.servers": mock_kafka.bootstrap})
    for v in VALUES:
        p.produce("one", value=v, partition=0)
    assert p.flush(10) == 0
    port = free_port_pair()
    cfg, mport = config(tmp_path, port, mock_kafka.bootstrap, "stop")
    dis = start_dis_process(tmp_path, cfg)
    try:
        wait_for(lambda: any(k.stopped for k in kafka_status(port)), 30, 0.2, "the partition stopped")
        [k] = kafka_status(port)
        assert "poison message at offset 5" in k.stopped and "bad JSON" in k.stopped, k.stopped
        assert k.next_offset == 5 and k.errors >= 1
        wait_for(lambda: sorted(rows(port)) == list(range(5)), 10, 0.1, "the 5 messages before the poison")  # published at the next flush
        m = scrape(mport)
        assert sample(m, "dis_kafka_partition_stopped", source="one", partition="0") == 1
        assert sample(m, "dis_kafka_errors_total", source="one") >= 1
        assert dis.alive()
    finally:
        dis.terminate()
    log = dis.log_text()
    assert "kafka partition stopped" in log and "Traceback" not in log

    cfg, mport = config(tmp_path, port, mock_kafka.bootstrap, "skip")
    dis = start_dis_process(tmp_path, cfg)
    try:
        wait_for(lambda: len(rows(port)) >= 10, 30, 0.2, "the good messages after the poison")
        assert sorted(rows(port)) == list(range(10))
        [k] = kafka_status(port)
        assert k.next_offset == 12 and not k.stopped and k.errors == 2
        assert sample(scrape(mport), "dis_kafka_errors_total", source="one") == 2
    finally:
        dis.terminate()
    log = dis.log_text()
    assert log.count("kafka poison message") == 1 + 2 and "Traceback" not in log  # stop: the first; skip: both


def test_poison_in_one_partition_costs_no_other_partition_a_row(tmp_path, mock_kafka):
    """A poison message in partition 1 of 3 (all produced before the DIS starts, so that a
    ``consume`` can return several partitions' messages) stops partition 1 alone, at its
    offset, while partitions 0 and 2 ingest every message."""
    p = Producer({"bootstrap.servers": mock_kafka.bootstrap})
    for part in range(3):
        for i in range(200):
            size = part * 1000 + i
            v = (b'{"Sym": "A", "Size": "many"}' if part == 1 and i == 120 else
                 json.dumps({"Timestamp": 1_795_392_000_000_000_000 + i, "Sym": "A", "Price": 1.5, "Size": size}).encode())
            p.produce("trades", value=v, partition=part)
    assert p.flush(10) == 0
    port = free_port_pair()
    cfg, _ = config(tmp_path, port, mock_kafka.bootstrap, "stop")
    data = yaml.safe_load(cfg.read_text())
    data["import"]["kafka"]["sources"]["one"]["topic"] = "trades"
    cfg.write_text(yaml.safe_dump(data))
    expected = sorted([*range(200), *range(1000, 1120), *range(2000, 2200)])
    dis = start_dis_process(tmp_path, cfg)
    try:
        wait_for(lambda: sorted(rows(port)) == expected, 30, 0.2, "partitions 0 and 2 whole, 1 up to its poison")
        ks = {k.partition: k for k in kafka_status(port)}
        assert ks[1].next_offset == 120 and "poison message at offset 120" in ks[1].stopped, ks[1].stopped
        assert ks[0].next_offset == ks[2].next_offset == 200 and not ks[0].stopped and not ks[2].stopped
    finally:
        dis.terminate()
    assert "Traceback" not in dis.log_text()
