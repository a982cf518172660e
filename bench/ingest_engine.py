"""Storage engine ingest speed: decoded Market.Trade batches into one location, in process.

The flusher runs every 100 ms as in production.  Target: at least 3 million rows/s.  Baseline,
same run, same disk: writing the same number of column-file bytes with plain 64 KiB file writes
(the physical limit of the work).  Last line: one JSON object with ``rows_per_s``; ``ratio`` =
engine rows/s / raw-write rows/s.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

from _common import TRADE_SCHEMA, emit, trade_table  # noqa: E402
from disd.binlog import BinlogWriter, LocationKey, RowFlag, decode_frames, decode_header, normalize_columns, scan_frames  # noqa: E402
from disd.schema import SchemaRegistry, load_schema  # noqa: E402
from disd.storage import ImportConfig, StorageEngine  # noqa: E402

N = int(os.environ.get("BENCH_ROWS", 4_000_000))
BATCH = 65_536
TARGET = 3_000_000
NAME = "Market.Trade.System.bench.2026-11-22.bin.2026-11-22.000000.000+0000"


def main() -> None:
    schema = load_schema(TRADE_SCHEMA)
    table = trade_table(N)
    work = tempfile.mkdtemp(dir=os.environ.get("BENCH_DIR"))
    try:
        path = os.path.join(work, NAME)
        with BinlogWriter(path, schema) as w:
            w.write_rows(normalize_columns(schema, table), np.full(N, RowFlag.SINGLE_ROW, np.uint8))
        data = open(path, "rb").read()
        run = scan_frames(data, 0, schema, start=decode_header(data).size)
        batches = []
        for i in range(len(run.starts)):  # one decoded batch per frame, decoded before timing
            sub = type(run)(base=0, starts=run.starts[i:i + 1], ends=run.ends[i:i + 1],
                            row_counts=run.row_counts[i:i + 1], end_offset=run.ends[i])
            batches.append((sub, decode_frames(data, 0, sub, schema)))
        del data

        best = float("inf")
        col_bytes = 0
        for rep in range(3):
            db = os.path.join(work, f"db{rep}")
            eng = StorageEngine(db, SchemaRegistry([schema]),
                                import_default=ImportConfig(flush_interval_ms=100, checkpoint_interval_ms=30000))
            eng.start()
            loc = eng.location(LocationKey("Market", "Trade", "bench", "2026-11-22"))
            t0 = time.perf_counter()
            for sub, rows in batches:
                loc.ingest(NAME, sub, rows)
            loc.flush()
            best = min(best, time.perf_counter() - t0)
            assert loc.published_rows == N
            col_bytes = sum(loc.column_files().values())
            eng.close()
            shutil.rmtree(db)

        block = os.urandom(65536)
        raw_best = float("inf")
        for rep in range(3):
            p = os.path.join(work, f"raw{rep}")
            t0 = time.perf_counter()
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            left = col_bytes
            while left > 0:
                left -= os.write(fd, block[: min(65536, left)])
            os.close(fd)
            raw_best = min(raw_best, time.perf_counter() - t0)
            os.unlink(p)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows_per_s = N / best
    raw_rows_per_s = N / raw_best
    print(f"rows={N} column bytes={col_bytes} ({col_bytes / N:.1f} B/row), batches of {BATCH}")
    print(f"engine ingest + flush: {best:.3f} s  {rows_per_s / 1e6:.2f} M rows/s (target {TARGET / 1e6:.0f} M)")
    print(f"plain 64 KiB writes of the same bytes: {raw_best:.3f} s  {raw_rows_per_s / 1e6:.2f} M rows/s")
    print("PASS" if rows_per_s >= TARGET else "BELOW TARGET")
    emit("ingest_engine", rows_per_s, "rows/s", raw_rows_per_s, rows_per_s=rows_per_s, target_rows_per_s=TARGET,
         column_bytes=col_bytes, meets_target=rows_per_s >= TARGET)


if __name__ == "__main__":
    main()
