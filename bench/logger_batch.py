"""log_batch throughput of the Python logger for the reference Market.Trade schema.

Logs N rows (default 2,000,000, env BENCH_ROWS) as pyarrow Tables of BATCH rows (default
100,000, env BENCH_BATCH) through ``IntradayLogger.log_batch`` and times it until ``flush()``
returns, i.e. until every row is encoded and written to the OS (fsync excluded, as the logger
fsyncs only on close).  Target: at least 1 million rows/s.

Baseline, same run: the floor of getting the same bytes to the OS without any encoding: the
exact bytes the logger wrote, in chunks of one batch, each copied with numpy into a buffer and
written to a file.  Also reported: single-row ``log()`` rows/s (end to end, until flushed).

Best of 3 runs each, to be the least disturbed by other load on a shared machine.  Last line:
one JSON object; ``ratio`` = logger rows/s / baseline rows/s.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "dis"))  # this checkout's disd

import numpy as np  # noqa: E402

from _common import TRADE_SCHEMA, emit, trade_table  # noqa: E402
from disd.logger import IntradayLogger, IntradayLoggerBuilder  # noqa: E402

N = int(os.environ.get("BENCH_ROWS", 2_000_000))
BATCH = int(os.environ.get("BENCH_BATCH", 100_000))
SINGLE_ROWS = int(os.environ.get("BENCH_SINGLE_ROWS", 100_000))
REPEAT = 3
TARGET = 1_000_000


def make_logger(logdir: str) -> IntradayLogger:
    return (IntradayLoggerBuilder(str(TRADE_SCHEMA)).set_process_name("bench").set_log_dir(logdir)
            .set_column_partition_value("2026-11-22").set_internal_partition("bench").build())


def main() -> None:
    table = trade_table(N)
    batches = [table.slice(i, BATCH) for i in range(0, N, BATCH)]
    d = tempfile.mkdtemp(prefix="bench-logger-")
    try:
        # log_batch
        best = float("inf")
        written = b""
        for rep in range(REPEAT):
            log = make_logger(os.path.join(d, f"logs{rep}"))
            t0 = time.perf_counter()
            for b in batches:
                log.log_batch(b)
            log.flush()
            best = min(best, time.perf_counter() - t0)
            log.close()
            if rep == 0:
                written = b"".join(f.read_bytes() for f in log.files)
        rows_per_s = N / best

        # baseline: numpy copy + raw write of the same bytes, batch by batch
        src = np.frombuffer(written, np.uint8)
        chunk = -(-len(src) // len(batches))
        buf = np.empty(chunk, np.uint8)
        raw_best = float("inf")
        for rep in range(REPEAT):
            path = os.path.join(d, f"raw{rep}")
            t0 = time.perf_counter()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                for a in range(0, len(src), chunk):
                    part = src[a:a + chunk]
                    np.copyto(buf[:len(part)], part)
                    os.write(fd, buf[:len(part)])
            finally:
                os.close(fd)
            raw_best = min(raw_best, time.perf_counter() - t0)
            os.unlink(path)
        baseline = N / raw_best

        # single rows through log()
        rows = table.slice(0, SINGLE_ROWS).to_pydict()
        ts = table.column("Timestamp").slice(0, SINGLE_ROWS).cast("int64").to_pylist()
        values = list(zip(ts, rows["Sym"], rows["Price"], rows["Size"]))
        single_best = float("inf")
        for rep in range(REPEAT):
            log = make_logger(os.path.join(d, f"single{rep}"))
            t0 = time.perf_counter()
            for t, s, p, z in values:
                log.log(Timestamp=t, Sym=s, Price=p, Size=z)
            log.flush()
            single_best = min(single_best, time.perf_counter() - t0)
            log.close()
        single_rows_per_s = SINGLE_ROWS / single_best
    finally:
        shutil.rmtree(d, ignore_errors=True)

    print(f"rows={N} batch={BATCH} log bytes={len(written)} ({len(written) / N:.1f} B/row)")
    print(f"log_batch until flushed: {best:.3f} s  {rows_per_s / 1e6:.2f} M rows/s "
          f"(target {TARGET / 1e6:.0f} M)")
    print(f"baseline, numpy copy + write of the same bytes: {raw_best:.3f} s  {baseline / 1e6:.2f} M rows/s")
    print(f"log() single rows until flushed: {single_rows_per_s / 1e3:.0f} k rows/s")
    print("PASS" if rows_per_s >= TARGET else "BELOW TARGET")
    emit("logger_batch", rows_per_s, "rows/s", baseline, rows_per_s=rows_per_s, target_rows_per_s=TARGET,
         meets_target=rows_per_s >= TARGET, single_row_log_rows_per_s=single_rows_per_s,
         bytes_per_row=len(written) / N)


if __name__ == "__main__":
    main()
