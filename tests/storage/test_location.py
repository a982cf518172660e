"""The storage engine in-process, over real files with real fsync: buffers and writes, flush and
publishing, checkpoints and recovery, transactions and malformed flag sequences, resuming, and
error isolation between locations."""

from __future__ import annotations

import errno
import os
import threading
import time

import numpy as np
import pytest

from disd.binlog import LocationKey, decode_frames
from disd.schema import SchemaError, SchemaRegistry
from disd.storage import (
    ImportConfig,
    LocationError,
    SourcePosition,
    StorageConfig,
    StorageEngine,
    UnknownTableError,
)
from disd.storage.checkpoint import FILE_NAME, TEMP_NAME, read_record
from disd.storage.fsio import OsFileSystem
from disd.storage.transactions import plan_transactions
from support import sample, scrape, trade_rows, wait_for, write_log

from .util import KEY, LOG, SCHEMAS, TRADE, frames, ingest_file, sub_run

KEY2 = LocationKey("Market", "Trade", "ip2", "2026-11-22")
LOG2 = "Market.Trade.System.ip2.2026-11-22.bin.2026-11-22.090000.000+0000"


@pytest.fixture
def engine(tmp_path):
    e = StorageEngine(str(tmp_path / "db"), SCHEMAS)
    yield e
    e.close()


def crash(engine: StorageEngine) -> StorageEngine:
    """Drop an engine as a crash would (no final flush or checkpoint) and open a new one."""
    engine.file_handles.close_all()
    engine._locs.clear()  # noqa: SLF001 - the test sets up the state it checks
    return StorageEngine(engine.db_root, engine.schemas, engine.storage)


def sizes_col(loc) -> list[int]:
    return loc.read_table(["Size"]).column(0).to_pylist()


# -- writing and flushing ----------------------------------------------------------------------


class SpyDisk(OsFileSystem):
    """The real calls, noting every write (a subclass: the engine composes its writes of them)."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, int, int]] = []

    def pwrite(self, fd: int, data, offset: int) -> int:
        n = os.pwrite(fd, data, offset)
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        if name.endswith((".dat", ".off")):  # the column files' writes
            self.writes.append((name, offset, n))
        return n


def _write_twice(eng: StorageEngine, tmp_path) -> tuple[object, float]:
    """Ingest 50,000 rows, flush, again, flush; (the location, the writes the histogram saw)."""
    count0 = sample(scrape(), "dis_write_size_bytes_count")
    le_block0 = sample(scrape(), "dis_write_size_bytes_bucket", le="65536.0")
    write_log(tmp_path / LOG, TRADE, trade_rows(0, 50000), [3] * 50000)
    loc = eng.location(KEY)
    ingest_file(loc, tmp_path / LOG, frames_per_call=1)
    loc.flush()
    ingest_file(loc, tmp_path / LOG, frames_per_call=1)  # a second pass continues after a partial flush
    loc.flush()
    counted = sample(scrape(), "dis_write_size_bytes_count") - count0
    assert sample(scrape(), "dis_write_size_bytes_bucket", le="65536.0") - le_block0 == counted  # none above a block
    return loc, counted


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_writes_are_at_most_one_block_and_aligned(tmp_path, compiled):
    disk = SpyDisk()
    eng = StorageEngine(str(tmp_path / "db"), SCHEMAS, fs=disk, compiled=compiled)
    try:
        loc, counted = _write_twice(eng, tmp_path)
        writes = disk.writes
        bs = 65536
        assert max(n for _, _, n in writes) == bs and min(n for _, _, n in writes) < bs
        assert all(off // bs == (off + n - 1) // bs for _, off, n in writes), "a write crossed a block boundary"
        by_file: dict[str, list[tuple[int, int]]] = {}
        for name, off, n in writes:
            by_file.setdefault(name, []).append((off, n))
        for name, ws in by_file.items():  # contiguous, each write starting where the last ended
            assert all(a + n == b for (a, n), (b, _) in zip(ws, ws[1:])), name
            assert ws[-1][0] + ws[-1][1] == os.path.getsize(loc.path / name)
        assert counted == len(writes)  # the histogram saw every write
        assert sizes_col(loc) == list(range(50000)) * 2
    finally:
        eng.close()


def test_compiled_writes_are_the_composed_ones(tmp_path):
    """The real file system's writes of compiled states, made in C (``ingestcore.write_out``):
    as many as the composed path makes, to the same bytes."""
    made = {}
    for name, fs in (("c", OsFileSystem()), ("composed", SpyDisk())):
        (tmp_path / name).mkdir()
        eng = StorageEngine(str(tmp_path / name / "db"), SCHEMAS, fs=fs, compiled=True)
        try:
            loc, counted = _write_twice(eng, tmp_path / name)
            made[name] = (counted, {n: (loc.path / n).read_bytes() for n in loc.file_names})
        finally:
            eng.close()
    assert made["c"] == made["composed"]


def test_rows_are_visible_only_after_a_flush(engine, tmp_path):
    write_log(tmp_path / LOG, TRADE, trade_rows(0, 20000), [3] * 20000)
    loc = engine.location(KEY)
    ingest_file(loc, tmp_path / LOG)
    assert loc.committed_rows == 20000 and loc.published_rows == 0
    assert loc.read_table().num_rows == 0
    assert all(v == 0 for v in loc.column_files().values())
    assert loc.read_block("Size.dat", 0) == b""
    loc.flush()
    assert loc.published_rows == 20000
    assert loc.column_files()["Size.dat"] == 80000
    assert loc.read_block("Size.dat", 1) == np.arange(16384, 20000, dtype="<i4").tobytes()
    assert len(loc.read_block("Sym.off", 0, 4096)) == 4096
    assert sizes_col(loc) == list(range(20000))


def test_the_flush_clock_publishes_within_the_interval_and_notifies(tmp_path):
    eng = StorageEngine(str(tmp_path / "db"), SCHEMAS, import_default=ImportConfig(flush_interval_ms=30),
                        import_tables={"Market.Trade": ImportConfig(flush_interval_ms=20, checkpoint_interval_ms=100)})
    seen: list[tuple[str, int]] = []
    got = threading.Event()

    def cb(loc, rows):
        seen.append((str(loc.key), rows))
        if rows == 500:
            got.set()

    unsubscribe = eng.subscribe(cb)
    eng.start()
    loc = eng.location(KEY)
    assert seen == [(str(KEY), 0)]  # a new location is announced
    assert loc.import_config.flush_interval_ms == 20
    write_log(tmp_path / LOG, TRADE, trade_rows(0, 500), [3] * 500)
    t0 = time.monotonic()
    ingest_file(loc, tmp_path / LOG)
    assert got.wait(2.0)
    assert time.monotonic() - t0 < 1.0
    assert loc.published_rows == 500
    wait_for(lambda: read_record(loc.path).rows == 500, 3, what="the checkpoint clock")
    assert read_record(loc.path).rows == 500
    unsubscribe()
    n = len(seen)
    write_log(tmp_path / LOG, TRADE, trade_rows(500, 5), [3] * 5)
    ingest_file(loc, tmp_path / LOG, start=loc.resume_point.offset)
    time.sleep(0.15)
    assert loc.published_rows == 505 and len(seen) == n
    eng.close()


# -- checkpoint and recovery -------------------------------------------------------------------


def test_checkpoint_then_crash_truncates_later_rows(engine, tmp_path):
    p = tmp_path / LOG
    end1 = write_log(p, TRADE, trade_rows(0, 100), [3] * 100)
    loc = engine.location(KEY)
    ingest_file(loc, p)
    assert loc.checkpoint()
    assert not loc.checkpoint()  # nothing new: no record written
    assert loc.resume_point == SourcePosition(LOG, end1, 0)
    write_log(p, TRADE, trade_rows(100, 50), [3] * 50)
    ingest_file(loc, p, start=end1)
    loc.flush()
    assert loc.published_rows == 150 and loc.resume_point.offset > end1
    eng2 = crash(engine)
    loc2 = eng2.location(KEY)
    assert loc2.committed_rows == 100 and loc2.resume_point == SourcePosition(LOG, end1, 0)
    assert os.path.getsize(loc2.path / "Size.dat") == 400
    ingest_file(loc2, p, start=loc2.resume_point.offset)
    loc2.flush()
    assert sizes_col(loc2) == list(range(150))
    eng2.close()


def test_checkpoint_order_is_files_then_temp_then_rename_then_directory(tmp_path, monkeypatch):
    from disd.storage.filehandles import TrackedFile

    events: list[str] = []

    class Recorder(OsFileSystem):
        def open(self, path, flags, mode=0o644):
            if path.endswith(TEMP_NAME):
                events.append(f"write {os.path.basename(path)}")
            return super().open(path, flags, mode)

        def rename(self, src, dst):
            events.append(f"rename {os.path.basename(src)} {os.path.basename(dst)}")
            super().rename(src, dst)

        def fsync_dir(self, directory):
            events.append("fsync dir")
            super().fsync_dir(directory)

    orig = TrackedFile.fsync
    monkeypatch.setattr(TrackedFile, "fsync", lambda self: (events.append(f"fsync {os.path.basename(self.path)}"),
                                                            orig(self))[1])
    eng = StorageEngine(str(tmp_path / "db"), SCHEMAS, fs=Recorder())
    loc = eng.location(KEY)
    write_log(tmp_path / LOG, TRADE, trade_rows(0, 10), [3] * 10)
    ingest_file(loc, tmp_path / LOG)
    events.clear()
    assert loc.checkpoint()
    files = sorted(loc.column_files())
    assert sorted(events[: len(files)]) == [f"fsync {n}" for n in files]
    assert events[len(files):] == [f"write {TEMP_NAME}", f"rename {TEMP_NAME} {FILE_NAME}", "fsync dir"]
    eng.close()


def test_a_checkpoint_interrupted_before_the_rename_keeps_the_old_record(tmp_path):
    class Crashy(OsFileSystem):
        armed = False

        def rename(self, src, dst):
            if self.armed:
                raise OSError(errno.EIO, "simulated crash before rename")
            super().rename(src, dst)

    ops = Crashy()
    eng = StorageEngine(str(tmp_path / "db"), SCHEMAS, fs=ops)
    p = tmp_path / LOG
    end1 = write_log(p, TRADE, trade_rows(0, 10), [3] * 10)
    loc = eng.location(KEY)
    ingest_file(loc, p)
    assert loc.checkpoint()
    write_log(p, TRADE, trade_rows(10, 10), [3] * 10)
    ingest_file(loc, p, start=end1)
    ops.armed = True
    assert not loc.checkpoint()
    assert loc.in_error and "simulated crash" in loc.error
    assert (loc.path / TEMP_NAME).exists()
    eng2 = crash(eng)
    loc2 = eng2.location(KEY)
    assert not loc2.in_error and loc2.committed_rows == 10 and loc2.resume_point.offset == end1
    assert not (loc2.path / TEMP_NAME).exists()
    eng2.close()


def test_checkpoints_racing_ingestion_always_recover(tmp_path):
    """Checkpoint continuously from another thread while ingesting; after a crash at any
    point the record must describe bytes that are really in the files."""
    from disd.storage.checkpoint import CheckpointRecord

    short: list[str] = []

    class Checking(OsFileSystem):
        """At the moment a record becomes the record (its rename), every byte it counts must
        already be in the files (the page cache; the fsyncs before made it durable)."""

        def rename(self, src, dst):
            if os.path.basename(dst) != "table.size":  # the table's schema.versions, written at start
                return super().rename(src, dst)
            with open(src, "rb") as f:
                rec = CheckpointRecord.from_bytes(f.read())
            for name, size in rec.files.items():
                f = os.path.join(os.path.dirname(src), name)
                on_disk = os.path.getsize(f) if os.path.exists(f) else 0
                if on_disk < size:
                    short.append(f"{name}: record {size} > file {on_disk}")
            super().rename(src, dst)

    eng = StorageEngine(str(tmp_path / "db"), SCHEMAS, fs=Checking())
    p = tmp_path / LOG
    write_log(p, TRADE, trade_rows(0, 30000), ([1] + [0] * 98 + [2]) * 300)
    loc = eng.location(KEY)
    stop = threading.Event()
    done = []

    def checkpointer():
        while not stop.is_set() and not loc.in_error:
            done.append(loc.checkpoint())
            time.sleep(0.0005)

    t = threading.Thread(target=checkpointer, daemon=True)
    t.start()
    data, run = frames(p)
    try:
        for i in range(len(run.starts)):
            sub = sub_run(run, i, i + 1)
            loc.ingest(LOG, sub, decode_frames(data, 0, sub, TRADE))
            time.sleep(0.001)  # ingestion spans several checkpoints however slow fsync is today
    finally:
        stop.set()
        t.join()
    assert not loc.in_error, loc.error
    assert sum(done) > 3 and not loc.in_error
    assert not short, short[:5]
    rec = read_record(loc.path)
    eng2 = crash(eng)
    loc2 = eng2.location(KEY)
    assert not loc2.in_error, loc2.error
    assert loc2.committed_rows == rec.rows and rec.rows % 100 == 0
    assert sizes_col(loc2) == list(range(rec.rows))
    eng2.close()


def test_new_location_writes_its_record_before_any_column_file(engine):
    loc = engine.location(KEY)
    rec = read_record(loc.path)
    assert rec.rows == 0 and rec.source == SourcePosition(None, 0, 0)
    assert rec.fingerprint == TRADE.fingerprint and set(rec.files) == set(loc.column_files())


class CountingDisk(OsFileSystem):
    """Records the paths looked up (stat), removed and opened read-only."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def stat(self, path):
        self.calls.append(("stat", path))
        return super().stat(path)

    def unlink(self, path):
        self.calls.append(("unlink", path))
        return super().unlink(path)

    def open(self, path, flags, mode=0o644):
        if not flags & (os.O_WRONLY | os.O_RDWR):
            self.calls.append(("read", path))
        return super().open(path, flags, mode)


def test_a_new_locations_directory_is_known_empty(tmp_path):
    """Creating a location looks for nothing inside the directory it just made (no stale temp
    file, record or column file can be there); a directory that was there already is still
    checked: a ``table.size.tmp`` in it is removed."""
    disk = CountingDisk()
    eng = StorageEngine(str(tmp_path / "db"), SCHEMAS, fs=disk)
    try:
        loc = eng.location(KEY)
        inside = [c for c in disk.calls if c[1].startswith(str(loc.path) + os.sep)]
        assert inside == [], inside
        assert read_record(loc.path).rows == 0 and all(os.path.getsize(loc.path / n) == 0 for n in loc.column_files())
        other = LocationKey("Market", "Trade", "ip2", "2026-11-22")
        made = tmp_path / "db" / "Intraday" / "Market" / "Trade" / "ip2" / "2026-11-22" / "Trade"
        made.mkdir(parents=True)
        (made / TEMP_NAME).write_bytes(b"half a record")
        disk.calls.clear()
        loc2 = eng.location(other)
        assert ("unlink", str(made / TEMP_NAME)) in disk.calls and not (made / TEMP_NAME).exists()
        assert not loc2.in_error and read_record(made).rows == 0
    finally:
        eng.close()


def test_missing_table_size(engine, tmp_path):
    p = tmp_path / LOG
    write_log(p, TRADE, trade_rows(0, 10), [3] * 10)
    loc = engine.location(KEY)
    path = loc.path
    # 1. no table.size and no data: a new location
    os.unlink(path / FILE_NAME)
    eng = crash(engine)
    loc = eng.location(KEY)
    assert not loc.in_error and loc.committed_rows == 0 and (path / FILE_NAME).exists()
    # 2. no table.size but column files with data: damage, refused explicitly
    ingest_file(loc, p)
    loc.checkpoint()
    os.unlink(path / FILE_NAME)
    eng = crash(eng)
    loc = eng.location(KEY)
    assert loc.in_error and "table.size is missing" in loc.error
    with pytest.raises(LocationError, match="missing"):
        ingest_file(loc, p)
    assert os.path.getsize(path / "Size.dat") == 40  # nothing was truncated
    eng.close()


@pytest.mark.parametrize(
    "damage,message",
    [
        (lambda b: b[:30] + bytes([b[30] ^ 1]) + b[31:], "checksum"),
        (lambda b: b[: len(b) // 2], "truncated"),
        (lambda b: b"", "not a checkpoint record"),
        (lambda b: b.replace(b"DISCKPT 1", b"DISCKPT 7"), "unsupported checkpoint format version"),
        (lambda b: b"garbage\n" * 3, "not a checkpoint record"),
    ],
)
def test_corrupt_table_size_puts_the_location_in_error(engine, tmp_path, damage, message):
    p = tmp_path / LOG
    write_log(p, TRADE, trade_rows(0, 10), [3] * 10)
    loc = engine.location(KEY)
    ingest_file(loc, p)
    loc.checkpoint()
    rec_path = loc.path / FILE_NAME
    rec_path.write_bytes(damage(rec_path.read_bytes()))
    before = engine.in_error_count()
    eng = crash(engine)
    loc = eng.location(KEY)
    assert loc.in_error and message in loc.error, loc.error
    assert eng.in_error_count() == before + 1
    with pytest.raises(LocationError):
        ingest_file(loc, p)
    assert os.path.getsize(loc.path / "Size.dat") == 40  # nothing was truncated
    eng.close()
    assert eng.in_error_count() == before


def test_column_file_shorter_than_the_record_or_missing(engine, tmp_path):
    p = tmp_path / LOG
    write_log(p, TRADE, trade_rows(0, 10), [3] * 10)
    loc = engine.location(KEY)
    ingest_file(loc, p)
    loc.checkpoint()
    os.truncate(loc.path / "Price.dat", 16)
    eng = crash(engine)
    loc = eng.location(KEY)
    assert loc.in_error and "Price.dat has 16 bytes" in loc.error
    os.unlink(loc.path / "Price.dat")
    eng = crash(eng)
    loc = eng.location(KEY)
    assert loc.in_error and "Price.dat is missing" in loc.error
    eng.close()


def test_record_of_another_schema_is_refused(engine, tmp_path):
    from disd.schema import TableSchema

    loc = engine.location(KEY)
    path = loc.path
    engine.close()
    other = TableSchema.from_dict({"namespace": "Market", "table": "Trade",
                                   "columns": [{"name": "Size", "type": "long"}]})
    # the database remembers version 1's columns: another schema under that number is refused
    with pytest.raises(SchemaError, match="Market.Trade version 1 is stored with other columns"):
        StorageEngine(engine.db_root, SchemaRegistry([other]))
    # without that record (a database from before schema versions), the location is in error
    os.unlink(os.path.join(engine.db_root, "Intraday", "Market", "Trade", "schema.versions"))
    eng = StorageEngine(engine.db_root, SchemaRegistry([other]))
    loc = eng.location(KEY)
    assert loc.in_error and "fingerprint" in loc.error and loc.path == path
    assert loc.schema_version == 0
    eng.close()


def test_a_record_from_before_schema_versions_opens_in_the_version_of_its_fingerprint(tmp_path):
    """``table.size`` without ``schema_version`` (0): the location opens in the version whose
    fingerprint is the record's, with that version's column files; its next checkpoint writes
    the version down."""
    import dataclasses

    from disd.schema import TableSchema
    from disd.storage.checkpoint import write_record

    p = tmp_path / LOG
    write_log(p, TRADE, trade_rows(0, 10), [3] * 10)
    eng = StorageEngine(str(tmp_path / "db"), SCHEMAS)
    loc = eng.location(KEY)
    ingest_file(loc, p)
    loc_path = str(loc.path)
    eng.close()
    rec = read_record(loc_path)
    assert rec.schema_version == 1 and rec.rows == 10
    write_record(loc_path, dataclasses.replace(rec, schema_version=0))
    os.unlink(os.path.join(eng.db_root, "Intraday", "Market", "Trade", "schema.versions"))
    assert b"schema_version" not in open(os.path.join(loc_path, FILE_NAME), "rb").read()
    v2 = TableSchema.from_dict({"namespace": "Market", "table": "Trade", "version": 2,
                                "columns": [*TRADE.canonical()["columns"], {"name": "Venue", "type": "string"}]})
    # the database kept no versions: the YAML's version 2 is all it knows, so the fingerprint
    # of the old record matches none and the location says so
    eng = StorageEngine(eng.db_root, SchemaRegistry([v2]))
    loc = eng.location(KEY)
    assert loc.in_error and rec.fingerprint in loc.error and "no version of Market.Trade" in loc.error, loc.error
    eng.close()
    # with version 1 on record (as a DIS of before versions leaves it after one start), it opens in 1
    os.unlink(os.path.join(eng.db_root, "Intraday", "Market", "Trade", "schema.versions"))
    StorageEngine(eng.db_root, SCHEMAS).close()
    eng = StorageEngine(eng.db_root, SchemaRegistry([v2]))
    loc = eng.location(KEY)
    assert not loc.in_error and loc.schema_version == 1 and loc.published_rows == 10, loc.error
    assert loc.schema.fingerprint == TRADE.fingerprint and "Venue.dat" not in loc.column_files()
    assert not (loc.path / "Venue.dat").exists()
    assert eng.schemas.get("Market", "Trade").version == 2 and list(eng.schemas.get("Market", "Trade").versions) == [1, 2]
    loc.import_state["restarts"] += 1  # something new to checkpoint
    loc._last_checkpoint = None  # noqa: SLF001 - the test sets up the state it checks
    assert loc.checkpoint()
    assert read_record(loc_path).schema_version == 1
    eng.close()


def test_locations_are_discovered_on_disk(tmp_path):
    eng = StorageEngine(str(tmp_path / "db"), SCHEMAS)
    eng.location(KEY)
    eng.location(KEY2)
    with pytest.raises(UnknownTableError):
        eng.location(LocationKey("No", "Such", "ip", "d"))
    with pytest.raises(LookupError):
        eng.location(LocationKey("Market", "Trade", "ip9", "d"), create=False)
    eng.close()
    (tmp_path / "db" / "Intraday" / "Unknown" / "T" / "ip" / "d" / "T").mkdir(parents=True)
    eng = StorageEngine(str(tmp_path / "db"), SCHEMAS)
    assert sorted(str(loc.key) for loc in eng.locations()) == sorted([str(KEY), str(KEY2)])
    other = StorageEngine(str(tmp_path / "db"), SCHEMAS)  # another engine adds one on disk
    k3 = LocationKey("Market", "Quote", "ip1", "2026-11-22")
    other.location(k3)
    other.close()
    # found at the next walk of the disk, at most SCAN_EVERY_S after the last one
    wait_for(lambda: str(k3) in {str(loc.key) for loc in eng.locations()}, 5, what="the next walk finds it")
    eng.close()


# -- transactions ------------------------------------------------------------------------------


def test_transaction_rows_are_written_not_published_then_rolled_back(engine, tmp_path):
    p = tmp_path / LOG
    end1 = write_log(p, TRADE, trade_rows(0, 5), [3] * 5)
    write_log(p, TRADE, trade_rows(5, 20000), [1] + [0] * 19999)
    loc = engine.location(KEY)
    ingest_file(loc, p, frames_per_call=1)
    loc.flush()
    assert loc.written_rows == 20005 and loc.committed_rows == 5 and loc.published_rows == 5
    assert os.path.getsize(loc.path / "Size.dat") == 20005 * 4  # on disk, unpublished
    assert loc.column_files()["Size.dat"] == 20
    loc.checkpoint()
    assert loc.resume_point.offset == end1 and read_record(loc.path).rows == 5
    assert sizes_col(loc) == list(range(5))
    loc.rollback()
    assert loc.written_rows == 5
    assert os.path.getsize(loc.path / "Size.dat") == 20
    assert os.path.getsize(loc.path / "Sym.dat") == read_record(loc.path).files["Sym.dat"]
    # and the location goes on normally after the rollback
    end3 = write_log(p, TRADE, trade_rows(100, 3), [3] * 3)
    data, run = frames(p)
    last = sub_run(run, len(run.starts) - 1, len(run.starts))
    loc.ingest(LOG, last, decode_frames(data, 0, last, TRADE))
    loc.flush()
    assert sizes_col(loc) == [0, 1, 2, 3, 4, 100, 101, 102] and loc.resume_point.offset == end3


def test_end_transaction_publishes_all_at_once(engine, tmp_path):
    p = tmp_path / LOG
    write_log(p, TRADE, trade_rows(0, 3), [1, 0, 0])
    write_log(p, TRADE, trade_rows(3, 2), [0, 0])
    end = write_log(p, TRADE, trade_rows(5, 1), [2])
    loc = engine.location(KEY)
    ingest_file(loc, p, frames_per_call=1)  # the transaction spans three ingest calls
    assert loc.committed_rows == 6
    loc.flush()
    assert loc.published_rows == 6 and loc.resume_point == SourcePosition(LOG, end, 0)


@pytest.mark.parametrize(
    "flags,expect_rows,desc",
    [
        ([2, 3], [0, 1], "End without Start commits that row as a single row"),
        ([0, 0], [0, 1], "None outside a transaction is a single row"),
        ([1, 0, 1, 0, 2], [2, 3, 4], "Start inside a transaction abandons it and starts anew"),
        ([1, 0, 3, 3], [2, 3], "SingleRow inside a transaction abandons it"),
        ([3, 1, 0, 0], [0], "an open transaction at the end stays unpublished"),
        ([3, 1, 0, 2, 2, 0, 1, 2], [0, 1, 2, 3, 4, 5, 6, 7], "End after End is a single row"),
        ([1, 1, 1, 2], [2, 3], "repeated Starts keep only the last transaction"),
    ],
)
def test_malformed_flag_sequences(engine, tmp_path, flags, expect_rows, desc):
    p = tmp_path / LOG
    write_log(p, TRADE, trade_rows(0, len(flags)), flags, single_frame=True)
    loc = engine.location(KEY)
    ingest_file(loc, p)
    loc.flush()
    assert sizes_col(loc) == expect_rows, desc


def test_malformed_sequences_across_calls_never_lose_committed_rows(engine, tmp_path):
    """A transaction spanning calls, abandoned by a later Start: only its rows go, committed rows
    before it stay, and the counters say what happened."""
    p = tmp_path / LOG
    for rows, flags in [((0, 3), [3, 3, 3]), ((3, 3), [1, 0, 0]), ((6, 2), [0, 0]), ((8, 3), [1, 0, 2])]:
        write_log(p, TRADE, trade_rows(*rows), flags)
    loc = engine.location(KEY)
    ingest_file(loc, p, frames_per_call=1)
    loc.flush()
    assert sizes_col(loc) == [0, 1, 2, 8, 9, 10]
    assert loc.import_state["transactions_abandoned"] == 1 and loc.import_state["rows_rolled_back"] == 5
    loc.checkpoint()
    assert read_record(loc.path).import_state["transactions_abandoned"] == 1


def test_plan_spans_batches():
    plan = plan_transactions(np.array([0, 0, 2, 3], np.uint8), in_txn=True)
    assert (plan.last_commit, plan.open_at_end, plan.rollback_open) == (3, False, False)
    plan = plan_transactions(np.array([0, 3, 1], np.uint8), in_txn=True)
    assert plan.rollback_open and plan.keep.tolist() == [False, True, True] and plan.open_at_end
    plan = plan_transactions(np.array([], np.uint8), in_txn=False)
    assert plan.last_commit == -1


def test_plan_matches_a_row_at_a_time_model():
    rng = np.random.default_rng(5)
    for _ in range(300):
        flags = rng.choice([0, 1, 2, 3], size=rng.integers(0, 30), p=[0.5, 0.15, 0.15, 0.2]).astype(np.uint8)
        in_txn = bool(rng.integers(0, 2))
        plan = plan_transactions(flags, in_txn)
        # model
        keep = np.ones(len(flags), bool)
        txn, begin, last, rollback_open = in_txn, -1, -1, False
        for i, f in enumerate(flags):
            if txn and f in (1, 3):
                if begin < 0:
                    rollback_open = True
                keep[max(begin, 0):i] = False
                txn = False
            if f == 1:
                txn, begin = True, i
            elif not txn:
                last = i
            elif f == 2:
                txn, last = False, i
        got_keep = plan.keep if plan.keep is not None else np.ones(len(flags), bool)
        assert got_keep.tolist() == keep.tolist(), flags
        assert (plan.last_commit, plan.open_at_end, plan.rollback_open) == (last, txn, rollback_open), flags


# -- resuming ----------------------------------------------------------------------------------


def test_commit_inside_a_frame_resumes_with_skip_rows(engine, tmp_path):
    p = tmp_path / LOG
    write_log(p, TRADE, trade_rows(0, 4), [3, 3, 1, 0], single_frame=True)  # commit after row 1, mid-frame
    loc = engine.location(KEY)
    ingest_file(loc, p)
    rp = loc.resume_point
    assert rp.skip_rows == 2 and rp.file_name == LOG
    loc.checkpoint()
    engine.close()
    eng = StorageEngine(engine.db_root, SCHEMAS)
    loc = eng.location(KEY)
    assert loc.resume_point == rp and loc.committed_rows == 2
    end = write_log(p, TRADE, trade_rows(4, 1), [2])
    ingest_file(loc, p, start=rp.offset)  # the sender resends the whole frame
    loc.flush()
    assert sizes_col(loc) == [0, 1, 2, 3, 4]
    assert loc.resume_point == SourcePosition(LOG, end, 0)
    eng.close()


def test_resending_from_the_resume_point_without_a_rollback_duplicates_nothing(engine, tmp_path):
    """A sender that reconnects and starts again at the resume point while the engine still holds
    its open transaction: the transaction is abandoned and resent, not doubled."""
    p = tmp_path / LOG
    write_log(p, TRADE, trade_rows(0, 2), [3, 3])
    write_log(p, TRADE, trade_rows(2, 3), [1, 0, 0])
    loc = engine.location(KEY)
    ingest_file(loc, p, frames_per_call=1)
    assert loc.written_rows == 5 and loc.committed_rows == 2
    write_log(p, TRADE, trade_rows(5, 1), [2])
    ingest_file(loc, p, start=loc.resume_point.offset)  # resend from the resume point
    loc.flush()
    assert sizes_col(loc) == list(range(6))
    assert loc.import_state["restarts"] == 1


def test_resend_of_a_mid_frame_commit_without_rollback(engine, tmp_path):
    p = tmp_path / LOG
    write_log(p, TRADE, trade_rows(0, 5), [3, 3, 1, 0, 0], single_frame=True)
    loc = engine.location(KEY)
    ingest_file(loc, p)
    rp = loc.resume_point
    assert rp.skip_rows == 2 and loc.written_rows == 5
    ingest_file(loc, p, start=rp.offset)  # same frame again, transaction still open
    assert loc.written_rows == 5 and loc.committed_rows == 2
    write_log(p, TRADE, trade_rows(5, 1), [2])
    ingest_file(loc, p, start=rp.offset)
    loc.flush()
    assert sizes_col(loc) == list(range(6))


def test_bad_input_is_refused_without_an_error_state(engine, tmp_path):
    p = tmp_path / LOG
    write_log(p, TRADE, trade_rows(0, 5), [3] * 5)
    data, run = frames(p)
    rows = decode_frames(data, 0, run, TRADE)
    loc = engine.location(KEY)
    with pytest.raises(ValueError):
        loc.ingest(LOG, run, type(rows)(TRADE, rows.columns[:2], rows.flags))
    with pytest.raises(ValueError):
        loc.ingest(LOG, run, type(rows)(TRADE, rows.columns, rows.flags[:3]))
    assert not loc.in_error
    loc.ingest(LOG, run, rows)
    assert loc.committed_rows == 5


# -- errors ------------------------------------------------------------------------------------


def test_one_location_in_error_others_keep_ingesting(tmp_path):
    from faults.disk import FaultyDisk

    disk = FaultyDisk(record=False)
    eng = StorageEngine(str(tmp_path / "db"), SCHEMAS, import_default=ImportConfig(flush_interval_ms=10,
                                                                                  checkpoint_interval_ms=50), fs=disk)
    p1, p2 = tmp_path / LOG, tmp_path / LOG2
    write_log(p1, TRADE, trade_rows(0, 20000), [3] * 20000)
    write_log(p2, TRADE, trade_rows(0, 20000), [3] * 20000)
    bad, good = eng.location(KEY), eng.location(KEY2)
    eng.start()
    disk.inject("pwrite", errno.EIO, path_contains=str(bad.path / "Price.dat"))
    before = eng.in_error_count()
    with pytest.raises(LocationError, match="Input/output error"):
        ingest_file(bad, p1)
    assert bad.in_error and "write failed" in bad.error
    assert eng.in_error_count() == before + 1
    with pytest.raises(LocationError):
        ingest_file(bad, p1)
    ingest_file(good, p2, frames_per_call=1)
    wait_for(lambda: read_record(good.path).rows >= 20000, 3, what="the good location checkpointed")
    assert good.published_rows == 20000 and read_record(good.path).rows == 20000 and not good.in_error
    eng.close()
    assert eng.in_error_count() == before


def test_a_failing_flush_puts_only_that_location_in_error(tmp_path):
    from faults.disk import FaultyDisk

    disk = FaultyDisk(record=False)
    engine = StorageEngine(str(tmp_path / "db"), SCHEMAS, fs=disk)
    p1, p2 = tmp_path / LOG, tmp_path / LOG2
    write_log(p1, TRADE, trade_rows(0, 100), [3] * 100)
    write_log(p2, TRADE, trade_rows(0, 100), [3] * 100)
    bad, good = engine.location(KEY), engine.location(KEY2)
    ingest_file(bad, p1)
    ingest_file(good, p2)
    # the flush's third write (of five, one per column file) fails
    disk.inject("pwrite", errno.ENOSPC, path_contains=str(bad.path / "Sym.dat"))
    bad.flush()
    good.flush()
    assert bad.in_error and "flush failed" in bad.error and "No space" in bad.error and "Sym.dat" in bad.error
    assert bad.published_rows == 0 and not bad.checkpoint()
    assert good.published_rows == 100 and good.checkpoint()
    # the writes before the failed one were made, nothing after it
    sizes = {name: os.path.getsize(bad.path / name) for name in bad.file_names}
    assert [bool(sizes[n]) for n in bad.file_names] == [True, True, False, False, False], sizes
    engine.close()


def test_a_closed_location_refuses_work(engine, tmp_path):
    p = tmp_path / LOG
    write_log(p, TRADE, trade_rows(0, 5), [3] * 5)
    loc = engine.location(KEY)
    engine.close()
    with pytest.raises(LocationError, match="closed"):
        ingest_file(loc, p)
    with pytest.raises(LocationError, match="closed"):
        loc.read_table()
    with pytest.raises(RuntimeError):
        engine.location(KEY)


def test_sentinel_values_read_back_as_null(tmp_path):
    """The documented cost of sentinels (docs/storage-format.md): a stored minimum value is null."""
    import pyarrow as pa

    from disd.schema import TableSchema

    schema = TableSchema.from_dict({"namespace": "S", "table": "T", "columns": [{"name": "B", "type": "byte"}]})
    eng = StorageEngine(str(tmp_path / "db"), SchemaRegistry([schema]), StorageConfig(block_size_bytes=7))
    p = tmp_path / "S.T.System.ip.d.bin.2026-11-22.000000.000+0000"
    write_log(p, schema, {"B": pa.array([-128, -127, None] * 10, pa.int8())}, [3] * 30)
    loc = eng.location(LocationKey("S", "T", "ip", "d"))
    ingest_file(loc, p, schema)
    loc.flush()
    assert loc.read_table().column("B").to_pylist() == [None, -127, None] * 10
    assert loc.read_block("B.dat", 1) == bytes([0x81, 0x80, 0x80, 0x81, 0x80, 0x80, 0x81])  # 7-byte blocks
    eng.close()
