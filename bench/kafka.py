"""Kafka pull mode: rows/s from librdkafka's mock cluster into visible rows of a real ``dis
serve``, against a plain confluent-kafka consume loop of the same messages in the same run; and
exactly once across SIGKILLs.

1. ``--messages`` JSON messages (Market.Trade rows, key, 2 dates) are produced beforehand to a
   3-partition topic of the mock cluster (its own process, tests/support/kafka_mock.py).
2. Baseline: one confluent-kafka ``Consumer`` assigned the 3 partitions from offset 0,
   ``consume(10000)`` in a loop touching every message's value; timed from the assignment to
   the last message read.  Best of ``--repeat``.  It has the DIS consumer's fetch settings
   (``FETCH``, from ``KafkaConfig.client_properties``): with librdkafka's defaults the bare loop
   often stalls on ``fetch.queue.backoff.ms`` (1000 ms) and runs at ~135 k messages/s instead
   of ~1 M, which made the ratio say more about librdkafka's defaults than about the DIS.
3. The DIS: ``dis serve`` with an ``import.kafka`` source of the topic; timed from its first
   partition assignment (the time of its ``kafka partition assigned`` log line) to the moment
   every row is visible (published rows followed by a subscription, as the DIS pushes each
   publish, checked by ``Status`` at the end), so the process's start-up is not timed but
   librdkafka's first fetches are, as in the baseline.  Best of ``--repeat`` (a fresh
   database each time).  ``ratio`` = DIS rows/s / baseline.
4. Exactness: ``--more`` messages are produced live while the DIS is killed with SIGKILL
   ``--kills`` times and restarted; then the table, read through ``disd.client``, must hold
   every message exactly once (``exact``).

Last line: one JSON object with exactly the keys ``rows_per_s``, ``baseline``, ``ratio``, ``exact``.

    .venv/bin/python bench/kafka.py [--messages 150000] [--repeat 2] [--more 15000] [--kills 3]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import numpy as np
import yaml
from confluent_kafka import Consumer, TopicPartition

from _common import Published
from disd.client import connect
from disd.kafka.config import KafkaConfig
from support import free_port_pair, start_dis_process, subprocess_env, write_dis_config
from support.kafka_mock import MockCluster

PRODUCE = pathlib.Path(__file__).resolve().parent.parent / "tests" / "kafka" / "produce.py"
TOPIC, PARTS = "bench", 3


def produce(bootstrap: str, n: int, first: int = 0, per_tick: int = 100_000, tick: float = 0.0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(PRODUCE), bootstrap, TOPIC, str(n), str(PARTS), str(per_tick),
                             str(tick), str(first)], env=subprocess_env())


#: librdkafka fetch settings of the DIS's consumer, given to the baseline too
FETCH = ("fetch.queue.backoff.ms", "queued.min.messages", "max.partition.fetch.bytes")


def baseline(bootstrap: str, n: int) -> float:
    props = KafkaConfig(bootstrap).client_properties()
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-baseline", "enable.auto.commit": False,
                  **{k: props[k] for k in FETCH}})
    t0 = time.perf_counter()
    c.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTS)])
    got = nbytes = 0
    while got < n:
        msgs = c.consume(10000, 1.0)
        for m in msgs:
            if m.error() is None:
                nbytes += len(m.value())
                got += 1
    dt = time.perf_counter() - t0
    c.close()
    return got / dt


#: ``fetch_processes`` of the DIS's source (None: the DIS's default); ``--fetch-processes``
FETCH_PROCESSES: int | None = None


def dis_config(tmp: pathlib.Path, port: int, bootstrap: str) -> pathlib.Path:
    path = write_dis_config(tmp, port, flush_ms=100, checkpoint_ms=1000)
    data = yaml.safe_load(path.read_text())
    data["import"]["kafka"] = {"bootstrap_servers": bootstrap, "sources": {"bench": {
        "topic": TOPIC, "table": "Market.Trade", "batch_size": 10000,
        "columns": {"Timestamp": {"from": "value.ts", "unit": "ms"}, "Sym": "key", "Price": "value.price",
                    "Size": "value.size"},
        "column_partition": {"column": "Timestamp"}}}}
    if FETCH_PROCESSES is not None:
        data["import"]["kafka"]["sources"]["bench"]["fetch_processes"] = FETCH_PROCESSES
    path.write_text(yaml.safe_dump(data))
    return path


def visible(port: int) -> int:
    with connect(f"127.0.0.1:{port}") as c:
        return sum(loc.rows for loc in c.status().locations)


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far, from /proc (0 if it is gone)."""
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of the DIS (``dis``) and each of its child processes (``child <pid>``)."""
    out = {"dis": cpu_s(pid)}
    for task in pathlib.Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids = (task / "children").read_text().split()
        except OSError:
            continue
        out.update({f"child {k}": cpu_s(int(k)) for k in kids})
    return out


def dis_rate(tmp: pathlib.Path, bootstrap: str, n: int) -> float:
    port = free_port_pair()
    dis = start_dis_process(tmp, dis_config(tmp, port, bootstrap))
    try:
        with connect(f"127.0.0.1:{port}") as c:
            c.status()  # serving
            # CPU per process over the timed window: from the first assignment (read off the log,
            # the fetch processes are started and idle by then) to the last row visible
            deadline = time.monotonic() + 60
            while '"kafka partition assigned"' not in dis.log_text() and time.monotonic() < deadline:
                time.sleep(0.001)
            cpu0 = process_cpu(dis.p.pid)
            # the moment of the last publish, from a subscription: polling Status every 20 ms
            # added up to 20 ms to a run of about 200 ms
            pub = Published(port)
            try:
                deadline = time.monotonic() + 600
                while time.monotonic() < deadline and pub.total()[0] < n and pub.error is None:
                    time.sleep(0.002)
                now = time.time()
            finally:
                pub.close()
            cpu1 = process_cpu(dis.p.pid)
            print("CPU ms from the first assignment to the last row visible: " + ", ".join(
                f"{k} {1000 * (v - cpu0.get(k, 0.0)):.0f}" for k, v in cpu1.items()))
            rows = sum(loc.rows for loc in c.status().locations)
        if rows != n or pub.error is not None:
            raise SystemExit(f"the DIS shows {rows} rows, {n} produced ({pub.error or 'subscription followed'})")
        return n / (now - assigned_at(dis.log_text()))
    finally:
        dis.terminate()


def assigned_at(log: str) -> float:
    """The wall-clock time of the DIS's first ``kafka partition assigned`` log line."""
    from datetime import datetime

    for line in log.splitlines():
        if line.startswith("{") and '"kafka partition assigned"' in line:
            return datetime.fromisoformat(json.loads(line)["timestamp"].replace("Z", "+00:00")).timestamp()
    raise SystemExit("the DIS logged no partition assignment")


def exactness(tmp: pathlib.Path, bootstrap: str, n: int, more: int, kills: int) -> bool:
    """Continue on the database of the last timed run: ``more`` messages produced live while the
    DIS is killed ``kills`` times; then every message exactly once?"""
    port = free_port_pair()
    cfg = dis_config(tmp, port, bootstrap)
    dis = start_dis_process(tmp, cfg)
    prod = produce(bootstrap, n + more, first=n, per_tick=2000, tick=0.05)
    rng = random.Random(18)
    try:
        for _ in range(kills):
            time.sleep(rng.uniform(0.5, 1.5))
            dis.kill9()
            dis = start_dis_process(tmp, cfg)
        if prod.wait(300) != 0:
            raise SystemExit("the live producer failed")
        deadline = time.monotonic() + 300
        while visible(port) < n + more and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # anything beyond would be a duplicate: let it show
        with connect(f"127.0.0.1:{port}") as c:
            sizes = np.sort(c.read_table("Market", "Trade", columns=["Size"]).column("Size").to_numpy())
        return len(sizes) == n + more and bool((sizes == np.arange(n + more)).all())
    finally:
        dis.terminate()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=150_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--more", type=int, default=15_000)
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--fetch-processes", type=int, default=None, help="the source's fetch_processes (default: "
                    "the DIS's default)")
    args = ap.parse_args()
    global FETCH_PROCESSES
    FETCH_PROCESSES = args.fetch_processes
    n = args.messages
    work = pathlib.Path(tempfile.mkdtemp(prefix="dis-bench-kafka-"))
    try:
        with MockCluster(f"{TOPIC}:{PARTS}") as mc:
            t0 = time.perf_counter()
            if produce(mc.bootstrap, n).wait(600) != 0:
                raise SystemExit("the producer failed")
            print(f"produced {n} messages over {PARTS} partitions in {time.perf_counter() - t0:.1f} s")
            base = max(baseline(mc.bootstrap, n) for _ in range(args.repeat))
            print(f"baseline: plain confluent-kafka consume loop (the DIS's fetch settings), best of {args.repeat}: "
                  f"{base:,.0f} messages/s")
            rates = []
            for i in range(args.repeat):
                tmp = work / f"run{i}"
                tmp.mkdir()
                rates.append(dis_rate(tmp, mc.bootstrap, n))
            rate = max(rates)
            print(f"dis serve: consumed into visible rows, best of {args.repeat}: {rate:,.0f} rows/s "
                  f"(runs {', '.join(f'{r:,.0f}' for r in rates)})")
            exact = exactness(work / f"run{args.repeat - 1}", mc.bootstrap, n, args.more, args.kills)
            print(f"exactness: {args.more} more messages produced live over {args.kills} SIGKILLs of the DIS: "
                  f"{'every message exactly once' if exact else 'NOT exactly once'}")
            print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"rows_per_s": round(rate, 1), "baseline": round(base, 1), "ratio": round(rate / base, 4),
                      "exact": exact}))


if __name__ == "__main__":
    main()
