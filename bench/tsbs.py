"""A standard row shape end to end: the TSBS "cpu-only" row through logger -> tailer -> DIS.

The Time Series Benchmark Suite's cpu-only use case writes one row per host every 10 s: a
timestamp, 10 string tags (hostname, region, datacenter, rack, os, arch, team, service,
service_version, service_environment) and 10 integer metrics (usage_user ... usage_guest_nice).
Here ``--hosts`` hosts (4,000 by default, TSBS's usual scale) report for as many intervals as
``--rows`` needs, generated as TSBS generates them (tags fixed per host, metrics random walks),
written by the Python logger into binary logs before the clock starts.  Then, as
``bench/pipeline.py`` does, a ``dis serve`` and a ``dis-tailer`` (separate processes on loopback)
are started, the tailer on an empty directory; the logs are hard-linked into it and timed from
their arrival until every row is published.

``rows_per_s_per_core`` divides by the machine's cores (every process of the pipeline shares
them).  For reference, QuestDB publishes 11.36 M rows/s on 32 vCPU for this workload (about
355 k rows/s per vCPU).  The baseline in the same run is the logger's own rate writing the rows.

Last line: JSON with ``rows_per_s`` and ``rows_per_s_per_core``.

    .venv/bin/python bench/tsbs.py [--rows 4000000] [--hosts 4000]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import numpy as np
import pyarrow as pa
import yaml

from _common import ROOT, Published, emit, time_arrival, wait_serving
from disd.client import connect
from disd.logger import IntradayLoggerBuilder
from e2e_helpers import free_port, start_dis, start_tailer, write_dis_config, write_tailer_config

TAGS = ["hostname", "region", "datacenter", "rack", "os", "arch", "team", "service", "service_version",
        "service_environment"]
METRICS = ["usage_user", "usage_system", "usage_idle", "usage_nice", "usage_iowait", "usage_irq",
           "usage_softirq", "usage_steal", "usage_guest", "usage_guest_nice"]
REGIONS = {
    "us-east-1": ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1e"],
    "us-west-1": ["us-west-1a", "us-west-1b"],
    "us-west-2": ["us-west-2a", "us-west-2b", "us-west-2c"],
    "eu-west-1": ["eu-west-1a", "eu-west-1b", "eu-west-1c"],
    "eu-central-1": ["eu-central-1a", "eu-central-1b"],
    "ap-southeast-1": ["ap-southeast-1a", "ap-southeast-1b"],
    "ap-southeast-2": ["ap-southeast-2a", "ap-southeast-2b"],
    "ap-northeast-1": ["ap-northeast-1a", "ap-northeast-1c"],
    "sa-east-1": ["sa-east-1a", "sa-east-1b", "sa-east-1c"],
}
START_NS = 1_763_769_600_000_000_000  # 2026-11-22T00:00:00Z
INTERVAL_NS = 10_000_000_000


def schema_yaml() -> dict:
    return {"namespace": "Tsbs", "table": "Cpu", "partition_column": "Date",
            "columns": [{"name": "Timestamp", "type": "timestamp"}]
            + [{"name": t, "type": "string"} for t in TAGS] + [{"name": m, "type": "long"} for m in METRICS]}


def host_tags(hosts: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Each host's ten tags, chosen as TSBS's cpu-only generator chooses them."""
    regions = np.array(list(REGIONS))
    region = regions[rng.integers(0, len(regions), hosts)]
    dc = np.array([REGIONS[r][i % len(REGIONS[r])] for r, i in zip(region, rng.integers(0, 6, hosts))])
    return {
        "hostname": np.array([f"host_{i}" for i in range(hosts)]),
        "region": region,
        "datacenter": dc,
        "rack": rng.integers(0, 100, hosts).astype(str),
        "os": np.array(["Ubuntu16.10", "Ubuntu16.04LTS", "Ubuntu15.10"])[rng.integers(0, 3, hosts)],
        "arch": np.array(["x64", "x86"])[rng.integers(0, 2, hosts)],
        "team": np.array(["SF", "NYC", "LON", "CHI"])[rng.integers(0, 4, hosts)],
        "service": rng.integers(0, 20, hosts).astype(str),
        "service_version": rng.integers(0, 2, hosts).astype(str),
        "service_environment": np.array(["production", "staging", "test"])[rng.integers(0, 3, hosts)],
    }


def interval_table(step: int, tags: dict[str, np.ndarray], state: np.ndarray, rng: np.random.Generator) -> pa.Table:
    """One reading per host at interval ``step``; ``state`` (hosts x 10) walks in [0, 100]."""
    hosts = len(tags["hostname"])
    state += rng.integers(-5, 6, state.shape)
    np.clip(state, 0, 100, out=state)
    cols = {"Timestamp": pa.array(np.full(hosts, START_NS + step * INTERVAL_NS, np.int64)).cast(
        pa.timestamp("ns", tz="UTC"))}
    cols.update({t: pa.array(tags[t]) for t in TAGS})
    cols.update({m: pa.array(state[:, j].copy()) for j, m in enumerate(METRICS)})
    return pa.table(cols)


def published(port: int) -> int:
    with connect(f"127.0.0.1:{port}") as c:
        return sum(loc.rows for loc in c.locations("Tsbs", "Cpu"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--hosts", type=int, default=4_000)
    ap.add_argument("--workers", type=int, default=2,
                    help="loaders, as TSBS's --workers: the hosts are split over this many internal partitions, "
                         "each a log of its own and a stream of its own (default 2, one per core here)")
    ap.add_argument("--max-in-flight-mib", type=int, default=0,
                    help="the tailer's max_in_flight_bytes in MiB (default: the tailer's own default)")
    args = ap.parse_args()
    cores = os.cpu_count() or 1

    work = pathlib.Path(tempfile.mkdtemp(prefix="tsbs-", dir=os.environ.get("BENCH_DIR")))
    procs = []
    try:
        schemas = work / "schemas"
        schemas.mkdir()
        shutil.copy(ROOT / "config" / "schemas" / "Market.Trade.yaml", schemas)
        schema_path = schemas / "Tsbs.Cpu.yaml"
        schema_path.write_text(yaml.safe_dump(schema_yaml(), sort_keys=False))
        logs = work / "logs"
        rng = np.random.default_rng(11)
        tags = host_tags(args.hosts, rng)
        state = rng.integers(0, 101, (args.hosts, len(METRICS))).astype(np.int64)
        steps = -(-args.rows // args.hosts)
        tables = [interval_table(s, tags, state, rng) for s in range(steps)]
        workers = [(IntradayLoggerBuilder(str(schema_path)).set_log_dir(str(logs)).set_internal_partition(f"tsbs{w}")
                    .set_column_partition_value("2026-11-22").build()) for w in range(args.workers)]
        mine = [np.flatnonzero(np.arange(args.hosts) % args.workers == w) for w in range(args.workers)]
        t0 = time.perf_counter()
        left = args.rows
        for t in tables:
            t = t.slice(0, min(left, t.num_rows))
            for log, rows in zip(workers, mine):
                log.log_batch(t.take(rows[rows < t.num_rows]))
            left -= t.num_rows
            if left <= 0:
                break
        for log in workers:
            log.close()
        logger_s = time.perf_counter() - t0
        log_bytes = sum(f.stat().st_size for f in logs.iterdir())

        port = free_port()
        cfg = write_dis_config(work, port, schemas=str(schemas), **{"import": {
            "default": {"flush_interval_ms": 100, "checkpoint_interval_ms": 30000}}})
        procs.append(start_dis(work, cfg))
        watched = work / "watched"
        watched.mkdir()
        tailer_metrics = free_port()
        extra = {"max_in_flight_bytes": args.max_in_flight_mib << 20} if args.max_in_flight_mib else {}
        procs.append(start_tailer(work, write_tailer_config(work, port, watched, metrics_port=tailer_metrics, **extra)))
        wait_serving(tailer_metrics, procs[-1])
        time.sleep(0.3)
        # counted from a subscription: a new client and a listing every 5 ms loaded the DIS it timed
        pub = Published(port, "Tsbs", "Cpu")
        try:
            el = time_arrival(logs, watched, lambda: pub.total()[0] >= args.rows, timeout=600)
        finally:
            pub.close()
        if published(port) != args.rows:
            raise SystemExit(f"the DIS lists {published(port)} rows, {args.rows} logged")
    finally:
        for p in procs:
            if p.alive():
                p.terminate()
        shutil.rmtree(work, ignore_errors=True)

    rows_per_s = args.rows / el
    logger_rows = args.rows / logger_s
    print(f"TSBS cpu-only rows: {args.rows} ({args.hosts} hosts, 10 tags + 10 metrics, {args.workers} workers), "
          f"{log_bytes / args.rows:.0f} log bytes per row")
    print(f"logger -> binary logs: {logger_s:.2f} s, {logger_rows / 1e6:.2f} M rows/s")
    print(f"tailer -> DIS -> published: {el:.2f} s, {rows_per_s / 1e6:.2f} M rows/s on {cores} cores, "
          f"{rows_per_s / cores / 1e3:.0f} k rows/s per core (QuestDB's published figure: about 355 k per vCPU)")
    emit("tsbs", rows_per_s, "rows/s", logger_rows, rows_per_s=rows_per_s, rows_per_s_per_core=rows_per_s / cores,
         cores=cores, hosts=args.hosts, workers=args.workers, log_bytes_per_row=log_bytes / args.rows, logger_rows_per_s=logger_rows)


if __name__ == "__main__":
    main()
