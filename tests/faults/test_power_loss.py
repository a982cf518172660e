"""Power loss, not only kill -9.

A kill -9 keeps everything the process wrote (the kernel still has it); a power loss keeps only
what the fsync barriers promised.  The engine runs on a FaultyDisk that records every durable
operation; the power is cut after random operations of an ingestion with transactions, flushes,
checkpoints and tailer reconnects; a fresh engine recovers what the disk kept (crashsim's model:
unsynced writes lost, torn at 4 KiB or reordered, size changes and directory entries only as far
as fsyncs promise) and must hold exactly a committed prefix of at least the last completed
checkpoint, from which resending gives exactly every committed row.

The checker is itself tested: engines that break the order on purpose must be caught.

Seeds: ``DIS_FAULT_SEED`` fixes one; otherwise each run draws one and names it on failure.
"""

from __future__ import annotations

import os
import random

import pytest

from disd.storage import Location, fsio
from disd.storage import location as location_mod
from disd.storage.checkpoint import FILE_NAME, TEMP_NAME

from .crashsim import CrashPolicy, materialize, read_tree, replay
from .disk import FaultyDisk
from .powerloss import check_image, crash_at_random_points, record
from .workload import Logs

STRICTEST = CrashPolicy(keep=0.0, sizes="none", dirs="none")


def run_seed() -> int:
    return int(os.environ.get("DIS_FAULT_SEED") or random.SystemRandom().randrange(1 << 32))


@pytest.fixture
def seed():
    s = run_seed()
    print(f"DIS_FAULT_SEED={s}")
    return s


def test_the_model_sees_every_durable_operation(tmp_path, seed):
    """Replaying the trace gives byte for byte the real files (nothing bypassed the seam), and
    after a clean close the strictest crash (every unsynced byte and entry lost) still holds
    every committed row."""
    logs = Logs.build(tmp_path / "logs", seed=seed % 1000)
    rec = record(tmp_path, logs, seed)
    assert rec.loc.committed_rows == len(logs.expected), f"seed {seed}"
    trace = rec.disk.trace
    (_, model), = replay(trace, rec.db, [len(trace)])
    assert model.current() == read_tree(rec.db), f"seed {seed}: the model and the real files differ"
    rec.engine.close()
    closed = rec.disk.trace
    (_, model), = replay(closed, rec.db, [len(closed)])
    materialize(model.crash(STRICTEST, random.Random(seed)), tmp_path / "after")
    n = len(logs.expected)
    problem, rows = check_image(tmp_path / "after", logs, lower=n, upper=n)
    assert problem is None and rows == n, f"seed {seed}: {problem}"


def test_power_loss_at_random_points_recovers_a_committed_prefix_and_resumes_exactly(tmp_path, seed):
    logs = Logs.build(tmp_path / "logs", seed=seed % 1000, files=3, batches=150)
    rec = record(tmp_path, logs, seed)
    out = crash_at_random_points(rec, logs, tmp_path / "work", points=400, seed=seed)
    print(f"{out.points} crash points over {len(rec.disk.trace)} operations; {len(logs.expected)} committed rows; "
          f"{len(out.recovered)} distinct recovered row counts; {len(out.violations)} violations")
    assert not out.violations, (f"DIS_FAULT_SEED={seed}: {len(out.violations)} of {out.points} crash points "
                                "violate the invariants:\n" + "\n".join(out.violations[:10]))
    # the crash points fell all along the ingestion, not only at its start
    assert len(out.recovered) >= 10 and max(out.recovered) > len(logs.expected) // 2, sorted(out.recovered)


def test_power_loss_after_io_errors_and_reopens(tmp_path, seed):
    """The same, on an ingestion where one-shot ENOSPC and EIO hit writes, truncates, fsyncs,
    renames and directory fsyncs, each time followed by a reopen from the checkpoint and a
    reconnect: a failed fsync's pages are lost for good, and still nothing committed is."""
    logs = Logs.build(tmp_path / "logs", seed=seed % 1000, files=3, batches=150)
    rec = record(tmp_path, logs, seed, fault_rate=0.04)
    assert rec.loc.committed_rows == len(logs.expected) and rec.failures >= 3, rec.failures
    out = crash_at_random_points(rec, logs, tmp_path / "work", points=300, seed=seed)
    kinds = sorted({op.kind for op in rec.disk.trace if op.kind == "fsync_failed"})
    print(f"{rec.failures} I/O errors and reopens; {out.points} crash points over {len(rec.disk.trace)} operations; "
          f"{len(out.violations)} violations {kinds}")
    assert not out.violations, (f"DIS_FAULT_SEED={seed}: {len(out.violations)} of {out.points} crash points "
                                "violate the invariants:\n" + "\n".join(out.violations[:10]))


# -- the test of the test: engines that break the order on purpose are caught ----------------------


def _rename_before_data_fsync(self, handles, record, state=None):  # no last-by state in these tables
    location_mod.write_record(str(self.path), record, self.fs)
    for h in handles:
        h.fsync()


def _record_without_directory_fsync(directory, record, fs):
    tmp = os.path.join(str(directory), TEMP_NAME)
    fsio.write_file(fs, tmp, record.to_bytes())
    fs.rename(tmp, os.path.join(str(directory), FILE_NAME))


def _record_without_temp_fsync(directory, record, fs):
    tmp = os.path.join(str(directory), TEMP_NAME)
    fd = fs.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    fs.pwrite(fd, record.to_bytes(), 0)
    fs.close(fd)
    fs.rename(tmp, os.path.join(str(directory), FILE_NAME))
    fs.fsync_dir(str(directory))


def _mkdir_without_parent_fsync(fs, path):
    missing = []
    p = os.path.abspath(path)
    while not fsio.exists(fs, p):
        missing.append(p)
        p = os.path.dirname(p)
    for d in reversed(missing):
        fs.mkdir(d)


BREAKS = {
    "rename_before_data_fsync": (Location, "_make_durable", _rename_before_data_fsync),
    "no_directory_fsync_after_rename": (location_mod, "write_record", _record_without_directory_fsync),
    "no_fsync_of_the_temp_record": (location_mod, "write_record", _record_without_temp_fsync),
    "no_fsync_of_new_directories": (fsio, "make_dirs", _mkdir_without_parent_fsync),
}


@pytest.mark.parametrize("broken", sorted(BREAKS))
def test_the_checker_catches_a_broken_order(tmp_path, monkeypatch, seed, broken):
    target, name, fn = BREAKS[broken]
    monkeypatch.setattr(target, name, fn)
    logs = Logs.build(tmp_path / "logs", seed=seed % 1000, files=2, batches=120)
    rec = record(tmp_path, logs, seed)
    assert rec.loc.committed_rows == len(logs.expected)  # the broken engine works until the power goes
    out = crash_at_random_points(rec, logs, tmp_path / "work", points=200, seed=seed)
    print(f"{broken}: {len(out.violations)} of {out.points} crash points caught", *out.violations[:3], sep="\n  ")
    assert out.violations, f"DIS_FAULT_SEED={seed}: the checker missed {broken}"


# -- the model itself ---------------------------------------------------------------------------


def _disk(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    return FaultyDisk(), root


def _crash(disk, root, policy, seed=0):
    (_, model), = replay(disk.trace, root, [len(disk.trace)])
    return model.crash(policy, random.Random(seed))


def _durable_file(disk, root, data: bytes) -> int:
    """``root/f`` holding ``data``, fsynced and its directory too (what every crash keeps); its
    descriptor, open for the writes a test then crashes."""
    fd = disk.open(str(root / "f"), os.O_RDWR | os.O_CREAT)
    disk.pwrite(fd, data, 0)
    disk.fsync(fd)
    disk.fsync_dir(str(root))
    return fd


def test_model_unsynced_writes_may_vanish_synced_ones_stay(tmp_path):
    disk, root = _disk(tmp_path)
    fd = _durable_file(disk, root, b"a" * 5000)
    disk.pwrite(fd, b"b" * 3000, 5000)
    assert _crash(disk, root, STRICTEST) == {"f": b"a" * 5000}
    assert _crash(disk, root, CrashPolicy(1.0, "all", "all")) == {"f": b"a" * 5000 + b"b" * 3000}
    # the size persisted but the data did not: a hole of zeros
    assert _crash(disk, root, CrashPolicy(0.0, "all", "all")) == {"f": b"a" * 5000 + bytes(3000)}


def test_model_tears_writes_at_4_kib_pages_in_any_order(tmp_path):
    disk, root = _disk(tmp_path)
    fd = _durable_file(disk, root, b"o" * 12288)
    disk.pwrite(fd, b"n" * 12288, 0)
    seen = set()
    for s in range(64):
        data = _crash(disk, root, CrashPolicy(0.5, "all", "all"), seed=s)["f"]
        pages = tuple(data[i * 4096:(i + 1) * 4096] for i in range(3))
        assert all(p in (b"o" * 4096, b"n" * 4096) for p in pages)  # torn only at page boundaries
        seen.add(tuple(p[:1] for p in pages))
    assert (b"o", b"n", b"o") in seen and (b"n", b"o", b"n") in seen  # later pages without earlier ones
    assert len(seen) == 8


def test_model_directory_entries_need_a_directory_fsync(tmp_path):
    disk, root = _disk(tmp_path)
    fd = disk.open(str(root / "new"), os.O_RDWR | os.O_CREAT)
    disk.pwrite(fd, b"x", 0)
    disk.fsync(fd)
    disk.close(fd)
    assert _crash(disk, root, STRICTEST) == {}  # the file is durable, its name is not
    disk.fsync_dir(str(root))
    assert _crash(disk, root, STRICTEST) == {"new": b"x"}
    fd = disk.open(str(root / "tmp"), os.O_RDWR | os.O_CREAT)
    disk.pwrite(fd, b"y", 0)
    disk.fsync(fd)
    disk.close(fd)
    disk.rename(str(root / "tmp"), str(root / "new"))
    assert _crash(disk, root, STRICTEST) == {"new": b"x"}  # the rename is not durable yet
    assert _crash(disk, root, CrashPolicy(0.0, "none", "all")) == {"new": b"y"}
    disk.mkdir(str(root / "d"))
    fd = disk.open(str(root / "d" / "f"), os.O_RDWR | os.O_CREAT)
    disk.fsync(fd)
    disk.fsync_dir(str(root / "d"))
    assert "d" not in _crash(disk, root, STRICTEST)  # its parent never synced the new directory


def test_model_a_failed_fsync_loses_its_pages_for_good(tmp_path):
    import errno

    disk, root = _disk(tmp_path)
    fd = _durable_file(disk, root, b"a" * 4096)
    disk.pwrite(fd, b"b" * 8192, 4096)
    disk.inject("fsync", errno.EIO, times=1)
    with pytest.raises(OSError):
        disk.fsync(fd)
    disk.fsync(fd)  # "succeeds": the kernel has nothing dirty left to write
    assert _crash(disk, root, STRICTEST) == {"f": b"a" * 4096 + bytes(8192)}
    disk.pwrite(fd, b"c" * 10, 4096)  # a new write dirties its page again
    disk.fsync(fd)
    assert _crash(disk, root, STRICTEST) == {"f": b"a" * 4096 + b"c" * 10 + b"b" * 4086 + bytes(4096)}
