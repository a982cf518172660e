"""Power cuts through the kernel (docs/reliability.md, "Real faults"): a real ``dis serve``,
tailer and loggers on ext4 on a recorded loop device; the disk rebuilt as of a power cut at a
fixed-seed sample of its flushes; at each, a clean ``e2fsck``, every checkpointed row exactly once
offline, and at some a real DIS recovering with no location in error and the tailer resuming to
every row logged.

``DIS_REALFAULTS_POINTS=n`` checks ``n`` flushes with the real DIS and tailer (default 10) and
twenty times as many offline; ``DIS_REALFAULTS_SEED`` changes the sample; the tests of the test
(DIS engines broken on purpose) run with ``DIS_REALFAULTS_BREAKS=1``."""

from __future__ import annotations

import filecmp
import os
import shutil

import pytest

from .blockrec import apply
from .powercut import Checker, choose, points_setting, record
from .privileges import fuse_problem, loop_problem, require

SEED = int(os.environ.get("DIS_REALFAULTS_SEED") or 41)


pytestmark = pytest.mark.realfaults


@pytest.fixture(autouse=True)
def _kernel_features():
    require(fuse_problem())
    require(loop_problem())


def replay(tmp_path, rec, full: int, offline: int, stop_at_first: bool = False):  # noqa: ANN001, ANN201
    chosen, fulls = choose(len(rec.flushes), offline + full, full, SEED)
    checker = Checker(rec, tmp_path / "replay")
    try:
        for k in chosen:
            res = checker.check(k, k in fulls)
            if res.problems and stop_at_first:
                break
    finally:
        checker.close()
    return checker.results


def test_power_cut_at_sampled_flushes_recovers_every_checkpointed_row_and_resumes(tmp_path):
    rec = record(tmp_path)
    full = points_setting(10)
    results = replay(tmp_path, rec, full, full * 20)
    bad = [r for r in results if r.problems]
    marks = sum(1 for e in rec.entries if e.kind == "M")
    print(f"recorded {len(rec.entries)} entries in {rec.seconds:.1f} s: {len(rec.flushes)} flushes, {marks} "
          f"checkpoint marks; logged {rec.logged}; {len(results)} power cuts tried "
          f"({sum(r.full for r in results)} with dis serve and the tailer), {len(bad)} violations")
    assert marks >= 20 and len(rec.flushes) >= 100, "the workload checkpointed too little to test anything"
    whole = tmp_path / "whole.img"  # the recorder saw every write: its whole log rebuilds the disk
    shutil.copyfile(rec.start_image, whole)
    apply(rec.log, rec.entries, whole)
    assert filecmp.cmp(whole, tmp_path / "disk.img", shallow=False), "the log misses writes the disk took"
    whole.unlink()
    assert not bad, "\n".join(f"power cut after flush {r.flush}: {p}" for r in bad[:10] for p in r.problems)
    # the sample reached states with rows in every location, and recovered varied row counts
    assert len({tuple(sorted(r.rows.items())) for r in results}) >= 10


# -- the test of the test: DIS engines that break the checkpoint's order on purpose --------------

#: the breakages of ``faults/test_power_loss.py`` a real DIS on ext4 can show.  Not here:
#: ``no_fsync_of_new_directories``, which changes only the composed creation of a location that the
#: real file system does in C (``disd.storage.newlocation``), and which ext4 makes up for anyway
#: (a journal commit takes every directory entry made before it: 483 power cuts of 483 found nothing).
BREAKS = ["rename_before_data_fsync", "no_directory_fsync_after_rename", "no_fsync_of_the_temp_record"]


@pytest.mark.parametrize("broken", BREAKS)
@pytest.mark.breaks
def test_the_power_cut_catches_a_broken_order(tmp_path, broken):
    """The same recording and replay under a ``dis serve`` whose checkpoint order is broken on
    purpose (``realfaults.broken``, the breakages of ``faults/test_power_loss.py``): a power cut
    finds rows the DIS reported checkpointed missing, or a checkpoint that does not read back.
    Replayed flush by flush until the first violation."""
    rec = record(tmp_path, broken=broken)
    results = replay(tmp_path, rec, full=2, offline=len(rec.flushes), stop_at_first=True)
    bad = [r for r in results if r.problems]
    print(f"{broken}: {len(results)} power cuts tried over {len(rec.flushes)} flushes;",
          *(f"after flush {r.flush}: {p}" for r in bad for p in r.problems[:2]), sep="\n  ")
    assert bad, f"no power cut caught {broken}"
