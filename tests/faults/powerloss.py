"""The power-loss checker: record an ingestion on a FaultyDisk, cut the power after random
operations, recover a fresh engine on what the disk kept, and say what went wrong.

Invariants at every crash point, against the reference model of the logs:

* recovery succeeds (a crash is never damage);
* the recovered rows are exactly the first ``rows`` committed rows, ``rows`` is a commit boundary
  (no row of an open or rolled-back transaction), at least the rows of the last checkpoint that
  had completed, and at most the rows committed by then;
* resending from the recovered resume point, as the tailer does, gives exactly every committed
  row of the logs.
"""

from __future__ import annotations

import pathlib
import random
import shutil
from dataclasses import dataclass

from disd.storage import Location, StorageConfig, StorageEngine

from storage.util import KEY, SCHEMAS

from .crashsim import CrashPolicy, materialize, replay
from .disk import FaultyDisk, Op
from .workload import Logs, drive, drop, mismatch

#: small blocks, so a small workload has full-block writes, partial flushes and 4 KiB tears
BLOCK = 8192
STORAGE = StorageConfig(block_size_bytes=BLOCK)


@dataclass
class Recording:
    disk: FaultyDisk
    db: pathlib.Path
    engine: StorageEngine
    loc: Location
    failures: int = 0  # times the location fell in error (and was reopened)


def record(tmp_path: pathlib.Path, logs: Logs, seed: int, fault_rate: float = 0.0) -> Recording:
    """Ingest every log into a new database on a recording FaultyDisk (see workload.drive;
    ``fault_rate`` arms one-shot ENOSPC/EIO faults, each followed by a reopen)."""
    db = tmp_path / "db"
    db.mkdir()
    disk = FaultyDisk()
    engine = StorageEngine(str(db), SCHEMAS, STORAGE, fs=disk)
    loc = engine.location(KEY)

    def mark(loc: Location) -> None:
        disk.mark(committed=loc.committed_rows, checkpointed=loc.checkpointed_rows)

    mark(loc)
    failures = drive(loc, logs, random.Random(seed), mark, engine, disk, fault_rate)
    loc.flush()
    mark(loc)
    return Recording(disk, db, engine, loc, failures)


def bounds(trace: list[Op]) -> tuple[list[int], list[int]]:
    """For a crash after ``trace[:i]``: the rows of the last completed checkpoint (lower) and
    the rows committed by the end of the step in progress (upper)."""
    n = len(trace)
    lower = [0] * (n + 1)
    last = 0
    for i, op in enumerate(trace):
        lower[i] = last
        if op.kind == "mark":
            last = op.note["checkpointed"]
    lower[n] = last
    upper = [0] * (n + 1)
    nxt = max((op.note["committed"] for op in trace if op.kind == "mark"), default=0)
    for i in range(n, -1, -1):
        if i < n and trace[i].kind == "mark":
            nxt = trace[i].note["committed"]
        upper[i] = nxt
    return lower, upper


def check_image(db: pathlib.Path, logs: Logs, lower: int, upper: int) -> tuple[str | None, int]:
    """Recover a fresh engine on ``db`` and check the invariants: (what is wrong or None, the
    rows recovered)."""
    try:
        engine = StorageEngine(str(db), SCHEMAS, STORAGE)
    except Exception as e:  # noqa: BLE001 - any failure is the finding
        return f"the engine does not open: {e!r}", -1
    rows = -1
    try:
        loc = engine.location(KEY)
        if loc.in_error:
            return f"recovery refused the location: {loc.error}", rows
        rows = loc.committed_rows
        if rows < lower:
            return f"recovered {rows} rows, fewer than the {lower} of the last completed checkpoint", rows
        if rows > upper:
            return f"recovered {rows} rows, more than the {upper} committed", rows
        if rows not in logs.boundaries:
            return f"recovered {rows} rows: inside a transaction", rows
        bad = mismatch(loc, logs.expected[:rows])
        if bad:
            return f"the {rows} recovered rows are not the first committed rows: {bad}", rows
        rp = loc.resume_point
        logs.resend(loc)
        loc.flush()
        bad = mismatch(loc, logs.expected)
        if bad:
            return f"after resending from {rp}: {bad}", rows
        return None, rows
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}", rows
    finally:
        drop(engine)


def random_policy(rng: random.Random) -> CrashPolicy:
    keep = rng.choice([0.0, 1.0, 0.5, rng.random()])
    return CrashPolicy(keep=keep, sizes=rng.choice(["random", "random", "none", "all"]),
                       dirs=rng.choice(["random", "random", "none", "all"]))


@dataclass
class Outcome:
    points: int
    violations: list[str]
    recovered: set[int]  # distinct row counts recovered (where no violation)


def crash_at_random_points(rec: Recording, logs: Logs, work: pathlib.Path, points: int, seed: int) -> Outcome:
    rng = random.Random(seed)
    trace = rec.disk.trace
    lower, upper = bounds(trace)
    chosen = rng.sample(range(len(trace) + 1), min(points, len(trace) + 1))
    violations: list[str] = []
    recovered: set[int] = set()
    for i, model in replay(trace, rec.db, chosen):
        policy = random_policy(rng)
        dest = work / f"crash-{i}"
        materialize(model.crash(policy, rng), dest)
        problem, rows = check_image(dest, logs, lower[i], upper[i])
        if problem:
            last = f"{trace[i - 1].kind} {trace[i - 1].path or ''}" if i else "nothing"
            violations.append(f"power lost after operation {i} of {len(trace)} ({last}; {policy}): {problem}")
        else:
            recovered.add(rows)
        shutil.rmtree(dest)
    return Outcome(len(chosen), violations, recovered)
