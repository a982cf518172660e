"""Helpers of the operations tests: a DIS in this process or as a subprocess, Market.Trade logs
written frame by frame, and the Prometheus text endpoint parsed."""

from __future__ import annotations

import pathlib

import numpy as np
import pyarrow as pa

from disd.binlog import BinlogWriter, RowFlag, normalize_columns
from disd.config import parse_dis_config
from disd.schema import load_schema
from e2e_helpers import scrape

__all__ = ["ROOT", "SCHEMAS", "TRADE", "append_rows", "log_name", "scrape", "server_config", "trade_rows"]

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "config" / "schemas"
TRADE = load_schema(SCHEMAS / "Market.Trade.yaml")
START_NS = 1_763_800_000_000_000_000


def log_name(ip: str = "feed1", day: str = "2026-11-22", hhmmss: str = "090000") -> str:
    """A Market.Trade log file name (docs/binlog-format.md): later ``hhmmss``, later file."""
    return f"Market.Trade.System.{ip}.{day}.bin.{day}.{hhmmss}.000+0000"


def trade_rows(start: int, n: int) -> dict:
    """Numbered rows: row i has Size i, Price i/4, Sym S<i%5>, Timestamp START_NS + i ns."""
    idx = np.arange(start, start + n, dtype=np.int64)
    return {
        "Timestamp": pa.array(START_NS + idx).cast(pa.timestamp("ns", tz="UTC")),
        "Sym": pa.array(np.char.add("S", (idx % 5).astype(str))),
        "Price": pa.array(idx * 0.25),
        "Size": pa.array(idx.astype(np.int32)),
    }


def append_rows(path: pathlib.Path, start: int, n: int, frames: int = 1) -> int:
    """Append rows [start, start+n) to a log in ``frames`` frames (single rows); returns the new
    file size."""
    with BinlogWriter(path, TRADE) as w:
        for part in np.array_split(np.arange(start, start + n), frames):
            if len(part):
                cols = normalize_columns(TRADE, trade_rows(int(part[0]), len(part)))
                w.write_rows(cols, np.full(len(part), RowFlag.SINGLE_ROW, np.uint8))
        return w.offset


def server_config(root: pathlib.Path, checkpoint_ms: int = 500, **server):
    return parse_dis_config({
        "db_root": str(root / "db"),
        "schemas": str(SCHEMAS),
        "server": {"host": "127.0.0.1", "port": 0, "metrics_port": 0, **server},
        "import": {"default": {"flush_interval_ms": 20, "checkpoint_interval_ms": checkpoint_ms}},
    }, "<ops test>")
