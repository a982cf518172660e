"""Log files and configs for the tailer's tests."""

from __future__ import annotations

import numpy as np

from disd.binlog import BinlogWriter, normalize_columns
from disd.schema import TableSchema
from disd.tailer import parse_tailer_config
from support import TRADE

TRADE2 = TableSchema.from_dict({
    "namespace": "Market", "table": "Trade",
    "columns": [{"name": c.name, "type": c.type.value} for c in TRADE.columns] + [{"name": "Venue", "type": "string"}],
})


def name(ip: str = "ip1", hour: int = 9, cp: str = "2026-11-22", kind: str = "bin", tz: str = "+0000") -> str:
    return f"Market.Trade.System.{ip}.{cp}.{kind}.2026-11-22.{hour:02d}0000.000{tz}"


def write(path, n: int, start: int = 0, schema: TableSchema = TRADE) -> int:
    """Append ``n`` rows (one frame) with Size = start..start+n-1; returns the file's end."""
    with BinlogWriter(path, schema) as w:
        return w.write_rows(normalize_columns(schema, {"Size": list(range(start, start + n))}),
                            np.full(n, 3, np.uint8))


def config(address: str, log_dir, **extra):
    data = {"dis": address, "log_dirs": [str(log_dir)], "poll_interval_ms": 50, "max_backoff_ms": 200,
            "retry_refused_ms": 300, "torn_tail_grace_ms": 300}
    data.update(extra)
    return parse_tailer_config(data, "tailer.yaml")


def sizes_from_rows(data: bytes) -> list[int]:
    """The Size column of every row in a log's bytes."""
    from disd.binlog import decode_frames, decode_header, scan_frames

    h = decode_header(data)
    run = scan_frames(data, 0, h.schema, start=h.size)
    return decode_frames(data, 0, run, h.schema).to_table().column("Size").to_pylist()
