"""A logger process, as an application runs one: ``python log_rows.py SCHEMA_YAML LOG_DIR IP START N``
logs Market.Trade rows START .. START+N-1 (Size = the row number, Venue ``V<i>`` when the schema
has it; other columns null) with ``IntradayLoggerBuilder`` into LOG_DIR, internal partition IP, column partition
2026-11-22, in batches of 100, and closes (a new process: a new file)."""

from __future__ import annotations

import sys

import numpy as np

from disd.logger import IntradayLoggerBuilder


def main(schema: str, log_dir: str, ip: str, start: int, n: int) -> None:
    log = (IntradayLoggerBuilder(schema).set_internal_partition(ip).set_log_dir(log_dir)
           .set_column_partition_value("2026-11-22").build())
    names = set(log.schema.column_names)
    for a in range(start, start + n, 100):
        seq = np.arange(a, min(a + 100, start + n))
        batch = {"Size": seq.astype(np.int32)}
        if "Venue" in names:
            batch["Venue"] = [f"V{i}" for i in seq]
        log.log_batch(batch)
    log.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
