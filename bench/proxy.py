"""The Table Data Cache Proxy: N readers of one table through a ``dis proxy`` vs straight on the DIS.

Real processes on loopback: one ``dis serve`` (its database written and checkpointed beforehand:
``--rows`` Market.Trade rows in four locations), one ``dis proxy`` whose upstream is that DIS.
Two phases in the same run, each timed from the readers' start to the last one's end:

* **direct** — the readers' routing names the DIS;
* **proxy** — the readers' routing file lists the DIS and, beside it, the proxy (``proxies:``,
  docs/replicas.md), so every reader goes through the proxy by routing alone.

The readers of a phase, all started at once: ``--readers`` threads of ``disd.client`` each
reading the whole table (``read_table``, every column, a client of its own), one Spark scan of
every column (``format("dis")``, the JVM reader, through the block endpoint), and
``--subscribers`` Subscribe streams on the table held open for the whole phase.

Measured per phase:

* the DIS's CPU seconds (user + system, ``psutil`` from /proc, before and after the phase);
* upstream bytes: straight on the DIS, the bytes it served, which are the bytes the readers got
  (each reader reads every byte of every column file once); through the proxy, the bytes the
  proxy read from the DIS (``dis_proxy_upstream_bytes_total`` before and after);
* readers' rows/s: the rows every reader got (client readers and the Spark scan) / wall seconds;
* with the proxy, its ``dis_proxy_upstream_subscriptions{table="Market.Trade"}`` while every
  subscriber is connected (upstream Subscribe streams for the table, however many readers).

A warm-up read (one client and the Spark scan, straight on the DIS, not measured) fills the page
cache and the DIS's block cache and starts Spark's JVM first, so neither phase starts colder than the other; the proxy's cache is
empty when its phase starts.  Everything shares the machine's cores (two on the development VM):
the proxy's own CPU is not the DIS's and is not counted.

Last line: one JSON object with exactly the keys ``readers``, ``upstream_subscriptions_per_table``
(goal 1), ``dis_cpu_ratio`` (DIS CPU seconds with the proxy / without; goal <= 0.2 at 50
readers), ``upstream_bytes_ratio`` (upstream bytes with the proxy / without; goal <= 1.5 /
readers) and ``throughput_ratio`` (readers' rows/s with the proxy / without).

    .venv/bin/python bench/proxy.py [--readers 50] [--subscribers 10] [--rows 400000]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import psutil
import yaml

from disd.binlog import LocationKey
from disd.client import connect
from proxy.readers_support import start_proxy
from support import Feeder, free_port_pair, sample, scrape, start_dis_process, start_dis_server
from support import trade_rows, write_dis_config

TABLE = ("Market", "Trade")
KEYS = [LocationKey("Market", "Trade", f"feed{i % 2 + 1}", d) for i, d in
        enumerate(("2026-11-20", "2026-11-20", "2026-11-21", "2026-11-21"))]


def write_database(db: pathlib.Path, rows: int) -> None:
    """``rows`` Market.Trade rows over KEYS, published and checkpointed, written by a DIS in this
    process that is then stopped (the measured DIS is a ``dis serve`` process on the same root)."""
    srv = start_dis_server(db)
    try:
        feeder = Feeder(srv)
        per = rows // len(KEYS)
        for i, key in enumerate(KEYS):
            feeder.append(key, trade_rows(i * per, per))
            srv.engine.location(key).checkpoint()
    finally:
        srv.stop(0.5)


def write_routing(path: pathlib.Path, dis: str, proxy: str | None) -> pathlib.Path:
    entry = {"name": "market", "tables": ["*"], "address": dis}
    if proxy is not None:
        entry["proxies"] = [{"name": "tdcp-1", "address": proxy}]
    path.write_text(yaml.safe_dump({"instances": [entry]}))
    return path


def cpu_seconds(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


class Phase:
    """One phase's readers, all started together; ``run`` returns when the last reader is done."""

    def __init__(self, name: str, routing: pathlib.Path, spark, readers: int, subscribers: int,  # noqa: ANN001
                 dis_address: str) -> None:
        self.name = name
        self.routing = routing
        self.spark = spark
        self.readers = readers
        self.subscribers = subscribers
        self.dis_address = dis_address
        self.rows = 0
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.subscribed = threading.Semaphore(0)
        self.stop_subscribers = threading.Event()

    def _client_reader(self, start: threading.Barrier) -> None:
        try:
            with connect(routing=str(self.routing), retry_s=10) as c:
                start.wait()
                t = c.read_table(*TABLE)
                with self.lock:
                    self.rows += t.num_rows
        except Exception as e:  # noqa: BLE001 - reported, and the run fails
            self.errors.append(f"client reader: {e}")

    def _spark_reader(self, start: threading.Barrier) -> None:
        try:
            df = (self.spark.read.format("dis").option("routing", str(self.routing))
                  .option("table", "Market.Trade").option("retrySeconds", "10").load())
            start.wait()
            row = df.selectExpr("count(*) AS n", "max(Timestamp)", "count(Sym)", "sum(Price)",
                                "sum(CAST(Size AS BIGINT))").collect()[0]
            with self.lock:
                self.rows += row["n"]
        except Exception as e:  # noqa: BLE001
            self.errors.append(f"spark scan: {e}")

    def _subscriber(self, locations: int) -> None:
        c = connect(routing=str(self.routing), retry_s=10)
        try:
            sub = c.subscribe(*TABLE)
            for _ in range(locations):
                next(sub)
            self.subscribed.release()
            self.stop_subscribers.wait()
        except Exception as e:  # noqa: BLE001
            self.errors.append(f"subscriber: {e}")
            self.subscribed.release()
        finally:
            c.close()

    def run(self, locations: int, during=None) -> float:  # noqa: ANN001
        """Wall seconds of the readers; ``during()`` is called once every subscriber has the
        table's current state and before the readers start."""
        subs = [threading.Thread(target=self._subscriber, args=(locations,), daemon=True)
                for _ in range(self.subscribers)]
        for t in subs:
            t.start()
        for _ in subs:
            if not self.subscribed.acquire(timeout=120):
                raise SystemExit(f"{self.name}: a subscriber did not get the table's state in 120 s")
        result = during() if during is not None else None
        start = threading.Barrier(self.readers + 2)
        threads = [threading.Thread(target=self._client_reader, args=(start,), daemon=True)
                   for _ in range(self.readers)]
        threads.append(threading.Thread(target=self._spark_reader, args=(start,), daemon=True))
        for t in threads:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        self.stop_subscribers.set()
        for t in subs:
            t.join(30)
        if self.errors:
            raise SystemExit(f"{self.name}: " + "; ".join(self.errors[:5]))
        self.result = result
        return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--readers", type=int, default=50, help="client readers (each reads the whole table)")
    ap.add_argument("--subscribers", type=int, default=10, help="Subscribe streams held open per phase")
    ap.add_argument("--rows", type=int, default=400_000, help="rows of the table (four locations)")
    ap.add_argument("--keep", action="store_true", help="keep the working directory")
    args = ap.parse_args()

    print(json.dumps({"load_average_at_start": [round(x, 2) for x in os.getloadavg()]}), flush=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix="dis-bench-proxy-"))
    dis_proc = proxy_proc = spark = None
    try:
        db = work / "db"
        write_database(db, args.rows)
        (work / "dis").mkdir()
        dis_port = free_port_pair()
        dis_proc = start_dis_process(work / "dis", write_dis_config(work / "dis", dis_port, db_root=db))
        dis = f"127.0.0.1:{dis_port}"
        proxy_port = free_port_pair()
        routing_direct = write_routing(work / "routing-direct.yaml", dis, None)
        routing_proxy = write_routing(work / "routing-proxy.yaml", dis, f"127.0.0.1:{proxy_port}")
        # The proxy reads the same routing file as its readers (its DIS entry; never itself).
        proxy_proc, _, proxy_metrics = start_proxy(work / "proxy", routing_proxy, proxy_port)
        ps = psutil.Process(dis_proc.p.pid)

        with connect(dis, retry_s=0) as c:  # warm-up, and the table's size
            snaps = c.locations(*TABLE)
            table_rows = sum(s.rows for s in snaps)
            table_bytes = sum(sum(s.files.values()) for s in snaps)
            c.read_table(*TABLE)

        import disd.spark

        spark = disd.spark.session("local[2]", app_name="bench-proxy", conf={
            "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2", "spark.driver.memory": "1g"})
        spark.sparkContext.setLogLevel("ERROR")
        # Spark's own start-up (JVM classes, code generation, the reader's first plan and reads)
        # is not timed: the phases' scan once, straight on the DIS.
        spark.read.format("dis").option("address", dis).option("table", "Market.Trade").load().selectExpr(
            "count(*)", "max(Timestamp)", "count(Sym)", "sum(Price)", "sum(CAST(Size AS BIGINT))").collect()

        out = {}
        for name, routing in (("direct", routing_direct), ("proxy", routing_proxy)):
            phase = Phase(name, routing, spark, args.readers, args.subscribers, dis)
            up0 = sample(scrape(proxy_metrics), "dis_proxy_upstream_bytes_total")
            cpu0 = cpu_seconds(ps)
            during = (lambda: sample(scrape(proxy_metrics), "dis_proxy_upstream_subscriptions",
                                     table="Market.Trade")) if name == "proxy" else None
            wall = phase.run(len(snaps), during)
            cpu = cpu_seconds(ps) - cpu0
            up = sample(scrape(proxy_metrics), "dis_proxy_upstream_bytes_total") - up0
            want = (args.readers + 1) * table_rows
            if phase.rows != want:
                raise SystemExit(f"{name}: the readers got {phase.rows} rows, expected {want}")
            readers_bytes = (args.readers + 1) * table_bytes
            upstream = readers_bytes if name == "direct" else up
            out[name] = {"wall_s": wall, "dis_cpu_s": cpu, "upstream_bytes": upstream, "readers_bytes": readers_bytes,
                         "rows_per_s": phase.rows / wall, "upstream_subscriptions": phase.result}
            print(json.dumps({"phase": name, "readers": args.readers, "spark_scans": 1,
                              "subscribers": args.subscribers, "table_rows": table_rows, "table_bytes": table_bytes,
                              **{k: (round(v, 3) if isinstance(v, float) else v) for k, v in out[name].items()}}),
                  flush=True)

        s = scrape(proxy_metrics)
        print(json.dumps({"proxy_metrics": {n: sample(s, n) for n in (
            "dis_proxy_cache_hits_total", "dis_proxy_cache_misses_total", "dis_proxy_upstream_reads_total",
            "dis_proxy_upstream_bytes_total", "dis_proxy_bytes_saved_total", "dis_proxy_cache_bytes")}}), flush=True)
        print(json.dumps({"load_average_at_end": [round(x, 2) for x in os.getloadavg()]}), flush=True)
        d, p = out["direct"], out["proxy"]
        print(json.dumps({
            "readers": args.readers,
            "upstream_subscriptions_per_table": p["upstream_subscriptions"],
            "dis_cpu_ratio": round(p["dis_cpu_s"] / d["dis_cpu_s"], 4),
            "upstream_bytes_ratio": round(p["upstream_bytes"] / d["upstream_bytes"], 5),
            "throughput_ratio": round(p["rows_per_s"] / d["rows_per_s"], 4),
        }), flush=True)
    finally:
        if spark is not None:
            spark.stop()
        for proc in (proxy_proc, dis_proc):
            if proc is not None and proc.alive():
                proc.terminate()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
