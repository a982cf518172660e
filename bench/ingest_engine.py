"""Storage engine ingest speed: decoded Market.Trade batches into one location, in process.

The engine runs its clocks as in production (flush every 100 ms).  Timed: ``Location.ingest`` of
every decoded batch (one frame of 65,536 rows each, decoded before timing) and a final flush, so
every row is published.  Target: at least 3 million rows/s.

Baseline, same run, same disk: writing the same bytes (each column file's final size, into as
many files) with plain 64 KiB ``os.write`` calls: the physical limit of the work.  ``ratio`` =
engine rows/s / baseline rows/s.  A second pair of figures includes durability: the engine's
checkpoint (fsync of every column file, table.size) against the raw files plus fsync.

Environment: BENCH_ROWS (default 4,000,000), BENCH_DIR (default the system temp dir).
Last line: one JSON object with ``rows_per_s``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np

from _common import TRADE_SCHEMA, emit, trade_table
from disd.binlog import (
    BinlogWriter,
    FrameRun,
    LocationKey,
    RowFlag,
    decode_frames,
    decode_header,
    normalize_columns,
    scan_frames,
)
from disd.schema import SchemaRegistry, load_schema
from disd.storage import ImportConfig, StorageEngine

N = int(os.environ.get("BENCH_ROWS", 4_000_000))
TARGET = 3_000_000
REPEAT = 3
BLOCK = 65536
NAME = "Market.Trade.System.bench.2026-11-22.bin.2026-11-22.000000.000+0000"
KEY = LocationKey("Market", "Trade", "bench", "2026-11-22")


def raw_write(directory: str, sizes: dict[str, int], fsync: bool) -> float:
    """Seconds to write files of these sizes with 64 KiB writes (and fsync them)."""
    block = os.urandom(BLOCK)
    t0 = time.perf_counter()
    fds = {name: os.open(os.path.join(directory, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
           for name in sizes}
    for name, size in sizes.items():
        left = size
        while left > 0:
            left -= os.write(fds[name], block[: min(BLOCK, left)])
    for fd in fds.values():
        if fsync:
            os.fsync(fd)
        os.close(fd)
    return time.perf_counter() - t0


def main() -> None:
    schema = load_schema(TRADE_SCHEMA)
    table = trade_table(N)
    work = tempfile.mkdtemp(prefix="dis-bench-", dir=os.environ.get("BENCH_DIR"))
    try:
        path = os.path.join(work, NAME)
        with BinlogWriter(path, schema) as w:
            w.write_rows(normalize_columns(schema, table), np.full(N, RowFlag.SINGLE_ROW, np.uint8))
        with open(path, "rb") as f:
            data = f.read()
        run = scan_frames(data, 0, schema, start=decode_header(data).size)
        batches = []
        for i in range(len(run.starts)):  # one decoded batch per frame, decoded before timing
            sub = FrameRun(base=0, starts=run.starts[i:i + 1], ends=run.ends[i:i + 1],
                           row_counts=run.row_counts[i:i + 1], end_offset=run.ends[i])
            batches.append((sub, decode_frames(data, 0, sub, schema)))
        del data
        os.unlink(path)

        best = best_durable = float("inf")
        sizes: dict[str, int] = {}
        for rep in range(REPEAT):
            db = os.path.join(work, f"db{rep}")
            eng = StorageEngine(db, SchemaRegistry([schema]),
                                import_default=ImportConfig(flush_interval_ms=100, checkpoint_interval_ms=30000))
            eng.start()
            loc = eng.location(KEY)
            t0 = time.perf_counter()
            for sub, rows in batches:
                loc.ingest(NAME, sub, rows)
            loc.flush()
            elapsed = time.perf_counter() - t0
            loc.checkpoint()
            durable = time.perf_counter() - t0
            best, best_durable = min(best, elapsed), min(best_durable, durable)
            assert loc.published_rows == N, loc.published_rows
            sizes = loc.column_files()
            eng.close()
            shutil.rmtree(db)

        raw_best = raw_durable = float("inf")
        for rep in range(REPEAT):
            d = os.path.join(work, f"raw{rep}")
            os.mkdir(d)
            raw_best = min(raw_best, raw_write(d, sizes, fsync=False))
            shutil.rmtree(d)
            os.mkdir(d)
            raw_durable = min(raw_durable, raw_write(d, sizes, fsync=True))
            shutil.rmtree(d)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    col_bytes = sum(sizes.values())
    rows_per_s = N / best
    raw_rows_per_s = N / raw_best
    print(f"rows={N} in {len(batches)} decoded batches; column bytes={col_bytes} ({col_bytes / N:.1f} B/row) "
          f"in {len(sizes)} files; best of {REPEAT}")
    print(f"engine ingest + flush:            {best:.3f} s  {rows_per_s / 1e6:7.2f} M rows/s "
          f"(target {TARGET / 1e6:.0f} M)")
    print(f"plain 64 KiB writes, same bytes:  {raw_best:.3f} s  {raw_rows_per_s / 1e6:7.2f} M rows/s  "
          f"ratio {rows_per_s / raw_rows_per_s:.2f}")
    print(f"engine + checkpoint (fsync):      {best_durable:.3f} s  {N / best_durable / 1e6:7.2f} M rows/s")
    print(f"plain writes + fsync:             {raw_durable:.3f} s  {N / raw_durable / 1e6:7.2f} M rows/s  "
          f"ratio {raw_durable / best_durable:.2f}")
    print("PASS" if rows_per_s >= TARGET else "BELOW TARGET")
    emit("ingest_engine", rows_per_s, "rows/s", raw_rows_per_s, rows_per_s=rows_per_s, target_rows_per_s=TARGET,
         meets_target=rows_per_s >= TARGET, column_bytes=col_bytes, rows=N,
         durable_rows_per_s=N / best_durable, durable_baseline_rows_per_s=N / raw_durable)


if __name__ == "__main__":
    main()
