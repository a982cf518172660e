"""Feeding a location from real binary log files, as the Ingest service does."""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pyarrow as pa

from disd.binlog import FrameRun, LocationKey, decode_frames, decode_header, scan_frames
from disd.schema import SchemaRegistry, TableSchema
from support import SCHEMAS as SCHEMAS_DIR, log_name

SCHEMAS = SchemaRegistry.load_dir(SCHEMAS_DIR)
TRADE = SCHEMAS.get("Market", "Trade")
KEY = LocationKey("Market", "Trade", "ip1", "2026-11-22")
LOG = log_name("ip1")

ALL_KEY = LocationKey("Test", "AllTypes", "ip", "2026-11-22")
ALL_LOG = "Test.AllTypes.System.ip.2026-11-22.bin.2026-11-22.000000.000+0000"
STRINGS = ["AAPL", "", "żółć", "日本語", "x" * 300, "MSFT", "emoji 🚀 ✓", "tab\tnew\nline", "\u0000nul"]


def all_types_table(n: int, seed: int = 7, null_fraction: float = 0.2) -> pa.Table:
    """Every column type, with nulls, non-ASCII strings and the extreme non-sentinel values."""
    rng = np.random.default_rng(seed)
    strs = np.array(STRINGS, dtype=object)

    def mask():
        return rng.random(n) < null_fraction

    def ints(dtype):
        info = np.iinfo(dtype)
        v = rng.integers(info.min + 1, info.max, n, dtype=dtype, endpoint=True)
        if n >= 2:
            v[0], v[1] = info.min + 1, info.max  # the values next to the sentinel survive
        return v

    cols = {
        "Bool": pa.array(rng.random(n) < 0.5, mask=mask()),
        "Byte": pa.array(ints(np.int8), mask=mask()),
        "Short": pa.array(ints(np.int16), mask=mask()),
        "Int": pa.array(ints(np.int32), mask=mask()),
        "Long": pa.array(ints(np.int64), mask=mask()),
        "Float": pa.array((rng.standard_normal(n) * 1e6).astype(np.float32), mask=mask()),
        "Double": pa.array(rng.standard_normal(n) * 1e300, mask=mask()),
        "Char": pa.array(rng.integers(0, 0xFFFE, n, dtype=np.uint16, endpoint=True), mask=mask()),
        "String": pa.array(strs[rng.integers(0, len(strs), n)].tolist(), pa.string(), mask=mask()),
        "Timestamp": pa.array(rng.integers(-(2**62), 2**62, n, dtype=np.int64), mask=mask()).cast(
            pa.timestamp("ns", tz="UTC")
        ),
        "Other": pa.array(strs[rng.integers(0, len(strs), n)].tolist(), pa.string(), mask=mask()),
    }
    return pa.table(cols)


def sub_run(run: FrameRun, i: int, j: int) -> FrameRun:
    """Frames [i, j) of a run."""
    return FrameRun(base=run.base, starts=run.starts[i:j], ends=run.ends[i:j], row_counts=run.row_counts[i:j],
                    end_offset=run.ends[j - 1])


def frames(path, schema: TableSchema = TRADE, start: int = 0) -> tuple[bytes, FrameRun]:
    data = pathlib.Path(path).read_bytes()
    hdr = decode_header(data)
    return data, scan_frames(data, 0, schema, start=max(start, hdr.size))


def ingest_file(loc, path, schema: TableSchema = TRADE, start: int = 0, frames_per_call: int | None = None):
    """Send the frames of a log from ``start`` as the Ingest service would."""
    data, run = frames(path, schema, start)
    name = pathlib.Path(path).name
    k = frames_per_call or len(run.starts) or 1
    for i in range(0, len(run.starts), k):
        sub = sub_run(run, i, min(i + k, len(run.starts)))
        loc.ingest(name, sub, decode_frames(data, 0, sub, schema))


def fds_under(root, column_files_only: bool = False) -> int:
    """Descriptors of this process open on files under ``root`` (only on column files, ``.dat``
    and ``.off``, with ``column_files_only``: a checkpoint briefly holds two more, on
    ``table.size.tmp`` and the directory, outside the file-handle factory)."""
    root = str(root)
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(root) and (not column_files_only or target.endswith((".dat", ".off"))):
            n += 1
    return n
