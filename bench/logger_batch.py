"""log_batch throughput of the Python logger for the reference Market.Trade schema.

Target: at least 1 million rows/s.  Baseline, same run: writing the same number of bytes to a
file with plain writes of the same batch size (the cost floor of getting the bytes to the OS).
Last line: one JSON object; ``ratio`` = logger rows/s / raw-write rows/s.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import TRADE_SCHEMA, emit, trade_table  # noqa: E402
from disd.logger import IntradayLoggerBuilder  # noqa: E402

N = int(os.environ.get("BENCH_ROWS", 2_000_000))
BATCH = 100_000
TARGET = 1_000_000


def main() -> None:
    table = trade_table(N)
    batches = [table.slice(i, BATCH) for i in range(0, N, BATCH)]
    d = tempfile.mkdtemp()
    try:
        best = float("inf")
        size = 0
        for rep in range(3):
            logdir = os.path.join(d, f"logs{rep}")
            log = (IntradayLoggerBuilder(str(TRADE_SCHEMA)).set_log_dir(logdir)
                   .set_column_partition_value("2026-11-22").set_internal_partition("bench").build())
            t0 = time.perf_counter()
            for b in batches:
                log.log_batch(b)
            log.flush()
            best = min(best, time.perf_counter() - t0)
            log.close()
            size = sum(f.stat().st_size for f in log.files)
        chunk = os.urandom(size // len(batches))
        raw_best = float("inf")
        for rep in range(3):
            path = os.path.join(d, f"raw{rep}")
            t0 = time.perf_counter()
            with open(path, "wb", buffering=0) as f:
                for _ in batches:
                    f.write(chunk)
            raw_best = min(raw_best, time.perf_counter() - t0)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    rows_per_s = N / best
    raw_rows_per_s = N / raw_best
    print(f"rows={N} batch={BATCH} log bytes={size}")
    print(f"log_batch: {best:.3f} s  {rows_per_s / 1e6:.2f} M rows/s (target {TARGET / 1e6:.0f} M)")
    print(f"raw writes of the same bytes: {raw_best:.3f} s  {raw_rows_per_s / 1e6:.2f} M rows/s")
    print("PASS" if rows_per_s >= TARGET else "BELOW TARGET")
    emit("logger_batch", rows_per_s, "rows/s", raw_rows_per_s, rows_per_s=rows_per_s, target_rows_per_s=TARGET,
         meets_target=rows_per_s >= TARGET)


if __name__ == "__main__":
    main()
