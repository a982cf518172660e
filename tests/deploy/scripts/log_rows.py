"""An application that logs Market.Trade rows with ``disd.logger``: rows START .. START+N-1, row
i with Size i (so a reader can tell exactly which rows it has), into LOG_DIR.

    python log_rows.py LOG_DIR START N

Run where the product is installed (a booted machine, a container): it uses nothing else."""

import sys

import numpy as np
import pyarrow as pa

from disd.logger import IntradayLoggerBuilder

log_dir, start, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
idx = np.arange(start, start + n, dtype=np.int64)
rows = pa.table({
    "Timestamp": pa.array(1_763_800_000_000_000_000 + idx * 1001).cast(pa.timestamp("ns", tz="UTC")),
    "Sym": pa.array(np.array(["AAPL", "MSFT", "IBM"], dtype=object)[idx % 3], pa.string()),
    "Price": pa.array(idx * 0.25),
    "Size": pa.array(idx.astype(np.int32)),
})
log = (IntradayLoggerBuilder("/etc/dis/schemas/Market.Trade.yaml").set_process_name("app").set_log_dir(log_dir)
       .set_internal_partition("app").set_column_partition_value("2026-11-22").build())
log.log_batch(rows)
log.close()  # written, fsynced
print(f"logged {n} rows from {start}")
