"""Power cuts through the kernel: a real ``dis serve`` ingesting onto ext4 on a loop device
whose backing file is recorded (``blockrec``), then the disk rebuilt as of a power cut at chosen
flushes and checked.

Recording: the DIS, the real tailer and the applications' loggers run as in production (transactions,
rollovers, new locations, a restart that declares schema version 2 and a location written in it,
checkpoints every 250 ms); a thread asks the DIS's Status all along and writes into the
recording, as a mark, every checkpoint the DIS reports complete.

A power cut just before flush ``k + 1`` completes may leave the disk with nothing after flush
``k``: the start image plus every write logged before flush ``k``.  Each mark logged before flush
``k + 1`` is a checkpoint the DIS had reported durable by then: the image must hold at least its
rows.  At each chosen flush the image is checked (``Checker``).
"""

from __future__ import annotations

import json
import pathlib
import random
import shutil
import threading
import time
from dataclasses import dataclass, field

from disd.blocks import LocalColumnFiles, read_location
from disd.client import connect
from support import Proc, free_port, free_port_pair, start_tailer, wait_for, write_dis_config, write_tailer_config

from . import blockrec
from .daemons import start_dis, status, stop
from .mounts import fsck, fuse_daemon, loop_device, make_ext4, mounted, run
from .workload import Loggers, prefix_problem, schemas_dirs, version2

IMAGE_MIB = 96
CHECKPOINT_MS = 250


@dataclass
class Recording:
    dir: pathlib.Path
    start_image: pathlib.Path
    log: pathlib.Path
    entries: list[blockrec.Entry]
    log_dir: pathlib.Path  # the applications' binary logs (on the real disk)
    schemas_v2: pathlib.Path
    logged: dict[str, int]
    versions: dict[str, int]
    seconds: float = 0.0

    @property
    def flushes(self) -> list[int]:
        return blockrec.flush_points(self.entries)

    def checkpointed_before(self, end: int) -> dict[str, int]:
        """The rows of the last checkpoint the DIS reported per location, among the marks logged
        before entry ``end``."""
        out: dict[str, int] = {}
        for m in blockrec.marks_before(self.entries, end):
            out[m["ip"]] = max(out.get(m["ip"], 0), m["ckpt"])
        return out


class CheckpointMarker:
    """Asks the DIS's Status every few ms and writes a mark for each checkpoint it reports."""

    def __init__(self, ctl: pathlib.Path) -> None:
        self.ctl = ctl
        self.address: str | None = None
        self.seen: dict[str, int] = {}
        self.marks = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            address = self.address
            if address is not None:
                try:
                    st = status(address)
                except Exception:  # noqa: BLE001 - the DIS restarting
                    st = {}
                lines = []
                for ip, loc in st.items():
                    if loc.checkpointed_rows > self.seen.get(ip, 0):
                        self.seen[ip] = loc.checkpointed_rows
                        lines.append(json.dumps({"ip": ip, "ckpt": loc.checkpointed_rows}) + "\n")
                if lines:
                    with open(self.ctl, "a") as f:
                        f.write("".join(lines))
                    self.marks += len(lines)
            self._stop.wait(0.01)

    def close(self) -> None:
        self._stop.set()
        self.thread.join(10)


def _rows_everywhere(address: str, want: dict[str, int], checkpointed: bool = False) -> bool:
    st = status(address)
    return all(ip in st and (st[ip].checkpointed_rows if checkpointed else st[ip].rows) == n for ip, n in want.items())


def record(tmp: pathlib.Path, broken: str | None = None, rounds: int = 24) -> Recording:
    """Run the workload on a recorded disk; the log of its writes, flushes and marks."""
    t0 = time.monotonic()
    v1, v2 = schemas_dirs(tmp)
    image, start = tmp / "disk.img", tmp / "start.img"
    make_ext4(image, IMAGE_MIB)
    run("cp", "--sparse=always", image, start)
    log = tmp / "writes.log"
    log_dir = tmp / "logs"
    log_dir.mkdir()
    loggers = Loggers(log_dir, {1: v1 / "Market.Trade.yaml", 2: v2 / "Market.Trade.yaml"})
    port, metrics = free_port_pair(), free_port()
    work = tmp / "recording"
    work.mkdir()
    dis = tailer = None
    with fuse_daemon("blockrec", tmp / "rec", image, log, log=tmp / "blockrec.log"):
        with loop_device(tmp / "rec" / blockrec.IMAGE_NAME) as dev, mounted(dev, tmp / "fs"):
            marker = CheckpointMarker(tmp / "rec" / blockrec.CTL_NAME)
            try:
                address = f"127.0.0.1:{port}"
                cfg = write_dis_config(work, port, metrics, db_root=tmp / "fs" / "db", schemas=v1, flush_ms=50,
                                       checkpoint_ms=CHECKPOINT_MS)
                dis = start_dis(work, cfg, broken)
                marker.address = address
                tailer = start_tailer(work, write_tailer_config(work, port, log_dir, poll_interval_ms=20,
                                                                max_backoff_ms=200))
                loggers.add("a")
                loggers.add("b")
                for r in range(rounds):
                    if r == rounds // 3:
                        loggers.add("c")  # a new location part-way
                    if r % 8 == 4:
                        loggers.roll_over()
                    for f in loggers.feeds.values():
                        if (r + len(f.ip)) % 5 != 0 or f.ip == "a":
                            f.log_transaction()
                    time.sleep(0.05)
                wait_for(lambda: _rows_everywhere(address, loggers.logged()), 60, 0.05, "every row before the restart")
                marker.address = None
                assert dis.terminate() == 0, dis.log_text()[-3000:]
                # second life: version 2 declared, a location written in it, the others go on in version 1
                cfg = write_dis_config(work, port, metrics, db_root=tmp / "fs" / "db", schemas=v2, flush_ms=50,
                                       checkpoint_ms=CHECKPOINT_MS)
                dis = start_dis(work, cfg, broken)
                marker.address = address
                loggers.add("v", version=2)
                for r in range(rounds * 2 // 3):
                    if r % 8 == 4:
                        loggers.roll_over()
                    for f in loggers.feeds.values():
                        if f.ip != "c" or r < 4:
                            f.log_transaction()
                    time.sleep(0.05)
                wait_for(lambda: _rows_everywhere(address, loggers.logged(), checkpointed=True), 60, 0.05,
                         "every row checkpointed")
                time.sleep(0.1)  # the marker's last poll
            finally:
                marker.close()
                stop(tailer, dis)
                loggers.close()
    return Recording(tmp, start, log, blockrec.read_log(log), log_dir, v2, loggers.logged(), loggers.versions(),
                     time.monotonic() - t0)


# -- checking -----------------------------------------------------------------------------------


@dataclass
class PointResult:
    flush: int  # the number of the flush (0-based) the power was cut after
    problems: list[str]
    rows: dict[str, int]
    full: bool  # checked with a real dis serve and tailer too


@dataclass
class Checker:
    """Rebuilds the disk at chosen flushes (in order, each from the last) and checks each:

    * ``e2fsck -fn`` finds the file system clean once the kernel replayed its journal (a mount);
    * offline, every location at its checkpoint holds rows ``0 .. n-1`` exactly once, whole
      transactions, at least the rows of every checkpoint the DIS had reported, never more than
      were logged (``LocalColumnFiles``, the reader of a DIS host's files);
    * for the ``full`` ones, a real ``dis serve`` starts on the image with no location in error
      and no manual repair, and the real tailer (one for all the points, as after a restart of its
      DIS) resumes it to every row logged, each once.
    """
    rec: Recording
    work: pathlib.Path
    results: list[PointResult] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.image = self.work / "replay.img"
        shutil.copyfile(self.rec.start_image, self.image)
        self.applied = 0
        self.port = free_port_pair()
        self.metrics = free_port()
        self.tailer: Proc | None = None
        self.schema = version2(self.rec.schemas_v2)

    def close(self) -> None:
        stop(self.tailer)

    def check(self, k: int, full: bool) -> PointResult:
        flushes = self.rec.flushes
        end = flushes[k]
        assert end >= self.applied, "points are checked in order"
        blockrec.apply(self.rec.log, self.rec.entries[self.applied:end], self.image)
        self.applied = end
        nxt = flushes[k + 1] if k + 1 < len(flushes) else len(self.rec.entries)
        floor = self.rec.checkpointed_before(nxt)
        # a new file (and loop devices of our own) for each point: mount -o loop would reuse a
        # loop device still attached to the same file, whose cached blocks are another point's
        chk = self.work / f"check-{k}.img"
        run("cp", "--sparse=always", self.image, chk)
        problems: list[str] = []
        rows: dict[str, int] = {}
        mnt = self.work / "mnt"
        try:
            with loop_device(chk) as dev, mounted(dev, mnt):  # the kernel replays the journal, as at boot
                pass
            r = fsck(chk)
            if r.returncode != 0:
                problems.append(f"e2fsck -fn exit {r.returncode}: {(r.stdout + r.stderr).strip()[-600:]}")
            with loop_device(chk) as dev, mounted(dev, mnt):
                db = mnt / "db"
                rows, found = self._offline(db, floor)
                problems += found
                if full and not problems:
                    problems += self._with_dis(db)
        finally:
            chk.unlink()
        res = PointResult(k, problems, rows, full)
        self.results.append(res)
        return res

    def _offline(self, db: pathlib.Path, floor: dict[str, int]) -> tuple[dict[str, int], list[str]]:
        return check_offline(db, self.schema, floor, self.rec.logged, self.rec.versions)

    def _with_dis(self, db: pathlib.Path) -> list[str]:
        d = self.work / "dis"
        d.mkdir(exist_ok=True)
        cfg = write_dis_config(d, self.port, self.metrics, db_root=db, schemas=self.rec.schemas_v2, flush_ms=20,
                               checkpoint_ms=1000)
        address = f"127.0.0.1:{self.port}"
        dis = start_dis(d, cfg)
        problems: list[str] = []
        try:
            errors = {ip: loc.error for ip, loc in status(address).items() if loc.error}
            if errors:
                return [f"recovery put locations in error: {errors}"]
            if self.tailer is None or not self.tailer.alive():
                tcfg = write_tailer_config(self.work, self.port, self.rec.log_dir, poll_interval_ms=20,
                                           max_backoff_ms=200, state_dir=str(self.work / "tailer-state"))
                self.tailer = start_tailer(self.work, tcfg)
            try:
                wait_for(lambda: _rows_everywhere(address, self.rec.logged), 60, 0.05, "the tailer resuming every row")
            except AssertionError as e:
                problems.append(f"after the restart: {e}")
            problems += [f"after the tailer resumed: {p}" for p in final_problems(address, self.rec.logged,
                                                                                  self.rec.versions)]
            errors = {ip: loc.error for ip, loc in status(address).items() if loc.error}
            if errors:
                problems.append(f"locations in error after resuming: {errors}")
        finally:
            stop(dis)
        return problems


def check_offline(db: pathlib.Path, schema, floor: dict[str, int], logged: dict[str, int],
                  versions: dict[str, int]) -> tuple[dict[str, int], list[str]]:
    """A database root as a power cut left it, read as the DIS host's column-file reader reads
    it (at each location's checkpoint): (rows per location, what is wrong).  Every location
    holds rows ``0 .. n-1`` exactly once in whole transactions, at least ``floor`` (checkpoints
    the DIS had reported), at most what was ``logged``."""
    problems: list[str] = []
    rows: dict[str, int] = {}
    if db.exists():
        src = LocalColumnFiles(str(db), [schema])
        try:
            for snap in src.locations("Market", "Trade"):
                ip = snap.key.internal_partition
                presented = src.schema(schema)
                t = read_location(src, presented, snap, [c for c in ("Size", "Venue") if c in presented.column_names])
                rows[ip] = t.num_rows
                bad = prefix_problem(ip, t, versions.get(ip, 1))
                if bad:
                    problems.append(bad)
        except Exception as e:  # noqa: BLE001 - any failure to read a checkpoint is the finding
            problems.append(f"the checkpointed files do not read back: {type(e).__name__}: {e}")
        finally:
            src.close()
    for ip, n in floor.items():
        if rows.get(ip, 0) < n and not problems:
            problems.append(f"{ip}: {rows.get(ip, 0)} rows on disk, fewer than the {n} of a checkpoint the DIS "
                            "had reported complete")
    for ip, n in rows.items():
        if n > logged.get(ip, 0):
            problems.append(f"{ip}: {n} rows, more than the {logged.get(ip, 0)} logged")
    return rows, problems


def final_problems(address: str, logged: dict[str, int], versions: dict[str, int]) -> list[str]:
    """What differs, at the DIS at ``address``, from every row ``logged`` exactly once."""
    problems = []
    with connect(address, retry_s=5) as c:
        seen = set()
        for snap in c.locations("Market", "Trade"):
            ip = snap.key.internal_partition
            seen.add(ip)
            names = c.schema("Market", "Trade").column_names
            t = c.read_location(snap, [n for n in ("Size", "Venue") if n in names])
            bad = prefix_problem(ip, t, versions.get(ip, 1))
            if bad or t.num_rows != logged.get(ip):
                problems.append(bad or f"{ip}: {t.num_rows} rows, {logged.get(ip)} logged")
    problems += [f"{ip}: missing" for ip in logged if ip not in seen]
    return problems


def choose(flushes: int, points: int, full: int, seed: int) -> tuple[list[int], set[int]]:
    """``points`` flushes (of ``flushes``) with a fixed seed, always the last; ``full`` of them
    for the real DIS and tailer, the last among them."""
    rng = random.Random(seed)
    chosen = sorted(set(rng.sample(range(flushes - 1), min(points - 1, flushes - 1))) | {flushes - 1})
    fulls = set(rng.sample(chosen[:-1], min(full - 1, len(chosen) - 1))) | {chosen[-1]}
    return chosen, fulls


def points_setting(default: int) -> int:
    import os

    return int(os.environ.get("DIS_REALFAULTS_POINTS") or default)

