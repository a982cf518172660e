"""Shared helpers for the benchmarks: reference data and the closing JSON line."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time
from typing import Any, Callable

import numpy as np
import pyarrow as pa

ROOT = pathlib.Path(__file__).resolve().parent.parent
TRADE_SCHEMA = ROOT / "config" / "schemas" / "Market.Trade.yaml"
SYMS = np.array(["AAPL", "MSFT", "GOOG", "IBM", "AMZN", "NVDA", "TSLA", "META"])


def trade_table(n: int, seed: int = 1, start_ns: int = 1_763_800_000_000_000_000) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "Timestamp": pa.array(start_ns + np.arange(n, dtype=np.int64) * 1000).cast(pa.timestamp("ns", tz="UTC")),
            "Sym": pa.array(SYMS[rng.integers(0, len(SYMS), n)]),
            "Price": pa.array(rng.random(n) * 100 + 50),
            "Size": pa.array(rng.integers(1, 1000, n, dtype=np.int32)),
        }
    )


def log_trade_rows(log_dir: str, n: int) -> None:
    """``n`` rows of ``trade_table`` logged by the product's logger into ``log_dir`` (internal
    partition ``bench``, column partition 2026-11-22), in batches of 100,000: the log a tailer
    streams in the pipeline benches."""
    from disd.logger import IntradayLoggerBuilder

    log = (IntradayLoggerBuilder(str(TRADE_SCHEMA)).set_log_dir(log_dir).set_internal_partition("bench")
           .set_column_partition_value("2026-11-22").build())
    table = trade_table(n)
    for i in range(0, n, 100_000):
        log.log_batch(table.slice(i, 100_000))
    log.close()


def best_of(fn: Callable[[], Any], repeat: int = 5) -> float:
    """Best wall time of ``repeat`` runs: the least disturbed by other load on a shared machine."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def emit(name: str, value: float, unit: str, baseline: float, **extra: Any) -> None:
    line = {"bench": name, "value": round(value, 3), "unit": unit, "baseline": round(baseline, 3),
            "ratio": round(value / baseline, 4) if baseline else None}
    line.update({k: (round(v, 4) if isinstance(v, float) else v) for k, v in extra.items()})
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def wait_serving(metrics_port: int, proc=None, timeout: float = 60.0) -> None:  # noqa: ANN001
    """Until the process behind ``metrics_port`` answers a scrape (it has started); exits with
    the end of ``proc``'s log (a ``support.Proc``) when it died or did not start in time."""
    import urllib.request

    deadline = time.perf_counter() + timeout
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2).read()
            return
        except OSError:
            if (proc is not None and not proc.alive()) or time.perf_counter() > deadline:
                tail = proc.log_text()[-2000:] if proc is not None else ""
                raise SystemExit(f"the process serving metrics on port {metrics_port} did not start:\n{tail}") from None
            time.sleep(0.05)


def time_arrival(logs, watched, done: Callable[[], bool], timeout: float = 300.0) -> float:  # noqa: ANN001
    """Seconds from hard-linking every file of ``logs`` into ``watched`` (the directory of a
    running tailer) until ``done()``: ingestion of a burst, the processes' start-up left out."""
    import os

    t0 = time.perf_counter()
    for f in sorted(os.listdir(logs)):
        os.link(os.path.join(logs, f), os.path.join(watched, f))
    while not done():
        time.sleep(0.005)
        if time.perf_counter() - t0 > timeout:
            raise SystemExit(f"not every row was published within {timeout:.0f} s of the logs' arrival")
    return time.perf_counter() - t0


class Published:
    """Rows published per location, kept by a subscription (the DIS pushes each change).  The
    waits below read it instead of listing the table every few milliseconds: a listing walks
    every location's directory on the DIS (about 14 ms for 400 locations), so polling it 50
    times a second cost the DIS most of a core during a 200-location burst and nothing for the
    one-location baseline."""

    def __init__(self, port: int, namespace: str = "Market", table: str = "Trade") -> None:
        import threading

        from disd.client import connect

        self.table = (namespace, table)
        self.rows: dict = {}
        self.first: dict = {}  # location key -> time.perf_counter() when it first had rows
        self.error: str | None = None
        self._client = connect(f"127.0.0.1:{port}")
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        try:
            for snap in self._client.subscribe(*self.table):
                self.rows[snap.key] = max(snap.rows, self.rows.get(snap.key, 0))
                if snap.rows and snap.key not in self.first:
                    self.first[snap.key] = time.perf_counter()
        except Exception as e:  # noqa: BLE001
            self.error = repr(e)

    def total(self) -> tuple[int, int]:
        """(rows published, locations with rows)."""
        vals = list(self.rows.values())
        return sum(vals), sum(1 for v in vals if v)

    def close(self) -> None:
        self._client.close()


def warm_memory(mib: int) -> None:
    """Touch ``mib`` MiB in a child process that then exits, leaving that much memory freed and
    backed.  Why: on a virtual machine whose host backs guest memory on first touch and takes
    freed memory back (this one: Firecracker, virtio-balloon), a page the guest has not used
    lately costs about 2 ns per byte the first time (a child touching 512 MiB took 1.08 s cold,
    0.04 s right after).  A phase allocates a few hundred MiB (the processes' growth and the new
    column files' page cache); without this the burst paid for its pages and the baseline, run
    just after the burst's processes exited, reused theirs."""
    if mib > 0:
        subprocess.run([sys.executable, "-c", f"import numpy; numpy.ones({int(mib)} << 20, numpy.uint8)"], check=True)
