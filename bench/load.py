"""Load: many locations ingesting at once from several tailers while the client and Spark read.

A real ``dis serve`` (subprocess) and ``--tailers`` real ``dis-tailer`` processes, the log
directories split among them.  Market.Trade rows for ``--locations`` locations (internal
partitions x 5 dates).  The applications' side appends pre-encoded frames to each location's log
with plain writes (``bench/loadfeed.py``), not through 10,000 logger objects: the two cores
measure the tailers and the DIS, and the logger's own speed is ``bench/logger_batch.py``'s.  All
the while a client thread follows the table (``subscribe``, then reads each location's new rows)
and a local Spark session counts it with ``spark.read.format("dis")`` every few seconds.

``--locations N`` alone scales the run: above 1,000 locations the defaults are those of a scaling
run (100 rows a location in the burst, one row a location a tick live, no Spark, no floor phase,
samples every 2 s, the DIS's ``max_open_files`` from the descriptor limit; ``scale_defaults``), so
``--locations 10000`` runs 10,000 locations live; without flags it is the 200-location run.  The
bench raises its descriptor limit to the hard limit (the processes it starts inherit it) and
prints the descriptor and inotify limits the run needs (``limits_line``).

1. Burst: ``--rows`` rows are logged into staging directories while the tailers start on empty
   ones; once every tailer serves its metrics, the staged files are moved into the tailers'
   directories, and rows / time from the move until every row is published is the
   throughput (the processes' start-up left out, as in ``bench/pipeline.py``; before, the four
   tailers' Python start-up on two cores was a third of the burst's time).
2. Live: the feed writes ``--live-rate`` rows/s (every ``--tick`` s) for ``--live-seconds``
   while the tailers follow.  A separate sampler process (so a busy benchmark process cannot
   starve it) records every ``--sample`` s each location's published rows, the DIS's RSS and
   open descriptors and the tailers' RSS (and every ``--metrics-every`` s the DIS's column-file
   handles from its ``/metrics``, a page as long as its locations); each location's lag is the rows written to its
   log by then minus the rows published.  The lag is bounded when it shows no upward trend
   (median of the worst location's lag over the last third of the phase no higher than over the
   first two thirds plus one second of a location's rows) and drains within 5 s of the last
   write, and every location ends with exactly the rows logged for it.
3. Baseline, same run: a fresh DIS and one running tailer take the burst's rows in a single
   location, moved in the same way, followed by the same client as the burst (its reads of the
   rows cost the DIS as much in either phase; Spark, when on, counts during the burst only).
   ``ratio`` = load rows/s / baseline rows/s.  ``--baseline-readers none`` gives the baseline
   no readers, as this bench did before (the ratio is then also the follower's cost).

Both phases start on warm memory: just before each move a child process touches ``--warm-mib``
MiB (default 1024) and exits (``warm_memory``).  On this kind of virtual machine the host backs a
guest page on its first touch and takes freed pages back, so memory not used lately costs about
2 ns a byte the first time; the burst's processes grow by a few hundred MiB and its new column
files take 127 MB of page cache, and without the warming the burst paid for all of it while the
baseline, run right after the burst's processes exited, reused their pages (docs/benchmarks-history.md, the note
"warm memory, same readers").  ``--warm-mib 0`` measures as before.

4. Floor, same run: fresh processes take the burst's locations again with
   ``--floor-rows-per-location`` rows each (default 10; 0 skips the phase), moved in and followed
   in the same way.  The time to publish them is what the locations cost whatever their rows:
   the tailers finding them, their streams' opens, the locations' creation, a first chunk and
   flush each.  The burst does all of that and more, so ``ratio_floor_ceiling`` (the baseline's
   seconds over the floor's) bounds its ratio from above however cheap rows become; the JSON line
   adds ``floor_rows``, ``floor_s``, the floor's CPU per location over every process
   (``floor_cpu_ms_per_location``) and the DIS's (``floor_dis_cpu_ms_per_location``), and
   ``floor_first_rows_p50_s``.

Per-location latency: each location's first rows are timed from the move (a subscription notes
when each location first has rows), printed as p50/p90/last and in the JSON line
(``first_rows_p50_s``, ``first_rows_p90_s``, ``first_rows_last_s``).

Failing fast: while waiting for rows, no progress for ``--stall-s`` seconds, or a burst (or the drain after the live
phase) longer than ``--timeout-s``, ends the run with what the processes were doing (rows and
locations published, each process's RSS, threads and descriptors, the tailers' last stream
errors) and a last JSON line with ``failed``, ``ratio`` null and ``lag_bounded`` false.

Flush latency (p99) comes from the DIS's Prometheus histogram ``dis_flush_duration_seconds``
(per phase, interpolated inside buckets as PromQL's histogram_quantile does).  The memory bound
the DIS should respect is derived from its configuration and printed next to the measured peak:

    idle RSS + locations x column files x block size (each column file buffers at most one
    partial block) + block_cache_bytes + locations x max_in_flight_bytes (the most a tailer
    leaves unacknowledged per location: all gRPC can be holding for it) + decoding (a few chunks
    at once: cores x 3 copies x chunk_bytes)

Output: human lines, then one JSON line (``bench/_common.emit``): ``ratio`` and ``lag_bounded``, and
``locations``, ``dis_cpu_us_per_write`` and ``tailer_cpu_us_per_write`` (each process's CPU over
the live phase and its drain per location write) and ``new_location_ms`` (the burst's DIS CPU
beyond the baseline's, per location), among others.  Each thread's run time over the burst and
over the baseline (``bench/_burstcpu.py``, from ``/proc/<pid>/task/*/schedstat``) is printed per
process (the DIS, the tailers together, this process, the sampler) and thread name with the busiest
thread, and the burst's CPU beyond the baseline's per location and process
(``extra_cpu_ms_per_location_by_process``, ``burst_cpu_s_by_process``, ``baseline_cpu_s_by_process``,
``burst_busiest_thread_by_process``, ``burst_threads_cpu_s`` and the baseline's likewise).

The work directory (logs, databases, the processes' logs) is made under ``BENCH_DIR`` (else the
system's temporary directory): ``new_location_ms`` is mostly the kernel creating the locations'
files, and on an ext4 without a journal (this machine's root file system) that cost grows several-fold
with the files deleted lately near the directory (docs/benchmarks-history.md, "New locations on a
journaled file system"), so where the run goes is one of its conditions.

    [BENCH_DIR=DIR] PYSPARK_PYTHON=.venv/bin/python .venv/bin/python bench/load.py [--locations 200] [--rows N]
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import pathlib
import re
import resource
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import numpy as np
import psutil
import yaml

from _burstcpu import CpuWindow, PhaseCpu, merge
from _common import TRADE_SCHEMA, Published, emit, wait_serving, warm_memory
from disd.client import connect
from disd.schema import load_schema
from loadfeed import FrameFeed
from e2e_helpers import BIN, Proc, free_port, start_dis

DATES = ["2026-11-16", "2026-11-17", "2026-11-18", "2026-11-19", "2026-11-20"]
COLUMN_FILES = 5  # Market.Trade: Timestamp, Sym (offsets + data), Price, Size
MiB = 1 << 20
#: pool threads left for the readers' and sampler's calls (subscribe, listings, reads, Spark)
READER_RPCS = 64


# ------------------------------------------------------------------------------------------
# Processes


@dataclass
class Cluster:
    """A DIS and its tailers."""

    work: pathlib.Path
    port: int
    metrics_port: int
    dis: Proc
    tailers: list[Proc] = field(default_factory=list)

    @property
    def dis_ps(self) -> psutil.Process:
        return psutil.Process(self.dis.p.pid)

    def metrics(self) -> str:
        return urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read().decode()

    def processes(self) -> dict[str, int]:
        return {"dis": self.dis.p.pid} | {f"tailer{k}": t.p.pid for k, t in enumerate(self.tailers)}

    def stop(self, locations: int = 0) -> None:
        """Stop the tailers, then the DIS, whose stop checkpoints each of its ``locations`` (the
        fsyncs of five column files, a record and its directory each): at 10,000 locations on
        this shared disk that took over 60 s, so the DIS has 60 s and 20 ms a location."""
        for p in self.tailers:
            if p.alive():
                p.terminate(60)
        if self.dis.alive():
            self.dis.terminate(60 + 0.02 * locations)


def start_cluster(work: pathlib.Path, args: argparse.Namespace) -> Cluster:
    work.mkdir(parents=True, exist_ok=True)
    port, mport = free_port(), free_port()
    cfg = {
        "db_root": str(work / "db"),
        "schemas": str(pathlib.Path(TRADE_SCHEMA).parent),
        "server": {"host": "127.0.0.1", "port": port, "metrics_port": mport, "max_workers": args.max_workers},
        "storage": {"max_open_files": args.max_open_files, "block_cache_bytes": args.block_cache_mib * MiB},
        "import": {"default": {"flush_interval_ms": 100, "checkpoint_interval_ms": 30000}},
    }
    path = work / "dis.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return Cluster(work, port, mport, start_dis(work, path))


def start_tailer(c: Cluster, k: int, log_dir: pathlib.Path, args: argparse.Namespace) -> Proc:
    """A ``dis-tailer`` of ``log_dir`` (created empty if need be), once it serves its metrics."""
    log_dir.mkdir(parents=True, exist_ok=True)
    mport = free_port()
    cfg = {"dis": f"127.0.0.1:{c.port}", "log_dirs": [str(log_dir)], "state_dir": str(c.work / f"tailer{k}"),
           "chunk_bytes": args.chunk_bytes, "max_in_flight_bytes": args.max_in_flight_bytes, "poll_interval_ms": 100,
           "metrics_port": mport}
    path = c.work / f"tailer{k}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    p = Proc([str(BIN / "dis-tailer"), "--config", str(path)], c.work / f"tailer{k}.log").start()
    c.tailers.append(p)
    wait_serving(mport, p)
    return p


def move_logs(staged: pathlib.Path, watched: pathlib.Path) -> None:
    """Move every staged log of every tailer (``staged/tK``) into its watched directory
    (``watched/tK``): the files appear at once.  Moved, not linked: the feed keeps the files
    open and go on writing them in the live phase, and the kernel reports those writes (inotify)
    to the directory the file is in now; through a hard link they would be reported to the
    staging directory only."""
    for d in sorted(staged.iterdir()):
        for f in sorted(d.iterdir()):
            os.rename(f, watched / d.name / f.name)


def cpu_seconds(c: Cluster, sampler: int | None = None) -> dict[str, float]:
    """CPU seconds used so far by the DIS, the tailers (together), this process (the feed's writes,
    readers, Spark driver; Spark's JVM and Python workers are not counted) and, given its pid,
    the sampler process."""
    def used(pid: int) -> float:
        try:
            t = psutil.Process(pid).cpu_times()
            return t.user + t.system
        except psutil.Error:
            return 0.0

    out = {"dis": used(c.dis.p.pid), "tailers": sum(used(t.p.pid) for t in c.tailers), "bench": used(os.getpid())}
    if sampler is not None:
        out["sampler"] = used(sampler)
    return out


# ------------------------------------------------------------------------------------------
# Prometheus text


def histogram(text: str, name: str) -> tuple[list[float], list[float]]:
    """(upper bounds, cumulative counts) of a Prometheus histogram in exposition text."""
    pts = []
    for m in re.finditer(rf'^{name}_bucket{{[^}}]*le="([^"]+)"[^}}]*}} ([0-9.e+]+)$', text, re.M):
        pts.append((math.inf if m.group(1) == "+Inf" else float(m.group(1)), float(m.group(2))))
    pts.sort()
    return [p[0] for p in pts], [p[1] for p in pts]


def gauge(text: str, name: str) -> float | None:
    m = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M)
    return float(m.group(1)) if m else None


def quantile(q: float, bounds: list[float], cum: list[float]) -> float:
    """PromQL histogram_quantile: linear interpolation inside the bucket holding rank q."""
    if not cum or cum[-1] == 0:
        return float("nan")
    rank = q * cum[-1]
    prev_b, prev_c = 0.0, 0.0
    for b, c in zip(bounds, cum):
        if c >= rank:
            if math.isinf(b):
                return prev_b
            return prev_b + (b - prev_b) * ((rank - prev_c) / (c - prev_c) if c > prev_c else 1.0)
        prev_b, prev_c = b, c
    return bounds[-1]


def flush_p99(before: str, after: str) -> tuple[float, int]:
    """p99 of the flush durations observed between two scrapes, and how many there were."""
    b0, c0 = histogram(before, "dis_flush_duration_seconds")
    b1, c1 = histogram(after, "dis_flush_duration_seconds")
    if b0 != b1:
        c0 = [0.0] * len(c1)
    delta = [y - x for x, y in zip(c0, c1)]
    return quantile(0.99, b1, delta), int(delta[-1]) if delta else 0


# ------------------------------------------------------------------------------------------
# The sampler (a separate process)


def sample_process(port: int, metrics_port: int, pids: list[int], interval: float, metrics_every: float,
                   stop, out: str, ready) -> None:  # noqa: ANN001
    """At once, then every ``interval`` until ``stop`` is set, one JSON line to ``out``: the time (monotonic,
    taken after reading the published rows, so lags err high), published rows per location (kept
    by a subscription, ``Published``: the DIS pushes each change, where listing the table twice a
    second cost it a ``location_info`` per location each time, about a tenth of its CPU in the
    live phase at 1,000 locations and more at 10,000), the DIS's RSS,
    descriptors and each tailer's RSS; every ``metrics_every`` s, the column-file handles from the
    DIS's ``/metrics`` (not every sample: the page has a series per location and gauge, and
    rendering it twice a second for a thousand locations took a third of the DIS's interpreter
    time, which Prometheus scraping every 15 s does not).  ``ready`` is set once the first line
    is written: the bench moves the burst's files only then, so the burst does not share its
    cores with this process's start-up (an interpreter's imports, its subscription, its first
    ``/metrics``: up to a quarter of a CPU second, at times inside a 0.5 s burst, at times not)."""
    dis = psutil.Process(pids[0])
    tailers = [psutil.Process(p) for p in pids[1:]]
    scraped = -math.inf
    pub = Published(port)
    with open(out, "w") as f:
        while True:
            try:
                if pub.error:
                    raise RuntimeError(f"the sampler's subscription ended: {pub.error}")
                published = {f"{k.internal_partition}/{k.column_partition}": rows
                             for k, rows in list(pub.rows.items())}
                t = time.monotonic()
                handles = None
                if t - scraped >= metrics_every:
                    scraped = t
                    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
                    handles = gauge(text, "dis_open_file_handles") or 0
                rec = {"t": t, "published": published, "dis_rss": dis.memory_info().rss, "dis_fds": dis.num_fds(),
                       "dis_threads": dis.num_threads(), "handles": handles,
                       "tailer_rss": [p.memory_info().rss for p in tailers],
                       "tailer_threads": [p.num_threads() for p in tailers],
                       "tailer_fds": [p.num_fds() for p in tailers]}
            except Exception as e:  # noqa: BLE001 - recorded, sampling goes on
                rec = {"t": time.monotonic(), "error": repr(e)}
            f.write(json.dumps(rec) + "\n")
            f.flush()
            ready.set()
            if stop.wait(interval):
                break
    pub.close()


# ------------------------------------------------------------------------------------------
# Readers


class Readers:
    """A client following the table, and Spark counting it every ``spark_every`` seconds.

    The follower is two threads: one drains ``subscribe`` and keeps the newest snapshot per
    location, the other reads each location's rows from where it stopped up to its newest
    snapshot.  Reading per message instead would replay every intermediate size the stream has
    buffered (one read per flush per location) and fall further behind the busier it gets."""

    def __init__(self, port: int, spark, spark_every: float) -> None:  # noqa: ANN001
        self.port, self.spark, self.spark_every = port, spark, spark_every
        self.stop = threading.Event()
        self.rows_read = 0
        self.reads = 0
        self.seen: dict = {}  # location key -> rows read
        self.latest: dict = {}  # location key -> newest snapshot
        self.changed = threading.Condition()
        self.spark_counts: list[int] = []
        self.errors: list[str] = []
        self._client = connect(f"127.0.0.1:{port}")
        self.threads = [threading.Thread(target=self._subscribe, daemon=True),
                        threading.Thread(target=self._read, daemon=True)]
        if spark is not None:
            self.threads.append(threading.Thread(target=self._spark, daemon=True))

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _subscribe(self) -> None:
        try:
            for snap in self._client.subscribe("Market", "Trade"):
                with self.changed:
                    old = self.latest.get(snap.key)
                    if old is None or snap.rows > old.rows:
                        self.latest[snap.key] = snap
                        self.changed.notify()
            if not self.stop.is_set():  # the client ends a subscription quietly on CANCELLED
                self.errors.append(f"client: the subscription ended after {self.rows_read} rows")
        except Exception as e:  # noqa: BLE001
            if not self.stop.is_set():
                self.errors.append(f"client: {e!r}")

    def _read(self) -> None:
        while not self.stop.is_set():
            with self.changed:
                todo = [s for k, s in self.latest.items() if s.rows > self.seen.get(k, 0)]
                if not todo:
                    self.changed.wait(0.5)
                    continue
            for snap in todo:
                start = self.seen.get(snap.key, 0)
                try:
                    t = self._client.read_location(snap, start=start)
                except Exception as e:  # noqa: BLE001
                    if not self.stop.is_set():
                        self.errors.append(f"client: {e!r}")
                    return
                if t.num_rows != snap.rows - start:
                    self.errors.append(f"client: read {t.num_rows} rows of {snap.key}, expected {snap.rows - start}")
                self.seen[snap.key] = snap.rows
                self.rows_read += t.num_rows
                self.reads += 1

    def _spark(self) -> None:
        while not self.stop.wait(self.spark_every):
            try:
                df = (self.spark.read.format("dis").option("address", f"127.0.0.1:{self.port}")
                      .option("namespace", "Market").option("table", "Trade").option("columns", "Size").load())
                self.spark_counts.append(df.count())
            except Exception as e:  # noqa: BLE001
                self.errors.append(f"spark: {str(e)[:300]}")

    def wait_caught_up(self, total: int, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end and self.rows_read < total:
            time.sleep(0.05)
        return self.rows_read == total

    def finish(self) -> None:
        self.stop.set()
        self._client.close()
        for t in self.threads:
            t.join(120)


# ------------------------------------------------------------------------------------------
# Logging


def layout(locations: int) -> tuple[list[str], list[str]]:
    dates = DATES[: min(len(DATES), locations)]
    n_ips = math.ceil(locations / len(dates))
    if n_ips * len(dates) != locations:
        raise SystemExit(f"--locations must be a multiple of {len(dates)} (internal partitions x dates)")
    return [f"feed{i:03d}" for i in range(n_ips)], dates


def published_rows(port: int) -> dict[str, int]:
    with connect(f"127.0.0.1:{port}") as c:
        return {f"{loc.key.internal_partition}/{loc.key.column_partition}": loc.rows for loc in c.locations("Market", "Trade")}


def wait_published(c: Cluster, pub: Published, total: int, timeout: float, stall_s: float, locations: int,
                   t0: float | None = None) -> float:
    """Seconds from ``t0`` (now) until ``total`` rows are published; ends the run (``stalled``)
    when no row is published for ``stall_s`` seconds or ``timeout`` passes."""
    t0 = time.perf_counter() if t0 is None else t0
    last, last_t = -1, time.perf_counter()
    while True:
        rows, locs = pub.total()
        if rows >= total:
            return time.perf_counter() - t0
        now = time.perf_counter()
        if rows > last:
            last, last_t = rows, now
        if now - last_t > stall_s or now - t0 > timeout or pub.error:
            why = (f"the subscription counting published rows failed: {pub.error}" if pub.error
                   else f"no row published for {now - last_t:.0f} s" if now - last_t > stall_s
                   else f"not every row published within {timeout:.0f} s")
            stalled(c, why, rows, total, locs, locations, now - t0)
        time.sleep(0.005)


def process_figures(pid: int) -> str:
    try:
        p = psutil.Process(pid)
        return f"RSS {p.memory_info().rss / MiB:.0f} MiB, {p.num_threads()} threads, {p.num_fds()} descriptors"
    except psutil.Error as e:
        return f"gone ({e.__class__.__name__})"


def stalled(c: Cluster, why: str, rows: int, total: int, published_locs: int, locations: int,
            elapsed: float) -> None:
    """Exit with what the processes were doing when the rows stopped coming, and a last JSON
    line with the contract's keys (``ratio`` null, ``lag_bounded`` false) and ``failed``."""
    lines = [f"FAILED at {locations} locations: {why}; {rows} of {total} rows published, "
             f"{published_locs} of {locations} locations have rows; load average {os.getloadavg()[0]:.1f}; "
             f"machine threads {sum(p.num_threads() for p in psutil.process_iter() if _alive(p))}"]
    for name, pid in c.processes().items():
        lines.append(f"  {name} (pid {pid}): {process_figures(pid)}")
    errors: dict[str, int] = {}
    for k in range(len(c.tailers)):
        for line in (c.work / f"tailer{k}.log").read_text(errors="replace").splitlines():
            if '"error"' in line and ("failed" in line or "refused" in line):
                try:
                    e = json.loads(line).get("error", "")
                except ValueError:
                    continue
                errors[e[:160]] = errors.get(e[:160], 0) + 1
    if errors:
        lines.append("  tailers' stream errors (count): " + "; ".join(f"{v}x {k}" for k, v in
                                                                      sorted(errors.items(), key=lambda x: -x[1])[:3]))
    print("\n".join(lines), flush=True)

    def rss(pid: int) -> float | None:
        try:
            return psutil.Process(pid).memory_info().rss / MiB
        except psutil.Error:
            return None

    def threads(pid: int) -> int | None:
        try:
            return psutil.Process(pid).num_threads()
        except psutil.Error:
            return None

    pids = c.processes()
    emit("load", rows / elapsed if elapsed > 0 else 0.0, "rows/s", 0.0, failed=why, locations=locations,
         rss_mib=rss(pids["dis"]), rss_bound_mib=None, lag_bounded=False, complete=False, published_rows=rows,
         rows=total, published_locations=published_locs, dis_threads=threads(pids["dis"]),
         tailer_threads=sum(t or 0 for t in (threads(p) for n, p in pids.items() if n != "dis")),
         load_average=os.getloadavg()[0])
    raise SystemExit(1)


def _alive(p: psutil.Process) -> bool:
    try:
        p.num_threads()
        return True
    except psutil.Error:
        return False


# ------------------------------------------------------------------------------------------


#: Above this many locations a run is a scaling run: the defaults below change (``scale_defaults``).
SCALE_LOCATIONS = 1000


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--locations", type=int, default=200, help="internal partitions x 5 dates")
    ap.add_argument("--rows", type=int, default=None,
                    help="rows of the burst (and of the baseline); default 4,000,000, or 100 a location above "
                         f"{SCALE_LOCATIONS} locations")
    ap.add_argument("--tailers", type=int, default=4)
    ap.add_argument("--live-seconds", type=float, default=30.0)
    ap.add_argument("--live-rate", type=int, default=None,
                    help="rows/s written in the live phase, all locations together; default 50,000, or one row a "
                         f"location a tick above {SCALE_LOCATIONS} locations")
    ap.add_argument("--tick", type=float, default=1.0, help="seconds between the live phase's writes")
    ap.add_argument("--sample", type=float, default=None,
                    help=f"seconds between samples (default 0.5; 2 above {SCALE_LOCATIONS} locations)")
    ap.add_argument("--metrics-every", type=float, default=15.0,
                    help="seconds between the sampler's reads of the DIS's /metrics (column-file handles)")
    ap.add_argument("--spark-every", type=float, default=5.0, help="seconds between Spark counts")
    ap.add_argument("--max-open-files", type=int, default=None,
                    help="the DIS's storage.max_open_files (default 512, or above "
                         f"{SCALE_LOCATIONS} locations as many as the process's descriptor limit leaves room for, "
                         "at most one per column file)")
    ap.add_argument("--block-cache-mib", type=int, default=64)
    ap.add_argument("--max-workers", type=int, default=512, help="the DIS's server.max_workers")
    ap.add_argument("--stall-s", type=float, default=None,
                    help=f"end the run when no row is published this long (default 60; 180 above {SCALE_LOCATIONS})")
    ap.add_argument("--timeout-s", type=float, default=None,
                    help="end the run when the burst, or the drain after the live phase, takes longer (default "
                         f"120; 900 above {SCALE_LOCATIONS})")
    ap.add_argument("--chunk-bytes", type=int, default=1 * MiB)
    ap.add_argument("--max-in-flight-bytes", type=int, default=2 * MiB)
    ap.add_argument("--warm-mib", type=int, default=1024,
                    help="before each phase's move, a child process touches this many MiB and exits, so both "
                         "phases start on memory the machine has backed (0: off; see the module's docstring)")
    ap.add_argument("--baseline-readers", choices=["follower", "none"], default="follower",
                    help="follower: the baseline's location is followed by the same client as the burst's, so the "
                         "two phases differ only in their locations (Spark, when on, counts during the burst only); "
                         "none: the baseline without readers, as before")
    ap.add_argument("--floor-rows-per-location", type=int, default=None,
                    help="the floor phase's rows per location (0: no floor phase; see the module's docstring); "
                         f"default 10, or 0 above {SCALE_LOCATIONS} locations")
    spark = ap.add_mutually_exclusive_group()
    spark.add_argument("--no-spark", dest="spark", action="store_false", default=None)
    spark.add_argument("--spark", dest="spark", action="store_true",
                       help=f"Spark counts the table during the burst (the default up to {SCALE_LOCATIONS} locations)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, databases, process logs)")
    return ap.parse_args()


def scale_defaults(args: argparse.Namespace, locations: int) -> None:
    """Fill the options left unset: today's 200-location run's values, or above
    ``SCALE_LOCATIONS`` locations those of a scaling run, so that ``--locations 10000`` alone runs
    10,000 locations live: 100 rows a location in the burst, one row a location a tick, samples
    every 2 s, no Spark and no floor phase (each would add a run as long as the burst), the longer
    limits such a run needs, and the DIS's ``max_open_files`` as high as the descriptor limit
    allows (raised to its hard limit first: ``raise_open_files``)."""
    big = locations > SCALE_LOCATIONS
    if args.rows is None:
        args.rows = 100 * locations if big else 4_000_000
    if args.live_rate is None:
        args.live_rate = locations if big else 50_000
    if args.sample is None:
        args.sample = 2.0 if big else 0.5
    if args.stall_s is None:
        args.stall_s = 180.0 if big else 60.0
    if args.timeout_s is None:
        args.timeout_s = 900.0 if big else 120.0
    if args.floor_rows_per_location is None:
        args.floor_rows_per_location = 0 if big else 10
    if args.spark is None:
        args.spark = not big
    if args.max_open_files is None:
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        # room for the DIS's sockets, the locations' directories and checkpoints, the readers
        args.max_open_files = max(512, min(COLUMN_FILES * locations, nofile - 4096)) if big else 512


def raise_open_files() -> int:
    """Raise this process's soft descriptor limit to its hard limit (the DIS and the tailers,
    started from here, inherit it): at 10,000 locations the bench holds a log file open per
    location, the tailers one per location they follow, and the DIS up to ``max_open_files``
    column files.  Returns the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def limits_line(args: argparse.Namespace, locations: int) -> None:
    """Print the limits a run of ``locations`` needs against the machine's: descriptors (the
    bench's log files, a tailer's followed files, the DIS's column files) and inotify (one
    instance and a watch per tailer; a tick's events must fit the queue)."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]

    def proc(name: str) -> int | None:
        try:
            return int(pathlib.Path("/proc/sys/fs/inotify", name).read_text())
        except (OSError, ValueError):
            return None

    queued = proc("max_queued_events")
    per_tailer = math.ceil(locations / args.tailers)
    print(f"limits: descriptors {nofile} per process (the bench holds {locations} log files, each tailer follows "
          f"up to {per_tailer}, the DIS max_open_files {args.max_open_files}); inotify instances "
          f"{proc('max_user_instances')}, watches {proc('max_user_watches')}, queued events {queued} (a tick "
          f"appends to {per_tailer} files per tailer; an overflow costs a rescan)")
    if locations + 256 > nofile:
        raise SystemExit(f"{locations} locations need more descriptors than this process may open ({nofile}): "
                         "raise the hard limit (ulimit -Hn)")


@dataclass
class CpuLimits:
    """What this machine's cores allow at the CPU the run's processes used (the DIS, the
    tailers, this process and the sampler; Spark's JVM is not counted, so with Spark the true
    limits are lower still).

    A phase cannot end sooner than its processes' CPU seconds spread perfectly over every core,
    so ``ratio_cpu_ceiling`` (the baseline's seconds over that shortest burst) bounds the ratio
    from above: a ratio near it says the burst was bound by CPU, not by waiting, and only less
    CPU per location can raise it.  The DIS, whose interpreter runs one thread at a time, bounds
    both phases: ``dis_cpu_ms_per_location_at_0_8`` is the most DIS CPU a location may add to the
    baseline's if the burst is to reach 0.8 with the DIS on one core.  Likewise the live phase's
    CPU per location write, over all processes, sets the most location writes per second these cores carry
    (``live_writes_per_s_ceiling``), and the DIS's share alone the most it could take with every
    core to itself (``dis_live_writes_per_s_ceiling``).  That CPU covers the live phase and its
    drain, idle work included (clocks, the sampler, the follower's waiting), so well below the
    machine's capacity it overstates a write's cost and the ceilings are low; near it (the 10,000
    locations of docs/benchmarks-history.md) they are what the run could not exceed."""

    cores: int
    burst_cpu_s: float
    baseline_cpu_s: float
    baseline_s: float
    live_writes: int
    live_s: float
    cpu_window_s: float  # the live phase and its drain: the seconds its CPU was measured over
    asked_writes_per_s: float
    live_cpu_ms_per_write: float
    dis_live_cpu_ms_per_write: float
    dis_baseline_cpu_s: float
    locations: int

    @property
    def ratio_ceiling(self) -> float:
        return self.baseline_s * self.cores / self.burst_cpu_s if self.burst_cpu_s > 0 else math.inf

    def cpu_allowed(self, ratio: float) -> float:
        """The CPU seconds a burst may use to reach ``ratio`` on these cores."""
        return self.cores * self.baseline_s / ratio

    def dis_ms_per_location_allowed(self, ratio: float) -> float:
        """The most DIS CPU per location a burst can spend and reach ``ratio`` while the DIS runs
        on one core: its interpreter runs one thread at a time, and both phases are bound by it
        (docs/benchmarks-history.md, the note "the floor").  Compare the floor's DIS CPU per location, and
        ``bench/location_path.py``'s ingest path alone.  Negative: even no locations could not."""
        return 1000 * (self.baseline_s / ratio - self.dis_baseline_cpu_s) / self.locations

    def writes_ceiling(self, ms_per_write: float) -> float:
        return self.cores * 1000 / ms_per_write if ms_per_write > 0 else math.inf

    def line(self, live: bool) -> str:
        text = (f"limits on {self.cores} cores: the burst's processes used {self.burst_cpu_s:.2f} CPU s (the "
                f"baseline's {self.baseline_cpu_s:.2f}), so the ratio cannot exceed {self.ratio_ceiling:.2f} at that "
                f"CPU; 0.8 needs the burst to use at most {self.cpu_allowed(0.8):.2f} CPU s, and the DIS, on one core, "
                f"at most {self.dis_ms_per_location_allowed(0.8):.2f} ms per location beyond the baseline's "
                f"{self.dis_baseline_cpu_s:.2f} s")
        if live:
            text += (f"; live: {self.live_cpu_ms_per_write:.3f} ms of CPU per location write over all processes "
                     f"carries at most {self.writes_ceiling(self.live_cpu_ms_per_write):.0f} location writes/s "
                     f"(the DIS's {self.dis_live_cpu_ms_per_write:.3f} ms alone, with every core: "
                     f"{self.writes_ceiling(self.dis_live_cpu_ms_per_write):.0f}/s); asked "
                     f"{self.asked_writes_per_s:.0f}/s, made {self.live_writes / self.live_s:.0f}/s, published "
                     f"{self.live_writes / self.cpu_window_s:.0f}/s from the phase's start to the drain's end")
        return text

    def figures(self) -> dict:
        """The JSON line's keys (None for a figure the run did not measure)."""
        live = self.live_writes > 0
        figures = {"cpu_s_burst": self.burst_cpu_s, "cpu_s_baseline": self.baseline_cpu_s,
                   "ratio_cpu_ceiling": self.ratio_ceiling,
                   "dis_cpu_ms_per_location_at_0_8": self.dis_ms_per_location_allowed(0.8),
                   "cpu_ms_per_write": self.live_cpu_ms_per_write if live else None,
                   "live_writes_per_s_asked": self.asked_writes_per_s if live else None,
                   "live_writes_per_s": self.live_writes / self.live_s if live and self.live_s > 0 else None,
                   "live_writes_published_per_s": self.live_writes / self.cpu_window_s if live else None,
                   "live_writes_per_s_ceiling": self.writes_ceiling(self.live_cpu_ms_per_write) if live else None,
                   "dis_live_writes_per_s_ceiling":
                       self.writes_ceiling(self.dis_live_cpu_ms_per_write) if live else None}
        return {k: None if v is not None and math.isinf(v) else v for k, v in figures.items()}


def cpu_limits(cpu0: dict, cpu1: dict, cpu2: dict, bcpu0: dict, bcpu1: dict, baseline_s: float, live_writes: int,
               live_s: float, drain_s: float, asked_writes_per_s: float, cores: int, locations: int) -> CpuLimits:
    """The run's CPU (``cpu_seconds`` before and after the burst, after the live phase's drain,
    before and after the baseline) as ``CpuLimits``."""
    def spent(a: dict, b: dict, key: str | None = None) -> float:
        return sum(b[k] - a[k] for k in a if key is None or k == key)

    per_write = 1000 / max(1, live_writes)
    return CpuLimits(cores=cores, burst_cpu_s=spent(cpu0, cpu1), baseline_cpu_s=spent(bcpu0, bcpu1),
                     baseline_s=baseline_s, live_writes=live_writes, live_s=live_s,
                     cpu_window_s=live_s + drain_s, asked_writes_per_s=asked_writes_per_s,
                     live_cpu_ms_per_write=spent(cpu1, cpu2) * per_write,
                     dis_live_cpu_ms_per_write=spent(cpu1, cpu2, "dis") * per_write,
                     dis_baseline_cpu_s=spent(bcpu0, bcpu1, "dis"), locations=locations)


@dataclass
class Floor:
    """The floor phase: the burst's locations with a handful of rows each (``run_floor``)."""

    rows: int
    seconds: float
    cpu_s: float  # every process of the phase (as the burst's ``cpu_s_burst``)
    dis_cpu_s: float
    first_rows_p50_s: float
    cpu_by_process: dict[str, float]  # CPU seconds: the DIS, the tailers together, this process

    def figures(self, locations: int, baseline_s: float) -> dict:
        return {"floor_rows": self.rows, "floor_s": self.seconds,
                # the burst must at least open its locations: no run can beat this ratio
                "ratio_floor_ceiling": round(baseline_s / self.seconds, 4),
                "floor_cpu_ms_per_location": 1000 * self.cpu_s / locations,
                "floor_dis_cpu_ms_per_location": 1000 * self.dis_cpu_s / locations,
                "floor_first_rows_p50_s": self.first_rows_p50_s}


def run_floor(work: pathlib.Path, args: argparse.Namespace, ips: list[str], dates: list[str],
              clusters: list[Cluster]) -> Floor:
    """The burst again on a fresh DIS and fresh tailers, followed by the same client, with
    ``--floor-rows-per-location`` rows per location: the time to publish them is what the
    burst's locations cost whatever their rows (the tailers finding them, their streams' opens,
    the locations' creation, the first chunk and flush), so ``baseline_s / floor_s`` bounds the
    burst's ratio from above."""
    f = start_cluster(work, args)
    clusters.append(f)
    feed = FrameFeed(work / "staged", load_schema(TRADE_SCHEMA), ips, dates, args.tailers)
    feed.log(args.floor_rows_per_location * len(dates))
    feed.close()
    rows = args.floor_rows_per_location * len(ips) * len(dates)
    for k in range(args.tailers):
        start_tailer(f, k, work / "logs" / f"t{k}", args)
    readers = Readers(f.port, None, args.spark_every)
    readers.start()
    pub = Published(f.port)
    warm_memory(args.warm_mib)
    cpu0 = cpu_seconds(f)
    t0 = time.perf_counter()
    move_logs(work / "staged", work / "logs")
    seconds = wait_published(f, pub, rows, args.timeout_s, args.stall_s, len(ips) * len(dates), t0)
    cpu1 = cpu_seconds(f)
    first = np.array([t - t0 for t in pub.first.values()]) if pub.first else np.zeros(1)
    pub.close()
    caught_up = readers.wait_caught_up(rows, 60)
    readers.finish()
    if not caught_up or readers.errors:
        raise SystemExit(f"the floor's follower read {readers.rows_read} of {rows} rows; errors: {readers.errors[:3]}")
    f.stop()
    spent = {k: cpu1[k] - cpu0[k] for k in cpu0}
    return Floor(rows=rows, seconds=seconds, cpu_s=sum(spent.values()), dis_cpu_s=spent["dis"],
                 first_rows_p50_s=float(np.percentile(first, 50)), cpu_by_process=spent)


def main() -> None:  # one linear script
    args = parse_args()
    raise_open_files()
    load_avg = os.getloadavg()[0]  # the machine may be shared: say how busy it was
    ips, dates = layout(args.locations)
    streams = len(ips) * len(dates)
    scale_defaults(args, streams)
    limits_line(args, streams)
    work = pathlib.Path(tempfile.mkdtemp(prefix="dis-load-", dir=os.environ.get("BENCH_DIR")))
    spark = None
    clusters: list[Cluster] = []
    sampler = None
    stop_sampling = mp.get_context("spawn").Event()
    try:
        if args.spark:
            import disd.spark

            t0 = time.perf_counter()
            spark = disd.spark.session(app_name="dis-load", conf={"spark.ui.enabled": "false",
                                                                  "spark.ui.showConsoleProgress": "false"})
            spark.sparkContext.setLogLevel("ERROR")
            print(f"spark session up in {time.perf_counter() - t0:.1f} s")
        c = start_cluster(work / "load", args)
        clusters.append(c)
        time.sleep(1.0)
        idle_rss, idle_fds = c.dis_ps.memory_info().rss, c.dis_ps.num_fds()
        feed = FrameFeed(work / "load" / "staged", load_schema(TRADE_SCHEMA), ips, dates, args.tailers)

        # -- 1. burst ------------------------------------------------------------------------
        per_ip = args.rows // len(ips)
        t0 = time.perf_counter()
        feed.log(per_ip)
        # the live phase's writes: one pre-encoded frame per location and tick (loadfeed)
        rows_per_write = max(1, round(args.live_rate * args.tick / streams))
        feed.prepare_live(rows_per_write)
        log_s = time.perf_counter() - t0
        burst_rows = per_ip * len(ips)
        for k in range(args.tailers):
            start_tailer(c, k, work / "load" / "logs" / f"t{k}", args)
        readers = Readers(c.port, spark, args.spark_every)
        readers.start()
        samples_path = work / "samples.jsonl"
        sampler_ready = mp.get_context("spawn").Event()
        sampler = mp.get_context("spawn").Process(
            target=sample_process, daemon=True,
            args=(c.port, c.metrics_port, [c.dis.p.pid] + [t.p.pid for t in c.tailers], args.sample,
                  args.metrics_every, stop_sampling,
                  str(samples_path), sampler_ready))
        sampler.start()
        if not sampler_ready.wait(120):
            raise SystemExit("the sampler process took no first sample in 120 s")
        pub = Published(c.port)
        warm_memory(args.warm_mib)
        m0, cpu0 = c.metrics(), cpu_seconds(c, sampler.pid)
        burst_threads = CpuWindow(c.processes() | {"bench": os.getpid(), "sampler": sampler.pid})
        burst_threads.start()
        t_burst = time.perf_counter()
        move_logs(work / "load" / "staged", work / "load" / "logs")
        burst_s = wait_published(c, pub, burst_rows, args.timeout_s, args.stall_s, streams, t_burst)
        burst_cpu = merge(burst_threads.stop(), "tailers", "tailer")
        m1, cpu1 = c.metrics(), cpu_seconds(c, sampler.pid)
        # per location: seconds from the move until its first rows were published (a location's
        # latency through the tailer finding it, its stream's open, the location's creation,
        # the first chunk, and the caught-up flush)
        first_rows = np.sort(np.array([t - t_burst for t in pub.first.values()])) if pub.first else np.zeros(1)
        if args.keep:  # wall-clock times, to line up with the processes' logs
            wall = time.time() - time.perf_counter()
            (work / "first_rows.json").write_text(json.dumps(
                {"moved": wall + t_burst, "first": {str(k): wall + t for k, t in pub.first.items()}}))
        burst_rate = burst_rows / burst_s
        burst_p99, burst_flushes = flush_p99(m0, m1)

        # -- 2. live -------------------------------------------------------------------------
        t_live = time.monotonic()
        ticks = late = 0
        while time.monotonic() - t_live < args.live_seconds:
            feed.tick()
            ticks += 1
            delay = t_live + ticks * args.tick - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                late += 1
        t_live_end = time.monotonic()
        live_s = t_live_end - t_live
        live_rows = ticks * rows_per_write * streams
        total = burst_rows + live_rows
        drain_s = wait_published(c, pub, total, args.timeout_s, args.stall_s, streams)
        m2, cpu2 = c.metrics(), cpu_seconds(c, sampler.pid)
        live_p99, live_flushes = flush_p99(m1, m2)
        pub.close()
        caught_up = readers.wait_caught_up(total, 60)
        if not caught_up:
            final_now = published_rows(c.port)
            behind = {f"{k.internal_partition}/{k.column_partition}": (v, final_now.get(
                f"{k.internal_partition}/{k.column_partition}")) for k, v in readers.seen.items()
                if v != final_now.get(f"{k.internal_partition}/{k.column_partition}")}
            print(f"the follower did not catch up: {len(behind)} locations behind (read, published): "
                  f"{dict(list(behind.items())[:10])}")
        time.sleep(args.sample * 2)
        stop_sampling.set()
        sampler.join(30)
        readers.finish()
        feed.close()
        final = published_rows(c.port)
        expected = dict(zip(feed.location_names(), feed.logged_at(np.array([math.inf]))[0].tolist()))
        complete = final == expected
        final_count = None
        if spark is not None:
            final_count = (spark.read.format("dis").option("address", f"127.0.0.1:{c.port}")
                           .option("namespace", "Market").option("table", "Trade").option("columns", "Size").load()
                           .count())
        c.stop(streams)

        # -- 3. baseline: the burst's rows in one location, one tailer, the same follower -----
        b = start_cluster(work / "base", args)
        clusters.append(b)
        bfeed = FrameFeed(work / "base" / "staged", load_schema(TRADE_SCHEMA), ["single"], dates[:1], 1)
        for i in range(0, burst_rows, 500_000):
            bfeed.log(min(500_000, burst_rows - i))
        bfeed.close()
        start_tailer(b, 0, work / "base" / "logs" / "t0", args)
        bpub = Published(b.port)
        breaders = None
        if args.baseline_readers == "follower":
            breaders = Readers(b.port, None, args.spark_every)
            breaders.start()
        warm_memory(args.warm_mib)
        bcpu0 = cpu_seconds(b)
        base_threads = CpuWindow(b.processes() | {"bench": os.getpid()})
        base_threads.start()
        t_base = time.perf_counter()
        move_logs(work / "base" / "staged", work / "base" / "logs")
        base_s = wait_published(b, bpub, burst_rows, args.timeout_s, args.stall_s, 1, t_base)
        phase_cpu = PhaseCpu(burst_cpu, merge(base_threads.stop(), "tailers", "tailer"), streams)
        bcpu1 = cpu_seconds(b)
        if breaders is not None:
            base_caught_up = breaders.wait_caught_up(burst_rows, 60)
            breaders.finish()
            if not base_caught_up or breaders.errors:
                raise SystemExit(f"the baseline's follower read {breaders.rows_read} of {burst_rows} rows; "
                                 f"errors: {breaders.errors[:3]}")
        bpub.close()
        base_rate = burst_rows / base_s
        b.stop()

        # -- 4. floor: the burst's locations with a handful of rows each ---------------------
        floor = run_floor(work / "floor", args, ips, dates, clusters) if args.floor_rows_per_location > 0 else None
        samples = [json.loads(line) for line in samples_path.read_text().splitlines()]
    finally:
        stop_sampling.set()
        if sampler is not None and sampler.is_alive():
            sampler.terminate()
        if spark is not None:
            spark.stop()
        for cl in clusters:
            try:
                cl.stop()
            except Exception:  # noqa: BLE001
                pass
        if args.keep:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    # -- analysis ----------------------------------------------------------------------------
    good = [s for s in samples if "error" not in s]
    sample_errors = [s["error"] for s in samples if "error" in s]
    names = feed.location_names()
    live = [s for s in good if t_live <= s["t"] <= t_live_end]
    times = np.array([s["t"] for s in live])
    logged = feed.logged_at(times)
    pub = np.array([[s["published"].get(n, 0) for n in names] for s in live], np.int64).reshape(len(live), len(names))
    lags = logged - pub  # per sample x location
    worst = lags.max(axis=1) if len(live) else np.zeros(1, np.int64)
    third = max(1, len(worst) // 3)
    early = float(np.median(worst[: 2 * third])) if len(worst) else 0.0
    late_median = float(np.median(worst[2 * third:])) if len(worst) > 2 * third else early
    lag_limit = early + args.live_rate / streams
    bounded = late_median <= lag_limit and drain_s < 5.0 and complete
    all_lags = lags.ravel() if lags.size else np.zeros(1, np.int64)
    peak_rss = max(s["dis_rss"] for s in good)
    peak_fds = max(s["dis_fds"] for s in good)
    peak_handles = max((s["handles"] for s in good if s["handles"] is not None), default=0)
    tailer_peak = max((max(s["tailer_rss"]) for s in good if s["tailer_rss"]), default=0)
    dis_threads = max(s["dis_threads"] for s in good)
    tailer_threads = max(sum(s["tailer_threads"]) for s in good)
    tailer_fds = max(sum(s["tailer_fds"]) for s in good)
    buffers = streams * COLUMN_FILES * 65536
    in_flight = streams * args.max_in_flight_bytes
    decode = (os.cpu_count() or 1) * 3 * args.chunk_bytes
    bound = idle_rss + buffers + args.block_cache_mib * MiB + in_flight + decode
    live_rate = live_rows / live_s if live_s > 0 else 0.0
    # every tick writes once to every location: the tailers' CPU of the live phase (and its
    # drain) per such write
    tailer_ms_per_write = (cpu2["tailers"] - cpu1["tailers"]) * 1000 / max(1, ticks * streams)
    limits = cpu_limits(cpu0, cpu1, cpu2, bcpu0, bcpu1, base_s, ticks * streams, live_s, drain_s,
                        streams / args.tick, os.cpu_count() or 1, streams)
    dis_ms_per_write = limits.dis_live_cpu_ms_per_write
    # what a new location costs the DIS: the burst's DIS CPU beyond the baseline's, which took
    # the same rows into one location and was followed by the same client
    new_location_ms = 1000 * ((cpu1["dis"] - cpu0["dis"]) - (bcpu1["dis"] - bcpu0["dis"])) / streams

    def cpu_line(a: dict, b: dict, secs: float) -> str:
        return ", ".join(f"{k} {(b[k] - a[k]) / secs:.2f}" for k in a)

    print(f"locations={streams} ({len(ips)} internal partitions x {len(dates)} dates)  tailers={args.tailers}  "
          f"spark={'on' if spark is not None else 'off'}  samples={len(good)} ({len(live)} live)  "
          f"cores={os.cpu_count()}  load average at start {load_avg:.1f}, at end {os.getloadavg()[0]:.1f}")
    print(f"burst: {burst_rows} rows logged in {log_s:.2f} s, published {burst_s:.2f} s after the move: "
          f"{burst_rate / 1e6:.3f} M rows/s; flush p99 {burst_p99 * 1000:.1f} ms over {burst_flushes} flushes")
    print(f"locations' first rows published after the move: p50 {np.percentile(first_rows, 50):.2f} s, p90 "
          f"{np.percentile(first_rows, 90):.2f} s, last {first_rows[-1]:.2f} s ({len(first_rows)} locations)")
    print(f"live: {live_rows} rows over {live_s:.1f} s ({live_rate / 1e3:.0f} k rows/s; {late} of {ticks} writes "
          f"late), all published {drain_s:.2f} s after the last write; flush p99 {live_p99 * 1000:.1f} ms over "
          f"{live_flushes} flushes")
    live_cpu = cpu_line(cpu1, cpu2, live_s + drain_s) if ticks else "no live phase"
    print(f"CPU (cores busy) burst: {cpu_line(cpu0, cpu1, burst_s)}; live: {live_cpu}; "
          f"baseline: {cpu_line(bcpu0, bcpu1, base_s)}")
    print(f"DIS's CPU per location write, live: {dis_ms_per_write:.3f} ms; tailers' {tailer_ms_per_write:.3f} ms "
          f"({ticks * streams} writes: "
          f"{ticks} ticks x {streams} locations)")
    print(f"a new location, the DIS's CPU beyond the baseline's (the same rows in one location): "
          f"{new_location_ms:.3f} ms")
    print(limits.line(ticks > 0))
    print("\n".join(phase_cpu.lines()))
    print(f"lag (rows logged - published) per location, live: p50 {np.percentile(all_lags, 50):.0f}, p99 "
          f"{np.percentile(all_lags, 99):.0f}, max {all_lags.max():.0f} (a location gets "
          f"{args.live_rate / streams:.0f} rows/s); worst location, median over the first two thirds {early:.0f}, "
          f"last third {late_median:.0f} (limit {lag_limit:.0f}): {'bounded' if bounded else 'NOT bounded'}; "
          f"every location exact at the end: {complete}")
    print(f"worst location's lag per sample ({args.sample:g} s apart): {' '.join(str(int(w)) for w in worst)}")
    print(f"DIS RSS: idle {idle_rss / MiB:.0f} MiB, peak {peak_rss / MiB:.0f} MiB; bound {bound / MiB:.0f} MiB = idle "
          f"+ {streams}x{COLUMN_FILES}x64 KiB buffers ({buffers / MiB:.0f}) + block cache ({args.block_cache_mib}) "
          f"+ {streams}x{args.max_in_flight_bytes / MiB:g} MiB in flight ({in_flight / MiB:.0f}) "
          f"+ decoding {os.cpu_count()}x3x{args.chunk_bytes / MiB:g} MiB ({decode / MiB:.0f})")
    print(f"DIS descriptors: idle {idle_fds}, peak {peak_fds}; column-file handles peak {peak_handles:.0f} "
          f"(max_open_files {args.max_open_files}, column files {streams * COLUMN_FILES})")
    print(f"tailer RSS peak {tailer_peak / MiB:.0f} MiB (the largest of {args.tailers}); threads peak: DIS "
          f"{dis_threads}, tailers {tailer_threads} together; tailers' descriptors peak {tailer_fds} together")
    print(f"readers: client followed {readers.rows_read} rows in {readers.reads} reads (caught up: {caught_up}); "
          f"spark {len(readers.spark_counts)} counts during the load, final count {final_count} of {total}; "
          f"errors {len(readers.errors) + len(sample_errors)}"
          + (f" (first: {(readers.errors + sample_errors)[0]})" if readers.errors or sample_errors else ""))
    print(f"memory warmed before each phase: {args.warm_mib} MiB" if args.warm_mib else "memory not warmed")
    print(f"baseline: {burst_rows} rows in one location, one tailer, "
          f"{'followed by the client' if args.baseline_readers == 'follower' else 'no readers'}: {base_s:.2f} s, "
          f"{base_rate / 1e6:.2f} M rows/s; load/baseline ratio {burst_rate / base_rate:.2f}")
    floor_figures = dict.fromkeys(("floor_rows", "floor_s", "ratio_floor_ceiling", "floor_cpu_ms_per_location",
                                   "floor_dis_cpu_ms_per_location", "floor_first_rows_p50_s"))
    if floor is not None:
        floor_figures = floor.figures(streams, base_s)
        print(f"floor: the same {streams} locations with {args.floor_rows_per_location} rows each ({floor.rows} rows), "
              f"fresh processes, followed by the client: published {floor.seconds:.2f} s after the move (first rows "
              f"p50 {floor.first_rows_p50_s:.2f} s); CPU {floor.cpu_s:.2f} s, "
              f"{floor_figures['floor_cpu_ms_per_location']:.2f} ms per location ("
              + ", ".join(f"{k} {1000 * v / streams:.2f}" for k, v in floor.cpu_by_process.items())
              + "); the burst cannot be faster than its "
              f"locations' floor, so its ratio cannot exceed {floor_figures['ratio_floor_ceiling']:.2f}")
    emit("load", burst_rate, "rows/s", base_rate, locations=streams, tailers=args.tailers, rows=burst_rows,
         live_rows=live_rows, live_rows_per_s=live_rate, flush_p99_ms_burst=burst_p99 * 1000,
         flush_p99_ms_live=live_p99 * 1000, lag_p99_rows=float(np.percentile(all_lags, 99)),
         lag_max_rows=int(all_lags.max()), lag_bounded=bool(bounded), complete=complete, drain_s=drain_s,
         rss_mib=peak_rss / MiB, rss_bound_mib=bound / MiB,  # the DIS's peak RSS and its derived bound
         dis_rss_idle_mib=idle_rss / MiB, dis_rss_peak_mib=peak_rss / MiB, dis_rss_bound_mib=bound / MiB,
         dis_fds_peak=peak_fds, column_handles_peak=peak_handles, max_open_files=args.max_open_files,
         tailer_rss_peak_mib=tailer_peak / MiB, dis_threads_peak=dis_threads, tailer_threads_peak=tailer_threads,
         tailer_fds_peak=tailer_fds, tailer_cpu_ms_per_write=tailer_ms_per_write,
         dis_cpu_ms_per_write=dis_ms_per_write, tailer_cpu_us_per_write=tailer_ms_per_write * 1000,
         dis_cpu_us_per_write=dis_ms_per_write * 1000, new_location_ms=new_location_ms,
         max_workers=args.max_workers, samples=len(live), client_rows_read=readers.rows_read,
         client_caught_up=caught_up, spark_counts=len(readers.spark_counts),
         reader_errors=len(readers.errors) + len(sample_errors),
         spark_final_count_ok=(final_count == total) if final_count is not None else None,
         warm_mib=args.warm_mib, baseline_readers=args.baseline_readers, dis_cpu_s_burst=cpu1["dis"] - cpu0["dis"],
         dis_cpu_s_baseline=bcpu1["dis"] - bcpu0["dis"], **limits.figures(), **phase_cpu.figures(),
         **floor_figures, load_average_start=load_avg, first_rows_p50_s=float(np.percentile(first_rows, 50)),
         first_rows_p90_s=float(np.percentile(first_rows, 90)), first_rows_last_s=float(first_rows[-1]))


if __name__ == "__main__":
    main()
