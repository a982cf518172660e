"""``dis demo`` (what ``make run`` runs): the main job on the embedded default configuration.

Writes a sample Market.Trade binary log and reads it back.
"""

from __future__ import annotations

import argparse
import datetime as dt
import pathlib

import numpy as np
import pyarrow as pa

from disd.binlog import BinlogWriter, LogFileName, NamespaceSet, RowFlag, normalize_columns, read_file
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


def sample_trades(n: int, now: dt.datetime) -> pa.Table:
    rng = np.random.default_rng(0)
    start = int(now.timestamp() * 1e9)
    syms = np.array(["AAPL", "MSFT", "GOOG", "IBM"])
    return pa.table(
        {
            "Timestamp": pa.array(start + np.arange(n, dtype=np.int64) * 1_000_000).cast(pa.timestamp("ns", tz="UTC")),
            "Sym": syms[rng.integers(0, 4, n)],
            "Price": np.round(rng.random(n) * 100 + 100, 2),
            "Size": rng.integers(1, 500, n, dtype=np.int32),
        }
    )


def run_demo(args: argparse.Namespace) -> int:
    schema = TableSchema.from_dict(EMBEDDED_SCHEMA, "<embedded>")
    work = pathlib.Path(args.workdir)
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    name = LogFileName(schema.namespace, schema.table, NamespaceSet.SYSTEM, "demo", now.date().isoformat(), now)
    path = logs / name.format()
    table = sample_trades(args.rows, now)
    with BinlogWriter(path, schema) as w:
        w.write_rows(normalize_columns(schema, table), np.full(args.rows, RowFlag.SINGLE_ROW, np.uint8))
        w.fsync()
    back = read_file(path, schema)
    assert back.table.equals(table), "read-back differs from what was written"
    print(f"wrote {back.table.num_rows} rows to {path} ({back.end_offset} bytes) and read them back")
    print(back.table.slice(0, 5).to_pandas().to_string() if _has_pandas() else back.table.slice(0, 5))
    return 0


def _has_pandas() -> bool:
    try:
        import pandas  # noqa: F401
    except ImportError:
        return False
    return True
