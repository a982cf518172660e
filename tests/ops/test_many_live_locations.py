"""Thousands of locations through real ``dis serve`` and ``dis-tailer`` processes: 2,000 locations
live (a row to each, every second), and ``kill -9`` of the DIS or of the tailer in the middle of a
1,000-location burst, every row published exactly once.

The logs are written as a logger writes them (a header, then whole frames appended), by plain
writes of pre-encoded frames: the test measures the tailer and the DIS, not 2,000 loggers.  Every
location's rows carry Size values of their own (location j: j * SPAN + 0, 1, ...), so one read of
the table's Size column says whether any row was lost or published twice.
"""

from __future__ import annotations

import os
import resource
import time

import numpy as np
import psutil
import pytest

from disd.binlog import RowFlag, normalize_columns
from disd.binlog.format import encode_frame, encode_header, encode_rows
from disd.client import connect
from support import (TRADE, free_port, start_dis_process, start_tailer, trade_rows, wait_for, write_dis_config,
                     write_tailer_config)

pytestmark = pytest.mark.slow

SPAN = 1000  # Size values a location may use
COLUMN_FILES = 5  # Market.Trade's column files per location


def _frame(start: int, n: int) -> bytes:
    cols = normalize_columns(TRADE, trade_rows(start, n))
    payload, rows = encode_rows(TRADE, cols, np.full(n, RowFlag.SINGLE_ROW, np.uint8))
    return encode_frame(payload, rows)


class Logs:
    """One log file per location (``n`` internal partitions of one date), kept open for appends."""

    def __init__(self, directory, n: int) -> None:
        directory.mkdir(exist_ok=True)
        self.fds = []
        self.next = [0] * n
        header = encode_header(TRADE)
        for j in range(n):
            path = directory / f"Market.Trade.System.ip{j:05d}.2026-11-22.bin.2026-11-22.090000.000+0000"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
            os.write(fd, header)
            self.fds.append(fd)

    def append(self, rows: int, frames: int = 1) -> None:
        """``rows`` more rows to every location, in ``frames`` frames each."""
        for j, fd in enumerate(self.fds):
            for part in np.array_split(np.arange(rows), frames):
                if len(part):
                    os.write(fd, _frame(j * SPAN + self.next[j], len(part)))
                    self.next[j] += len(part)

    def encode_ticks(self, ticks: int) -> list[list[bytes]]:
        """The frames of ``ticks`` live writes, a row to every location each, encoded ahead: a
        tick is then a write per location, not 2,000 encodings."""
        return [[_frame(j * SPAN + self.next[j] + k, 1) for j in range(len(self.fds))] for k in range(ticks)]

    def write(self, frames: list[bytes]) -> None:
        """One tick of ``encode_ticks``: a frame of one row to every location."""
        for j, (fd, frame) in enumerate(zip(self.fds, frames)):
            os.write(fd, frame)
            self.next[j] += 1

    @property
    def total(self) -> int:
        return sum(self.next)

    def expected_sizes(self) -> list[int]:
        return sorted(j * SPAN + i for j, k in enumerate(self.next) for i in range(k))

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


def _room_for(locations: int) -> int:
    """The DIS's ``max_open_files`` for ``locations`` (a handle per column file when the
    descriptor limit allows: none cycling), after raising this process's soft limit to the hard
    one for the daemons to inherit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return max(512, min(COLUMN_FILES * locations + 64, hard - 2 * locations - 1024))


def _published(port: int) -> tuple[int, int]:
    """(rows, locations) the DIS has published."""
    with connect(f"127.0.0.1:{port}") as c:
        locs = c.locations("Market", "Trade")
        return sum(loc.rows for loc in locs), len(locs)


def _sizes(port: int) -> list[int]:
    with connect(f"127.0.0.1:{port}") as c:
        return sorted(c.read_table("Market", "Trade", columns=["Size"]).column("Size").to_pylist())


def test_2000_live_locations_through_real_processes(tmp_path):
    """2,000 locations, each written a row a second for 10 s after a first row each: the tailer
    holds them with a handful of threads (a location is state on its event loop, not a thread),
    every write is published within seconds, and every row exactly once."""
    n, ticks = 2000, 10
    port = free_port()
    dis_cfg = write_dis_config(tmp_path, port, storage={"max_open_files": _room_for(n)}, checkpoint_ms=5000)
    logs = Logs(tmp_path / "logs", n)
    logs.append(1)
    dis = start_dis_process(tmp_path, dis_cfg)
    tailer = start_tailer(tmp_path, write_tailer_config(tmp_path, port, tmp_path / "logs"))
    try:
        wait_for(lambda: _published(port) == (n, n), 90, 0.5, f"the first row of each of {n} locations")
        threads = psutil.Process(tailer.p.pid).num_threads()
        ticks_frames = logs.encode_ticks(ticks)
        lags = []  # rows written and not yet published, a second after each tick
        t0 = time.monotonic()
        for k, frames in enumerate(ticks_frames):
            logs.write(frames)
            time.sleep(max(0.0, t0 + k + 1 - time.monotonic()))
            lags.append(logs.total - _published(port)[0])
        t_end = time.monotonic()
        wait_for(lambda: _published(port)[0] == logs.total, 60, 0.2, "every live row published")
        drained_s = time.monotonic() - t_end
        assert _sizes(port) == logs.expected_sizes()
        # a thread per location was 2,000 threads in this tailer
        assert threads < 64, threads
        # the lag is bounded: it does not grow from tick to tick (the second half's worst is no
        # worse than the first half's and one tick more: a loaded machine may leave a tick
        # behind), and it drains within seconds of the last write
        half = ticks // 2
        assert max(lags[half:]) <= max(lags[:half]) + n, lags
        assert drained_s < 30, (drained_s, lags)
    finally:
        logs.close()
        tailer.terminate()
        dis.terminate()


@pytest.mark.parametrize("victim", ["dis", "tailer"])
def test_kill9_during_a_1000_location_burst_publishes_every_row_once(tmp_path, victim):
    n, rows = 1000, 60
    port = free_port()
    dis_cfg = write_dis_config(tmp_path, port, storage={"max_open_files": _room_for(n)}, checkpoint_ms=300)
    tailer_cfg = write_tailer_config(tmp_path, port, tmp_path / "logs", max_backoff_ms=500)
    logs = Logs(tmp_path / "logs", n)
    logs.append(rows, frames=3)
    dis = start_dis_process(tmp_path, dis_cfg)
    tailer = start_tailer(tmp_path, tailer_cfg)
    try:
        # killed once the burst has started and before it ended
        wait_for(lambda: _published(port)[0] > 0, 60, 0.02, "the burst's first rows")
        before = _published(port)
        if victim == "dis":
            dis.kill9()
            dis = start_dis_process(tmp_path, dis_cfg)
        else:
            tailer.kill9()
            tailer = start_tailer(tmp_path, tailer_cfg)
        logs.append(5)  # and rows written after the restart
        wait_for(lambda: _published(port)[0] == logs.total, 120, 0.2, f"all {logs.total} rows published")
        assert _sizes(port) == logs.expected_sizes(), f"killed the {victim} at {before} (rows, locations)"
        assert before[0] < logs.total  # the kill came in the middle of the burst
    finally:
        logs.close()
        tailer.terminate()
        dis.terminate()
