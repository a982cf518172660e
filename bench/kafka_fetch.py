"""Kafka pull mode in process: CPU of a fetch process's work per 100,000 messages, without the DIS.

``--messages`` JSON messages of bench/kafka.py's kind (Market.Trade rows, key, 2 dates) are
produced to a 3-partition topic of librdkafka's mock cluster (its own process).  Then, in rounds,
each of three readers takes all of them from offset 0 with a client of its own, and the CPU of
this process (every thread: librdkafka's too, from ``time.process_time``) from the assignment to
the last message is counted:

* ``compiled``: ``Fetcher.fetch_once`` with the compiled reader (``disd.kafka.batchread``), each
  batch encoded for the DIS (``Fetcher.encode``: decode, Arrow IPC) as the fetch process does;
* ``consume``: the same with confluent-kafka's ``Consumer.consume`` (the fallback);
* ``baseline``: a bare ``consume(10000)`` loop touching every message's value (bench/kafka.py's).

Last line: ``{"compiled_ms", "consume_ms", "baseline_ms"}``, each the median CPU ms per 100,000
messages over ``--rounds`` (after one round not counted: imports, Arrow's first JSON read),
and ``load`` (``/proc/loadavg``'s first figure at the start).

    .venv/bin/python bench/kafka_fetch.py [--messages 150000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # before tests/: bench/kafka.py, not tests/kafka

from confluent_kafka import Consumer, TopicPartition

from kafka import FETCH, PARTS, TOPIC, produce  # bench/kafka.py
from disd.kafka import parse_kafka_config
from disd.kafka.config import KafkaConfig
from disd.kafka.fetcher import Fetcher
from disd.schema import SchemaRegistry
from support import SCHEMAS
from support.kafka_mock import MockCluster


def source(bootstrap: str) -> object:
    data = {"bootstrap_servers": bootstrap, "sources": {"bench": {
        "topic": TOPIC, "table": "Market.Trade", "batch_size": 10000,
        "columns": {"Timestamp": {"from": "value.ts", "unit": "ms"}, "Sym": "key", "Price": "value.price",
                    "Size": "value.size"},
        "column_partition": {"column": "Timestamp"}}}}
    cfg = parse_kafka_config(data, "bench", SchemaRegistry.load_dir(str(SCHEMAS)))
    assert cfg is not None
    return cfg


def fetch(bootstrap: str, n: int, compiled: bool) -> float:
    """CPU seconds of ``Fetcher.fetch_once`` + ``encode`` until ``n`` messages are in."""
    cfg = source(bootstrap)
    c = Consumer(cfg.client_properties())
    got = [0]

    def send(header: tuple, body: object) -> None:
        if header[0] == "decode":
            got[0] += f.encode(header, body)[0][5]

    f = Fetcher(cfg.sources[0], c, send)
    if not compiled:
        f._chosen = True  # noqa: SLF001 - the fallback, chosen by the bench
    c.list_topics(TOPIC, timeout=5)
    t0 = time.process_time()
    for p in range(PARTS):
        f.handle(("assign", p, 0, 1))
    while got[0] < n:
        f.fetch_once(1.0)
    cpu = time.process_time() - t0
    assert (f.reader is not None) == compiled
    c.close()
    return cpu


def baseline(bootstrap: str, n: int) -> float:
    props = KafkaConfig(bootstrap).client_properties()
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-baseline", "enable.auto.commit": False,
                  **{k: props[k] for k in FETCH}})
    c.list_topics(TOPIC, timeout=5)
    t0 = time.process_time()
    c.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTS)])
    got = nbytes = 0
    while got < n:
        for m in c.consume(10000, 1.0):
            if m.error() is None:
                nbytes += len(m.value())
                got += 1
    cpu = time.process_time() - t0
    c.close()
    return cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=150_000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    load = float(open("/proc/loadavg").read().split()[0])
    with MockCluster(f"{TOPIC}:{PARTS}") as mc:
        assert produce(mc.bootstrap, a.messages).wait(300) == 0
        runs: dict[str, list[float]] = {"compiled": [], "consume": [], "baseline": []}
        for r in range(a.rounds + 1):
            for name in runs:
                cpu = (baseline(mc.bootstrap, a.messages) if name == "baseline"
                       else fetch(mc.bootstrap, a.messages, name == "compiled"))
                if not r:
                    continue
                runs[name].append(cpu * 1e3 * 100_000 / a.messages)
                print(f"round {r} {name}: {runs[name][-1]:.1f} ms CPU per 100k messages", flush=True)
    print(json.dumps({f"{k}_ms": round(statistics.median(v), 1) for k, v in runs.items()} | {"load": load}))


if __name__ == "__main__":
    main()
