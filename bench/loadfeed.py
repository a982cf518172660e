"""The applications' side of ``bench/load.py``: Market.Trade rows appended to every location's log
as pre-encoded binary-log frames with plain ``write`` calls, not through ``disd.logger``.

Why: the bench measures the tailer and the DIS.  With a logger per internal partition the bench's
own process spent as much CPU as the two under test at 10,000 locations (2,000 loggers, a
partition function and a writer thread each), and made 4-9 of its 30 live writes in the time
(docs/benchmarks-history.md); the logger's own speed is ``bench/logger_batch.py``'s figure.  Here each
location's file gets its header, the burst's rows as frames (``disd.binlog.encode_frame``, at most
``MAX_ROWS_PER_FRAME`` rows each), and in the live phase the same pre-encoded frame of a few rows
per tick, one ``write`` per location: the bytes a logger writes, without its CPU.  The tailer
cannot tell the difference (a log file of whole frames, appended to).

Every call is recorded with the time it returned, so the rows logged for any location at any
instant are known exactly (``logged_at``).
"""

from __future__ import annotations

import datetime as dt
import os
import pathlib
import time

import numpy as np
import pyarrow as pa

from _common import SYMS
from disd.binlog import RowFlag, normalize_columns
from disd.binlog.format import encode_frame, encode_header, encode_rows
from disd.binlog.io import MAX_ROWS_PER_FRAME
from disd.schema import TableSchema


def file_name(ip: str, date: str) -> str:
    """The location's log file (docs/binlog-format.md), one per location for the whole run."""
    return f"Market.Trade.System.{ip}.{date}.bin.{date}.000000.000+0000"


class FrameFeed:
    """One open log file per location (``ips`` x ``dates``, ip-major), spread over ``tailers``
    directories under ``log_root`` (``t0``, ``t1``, ...) by internal partition."""

    def __init__(self, log_root: pathlib.Path, schema: TableSchema, ips: list[str], dates: list[str],
                 tailers: int) -> None:
        self.schema = schema
        self.ips, self.dates = ips, dates
        self.rng = np.random.default_rng(3)
        self.next_row = 0
        self._starts = np.array([int(dt.datetime.strptime(d, "%Y-%m-%d").replace(tzinfo=dt.timezone.utc)
                                     .timestamp()) * 1_000_000_000 for d in dates], np.int64)
        self.calls: list[tuple[float, np.ndarray]] = []  # (returned at, rows per location)
        self.fds: list[int] = []
        self.paths: list[pathlib.Path] = []
        header = encode_header(schema)
        for i, ip in enumerate(ips):
            d = log_root / f"t{i % tailers}"
            d.mkdir(parents=True, exist_ok=True)
            for date in dates:
                path = d / file_name(ip, date)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
                os.write(fd, header)
                self.fds.append(fd)
                self.paths.append(path)
        self._live: list[bytes] = []
        self._live_rows = 0

    @property
    def locations(self) -> int:
        return len(self.paths)

    def location_names(self) -> list[str]:
        return [f"{ip}/{d}" for ip in self.ips for d in self.dates]

    def _frames(self, date_index: int, n: int) -> bytes:
        """``n`` rows of one date as whole frames (random symbols, prices and sizes)."""
        out = []
        for start in range(0, n, MAX_ROWS_PER_FRAME):
            k = min(MAX_ROWS_PER_FRAME, n - start)
            idx = np.arange(self.next_row, self.next_row + k, dtype=np.int64)
            self.next_row += k
            ts = self._starts[date_index] + (idx % 86_400_000) * 1_000_000  # a millisecond apart, in the day
            cols = normalize_columns(self.schema, {
                "Timestamp": pa.array(ts).cast(pa.timestamp("ns", tz="UTC")),
                "Sym": pa.array(SYMS[self.rng.integers(0, len(SYMS), k)]),
                "Price": pa.array(self.rng.random(k) * 100 + 50),
                "Size": pa.array(self.rng.integers(1, 1000, k, dtype=np.int32)),
            })
            payload, rows = encode_rows(self.schema, cols, np.full(k, RowFlag.SINGLE_ROW, np.uint8))
            out.append(encode_frame(payload, rows))
        return b"".join(out)

    def log(self, n: int) -> None:
        """``n`` rows into every internal partition, each split evenly over its dates."""
        k = len(self.dates)
        per = np.full(k, n // k, np.int64)
        per[: n % k] += 1
        for i in range(len(self.ips)):
            for j in range(k):
                if per[j]:
                    os.write(self.fds[i * k + j], self._frames(j, int(per[j])))
        self.calls.append((time.monotonic(), np.tile(per, len(self.ips))))

    def prepare_live(self, rows_per_write: int) -> None:
        """Encode each location's live frame (``rows_per_write`` rows) once: every tick appends
        the same bytes."""
        self._live = [self._frames(loc % len(self.dates), rows_per_write) for loc in range(self.locations)]
        self._live_rows = rows_per_write

    def tick(self) -> None:
        """One live write to every location: its pre-encoded frame, one ``write`` each."""
        write = os.write
        for fd, frame in zip(self.fds, self._live):
            write(fd, frame)
        self.calls.append((time.monotonic(), np.full(self.locations, self._live_rows, np.int64)))

    def logged_at(self, times: np.ndarray) -> np.ndarray:
        """Rows logged per location (ips x dates, flattened ip-major) by each of ``times``."""
        out = np.zeros((len(times), self.locations), np.int64)
        if not self.calls:
            return out
        t = np.array([c[0] for c in self.calls])
        cum = np.vstack([np.zeros((1, self.locations), np.int64), np.cumsum(np.stack([c[1] for c in self.calls]),
                                                                              axis=0)])
        return cum[np.searchsorted(t, times, side="right")]

    def flush(self) -> None:
        """Nothing to flush: every write went to the file when it was made."""

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []
