"""``dis demo`` (what ``make run`` runs): the live pipeline on the embedded default configuration.

Starts a DIS on loopback over a fresh database under ``--workdir``, a tailer on its log
directory, and a logger that writes Market.Trade rows (single rows, batches, a transaction and an
abandoned transaction); then waits until every committed row is visible through the table-data
client and checks that what is read equals what was logged.
"""

from __future__ import annotations

import argparse
import datetime as dt
import pathlib
import shutil
import time

import numpy as np
import pyarrow as pa
import yaml

from disd.schema import TableSchema

EMBEDDED_SCHEMA = {
    "namespace": "Market",
    "table": "Trade",
    "partition_column": "Date",
    "columns": [
        {"name": "Timestamp", "type": "timestamp"},
        {"name": "Sym", "type": "string"},
        {"name": "Price", "type": "double"},
        {"name": "Size", "type": "int"},
    ],
}


def first_rows(table: pa.Table, n: int) -> str:
    """The first ``n`` rows as an aligned text table (no pandas: ``make run`` installs only the
    project's own dependencies)."""
    head = table.slice(0, n)
    cols = [[c, *("null" if v is None else v for v in head.column(c).cast(pa.string()).to_pylist())]
            for c in head.column_names]
    widths = [max(len(x) for x in col) for col in cols]
    return "\n".join("  ".join(col[i].rjust(w) for col, w in zip(cols, widths)) for i in range(head.num_rows + 1))


def sample_trades(start: int, n: int, t0_ns: int) -> pa.Table:
    rng = np.random.default_rng(start)
    syms = np.array(["AAPL", "MSFT", "GOOG", "IBM"])
    idx = np.arange(start, start + n)
    return pa.table({
        "Timestamp": pa.array(t0_ns + idx * 1_000_000).cast(pa.timestamp("ns", tz="UTC")),
        "Sym": syms[rng.integers(0, 4, n)],
        "Price": np.round(rng.random(n) * 100 + 100, 2),
        "Size": idx.astype(np.int32),
    })


def run_demo(args: argparse.Namespace) -> int:
    from disd.client import connect
    from disd.config import parse_dis_config
    from disd.logger import IntradayLoggerBuilder
    from disd.logconfig import configure_logging
    from disd.routing import Routing
    from disd.server.daemon import DisServer
    from disd.tailer import Tailer, TailerConfig

    configure_logging(level="warning")
    work = pathlib.Path(args.workdir)
    if work.exists():
        shutil.rmtree(work)
    (work / "schemas").mkdir(parents=True)
    schema = TableSchema.from_dict(EMBEDDED_SCHEMA, "<embedded>")
    (work / "schemas" / "Market.Trade.yaml").write_text(yaml.safe_dump(EMBEDDED_SCHEMA, sort_keys=False))
    logs = work / "logs"
    logs.mkdir()
    cfg = parse_dis_config({
        "db_root": str(work / "db"), "schemas": str(work / "schemas"),
        "server": {"host": "127.0.0.1", "port": 0, "metrics_port": 0},
        "import": {"default": {"flush_interval_ms": 100, "checkpoint_interval_ms": 1000}},
    }, "<embedded>")
    server = DisServer(cfg)
    port = server.start()
    address = f"127.0.0.1:{port}"
    print(f"DIS serving on {address} (metrics on :{server.metrics_port}), database {cfg.db_root}")
    tailer = Tailer(TailerConfig(routing=Routing.single(address), log_dirs=[str(logs)])).start()
    print(f"tailer watching {logs}")
    log = (IntradayLoggerBuilder(schema).set_process_name("demo").set_log_dir(logs)
           .set_internal_partition("demo").set_column_partition_value(dt.date.today().isoformat()).build())
    t0_ns = time.time_ns()
    rows = args.rows
    logged = []
    try:
        done = 0
        batch = max(1, rows // 10)
        while done < rows:
            n = min(batch, rows - done)
            t = sample_trades(done, n, t0_ns)
            log.log_batch(t, atomic=(done // batch) % 2 == 1)
            logged.append(t)
            done += n
            time.sleep(0.05)
        try:
            with log.transaction():
                log.log(Sym="NEVER", Price=0.0, Size=-1)
                raise RuntimeError("abandoned on purpose: these rows must never be visible")
        except RuntimeError:
            pass
        log.flush()
        t_written = time.perf_counter()
        with connect(address) as client:
            while sum(loc.rows for loc in client.locations("Market", "Trade")) < rows:
                if time.perf_counter() - t_written > 30:
                    print("rows did not become visible within 30 s")
                    return 1
                time.sleep(0.01)
            visible_ms = (time.perf_counter() - t_written) * 1000
            back = client.read_table("Market", "Trade")
        expect = pa.concat_tables(logged)
        same = back.drop_columns(["Date"]).equals(expect)
        print(f"logged {rows} rows; all visible {visible_ms:.0f} ms after the last write; "
              f"read back {back.num_rows} rows, equal to what was logged: {same}")
        print(first_rows(back, 5))
        return 0 if same else 1
    finally:
        log.close()
        tailer.stop()
        server.stop()
