"""Durability by SIGKILL: a writer killed at random points, reopened and resumed many times,
ends with exactly the committed rows: nothing lost, nothing duplicated, no partial transaction."""

from __future__ import annotations

import pathlib
import random
import resource
import subprocess
import sys
import time

import numpy as np
import pytest

from disd.binlog import BinlogWriter, RowFlag, normalize_columns
from disd.storage import StorageEngine

from .util import KEY, LOG, SCHEMAS, TRADE, trade_rows

CHILD = pathlib.Path(__file__).with_name("crash_child.py")
TESTS = pathlib.Path(__file__).resolve().parents[1]


def build_log(path: pathlib.Path, seed: int = 3, batches: int = 3000) -> list[int]:
    """A log of single rows, transactions spanning several frames and abandoned transactions.
    Returns the Size values of the committed rows, by a row-at-a-time reference model."""
    rng = random.Random(seed)
    committed: list[int] = []
    pending: list[int] = []
    in_txn = False
    i = 0
    with BinlogWriter(path, TRADE) as w:
        for _ in range(batches):
            kind = rng.random()
            n = rng.randint(1, 40)
            if kind < 0.4:
                flags = [RowFlag.SINGLE_ROW] * n
            elif kind < 0.6:
                flags = [RowFlag.START_TRANSACTION] + [RowFlag.NONE] * (n - 1)
            elif kind < 0.85:
                flags = [RowFlag.NONE] * (n - 1) + [RowFlag.END_TRANSACTION]
            else:
                flags = [RowFlag.NONE] * n
            w.write_rows(normalize_columns(TRADE, trade_rows(i, n)), np.array(flags, np.uint8))
            for k, f in enumerate(flags):  # the reference model, one row at a time
                row = i + k
                if f == RowFlag.START_TRANSACTION:
                    pending = [row]
                    in_txn = True
                elif f == RowFlag.SINGLE_ROW:
                    pending, in_txn = [], False
                    committed.append(row)
                elif f == RowFlag.END_TRANSACTION:
                    committed.extend(pending + [row]) if in_txn else committed.append(row)
                    pending, in_txn = [], False
                else:
                    if in_txn:
                        pending.append(row)
                    else:
                        committed.append(row)
            i += n
    return committed


def run_child(db_root, log, pause, kill_after=None):
    p = subprocess.Popen([sys.executable, str(CHILD), str(db_root), str(log), str(pause)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=TESTS)
    if kill_after is None:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()[-3000:]
        return out.decode()
    time.sleep(kill_after)
    p.kill()
    p.communicate(timeout=30)
    return None


@pytest.mark.slow
def test_sigkill_at_random_points_loses_and_duplicates_nothing(tmp_path):
    log = tmp_path / LOG
    expected = build_log(log)
    db_root = tmp_path / "db"
    rng = random.Random(11)
    last_rows = 0
    mid = 0
    for _ in range(50):
        run_child(db_root, log, pause=0.01, kill_after=rng.uniform(0.35, 0.9))
        eng = StorageEngine(str(db_root), SCHEMAS)
        loc = eng.location(KEY)
        assert not loc.in_error, loc.error
        rows = loc.committed_rows
        assert rows >= last_rows, "a checkpoint went backwards"
        got = loc.read_table(["Size"]).column(0).to_pylist()
        assert got == expected[:rows], "recovered rows are not a prefix of the committed rows"
        last_rows = rows
        mid += rows < len(expected)
        eng.file_handles.close_all()  # no final checkpoint: leave the state as the crash left it
    assert mid == 50 and last_rows > 0, f"only {mid} of 50 kills landed before the end of ingestion"
    out = run_child(db_root, log, pause=0.0)
    assert out.startswith("DONE")
    eng = StorageEngine(str(db_root), SCHEMAS)
    loc = eng.location(KEY)
    assert loc.read_table(["Size"]).column(0).to_pylist() == expected
    eng.close()


RSS_CHILD = r"""
import resource, sys, tempfile, pathlib, numpy as np
sys.path.insert(0, sys.argv[3])
from storage.util import KEY, SCHEMAS, TRADE, trade_rows
from disd.binlog import BinlogWriter, normalize_columns, scan_frames, decode_frames, decode_header
from disd.storage import StorageEngine
mode, n = sys.argv[1], int(sys.argv[2])
d = pathlib.Path(tempfile.mkdtemp())
eng = StorageEngine(str(d / "db"), SCHEMAS)
loc = eng.location(KEY)
batch = 100_000
name = "Market.Trade.System.ip1.2026-11-22.bin.2026-11-22.090000.000+0000"
for i in range(0, n, batch):
    flags = np.full(batch, 3, np.uint8)
    if mode == "txn":
        flags[:] = 0
        if i == 0: flags[0] = 1
        if i + batch >= n: flags[-1] = 2
    p = d / name
    if p.exists(): p.unlink()
    with BinlogWriter(p, TRADE) as w:
        w.write_rows(normalize_columns(TRADE, trade_rows(i, batch)), flags)
    data = p.read_bytes()
    run = scan_frames(data, 0, TRADE, start=decode_header(data).size)
    loc.ingest(name, run, decode_frames(data, 0, run, TRADE))
    if mode == "single": loc.flush()
loc.flush()
assert loc.published_rows == n, loc.published_rows
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


@pytest.mark.slow
def test_four_million_row_transaction_memory_is_like_single_rows():
    def peak(mode: str) -> int:
        r = subprocess.run([sys.executable, "-c", RSS_CHILD, mode, "4000000", str(TESTS)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        return int(r.stdout.strip().splitlines()[-1])

    single_kb = peak("single")
    txn_kb = peak("txn")
    print(f"peak RSS: 4M single rows {single_kb / 1024:.0f} MiB, one 4M-row transaction {txn_kb / 1024:.0f} MiB")
    assert txn_kb <= single_kb * 1.15 + 16 * 1024, (single_kb, txn_kb)
