"""Decode speed of the binary log for the reference Market.Trade schema, on one core.

Target: at least 3 million rows/s.  Baseline, same run: a plain numpy copy of the same bytes
(the memory-bandwidth floor of touching every byte once).  Prints the figures and, last, one JSON
line; ``ratio`` = decode rows/s / copy rows/s.
"""

from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np

from _common import TRADE_SCHEMA, best_of, emit, trade_table
from disd.binlog import BinlogWriter, RowFlag, decode_frames, decode_header, normalize_columns, scan_frames
from disd.schema import load_schema

N = int(os.environ.get("BENCH_ROWS", 2_000_000))
TARGET = 3_000_000


def main() -> None:
    schema = load_schema(TRADE_SCHEMA)
    table = trade_table(N)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "Market.Trade.System.bench.2026-11-22.bin.2026-11-22.000000.000+0000")
        with BinlogWriter(path, schema) as w:
            w.write_rows(normalize_columns(schema, table), np.full(N, RowFlag.SINGLE_ROW, np.uint8))
        data = open(path, "rb").read()
    header = decode_header(data)

    def decode() -> None:
        run = scan_frames(data, 0, schema, start=header.size)
        rows = decode_frames(data, 0, run, schema)
        assert rows.num_rows == N

    raw = np.frombuffer(data, np.uint8)

    def copy() -> None:
        raw.copy()

    t_decode = best_of(decode)
    t_copy = best_of(copy)
    rows_per_s = N / t_decode
    copy_rows_per_s = N / t_copy
    print(f"rows={N} bytes={len(data)} ({len(data) / N:.1f} B/row)")
    print(f"decode: {t_decode * 1e3:.1f} ms  {rows_per_s / 1e6:.2f} M rows/s  (target {TARGET / 1e6:.0f} M)")
    print(f"numpy copy of the same bytes: {t_copy * 1e3:.1f} ms  {copy_rows_per_s / 1e6:.2f} M rows/s")
    print("PASS" if rows_per_s >= TARGET else "BELOW TARGET")
    emit("binlog_decode", rows_per_s, "rows/s", copy_rows_per_s, rows_per_s=rows_per_s,
         target_rows_per_s=TARGET, decode_s=t_decode, copy_s=t_copy, bytes=len(data), meets_target=rows_per_s >= TARGET)


if __name__ == "__main__":
    main()
