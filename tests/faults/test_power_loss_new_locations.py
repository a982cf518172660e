"""Power loss while many new locations are made together (a day's start, a burst).

``StorageEngine.open_many`` makes a batch of new locations in one operation of the file system
(``fsio.create_locations``): every missing directory made and each parent fsynced once, every
first record written, fsynced, renamed and its directory fsynced, then every column file.  The
engine runs on a recording FaultyDisk: 30 new locations of a burst are opened together, each
takes a chunk of rows through the chunk entry (``storage.ingest``) and is checkpointed; the
power is cut after random operations, a fresh engine recovers what the disk kept (crashsim) and:

* no location is damage (a directory with column files and no ``table.size``, a bad record):
  a crash during creation leaves a new location, or none;
* every location whose checkpoint had completed holds its rows, and none holds rows it was not
  sent.

The checker is tested too: the same batch made without the parents' fsyncs must be caught.
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil

import pytest

from disd.binlog import LocationKey
from disd.storage import StorageEngine, fsio
from disd.storage.ingest import LocationIngest, ingest_chunks
from support import trade_rows, write_log

from .crashsim import materialize, replay
from .disk import FaultyDisk
from .powerloss import SCHEMAS, STORAGE, random_policy
from .test_power_loss import run_seed
from .workload import drop

KEYS = [LocationKey("Market", "Trade", f"burst{i}", d) for i in range(6)
        for d in ("2026-11-20", "2026-11-21", "2026-11-22", "2026-11-23", "2026-11-24")]
ROWS = 7


@dataclasses.dataclass
class Chunk:
    file_name: str
    offset: int
    data: bytes
    caught_up: bool = True


def _burst(tmp_path, disk: FaultyDisk) -> None:
    """The 30 locations made together, each given ROWS rows and checkpointed (marked)."""
    db = tmp_path / "db"
    db.mkdir()
    engine = StorageEngine(str(db), SCHEMAS, STORAGE, fs=disk)
    disk.mark(phase="burst")
    engine.open_many([(k, None) for k in KEYS])
    disk.mark(phase="made")
    trade = SCHEMAS.get("Market", "Trade")
    items = []
    for k in KEYS:
        name = f"Market.Trade.System.{k.internal_partition}.{k.column_partition}.bin.{k.column_partition}.090000.000+0000"
        p = tmp_path / "logs" / name
        p.parent.mkdir(exist_ok=True)
        write_log(p, trade, trade_rows(0, ROWS), [3] * ROWS)
        loc = engine.location(k)
        rp, epoch = loc.resume()
        items.append((LocationIngest(loc, trade, rp, epoch), Chunk(name, 0, p.read_bytes()), None))
    results = ingest_chunks(items)
    assert all(r is not None and r.refused is None and r.committed_rows == ROWS for r in results)
    for k in KEYS:
        loc = engine.location(k)
        loc.checkpoint()
        disk.mark(checkpointed=str(k))
    drop(engine)


def _check(db) -> str | None:
    """Recover the image: (what is wrong, or None; the locations holding their rows)."""
    try:
        engine = StorageEngine(str(db), SCHEMAS, STORAGE)
    except Exception as e:  # noqa: BLE001
        return f"the engine does not open: {e!r}", set()
    full = set()
    try:
        for loc in engine.locations():
            if loc.in_error:
                return f"{loc.key} is damage: {loc.error}", full
            if loc.committed_rows not in (0, ROWS):
                return f"{loc.key} holds {loc.committed_rows} rows", full
            if loc.committed_rows == ROWS:
                full.add(str(loc.key))
        return None, full
    finally:
        drop(engine)


def _crash_points(tmp_path, disk: FaultyDisk, seed: int, points: int) -> list[str]:
    rng = random.Random(seed)
    trace = disk.trace
    done: list[set[str]] = []  # per crash point, the locations whose checkpoint had completed
    acc: set[str] = set()
    for op in trace:
        done.append(set(acc))
        if op.kind == "mark" and "checkpointed" in op.note:
            acc.add(op.note["checkpointed"])
    done.append(set(acc))
    violations = []
    chosen = rng.sample(range(len(trace) + 1), min(points, len(trace) + 1))
    for i, model in replay(trace, tmp_path / "db", chosen):
        dest = tmp_path / f"crash-{i}"
        materialize(model.crash(random_policy(rng), rng), dest)
        problem, full = _check(dest)
        lost = done[i] - full
        if problem is None and lost:
            problem = f"checkpointed locations lost: {sorted(lost)[:3]}"
        if problem:
            violations.append(f"power lost after operation {i} of {len(trace)} "
                              f"({trace[i - 1].kind if i else 'nothing'}): {problem}")
        shutil.rmtree(dest)
    return violations


def test_power_loss_during_a_burst_of_new_locations(tmp_path):
    seed = run_seed()
    print(f"DIS_FAULT_SEED={seed}")
    disk = FaultyDisk()
    _burst(tmp_path, disk)
    phases = [i for i, op in enumerate(disk.trace) if op.kind == "mark" and "phase" in op.note]
    synced = [op.path for op in disk.trace[phases[0]:phases[1]] if op.kind == "fsync_dir"]
    # each directory fsynced once for the whole batch: a parent once for all its new children
    # (the table's directory once, not six times), each location's own once (after its rename)
    table_dir = os.path.join(str(tmp_path / "db"), "Intraday", "Market", "Trade")
    assert synced.count(table_dir) == 1 and len(synced) == len(set(synced)), synced
    assert len(synced) == 1 + 6 + 30 + 30, len(synced)
    violations = _crash_points(tmp_path, disk, seed, points=150)
    assert not violations, f"DIS_FAULT_SEED={seed}: " + "\n".join(violations[:10])


def _without_parent_fsyncs(fs, items, at_once=8):
    """create_locations as the composition makes it, but no directory fsync after a mkdir."""

    class NoParentSync:
        def __getattr__(self, name):
            return getattr(fs, name)

        def fsync_dir(self, path):
            if os.path.basename(path) in PARENTS:
                return None  # a parent that gained a new directory: skipped (broken on purpose)
            return fs.fsync_dir(path)

    return ORIGINAL(NoParentSync(), items, at_once)


ORIGINAL = fsio.create_locations
#: the internal partitions' and column partitions' directories (each gains a new directory)
PARENTS = {k.internal_partition for k in KEYS} | {k.column_partition for k in KEYS}


def test_the_checker_catches_new_locations_made_without_their_parents_fsyncs(tmp_path, monkeypatch):
    seed = run_seed()
    print(f"DIS_FAULT_SEED={seed}")
    monkeypatch.setattr(fsio, "create_locations", _without_parent_fsyncs)
    disk = FaultyDisk()
    _burst(tmp_path, disk)
    violations = _crash_points(tmp_path, disk, seed, points=150)
    assert violations, f"DIS_FAULT_SEED={seed}: the checker missed directories made without their parents' fsyncs"


pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
