"""Ingestion as the tailer and the Ingest service drive it, over logs with transactions.

The logs come from ``storage.test_crash.build_logs``: single rows, transactions spanning frames,
calls and files, abandoned transactions, stray Ends and frames with a commit in the middle (resume
points with ``skip_rows``), with a row-at-a-time reference model of the committed rows.  Row
``i`` of the logs is row ``i`` of ``support.trade_rows`` (Size ``i``) with Sym ``S{i % 5}``, so a
table is checked from its Size column alone plus the derived columns.
"""

from __future__ import annotations

import bisect
import errno
import math
import pathlib
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from disd.binlog import FrameRun, LogFileName, decode_frames
from disd.storage import Location, LocationError, SourcePosition, StorageEngine

from storage.test_crash import build_logs
from storage.util import TRADE, frames, sub_run
from support import trade_rows

if TYPE_CHECKING:
    from .disk import FaultyDisk


@dataclass
class Logs:
    names: list[str]  # in log order
    data: dict[str, tuple[bytes, FrameRun]]  # each file's bytes and its frames
    expected: np.ndarray  # Size of every committed row, in order
    boundaries: set[int]  # committed row counts at which a commit completes

    @classmethod
    def build(cls, log_dir: pathlib.Path, seed: int = 3, files: int = 2, batches: int = 90) -> "Logs":
        expected, boundaries = build_logs(log_dir, seed=seed, files=files, batches=batches)
        paths = sorted(log_dir.iterdir(), key=lambda p: LogFileName.parse(p.name).sort_key)
        return cls([p.name for p in paths], {p.name: frames(p, TRADE) for p in paths},
                   np.asarray(expected, np.int64), set(boundaries))

    def cursor(self, rp: SourcePosition) -> tuple[int, int]:
        """(file index, frame index) of a resume point: the frame that starts at its offset."""
        if rp.file_name is None:
            return 0, 0
        f = self.names.index(rp.file_name)
        starts = self.data[rp.file_name][1].starts
        j = bisect.bisect_left(starts, rp.offset)
        if j < len(starts):
            assert starts[j] == rp.offset, f"resume offset {rp.offset} is not a frame start"
            return f, j
        assert rp.offset == self.data[rp.file_name][1].end_offset, rp
        return f + 1, 0

    def send(self, loc: Location, f: int, i: int, j: int) -> None:
        """Frames [i, j) of file ``f``, in one ingest call."""
        name = self.names[f]
        data, run = self.data[name]
        sub = sub_run(run, i, j)
        loc.ingest(name, sub, decode_frames(data, 0, sub, TRADE))

    def resend(self, loc: Location) -> None:
        """Everything from the location's resume point on, as a reconnecting tailer sends it."""
        f, i = self.cursor(loc.resume_point)
        while f < len(self.names):
            n = len(self.data[self.names[f]][1].starts)
            if i < n:
                self.send(loc, f, i, n)
            f, i = f + 1, 0


#: operations a one-shot fault may hit in ``drive``, and its errors
FAULT_OPS = ("pwrite", "ftruncate", "fsync", "rename", "fsync_dir")
FAULT_ERRNOS = (errno.ENOSPC, errno.EIO)


def drive(loc: Location, logs: Logs, rng: random.Random, mark=None, engine: StorageEngine | None = None,
          disk: "FaultyDisk | None" = None, fault_rate: float = 0.0) -> int:
    """Ingest every log a few frames per call, with flushes, checkpoints and tailer reconnects
    (rollback, then resume from the resume point) at random; ``mark(loc)`` after every step.

    With ``fault_rate``, a one-shot ENOSPC or EIO is armed on a random operation of ``disk``
    before that share of the steps; when the location falls in error, the disk heals, the
    engine's reopener runs (its backoff elapsed) and the tailer reconnects.  Returns how many
    times the location fell in error."""
    failures = 0
    f, i = logs.cursor(loc.resume_point)
    while f < len(logs.names):
        n = len(logs.data[logs.names[f]][1].starts)
        if i >= n:
            f, i = f + 1, 0
            continue
        if disk is not None and not disk.faults and rng.random() < fault_rate:
            disk.inject(rng.choice(FAULT_OPS), rng.choice(FAULT_ERRNOS), times=1)
        r = rng.random()
        if r < 0.6:
            j = min(n, i + rng.randint(1, 4))
            try:
                logs.send(loc, f, i, j)
                i = j
            except LocationError:
                pass
        elif r < 0.8:
            loc.flush()
        elif r < 0.95:
            loc.checkpoint()
        else:  # the stream breaks: the Ingest service rolls back, the tailer resumes
            loc.rollback()
            f, i = logs.cursor(loc.resume_point)
        if loc.in_error:
            assert engine is not None and disk is not None and loc.retryable, loc.error
            failures += 1
            disk.heal()
            if mark is not None:
                mark(loc)
            assert engine.reopen_due(now=math.inf) == 1, loc.error
            f, i = logs.cursor(loc.resume_point)
        elif disk is not None and disk.faults and disk.faults[0].exhausted():
            disk.heal()  # the fault hit an operation whose failure was not the location's
        if mark is not None:
            mark(loc)
    return failures


def mismatch(loc: Location, expected: np.ndarray) -> str | None:
    """Why the location's published rows are not exactly ``expected``; None when they are."""
    t = loc.read_table()
    size = t.column("Size").to_numpy(zero_copy_only=False).astype(np.int64)
    if len(size) != len(expected):
        return f"{len(size)} rows, expected {len(expected)}"
    if not np.array_equal(size, expected):
        k = int(np.flatnonzero(size != expected)[0])
        return f"row {k}: Size {size[k]}, expected {expected[k]}"
    price = t.column("Price").to_numpy(zero_copy_only=False)
    ts = t.column("Timestamp").cast("int64").to_numpy(zero_copy_only=False)
    syms = t.column("Sym").to_pylist()
    logged = trade_rows(0, int(expected.max(initial=-1)) + 1).take(expected)
    if (not np.array_equal(price, logged.column("Price").to_numpy())
            or not np.array_equal(ts, logged.column("Timestamp").cast("int64").to_numpy())):
        return "Price or Timestamp differ from the rows logged"
    if syms != [f"S{v % 5}" for v in expected.tolist()]:
        return "Sym differs from the rows logged"
    return None


def drop(engine: StorageEngine) -> None:
    """Let an engine go as a crash would: no flush, no checkpoint; descriptors closed."""
    for loc in engine.open_locations():
        loc.close()
    engine.file_handles.close_all()
