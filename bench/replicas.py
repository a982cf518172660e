"""Hot replicas: what a second replica costs ingestion, and what a reader notices when one dies.

Real processes on loopback: ``dis serve`` replicas, one ``dis-tailer`` streaming every location
to every replica of its routing entry (docs/replicas.md), logs written by ``disd.logger``.

1. Ingestion, same run: ``--rows`` Market.Trade rows (two locations) written beforehand; the
   time from their arrival in the directory of a running tailer (hard links, so the tailer's
   start-up is not timed) until every row is published, once with a
   replica set of one and once with two (each on a fresh database; both must publish every
   row).  Best of ``--repeat`` runs each, alternating.  ``ratio`` = rows/s with two / rows/s with
   one.  On the 2-core development machine the two DISes and the tailer share the same cores, so
   this is the worst case; on separate hosts each replica pays only for its own stream.
2. Failover stall: two replicas, a logger writing live (``--live-rate`` rows/s), and a client
   reading in a loop through the routing file: list the location, read its rows from a little
   before what it has read up to the published end (``disd.client``, 64 KiB blocks over gRPC).
   ``--kills`` times: find the replica serving the reads (the one whose
   ``dis_block_reads_total`` grows), SIGKILL it, and measure the time from the kill until the
   first successful read that *started* after it (an upper bound: it includes one normal read);
   restart the replica and let it catch up before the next kill.  ``failover_stall_p99_ms``.
3. Exactness: the rows the reading client assembled across every failover are exactly the rows
   logged, each once (``exact``).

Last line: one JSON object with exactly the keys ``ratio``, ``failover_stall_p99_ms`` and
``exact``; the figures behind them are on the lines before it.

    .venv/bin/python bench/replicas.py [--rows 4000000] [--kills 6]
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

import numpy as np
import yaml

from _common import TRADE_SCHEMA, trade_table, wait_serving
from disd.client import connect
from disd.logger import IntradayLoggerBuilder
from support import BIN, Proc, free_port, free_port_pair, sample, scrape, start_dis_process, trade_rows
from support import write_dis_config

DAY = "2026-11-22"


class Replica:
    """A ``dis serve`` in its own directory (database, config, log), restartable."""

    def __init__(self, work: pathlib.Path, name: str, flush_ms: int = 100, checkpoint_ms: int = 30000) -> None:
        self.name = name
        self.dir = work / name
        self.dir.mkdir(parents=True)
        self.port = free_port_pair()
        self.metrics_port = free_port()
        self.config = write_dis_config(self.dir, self.port, self.metrics_port, flush_ms=flush_ms,
                                       checkpoint_ms=checkpoint_ms)
        self.proc: Proc | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "Replica":
        self.proc = start_dis_process(self.dir, self.config)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.alive():
            self.proc.terminate()

    def published(self) -> int:
        """Rows of Market.Trade this replica has published (0 while it is down)."""
        try:
            with connect(self.address, retry_s=0, timeout_s=5) as c:
                return sum(s.rows for s in c.locations("Market", "Trade"))
        except Exception:  # noqa: BLE001 - down or starting: nothing published for now
            return 0

    def block_reads(self) -> float:
        return sample(scrape(self.metrics_port), "dis_block_reads_total")


def write_routing(path: pathlib.Path, replicas: list[Replica]) -> pathlib.Path:
    path.write_text(yaml.safe_dump({"instances": [{
        "name": "market", "tables": ["Market.*"],
        "replicas": [{"name": r.name, "address": r.address, "http_address": f"127.0.0.1:{r.port + 1}"}
                     for r in replicas]}]}))
    return path


def start_tailer(work: pathlib.Path, name: str, routing: pathlib.Path, log_dir: pathlib.Path,
                 metrics_port: int | None = None) -> Proc:
    cfg = work / f"{name}.yaml"
    data = {"routing": str(routing), "log_dirs": [str(log_dir)], "state_dir": str(work / f"{name}-state"),
            "max_backoff_ms": 200}
    if metrics_port:
        data["metrics_port"] = metrics_port
    cfg.write_text(yaml.safe_dump(data))
    return Proc([str(BIN / "dis-tailer"), "--config", str(cfg)], work / f"{name}.log").start()


def logger(log_dir: pathlib.Path, ip: str):  # noqa: ANN201
    return (IntradayLoggerBuilder(str(TRADE_SCHEMA)).set_log_dir(str(log_dir)).set_internal_partition(ip)
            .set_column_partition_value(DAY).build())


# -- 1. ingestion ----------------------------------------------------------------------------------
def ingest_seconds(work: pathlib.Path, logs: pathlib.Path, n: int, replicas: int, run: int) -> float:
    """Seconds from the logs' arrival in the log directory of a running tailer until every
    replica of a fresh set has published ``n`` rows.  The tailer starts on an empty directory and
    the files are hard-linked in once it serves its metrics, so its start-up is not timed."""
    d = work / f"ingest-{replicas}-{run}"
    reps = [Replica(d, f"r{i + 1}").start() for i in range(replicas)]
    tailer = None
    try:
        routing = write_routing(d / "routing.yaml", reps)
        log_dir = d / "logs"
        log_dir.mkdir()
        metrics_port = free_port()
        tailer = start_tailer(d, "tailer", routing, log_dir, metrics_port)
        wait_serving(metrics_port, tailer)
        time.sleep(0.3)
        t0 = time.perf_counter()
        for f in sorted(logs.iterdir()):
            os.link(f, log_dir / f.name)
        while min(r.published() for r in reps) < n:
            time.sleep(0.02)
            if not tailer.alive():
                raise SystemExit("dis-tailer exited:\n" + tailer.log_text()[-2000:])
            if time.perf_counter() - t0 > 600:
                raise SystemExit(f"{replicas} replica(s) did not publish {n} rows in 600 s: "
                                 f"{[r.published() for r in reps]}")
        return time.perf_counter() - t0
    finally:
        if tailer is not None:
            tailer.terminate()
        for r in reps:
            r.stop()
        shutil.rmtree(d, ignore_errors=True)


# -- 2. failover -------------------------------------------------------------------------------------
class Reader(threading.Thread):
    """Reads the location in a loop through the routing file: rows from a little before what it
    has read up to the published end.  Rows are Size = row number, so every read checks what it
    re-reads; new rows are appended.  Records when each successful read started and ended."""

    OVERLAP = 256

    def __init__(self, routing: pathlib.Path) -> None:
        super().__init__(daemon=True)
        self.client = connect(routing=str(routing), retry_s=60)
        self.sizes: list[np.ndarray] = []
        self.seen = 0
        self.reads: list[tuple[float, float]] = []
        self.error: BaseException | None = None
        self.stopping = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                t0 = time.perf_counter()
                snaps = self.client.locations("Market", "Trade")
                if not snaps:
                    time.sleep(0.01)
                    continue
                snap = snaps[0]
                lo = max(0, min(self.seen, snap.rows) - self.OVERLAP)
                t = self.client.read_location(snap, ["Size"], lo, snap.rows)
                got = np.asarray(t.column("Size"))
                if len(got) != snap.rows - lo:
                    raise AssertionError(f"asked rows [{lo}, {snap.rows}), got {len(got)}")
                old = min(self.seen, snap.rows) - lo
                if not (got[:old] == np.arange(lo, lo + old)).all():
                    raise AssertionError(f"rows [{lo}, {lo + old}) read again differ from the first read")
                with self.lock:
                    if snap.rows > self.seen:
                        self.sizes.append(got[old:])
                        self.seen = snap.rows
                    self.reads.append((t0, time.perf_counter()))
                time.sleep(0.002)
        except BaseException as e:  # noqa: BLE001 - reported by the benchmark
            self.error = e

    def first_read_after(self, t: float) -> float | None:
        with self.lock:
            ends = [e for s, e in self.reads if s >= t]
        return ends[0] if ends else None

    def all_sizes(self) -> np.ndarray:
        with self.lock:
            return np.concatenate(self.sizes) if self.sizes else np.zeros(0, np.int32)


def serving(replicas: list[Replica], wait_s: float = 0.5) -> Replica:
    """The replica the reader's block reads go to now: whose ``dis_block_reads_total`` grows."""
    before = [r.block_reads() for r in replicas]
    time.sleep(wait_s)
    grew = [r.block_reads() - b for r, b in zip(replicas, before)]
    if max(grew) <= 0:
        raise SystemExit("no replica served a block read in 0.5 s: the reader is stuck")
    return replicas[int(np.argmax(grew))]


def failover(work: pathlib.Path, kills: int, rate: int) -> tuple[list[float], bool, int, str]:
    d = work / "failover"
    reps = [Replica(d, "r1", checkpoint_ms=1000).start(), Replica(d, "r2", checkpoint_ms=1000).start()]
    routing = write_routing(d / "routing.yaml", reps)
    log_dir = d / "logs"
    log_dir.mkdir()
    tailer = start_tailer(d, "tailer", routing, log_dir)
    lg = logger(log_dir, "live")
    logged = 0
    stop = threading.Event()

    def write() -> None:
        nonlocal logged
        per_tick = max(1, rate // 50)
        while not stop.is_set():
            lg.log_batch(trade_rows(logged, per_tick), atomic=True)
            logged += per_tick
            time.sleep(0.02)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    reader = Reader(routing)
    stalls: list[float] = []
    victims: list[str] = []
    try:
        reader.start()
        t_start = time.perf_counter()
        while reader.seen == 0:
            if reader.error or time.perf_counter() - t_start > 60:
                raise SystemExit(f"the reader read nothing in 60 s: {reader.error!r}")
            time.sleep(0.05)
        for _ in range(kills):
            time.sleep(1.0)
            victim = serving(reps)
            victims.append(victim.name)
            t_kill = time.perf_counter()
            victim.proc.kill9()
            deadline = t_kill + 70
            while (end := reader.first_read_after(t_kill)) is None:
                if reader.error or time.perf_counter() > deadline:
                    raise SystemExit(f"no read succeeded after killing {victim.name}: {reader.error!r}")
                time.sleep(0.001)
            stalls.append(end - t_kill)
            victim.start()
            other = next(r for r in reps if r is not victim)
            target = other.published()
            t_catch = time.perf_counter()
            while victim.published() < target:
                if time.perf_counter() - t_catch > 60:
                    raise SystemExit(f"{victim.name} did not catch up after its restart")
                time.sleep(0.05)
        stop.set()
        writer.join(10)
        lg.close()
        t_end = time.perf_counter()
        while reader.seen < logged and time.perf_counter() - t_end < 60:
            if reader.error:
                raise reader.error
            time.sleep(0.05)
        reader.stopping.set()
        reader.join(30)
        if reader.error:
            raise reader.error
        got = reader.all_sizes()
        exact = len(got) == logged and bool((got == np.arange(logged)).all())
        return stalls, exact, logged, ",".join(victims)
    finally:
        stop.set()
        reader.stopping.set()
        reader.client.close()
        tailer.terminate()
        for r in reps:
            r.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=4_000_000, help="rows of the ingestion phase (two locations)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each ingestion case (best taken)")
    ap.add_argument("--kills", type=int, default=6, help="replica kills of the failover phase")
    ap.add_argument("--live-rate", type=int, default=25_000, help="rows/s logged during the failover phase")
    args = ap.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-replicas-", dir=os.environ.get("BENCH_DIR")))
    try:
        log_dir = work / "logs"
        half = args.rows // 2
        table = trade_table(args.rows)
        for k, ip in enumerate(("bench1", "bench2")):
            lg = logger(log_dir, ip)
            for i in range(k * half, (k + 1) * half, 100_000):
                lg.log_batch(table.slice(i, min(100_000, (k + 1) * half - i)))
            lg.close()
        n = 2 * half
        one, two = [], []
        for run in range(args.repeat):
            one.append(ingest_seconds(work, log_dir, n, 1, run))
            two.append(ingest_seconds(work, log_dir, n, 2, run))
            print(f"run {run + 1}: one replica {one[-1]:.2f} s, two replicas {two[-1]:.2f} s", flush=True)
        rate1, rate2 = n / min(one), n / min(two)
        stalls, exact, logged, victims = failover(work, args.kills, args.live_rate)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ms = np.array(stalls) * 1000
    p50, p99 = float(np.percentile(ms, 50)), float(np.percentile(ms, 99))
    load = os.getloadavg()[0]
    print(f"ingestion of {n} rows (two locations), best of {args.repeat}: one replica {rate1 / 1e6:.2f} M rows/s, "
          f"two replicas {rate2 / 1e6:.2f} M rows/s (every row on both): ratio {rate2 / rate1:.2f}")
    print(f"failover: {len(stalls)} kills of the replica serving the reads ({victims}) while logging "
          f"{args.live_rate} rows/s; stall p50 {p50:.0f} ms, p99 {p99:.0f} ms, max {ms.max():.0f} ms "
          f"({', '.join(f'{x:.0f}' for x in ms)})")
    print(f"exactness: {logged} rows logged, read {'exactly once each' if exact else 'NOT exactly once'}")
    print(f"load average at the end: {load:.1f}")
    print(json.dumps({"ratio": round(rate2 / rate1, 4), "failover_stall_p99_ms": round(p99, 1), "exact": exact}))


if __name__ == "__main__":
    main()
