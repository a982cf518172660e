"""Power cuts under the DIS process itself (docs/reliability.md, "Real faults"): ``dis serve``
on a LazyFS-style FUSE layer (``realfaults.lazyfs``: file contents kept in memory until fsync),
fed by the real tailer and loggers; at fixed-seed moments the DIS is killed and the layer drops
everything unsynced, as a power cut would: half of the cuts at a random moment, half right after
a checkpoint renames its record (the layer stops the DIS there, ``lazyfs`` "arm").  What is left on the disk holds every row of every
checkpoint the DIS had reported, exactly once, in whole transactions; the DIS restarts on it with
no location in error; at the end the table equals everything logged.

``DIS_REALFAULTS_POINTS=n`` cuts the power ``n`` times (default 6)."""

from __future__ import annotations

import os
import random
import time

import pytest

from support import free_port, free_port_pair, start_tailer, wait_for, write_dis_config, write_tailer_config

from .daemons import start_dis, status, stop
from .mounts import fuse_daemon
from .powercut import check_offline, final_problems, points_setting
from .privileges import fuse_problem, require
from .workload import Loggers, schemas_dirs, version2

SEED = int(os.environ.get("DIS_REALFAULTS_SEED") or 41)


pytestmark = pytest.mark.realfaults


@pytest.fixture(autouse=True)
def _kernel_features():
    require(fuse_problem())


def cut_the_power(tmp_path, cuts: int, broken: str | None = None, stop_at_first: bool = False):
    """(what went wrong at each cut, the rows found after each, seconds)."""
    t0 = time.monotonic()
    v1, _ = schemas_dirs(tmp_path)
    schema = version2(v1)
    under, lazy, work, logs = (tmp_path / n for n in ("under", "lazy", "work", "logs"))
    for d in (under, work, logs):
        d.mkdir()
    rng = random.Random(SEED)
    loggers = Loggers(logs, {1: v1 / "Market.Trade.yaml"})
    port, metrics = free_port_pair(), free_port()
    address = f"127.0.0.1:{port}"
    problems: list[str] = []
    found: list[dict[str, int]] = []
    dis = tailer = None
    with fuse_daemon("lazyfs", lazy, under, log=tmp_path / "lazyfs.log"):
        try:
            cfg = write_dis_config(work, port, metrics, db_root=lazy / "db", schemas=v1, flush_ms=50,
                                   checkpoint_ms=300)
            dis = start_dis(work, cfg, broken)
            tailer = start_tailer(work, write_tailer_config(work, port, logs, poll_interval_ms=20, max_backoff_ms=200))
            loggers.add("a")
            loggers.add("b")
            for cut in range(cuts):
                if cut == 1:
                    loggers.add("c")
                for r in range(rng.randint(6, 16)):
                    if rng.random() < 0.1:
                        loggers.roll_over()
                    for f in loggers.feeds.values():
                        if rng.random() < 0.8:
                            f.log_transaction()
                    time.sleep(0.05)
                ctl = lazy / ".lazyfs"
                floor = {ip: loc.checkpointed_rows for ip, loc in status(address).items()}
                if cut % 2:  # at a random moment
                    time.sleep(rng.random() * 0.6)
                    floor = {ip: loc.checkpointed_rows for ip, loc in status(address).items()}
                    dis.kill9()
                    ctl.write_text("cut")  # the power goes: every unsynced byte with it
                else:  # right after a checkpoint's rename of its record, the DIS stopped there
                    before = int(ctl.read_text())
                    ctl.write_text(f"arm table.size {rng.randint(1, 3)}")
                    deadline = time.monotonic() + 30
                    while int(ctl.read_text()) == before:  # rows keep coming, so checkpoints keep renaming
                        assert time.monotonic() < deadline, "the armed power cut never came"
                        for f in loggers.feeds.values():
                            f.log_transaction()
                        time.sleep(0.05)
                    dis.kill9()
                ctl.write_text("revive")
                rows, bad = check_offline(under / "db", schema, floor, loggers.logged(), loggers.versions())
                found.append(rows)
                problems += [f"power cut {cut + 1}: {p}" for p in bad]
                if bad and stop_at_first:
                    break
                dis = start_dis(work, cfg, broken)
                errors = {ip: loc.error for ip, loc in status(address).items() if loc.error}
                if errors:
                    problems.append(f"power cut {cut + 1}: the restarted DIS has locations in error: {errors}")
                    if stop_at_first:
                        break
            if not problems:
                try:
                    wait_for(lambda: all(status(address)[ip].rows == n for ip, n in loggers.logged().items()), 60,
                             0.05, "every row after the last power cut")
                except AssertionError as e:
                    problems.append(str(e))
                problems += [f"at the end: {p}" for p in final_problems(address, loggers.logged(), loggers.versions())]
        finally:
            stop(tailer, dis)
            loggers.close()
    return problems, found, time.monotonic() - t0, loggers.logged()


def test_power_cuts_under_the_dis_keep_every_checkpointed_row_and_resume(tmp_path):
    cuts = points_setting(6)
    problems, found, took, logged = cut_the_power(tmp_path, cuts)
    print(f"{cuts} power cuts in {took:.1f} s; rows kept after each: {found}; logged {logged}; "
          f"{len(problems)} violations")
    assert not problems, "\n".join(problems[:10])
    assert any(sum(r.values()) > 0 for r in found), "no power cut came after a checkpoint"


#: what the layer can show of the checkpoint's order: data kept in memory until fsync.  Directory
#: entries reach the disk at once here, so a missing directory fsync is the recorder's to catch.
BREAKS = ["rename_before_data_fsync", "no_fsync_of_the_temp_record"]


@pytest.mark.parametrize("broken", BREAKS)
def test_the_lazy_layer_catches_a_broken_order(tmp_path, broken):
    """A DIS whose checkpoint renames its record before the column files (or the record itself)
    are synced loses checkpointed rows to the first cut armed at that rename."""
    problems, found, took, _ = cut_the_power(tmp_path, 8, broken, stop_at_first=True)
    print(f"{broken}: {len(found)} power cuts, {took:.1f} s:", *problems[:3], sep="\n  ")
    assert problems, f"no power cut caught {broken}"
