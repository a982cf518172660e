"""The tracked file handle factory: capacity, cleanup to under 90% (in-use handles included),
transparent reopen, identity checks, the background cleaner and the fast-cycling warning; and the
engine with 2,000 column files under a limit of 64 descriptors."""

from __future__ import annotations

import os
import resource
import threading
import time

import numpy as np
import pytest
from structlog.testing import capture_logs

from disd.binlog import LocationKey
from disd.schema import SchemaRegistry, TableSchema
from disd.storage import FileIdentityError, StorageConfig, StorageEngine, TrackedFileHandleFactory
from disd.storage import filehandles as fh
from disd.storage.fsio import OsFileSystem
from support import running_dis, trade_rows, wait_for, write_log

from .util import KEY, LOG, SCHEMAS, TRADE, fds_under, ingest_file


def make_files(tmp_path, n: int) -> list[str]:
    d = tmp_path / "files"
    d.mkdir(exist_ok=True)
    return [str(d / f"f{i}.dat") for i in range(n)]


def test_capacity_cleanup_to_under_90_percent_oldest_first(tmp_path):
    f = TrackedFileHandleFactory(20)
    paths = make_files(tmp_path, 25)
    handles = []
    for i, p in enumerate(paths[:20]):
        h = f.open(p)
        h.pwrite(i.to_bytes(4, "little"), 0)
        handles.append(h)
    assert f.open_count == 20 and fds_under(tmp_path) == 20
    extra = f.open(paths[20])  # at capacity: cleanup first
    assert f.open_count < 20 * 0.9 + 1 and f.open_count == 18
    assert [h.fd is None for h in handles[:3]] == [True, True, True]  # the least recently opened
    assert all(h.fd is not None for h in handles[3:])
    assert f.reclaimed_total == 3 and fds_under(tmp_path) == 18
    # reclaimed handles are still in use by their owners: they reopen transparently
    assert handles[0].pread(4, 0) == (0).to_bytes(4, "little")
    handles[1].pwrite(b"\x07\x00\x00\x00", 0)
    assert handles[1].pread(4, 0) == b"\x07\x00\x00\x00"
    assert handles[0].opens == 2
    assert f.open_count <= 20 and f.peak_open <= 20
    extra.close()
    for h in handles:
        h.close()
    assert f.open_count == 0 and fds_under(tmp_path) == 0


def test_closed_handles_are_dropped_before_live_ones_are_reclaimed(tmp_path):
    f = TrackedFileHandleFactory(10)
    paths = make_files(tmp_path, 12)
    handles = [f.open(p) for p in paths[:10]]
    for h in handles[5:]:
        h.close()
    f.open(paths[10])
    assert f.reclaimed_total == 0  # closing five already made room
    assert all(h.fd is not None for h in handles[:5])


def test_a_handle_busy_this_instant_is_not_closed_under_its_user(tmp_path):
    f = TrackedFileHandleFactory(10)
    paths = make_files(tmp_path, 11)
    handles = [f.open(p) for p in paths[:10]]
    with handles[0].lock:  # an operation in progress on the oldest handle
        other = threading.Thread(target=lambda: f.open(paths[10]))
        other.start()
        other.join()
        assert handles[0].fd is not None
    assert handles[1].fd is None and f.open_count == 9


class SlowSync(OsFileSystem):
    """A disk whose fsync waits for ``release`` (after setting ``entered``)."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()

    def fsync(self, fd):
        self.entered.set()
        self.release.wait(5)
        os.fsync(fd)


def test_a_descriptor_in_fsync_survives_cleanup_and_close(tmp_path):
    disk = SlowSync()
    f = TrackedFileHandleFactory(4, disk)
    paths = make_files(tmp_path, 6)
    h = f.open(paths[0])
    entered, release = disk.entered, disk.release
    t = threading.Thread(target=h.fsync)
    t.start()
    assert entered.wait(5)
    fd = h.fd
    for p in paths[1:5]:
        f.open(p)  # at capacity: cleanup passes over the pinned oldest handle
    assert h.fd == fd and paths[0] in os.readlink(f"/proc/self/fd/{fd}")
    h.close()
    assert h.fd == fd  # still syncing: closed when the fsync finishes
    release.set()
    t.join()
    assert h.fd is None and fds_under(tmp_path / "files") == f.open_count
    f.close_all()


def test_fsync_does_not_hold_the_handle_lock(tmp_path):
    disk = SlowSync()
    f = TrackedFileHandleFactory(4, disk)
    h = f.open(make_files(tmp_path, 1)[0])
    entered, release = disk.entered, disk.release
    t = threading.Thread(target=h.fsync)
    t.start()
    assert entered.wait(5)
    t0 = time.monotonic()
    h.pwrite(b"abc", 0)  # not blocked by the fsync in progress
    assert time.monotonic() - t0 < 1
    assert f.cleanup() == 0 and h.fd is not None  # pinned: not reclaimed
    release.set()
    t.join()
    assert h.pread(3, 0) == b"abc"
    h.close()


def test_replaced_or_deleted_file_is_a_clear_error(tmp_path):
    f = TrackedFileHandleFactory(4)
    p = make_files(tmp_path, 1)[0]
    h = f.open(p)
    h.pwrite(b"x" * 40, 0)
    f.close_all()  # descriptor reclaimed; the handle would reopen on its next operation
    tmp = p + ".new"
    with open(tmp, "wb") as out:
        out.write(b"\0" * 40)
    os.replace(tmp, p)
    with pytest.raises(FileIdentityError, match="replaced while the DIS had it open"):
        h.pread(4, 0)
    with pytest.raises(FileIdentityError, match="replaced"):
        h.pwrite(b"y", 0)
    assert open(p, "rb").read() == b"\0" * 40  # the new file was not written to
    os.unlink(p)
    with pytest.raises(FileIdentityError, match="deleted"):
        h.pread(4, 0)


def test_replaced_column_file_puts_its_location_in_error(tmp_path):
    eng = StorageEngine(str(tmp_path / "db"), SCHEMAS, StorageConfig(max_open_files=16))
    p = tmp_path / LOG
    end = write_log(p, TRADE, trade_rows(0, 10), [3] * 10)
    loc = eng.location(KEY)
    ingest_file(loc, p)
    loc.flush()
    eng.file_handles.close_all()
    target = loc.path / "Size.dat"
    os.replace(str(target), str(target) + ".old")
    target.write_bytes(b"\0" * 40)
    write_log(p, TRADE, trade_rows(10, 20000), [3] * 20000)
    with pytest.raises(Exception, match="replaced"):
        ingest_file(loc, p, start=end)
        loc.flush()
    assert loc.in_error and "replaced" in loc.error
    eng.close()


def test_background_cleanup_runs_on_its_interval(tmp_path):
    f = TrackedFileHandleFactory(10)
    paths = make_files(tmp_path, 10)
    handles = [f.open(p) for p in paths]
    handles[9].close()
    handles[8].close()
    assert f.open_count == 8  # close() already releases
    f.start(interval_s=0.05)
    wait_for(lambda: f.cleanups >= 1, 3, what="a cleanup pass")
    assert f.cleanups >= 1 and f.open_count == 8  # under 90%: nothing to reclaim
    for p in make_files(tmp_path, 10)[8:]:
        handles.append(f.open(p))  # back at 10 = capacity
    wait_for(lambda: f.open_count < 9, 3, what="handles reclaimed")
    assert f.open_count == 8 and f.reclaimed_total == 2
    f.close_all()
    assert fds_under(tmp_path) == 0


def test_fast_cycling_warns_once_per_window(tmp_path):
    f = TrackedFileHandleFactory(10)
    paths = make_files(tmp_path, 30)
    with capture_logs() as logs:
        handles = [f.open(p) for p in paths]  # 30 opens through a capacity of 10
        for h in handles:
            h.pread(1, 0)  # every reclaimed one reopens
    warnings = [e for e in logs if e["event"] == "file handles cycling fast"]
    assert f.reclaimed_total >= 2 * 10 * fh.FAST_CYCLE_FRACTION
    assert len(warnings) == 1 and f.fast_cycling_total == 1
    assert warnings[0]["log_level"] == "warning" and warnings[0]["max_open_files"] == 10
    # after a quiet window it can warn again
    f._note_reclaims(1, now=time.monotonic() + fh.FAST_CYCLE_WINDOW_S + 1)  # noqa: SLF001 - the test drives the factory's internal clock
    assert f.fast_cycling_total == 1  # one reclaim is not 20% of capacity
    f._note_reclaims(2, now=time.monotonic() + fh.FAST_CYCLE_WINDOW_S + 2)  # noqa: SLF001 - the test drives the factory's internal clock
    assert f.fast_cycling_total == 2
    f.close_all()


def test_slow_reclaiming_does_not_warn(tmp_path):
    f = TrackedFileHandleFactory(100)
    now = time.monotonic()
    for k in range(10):  # 10 reclaims a minute apart: never 20 within 60 s
        f._note_reclaims(10, now=now + k * (fh.FAST_CYCLE_WINDOW_S + 1))  # noqa: SLF001 - the test drives the factory's internal clock
    assert f.fast_cycling_total == 0


def test_two_thousand_column_files_never_exceed_64_descriptors(tmp_path):
    cols = [{"name": f"C{i}", "type": "long"} for i in range(9)] + [{"name": "S", "type": "string"}]
    schema = TableSchema.from_dict({"namespace": "Wide", "table": "T", "columns": cols})
    reg = SchemaRegistry([schema])
    root = tmp_path / "db"
    eng = StorageEngine(str(root), reg, StorageConfig(max_open_files=64))
    p = tmp_path / "Wide.T.System.ip.d.bin.2026-11-22.000000.000+0000"
    data = {f"C{i}": np.arange(100, dtype=np.int64) * (i + 1) for i in range(9)}
    data["S"] = [f"ż{i}" for i in range(100)]
    write_log(p, schema, data, [3] * 100)

    peak = 0
    stop = threading.Event()

    def watch():  # sample /proc/self/fd continuously while the engine works
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, fds_under(root, column_files_only=True))
            time.sleep(0.001)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        locs = []
        for j in range(182):  # 182 locations x 11 files = 2,002 column files
            loc = eng.location(LocationKey("Wide", "T", f"ip{j}", "d"))
            ingest_file(loc, p, schema)
            loc.flush()
            if j % 20 == 0:
                loc.checkpoint()
            locs.append(loc)
            peak = max(peak, fds_under(root, column_files_only=True))
        n_files = sum(len(loc.column_files()) for loc in locs)
        assert n_files >= 2000
        for loc in locs:  # every file again, in another order: all reopen, data intact
            t = loc.read_table()
            assert t.column("C3").to_pylist() == (np.arange(100) * 4).tolist()
            assert t.column("S").to_pylist()[-1] == "ż99"
        eng.close()
    finally:
        stop.set()
        watcher.join()
    assert peak <= 64, peak
    assert eng.file_handles.peak_open <= 64
    assert eng.file_handles.reclaimed_total > 2000
    assert fds_under(root) == 0
    eng2 = StorageEngine(str(root), reg, StorageConfig(max_open_files=64))  # recovery of all of them
    assert len(eng2.locations()) == 182 and all(loc.published_rows == 100 for loc in eng2.locations())
    assert fds_under(root, column_files_only=True) <= 64
    eng2.close()


def test_a_slow_open_holds_up_no_other_handle(tmp_path):
    """Creating a file can take long on a busy file system: other files open (and reopen) in
    the meantime, and the slow one's descriptor still counts against the capacity."""
    entered, gate = threading.Event(), threading.Event()

    class SlowCreate(OsFileSystem):
        def open(self, path: str, flags: int, mode: int = 0o644) -> int:
            if path.endswith("slow.dat"):
                entered.set()
                gate.wait(20)
            return super().open(path, flags, mode)

    paths = make_files(tmp_path, 4)
    f = TrackedFileHandleFactory(max_open_files=4, fs=SlowCreate())
    slow: list = []
    t = threading.Thread(target=lambda: slow.append(f.open(str(tmp_path / "files" / "slow.dat"))))
    t.start()
    try:
        assert entered.wait(10)
        t0 = time.monotonic()
        hs = [f.open(p) for p in paths[:3]]
        assert time.monotonic() - t0 < 5  # not behind the slow create
        assert f.open_count == 3
        hs.append(f.open(paths[3]))  # the fourth: capacity 4 with one opening, so one is reclaimed first
        assert f.open_count <= 3
    finally:
        gate.set()
        t.join(20)
    assert slow and f.open_count <= 4
    slow[0].pwrite(b"x", 0)
    assert [h.pwrite(b"y", 0) for h in hs] == [1] * 4  # reclaimed handles reopen
    assert f.peak_open <= 4
    f.close_all()


@pytest.fixture
def nofile_3000():
    """This process's descriptor limit lowered to 3000 for the test (restored after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (3000, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_max_open_files_left_out_is_derived_from_the_descriptor_limit(tmp_path, nofile_3000):
    """Without ``storage.max_open_files``: the limit less 2 x max_workers + 256, README's relation
    with LimitNOFILE (an engine made without a server counts the default 256 workers)."""
    eng = StorageEngine(str(tmp_path / "db"), SCHEMAS)
    try:
        assert eng.file_handles.capacity == 3000 - 2 * 256 - 256 == fh.default_max_open_files()
    finally:
        eng.close()
    with running_dis(tmp_path / "served", max_workers=16) as srv:
        assert srv.engine.file_handles.capacity == 3000 - 2 * 16 - 256
    with running_dis(tmp_path / "set", max_workers=16, storage={"max_open_files": 100}) as srv:
        assert srv.engine.file_handles.capacity == 100  # set: as set
    assert fh.max_open_files_for(300, 16) == 16  # never below the least the engine works with


def _live_writes(eng: StorageEngine, tmp_path, n_locs: int, rounds: int):
    """``n_locs`` Market.Trade locations, then ``rounds`` rounds of a 1-row caught-up chunk to
    each, every round one batch through the chunk entry (as a Multiplex request's)."""
    from disd.storage.ingest import LocationIngest, ingest_chunks

    class Chunk:
        def __init__(self, name, offset, data):
            self.file_name, self.offset, self.data, self.caught_up = name, offset, data, True

    logs, streams = {}, {}
    keys = [LocationKey("Market", "Trade", f"ip{i}", "2026-11-22") for i in range(n_locs)]
    eng.open_many([(k, None) for k in keys])
    for k in keys:
        name = f"Market.Trade.System.{k.internal_partition}.2026-11-22.bin.2026-11-22.000000.000+0000"
        p = tmp_path / "logs" / name
        p.parent.mkdir(exist_ok=True)
        ends = [write_log(p, TRADE, trade_rows(r, 1), [3]) for r in range(rounds)]
        logs[k] = (name, p.read_bytes(), ends)
        loc = eng.location(k)
        rp, epoch = loc.resume()
        streams[k] = LocationIngest(loc, TRADE, rp, epoch)
    for r in range(rounds):
        items = []
        for k in keys:
            name, data, ends = logs[k]
            start = 0 if r == 0 else ends[r - 1]
            items.append((streams[k], Chunk(name, start, data[start:ends[r]]), None))
        results = ingest_chunks(items)
        assert all(x is not None and x.refused is None and x.committed_rows == r + 1 for x in results)
    return [eng.location(k) for k in keys]


def test_writes_to_reclaimed_descriptors_open_their_files_alone_within_the_limit(tmp_path):
    """More column files than ``max_open_files`` (40 locations, 200 files, 16 descriptors): a
    batch's writes to files whose descriptors were reclaimed open them for the writes alone, in
    the C call, never more descriptors than the limit; every row lands, and the cycling is
    counted as such."""
    root = tmp_path / "db"
    eng = StorageEngine(str(root), SCHEMAS, StorageConfig(max_open_files=16))
    peak, stop = 0, threading.Event()

    def watch():
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, fds_under(root, column_files_only=True))
            time.sleep(0.0005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        locs = _live_writes(eng, tmp_path, 40, 4)
        assert eng.file_handles.transient_opens >= 100  # the later rounds found most of them closed
        for loc in locs:
            loc.flush()  # (a caught-up flush is held back while the last was under 25 ms ago)
            assert loc.published_rows == 4 and loc.read_table().column("Size").to_pylist() == [0, 1, 2, 3]
    finally:
        stop.set()
        watcher.join()
        eng.close()
    assert peak <= 16, peak
    assert eng.file_handles.peak_open <= 16


def test_a_write_that_opens_a_replaced_file_alone_finds_it_replaced(tmp_path):
    """A file opened for its writes alone is checked as a reopen is: replaced under the DIS, the
    write is refused and its location stops (FileIdentityError), nothing lands in the new file."""
    from disd.storage.ingest import LocationIngest, ingest_chunks

    eng = StorageEngine(str(tmp_path / "db"), SCHEMAS, StorageConfig(max_open_files=16))
    try:
        loc = _live_writes(eng, tmp_path, 4, 1)[0]
        eng.file_handles.cleanup()  # every descriptor reclaimed (none busy)
        while eng.file_handles.open_count:
            eng.file_handles._cleanup_locked(room=eng.file_handles.capacity)  # noqa: SLF001 - the test drives the factory's internal clock
        victim = loc.path / "Price.dat"
        copy = tmp_path / "copy"
        copy.write_bytes(victim.read_bytes())
        os.replace(copy, victim)
        name = "Market.Trade.System.ip0.2026-11-22.bin.2026-11-22.000000.000+0000"
        p = tmp_path / "logs" / name
        start = p.stat().st_size
        write_log(p, TRADE, trade_rows(1, 1), [3])
        rp, epoch = loc.resume()

        class Chunk:
            file_name, offset, data, caught_up = name, start, p.read_bytes()[start:], True

        result, = ingest_chunks([(LocationIngest(loc, TRADE, rp, epoch), Chunk(), None)])
        assert result.refused is None  # its rows are in the buffers (a caught-up flush may be held back 25 ms)
        loc.flush()
        assert loc.in_error and "was replaced" in loc.error and "Price.dat" in loc.error
        assert victim.stat().st_size == 8  # the new file got nothing
    finally:
        eng.close()


class CountingSync(OsFileSystem):
    """The real file system, counting fsyncs by the file they reached."""

    def __init__(self) -> None:
        self.synced: list[str] = []

    def fsync(self, fd: int) -> None:
        self.synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        super().fsync(fd)


def test_fsync_of_a_reclaimed_file_keeps_the_descriptors_of_files_being_written(tmp_path):
    """A checkpoint syncs every column file once an interval; at capacity, reopening a reclaimed
    one through the factory would close the descriptors of files being written (which then
    reopen on their next write).  It is synced on a descriptor of its own, checked and closed."""
    disk = CountingSync()
    f = TrackedFileHandleFactory(10, disk)
    paths = make_files(tmp_path, 12)
    handles = [f.open(p) for p in paths]
    for i, h in enumerate(handles):
        h.pwrite(bytes([i]) * 8, 0)
    f.cleanup()  # under 90% of capacity, as writes leave it (``pin_for_write`` reopens no further)
    reclaimed = [h for h in handles if h.fd is None]
    held = {id(h): h.fd for h in handles if h.fd is not None}
    assert reclaimed and held
    before = f.reclaimed_total
    for h in reclaimed:
        h.fsync()
    assert {id(h): h.fd for h in handles if h.fd is not None} == held  # none pushed out
    assert f.reclaimed_total == before and all(h.fd is None for h in reclaimed)
    assert disk.synced == [h.path for h in reclaimed]  # each synced, on its own file
    assert fds_under(tmp_path / "files") == f.open_count <= 10
    assert f.transient_opens == len(reclaimed)
    os.unlink(reclaimed[0].path)
    with pytest.raises(FileIdentityError, match="deleted"):
        reclaimed[0].fsync()
    f.close_all()


def test_writes_of_reclaimed_files_without_room_are_handed_the_files_spec(tmp_path):
    """At capacity, a compiled write's pinning hands over the spec of a file whose descriptor
    was reclaimed (the write opens it alone) and pins those that hold one."""
    f = TrackedFileHandleFactory(10)
    handles = [f.open(p) for p in make_files(tmp_path, 12)]
    files, pinned = f.pin_for_write(handles)
    try:
        assert [x for x in files if isinstance(x, tuple)] == [h.spec for h in handles if h.fd is None]
        assert [x for x in files if isinstance(x, int)] == [h.fd for h in pinned]
        assert all(h.pins == 1 for h in pinned)
    finally:
        f.unpin(pinned)
    f.close_all()
