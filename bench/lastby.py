"""Last-by state: what keeping it costs ingestion, and what it saves a reader.

Real processes on loopback (``dis serve``, ``dis-tailer``), 2,000,000 Market.Trade rows of random
updates over 100,000 keys (``Sym``), logged before timing.

1. Ingestion (the rows in ten log files): seconds from the logs' arrival in the directory of a running tailer until the DIS
   has published every row, with ``import.tables.Market.Trade.last_by: [Sym]`` and without it,
   alternately, best of ``--repeat`` each.  ``ratio`` = rows/s with last-by / rows/s without.
2. Reading: with the last-by DIS of the last run still up, ``snapshot_ms`` is the best time of
   ``Client.last_by`` (the 100,000-key state over gRPC as Arrow IPC, decoded); ``scan_ms`` the
   best time of reading every row (``Client.read_table``) and reducing it to the same view.
3. Exactness: a fresh last-by DIS is killed with SIGKILL three times while rows stream into its
   log, each time past a new checkpoint;
   after each restart (and at the end) the state it serves must equal the last-by recomputed
   from the rows it covers.  ``exact`` is true when it always did (and the view read in 2
   equalled the scan's).

The limit (``bench/_burstcpu.py``): each timed run's CPU, per thread of the DIS, the tailer and
this process (its polling), from the logs' arrival until it is timed done.  A ``limits`` line for
the best run with last-by against the best without: that run cannot end sooner than its CPU spread
over the usable cores, nor than its busiest thread, so ``ratio_cpu_ceiling`` (the off run's seconds
over that shortest on run) bounds ``ratio`` at the CPU it took; with the DIS's CPU per row on and off
and the busiest thread named (the DIS names its threads: ``disd.server.threadnames``).  The ceiling
assumes a perfect spread over the cores, which a pipeline of dependent steps never reaches: so also
each run's use of the cores (CPU over cores x wall) and the ratio the on run would reach at the off
run's use (the runs' CPU, off over on).  Then each thread's CPU on and off, and what last-by added
per thread; and each run's pages faulted in by the DIS (first touches of memory).

Last line: JSON with exactly ``ratio``, ``snapshot_ms``, ``scan_ms``, ``exact``.
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

from disd.binlog import BinlogWriter, normalize_columns
from disd.client import connect, state_table
from disd.schema import load_schema
from disd.storage.lastby import last_by
from _burstcpu import BurstLimits, CpuWindow, ProcessCpu, thread_growth
from _common import TRADE_SCHEMA, wait_serving, warm_memory
from lastby.support_lastby import random_updates, with_last_by
from support import (BIN, Proc, dis_settings, free_port, free_port_pair, sample, scrape,
                     start_dis_process)

KEYS = 100_000
CHUNK = 100_000
FILES = 10


def write_logs(logs: pathlib.Path, n: int) -> None:
    """Ten log files of one location (successive, so the kill phase can link them in over time)."""
    schema = load_schema(TRADE_SCHEMA)
    logs.mkdir(parents=True)
    per_file = -(-n // FILES)
    for i, first in enumerate(range(0, n, per_file)):
        name = f"Market.Trade.System.bench.2026-11-22.bin.2026-11-22.09{i:02d}00.000+0000"
        with BinlogWriter(logs / name, schema) as w:
            for a in range(first, min(n, first + per_file), CHUNK):
                m = min(CHUNK, n - a, first + per_file - a)
                w.write_rows(normalize_columns(schema, random_updates(a, m, KEYS, seed=3)), np.full(m, 3, np.uint8))


def start_dis(d: pathlib.Path, on: bool, checkpoint_ms: int = 30000) -> tuple[Proc, int]:
    port = free_port_pair()
    settings = dis_settings(d / "db", port=port, metrics_port=free_port(), flush_ms=100, checkpoint_ms=checkpoint_ms)
    if on:
        with_last_by(settings)
    (d / "dis.yaml").write_text(yaml.safe_dump(settings))
    return start_dis_process(d, d / "dis.yaml"), port


def start_tailer(d: pathlib.Path, port: int, log_dir: pathlib.Path, metrics_port: int) -> Proc:
    cfg = d / "tailer.yaml"
    cfg.write_text(yaml.safe_dump({"dis": f"127.0.0.1:{port}", "log_dirs": [str(log_dir)],
                                   "state_dir": str(d / "tailer-state"), "max_backoff_ms": 200,
                                   "metrics_port": metrics_port}))
    return Proc([str(BIN / "dis-tailer"), "--config", str(cfg)], d / "tailer.log").start()


def checkpointed(client) -> int:  # noqa: ANN001
    try:
        return sum(loc.checkpointed_rows for loc in client.status().locations)
    except Exception:  # noqa: BLE001 - restarting
        return 0


def state_rows(client) -> int:  # noqa: ANN001
    try:
        return sum(s.rows for s in client.last_by_states("Market", "Trade"))
    except Exception:  # noqa: BLE001 - restarting
        return 0


def published(client) -> int:  # noqa: ANN001
    try:
        return sum(s.rows for s in client.locations("Market", "Trade"))
    except Exception:  # noqa: BLE001 - down or restarting: nothing published for now
        return 0


#: MiB touched by a child process (which then exits) right before each timed run
#: (``warm_memory``), so that the runs with and without last-by both grow into pages the host has
#: backed lately: a page this virtual machine's host took back costs about 2 ns a byte at its first
#: touch, and a run with last-by grows by more (its state and the rows held for its update).
WARM_MIB = int(os.environ.get("BENCH_WARM_MIB", 1024))


def minor_faults(proc: Proc) -> int:
    """Pages a process has faulted in so far (``minflt`` of ``/proc/<pid>/stat``): each a first
    touch of memory, which on this virtual machine can cost more than the bytes' copy."""
    return int(pathlib.Path(f"/proc/{proc.p.pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


def ingest(work: pathlib.Path, logs: pathlib.Path, n: int, on: bool, run: int, keep: bool = False):  # noqa: ANN201
    """Seconds from the logs' arrival until every row is published (the tailer's start-up is
    not timed), and the processes' CPU over those seconds; with ``keep``, the DIS is left running
    and returned."""
    d = work / f"ingest-{'on' if on else 'off'}-{run}"
    d.mkdir()
    dis, port = start_dis(d, on)
    log_dir = d / "logs"
    log_dir.mkdir()
    metrics_port = free_port()
    tailer = start_tailer(d, port, log_dir, metrics_port)
    try:
        wait_serving(metrics_port, tailer)
        time.sleep(0.3)
        with connect(f"127.0.0.1:{port}", retry_s=0, timeout_s=10) as c:
            warm_memory(WARM_MIB)
            window = CpuWindow({"dis": dis.p.pid, "tailer": tailer.p.pid, "bench": os.getpid()})
            faults0 = minor_faults(dis)
            window.start()
            t0 = time.perf_counter()
            for f in sorted(logs.iterdir()):
                os.link(f, log_dir / f.name)
            while published(c) < n:
                time.sleep(0.01)
                if time.perf_counter() - t0 > 300:
                    raise SystemExit(f"not every row published in 300 s:\n{dis.log_text()[-2000:]}")
            t_published = time.perf_counter() - t0
            metrics_dis = yaml.safe_load((d / "dis.yaml").read_text())["server"]["metrics_port"]
            # and, with last-by, the state covers them: polled as the dis_lastby_rows gauge every
            # 10 ms like the rows above, not by fetching the 100,000-key state itself (each fetch
            # cost the DIS being timed more CPU than a publish's update)
            while on and sample(scrape(metrics_dis), "dis_lastby_rows") < n:
                time.sleep(0.01)
            elapsed = time.perf_counter() - t0
            cpu = window.stop()
            faults = minor_faults(dis) - faults0
            dis_cpu, tailer_cpu = cpu["dis"].seconds, cpu["tailer"].seconds
            print(f"  (CPU while timed: DIS {dis_cpu:.2f} s, {dis_cpu / n * 1e9:.0f} ns/row, {faults:,} pages faulted in "
                  f"({faults * 4096 / n:.0f} bytes/row); tailer {tailer_cpu:.2f} s)", flush=True)
            if on:
                print(f"  (every row published after {t_published:.3f} s; the state covered them "
                      f"{(elapsed - t_published) * 1e3:.0f} ms later)", flush=True)
            if keep:
                metrics = scrape(metrics_dis)
                keys, size = (sample(metrics, f"dis_lastby_{m}") for m in ("keys", "state_bytes"))
                print(f"state in memory: {keys:,.0f} keys, {size:,.0f} bytes ({size / keys:.1f} bytes per key; "
                      "dis_lastby_state_bytes / dis_lastby_keys)", flush=True)
    finally:
        tailer.terminate()
        if not keep:
            dis.terminate()
            shutil.rmtree(d, ignore_errors=True)
    return (elapsed, cpu, dis, port) if keep else (elapsed, cpu, None, None)


def reads(port: int, n: int, repeat: int) -> tuple[float, float, bool]:
    with connect(f"127.0.0.1:{port}", timeout_s=60) as c:
        snap = scan = float("inf")
        view = scanned = None
        for _ in range(repeat):
            t0 = time.perf_counter()
            view = c.last_by("Market", "Trade")
            snap = min(snap, time.perf_counter() - t0)
        for _ in range(max(1, repeat // 2)):
            t0 = time.perf_counter()
            scanned = last_by(c.read_table("Market", "Trade"), ["Sym"])
            scan = min(scan, time.perf_counter() - t0)
        exact = view.num_rows == KEYS and view.equals(scanned)
    return snap * 1e3, scan * 1e3, exact


def kills(work: pathlib.Path, n: int, count: int) -> bool:
    """SIGKILL a last-by DIS ``count`` times while rows stream into its log (a writer appends
    10,000 rows every 50 ms, slow enough that three restarts fit in on a loaded machine), each
    time after a checkpoint newer than the last restart's and with published rows past it; True
    when its state equalled the recomputed last-by after every restart and at the end."""
    d = work / "kills"
    d.mkdir()
    dis, port = start_dis(d, True, checkpoint_ms=200)
    log_dir = d / "logs"
    log_dir.mkdir()
    tailer = start_tailer(d, port, log_dir, free_port())
    schema = load_schema(TRADE_SCHEMA)

    def write() -> None:
        with BinlogWriter(log_dir / "Market.Trade.System.bench.2026-11-22.bin.2026-11-22.090000.000+0000", schema) as w:
            for a in range(0, n, 10_000):
                m = min(10_000, n - a)
                w.write_rows(normalize_columns(schema, random_updates(a, m, KEYS, seed=5)), np.full(m, 3, np.uint8))
                time.sleep(0.05)

    writer = threading.Thread(target=write)
    writer.start()
    exact = True
    try:
        with connect(f"127.0.0.1:{port}", retry_s=30, timeout_s=30) as c:
            last = 0
            for i in range(count):
                while (ckpt := checkpointed(c)) <= last and writer.is_alive():
                    time.sleep(0.01)
                while published(c) <= ckpt and writer.is_alive():
                    time.sleep(0.005)
                if not writer.is_alive():
                    print(f"the writer finished before kill {i + 1}", flush=True)
                    exact = False
                    break
                dis.kill9()
                dis = start_dis_process(d, d / "dis.yaml")
                last = checkpointed(c)  # what the restarted DIS loaded
                (state,) = c.last_by_states("Market", "Trade")
                rows = c.read_table("Market", "Trade").slice(0, state.rows).drop_columns(["Date"])
                ok = state_table(c.schema("Market", "Trade"), state).equals(last_by(rows, ["Sym"]))
                print(f"kill {i + 1}: restarted from a checkpoint of {last:,} rows, state at {state.rows:,} rows "
                      f"{'equals' if ok else 'DIFFERS from'} the recomputed last-by", flush=True)
                exact &= ok
            writer.join()
            while state_rows(c) < n:
                time.sleep(0.05)
            (state,) = c.last_by_states("Market", "Trade")
            ok = state.rows == n and state_table(c.schema("Market", "Trade"), state).equals(
                last_by(c.read_table("Market", "Trade").drop_columns(["Date"]), ["Sym"]))
            print(f"final: {state.rows:,} rows, state {'equals' if ok else 'DIFFERS from'} the last-by of every row")
            exact &= ok
    finally:
        writer.join()
        tailer.terminate()
        dis.terminate()
    return exact


def print_limits(n: int, best: dict[bool, float], cpu: dict[bool, dict[str, ProcessCpu]]) -> None:
    """The ``limits`` line of the best on run against the best off run, and their threads."""
    on = BurstLimits(best[True], best[False], len(os.sched_getaffinity(0)), cpu[True])
    proc, thread, busiest_s = on.busiest
    off_busiest = BurstLimits(best[False], best[False], on.cores, cpu[False]).busiest
    print(f"limits on {on.cores} cores: the on run ({on.burst_s:.3f} s) used {on.cpu_s:.3f} CPU s "
          f"({', '.join(f'{k} {p.seconds:.3f}' for k, p in cpu[True].items())}; busiest thread {proc}/{thread} "
          f"{busiest_s:.3f} s), so it cannot end in less than {on.shortest_s:.3f} s "
          f"({'its busiest thread' if busiest_s >= on.cpu_s / on.cores else 'its CPU over the cores'}); "
          f"the off run took {on.baseline_s:.3f} s (busiest thread {off_busiest[0]}/{off_busiest[1]} "
          f"{off_busiest[2]:.3f} s), so ratio_cpu_ceiling {on.ratio_ceiling:.3f}; DIS CPU per row: "
          f"on {cpu[True]['dis'].seconds / n * 1e9:.0f} ns, off {cpu[False]['dis'].seconds / n * 1e9:.0f} ns", flush=True)
    off = BurstLimits(best[False], best[False], on.cores, cpu[False])
    at_off_use = on.cpu_s_at_use(off.core_use)
    print(f"  use of the {on.cores} cores (CPU s / cores / wall s): off {off.core_use:.0%} ({off.cpu_s:.3f} CPU s), on "
          f"{on.core_use:.0%} ({on.cpu_s:.3f}); at the off run's use the on run takes {at_off_use:.3f} s: ratio "
          f"{off.burst_s / at_off_use:.3f} (the runs' CPU, off / on); 0.7 needs the on run to use at most "
          f"{off.cpu_s / 0.7:.3f} CPU s at that use", flush=True)
    for label, c in (("on", cpu[True]), ("off", cpu[False])):
        print(f"  threads, {label} (CPU s): " + "; ".join(
            f"{k}: " + ", ".join(f"{t} {s:.3f}" for t, s in sorted(p.by_thread.items(), key=lambda kv: -kv[1])[:5])
            for k, p in c.items()), flush=True)
    print("  what last-by added, per DIS thread (CPU s, ns/row): " + ", ".join(
        f"{t} {s:+.3f} ({s / n * 1e9:+.0f})" for t, s in thread_growth(cpu[True]["dis"], cpu[False]["dis"])[:5]),
        flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--kills", type=int, default=3)
    args = ap.parse_args()
    n = args.rows
    work = pathlib.Path(tempfile.mkdtemp(prefix="dis-bench-lastby-", dir=os.environ.get("BENCH_DIR")))
    dis = None
    try:
        logs = work / "logs"
        write_logs(logs, n)
        best = {False: float("inf"), True: float("inf")}
        best_cpu: dict[bool, dict[str, ProcessCpu]] = {}
        port = None
        for run in range(args.repeat):
            for on in (False, True):
                keep = on and run == args.repeat - 1
                elapsed, cpu, d, p = ingest(work, logs, n, on, run, keep)
                if keep:
                    dis, port = d, p
                if elapsed < best[on]:
                    best[on], best_cpu[on] = elapsed, cpu
                print(f"ingest {n:,} rows, last-by {'on ' if on else 'off'}: {elapsed:.3f} s "
                      f"({n / elapsed / 1e6:.2f} M rows/s)", flush=True)
        ratio = best[False] / best[True]
        print(f"best: off {n / best[False] / 1e6:.2f} M rows/s, on {n / best[True] / 1e6:.2f} M rows/s, ratio {ratio:.3f}")
        print_limits(n, best, best_cpu)
        snapshot_ms, scan_ms, view_exact = reads(port, n, 2 * args.repeat)
        print(f"read the {KEYS:,}-key view: snapshot {snapshot_ms:.1f} ms, scan of {n:,} rows {scan_ms:.1f} ms "
              f"({scan_ms / snapshot_ms:.1f}x); equal: {view_exact}", flush=True)
        dis.terminate()
        dis = None
        exact = kills(work, n, args.kills) and view_exact
    finally:
        if dis is not None:
            dis.terminate()
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"ratio": round(ratio, 4), "snapshot_ms": round(snapshot_ms, 2), "scan_ms": round(scan_ms, 2),
                      "exact": bool(exact)}))


if __name__ == "__main__":
    main()
