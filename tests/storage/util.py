"""Feeding a location from real binary log files, as the Ingest service does."""

from __future__ import annotations

import pathlib

import numpy as np

from disd.binlog import BinlogWriter, LocationKey, decode_frames, decode_header, normalize_columns, scan_frames
from disd.binlog.format import encode_frame, encode_rows
from disd.schema import SchemaRegistry, TableSchema

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCHEMAS = SchemaRegistry.load_dir(ROOT / "config" / "schemas")
TRADE = SCHEMAS.get("Market", "Trade")
KEY = LocationKey("Market", "Trade", "ip1", "2026-11-22")
LOG = "Market.Trade.System.ip1.2026-11-22.bin.2026-11-22.090000.000+0000"


def trade_rows(start: int, n: int) -> dict:
    idx = np.arange(start, start + n)
    return {"Timestamp": idx * 1000, "Sym": [f"S{i % 5}" for i in idx], "Price": idx * 0.5,
            "Size": idx.astype(np.int32)}


def write_log(path, schema: TableSchema, columns: dict, flags, single_frame: bool = False) -> int:
    """Append rows; ``single_frame`` writes them as one frame even across transaction starts
    (as a foreign writer might)."""
    flags = np.asarray(flags, np.uint8)
    if not single_frame:
        with BinlogWriter(path, schema) as w:
            return w.write_rows(normalize_columns(schema, columns), flags)
    with BinlogWriter(path, schema) as w:
        payload, n = encode_rows(schema, normalize_columns(schema, columns), flags)
        data = encode_frame(payload, n)
        w._file.write(data)
        return w.offset + len(data)


def ingest_file(loc, path, schema: TableSchema = TRADE, start: int = 0, frames_per_call: int | None = None):
    data = pathlib.Path(path).read_bytes()
    hdr = decode_header(data)
    run = scan_frames(data, 0, schema, start=max(start, hdr.size))
    name = pathlib.Path(path).name
    k = frames_per_call or len(run.starts) or 1
    for i in range(0, len(run.starts), k):
        sub = type(run)(base=0, starts=run.starts[i:i + k], ends=run.ends[i:i + k],
                        row_counts=run.row_counts[i:i + k], end_offset=run.ends[min(i + k, len(run.ends)) - 1])
        loc.ingest(name, sub, decode_frames(data, 0, sub, schema))
