"""``kill -9`` of the DIS during a burst of 1,000 new locations, with the real daemons.

A day's start: 1,000 locations' logs appear at once in a running ``dis-tailer``'s directory, and
the DIS makes their locations in batches (``StorageEngine.open_many``: directories, records and
column files of a request's opens together) and takes their chunks in batches
(``storage.ingest``).  The DIS is killed with SIGKILL while it is at it, once when some of the
locations are published and again later, and restarted each time; at the end every location
holds exactly its logged rows, each once: none lost, none doubled, none a location in error.
"""

from __future__ import annotations

import time

import pytest

from disd.client import connect
from support import (free_port_pair, start_dis_process, start_tailer, trade_rows, wait_for, write_dis_config,
                     write_log, write_tailer_config)
from support.rows import TRADE

pytestmark = pytest.mark.slow

LOCATIONS = 1000  # 200 internal partitions x 5 dates
DATES = ["2026-11-20", "2026-11-21", "2026-11-22", "2026-11-23", "2026-11-24"]
ROWS = 12  # a location's rows: single rows, then a transaction across two frames


def _logs(staged) -> dict[tuple[str, str], int]:
    """Each location's log (single rows, then a 4-row transaction in two frames); its rows."""
    out = {}
    for i in range(LOCATIONS // len(DATES)):
        for d in DATES:
            ip = f"burst{i:03d}"
            p = staged / f"Market.Trade.System.{ip}.{d}.bin.{d}.090000.000+0000"
            write_log(p, TRADE, trade_rows(0, 8), [3] * 8)
            write_log(p, TRADE, trade_rows(8, 2), [1, 0])
            write_log(p, TRADE, trade_rows(10, 2), [0, 2])
            out[(ip, d)] = ROWS
    return out


def _published(port: int) -> tuple[int, int]:
    """(locations listed, rows published) of Market.Trade."""
    with connect(f"127.0.0.1:{port}") as c:
        locs = c.locations("Market", "Trade")
        return len(locs), sum(loc.rows for loc in locs)


def test_kill9_of_the_dis_during_a_burst_of_new_locations_loses_and_duplicates_nothing(tmp_path):
    port = free_port_pair()
    staged, logs = tmp_path / "staged", tmp_path / "logs"
    staged.mkdir()
    logs.mkdir()
    expected = _logs(staged)
    dis_cfg = write_dis_config(tmp_path, port, checkpoint_ms=300)
    dis = start_dis_process(tmp_path, dis_cfg)
    tailer = start_tailer(tmp_path, write_tailer_config(tmp_path, port, logs))
    try:
        for f in sorted(staged.iterdir()):  # the burst: every log at once
            f.rename(logs / f.name)
        at_kill = []  # (locations listed, rows published) when the DIS was killed
        for want in (LOCATIONS // 10, LOCATIONS // 2):  # once a tenth is listed, then half
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    _seen = _published(port)
                except Exception:  # noqa: BLE001 - restarting
                    _seen = (0, 0)
                listed = _seen[0]
                if listed >= want:
                    break
                time.sleep(0.05)
            dis.kill9()
            at_kill.append(_seen)
            time.sleep(0.3)
            dis = start_dis_process(tmp_path, dis_cfg)
        total = sum(expected.values())
        print(f"killed at (locations listed, rows published): {at_kill}")
        assert at_kill[0][1] < total, "the first kill came after the burst: it tested nothing"
        wait_for(lambda: _published(port) == (LOCATIONS, total), 300, 0.5,
                 what=f"{LOCATIONS} locations and {total} rows published")
        with connect(f"127.0.0.1:{port}") as c:
            errors = [s.error for s in c.status().locations if s.error]
            t = c.read_table("Market", "Trade", columns=["Size"])
        assert not errors, errors[:3]
        sizes = t.column("Size").to_pylist()
        assert len(sizes) == total
        # every location holds 0..11 once (read_table concatenates the locations)
        assert sorted(sizes) == sorted(list(range(ROWS)) * LOCATIONS)
        with connect(f"127.0.0.1:{port}") as c:
            for loc in c.locations("Market", "Trade")[:: LOCATIONS // 20]:  # a sample, location by location
                got = c.read_location(loc).column("Size").to_pylist()
                assert got == list(range(ROWS)), (loc, got)
    finally:
        tailer.terminate()
        dis.terminate()
