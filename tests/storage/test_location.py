"""The storage engine in-process, over real files with real fsync."""

from __future__ import annotations

import errno
import os

import numpy as np
import pyarrow as pa
import pytest

from disd.binlog import LocationKey, RowFlag
from disd.schema import SchemaRegistry, TableSchema
from disd.storage import FileIdentityError, ImportConfig, LocationError, StorageConfig, StorageEngine
from disd.storage.checkpoint import FILE_NAME
from disd.storage.location import plan_transactions

from .util import KEY, LOG, SCHEMAS, TRADE, ingest_file, trade_rows, write_log


@pytest.fixture
def engine(tmp_path):
    e = StorageEngine(str(tmp_path / "db"), SCHEMAS)
    yield e
    e.close()


def reopen(engine):
    engine.close()
    return StorageEngine(engine.db_root, engine.schemas, engine.storage)



def test_every_type_round_trips(tmp_path, all_types_schema):
    reg = SchemaRegistry([all_types_schema])
    eng = StorageEngine(str(tmp_path / "db"), reg)
    key = LocationKey("Test", "AllTypes", "ip", "2026-11-22")
    from test_binlog import all_types_table

    t = all_types_table(3000)
    p = tmp_path / "Test.AllTypes.System.ip.2026-11-22.bin.2026-11-22.000000.000+0000"
    write_log(p, all_types_schema, {c: t.column(c) for c in t.column_names}, [3] * 3000)
    loc = eng.location(key)
    ingest_file(loc, p, all_types_schema, frames_per_call=1)
    loc.flush()
    expect = t.select(all_types_schema.column_names).cast(all_types_schema.arrow_schema())
    assert loc.read_table().equals(expect)
    assert loc.read_table(["String"], 1000, 1700).column(0).equals(expect.column("String").slice(1000, 700))
    eng.close()
    eng = StorageEngine(str(tmp_path / "db"), reg)  # and again after recovery
    assert eng.location(key).read_table().equals(expect)
    eng.close()


def test_flush_publishes_and_writes_never_exceed_the_block(engine, tmp_path, monkeypatch):
    from disd.storage.filehandles import TrackedFile

    sizes = []
    orig = TrackedFile.pwrite
    monkeypatch.setattr(TrackedFile, "pwrite", lambda self, data, off: (sizes.append(len(data)), orig(self, data, off))[1])
    write_log(tmp_path / LOG, TRADE, trade_rows(0, 20000), [3] * 20000)
    loc = engine.location(KEY)
    ingest_file(loc, tmp_path / LOG)
    assert loc.committed_rows == 20000 and loc.published_rows == 0
    assert loc.read_table().num_rows == 0
    loc.flush()
    assert loc.published_rows == 20000
    assert loc.read_table(["Size"]).column(0).to_pylist() == list(range(20000))
    assert max(sizes) == 65536 and min(sizes) < 65536


def test_checkpoint_then_restart_truncates_later_rows(engine, tmp_path):
    p = tmp_path / LOG
    end1 = write_log(p, TRADE, trade_rows(0, 100), [3] * 100)
    loc = engine.location(KEY)
    ingest_file(loc, p)
    assert loc.checkpoint()
    assert (loc.resume_point.file_name, loc.resume_point.offset) == (LOG, end1)
    write_log(p, TRADE, trade_rows(100, 50), [3] * 50)
    ingest_file(loc, p, start=end1)
    loc.flush()
    assert loc.published_rows == 150
    # simulate a crash: no final checkpoint
    engine.file_handles.close_all()
    eng2 = StorageEngine(engine.db_root, SCHEMAS)
    loc2 = eng2.location(KEY)
    assert loc2.committed_rows == 100 and loc2.resume_point.offset == end1
    assert os.path.getsize(os.path.join(loc2.path, "Size.dat")) == 400
    ingest_file(loc2, p, start=loc2.resume_point.offset)
    loc2.flush()
    assert loc2.read_table(["Size"]).column(0).to_pylist() == list(range(150))
    eng2.close()
    engine._locs.clear()


def test_missing_and_corrupt_table_size(engine, tmp_path):
    p = tmp_path / LOG
    write_log(p, TRADE, trade_rows(0, 10), [3] * 10)
    loc = engine.location(KEY)
    ingest_file(loc, p)
    loc.flush()  # data written, never checkpointed
    path = loc.path
    engine.file_handles.close_all()
    engine._locs.clear()
    eng = StorageEngine(engine.db_root, SCHEMAS)
    loc = eng.location(KEY)
    assert loc.committed_rows == 0 and not loc.in_error
    assert os.path.getsize(os.path.join(path, "Size.dat")) == 0
    ingest_file(loc, p)
    loc.checkpoint()
    eng.close()
    with open(os.path.join(path, FILE_NAME), "r+b") as f:
        f.seek(30)
        f.write(b"X")
    eng = StorageEngine(engine.db_root, SCHEMAS)
    loc = eng.location(KEY)
    assert loc.in_error and "checksum" in loc.error
    with pytest.raises(LocationError):
        ingest_file(loc, p)
    eng.close()


def test_transaction_rows_are_written_not_published_then_rolled_back(engine, tmp_path):
    p = tmp_path / LOG
    end1 = write_log(p, TRADE, trade_rows(0, 5), [3] * 5)
    write_log(p, TRADE, trade_rows(5, 1000), [1] + [0] * 999)
    loc = engine.location(KEY)
    ingest_file(loc, p)
    loc.flush()
    assert loc.written_rows == 1005 and loc.committed_rows == 5 and loc.published_rows == 5
    assert os.path.getsize(os.path.join(loc.path, "Size.dat")) == 1005 * 4  # on disk, unpublished
    loc.checkpoint()
    assert loc.resume_point.offset == end1
    loc.rollback()
    assert loc.written_rows == 5
    assert os.path.getsize(os.path.join(loc.path, "Size.dat")) == 20


def test_end_transaction_publishes_all_at_once(engine, tmp_path):
    p = tmp_path / LOG
    write_log(p, TRADE, trade_rows(0, 3), [1, 0, 0])
    end = write_log(p, TRADE, trade_rows(3, 1), [2])
    loc = engine.location(KEY)
    ingest_file(loc, p, frames_per_call=1)
    loc.flush()
    assert loc.published_rows == 4 and loc.resume_point.offset == end


@pytest.mark.parametrize(
    "flags,expect_rows,desc",
    [
        ([2, 3], [0, 1], "End without Start commits that row"),
        ([0, 0], [0, 1], "None outside a transaction commits"),
        ([1, 0, 1, 0, 2], [2, 3, 4], "Start inside a transaction abandons it"),
        ([1, 0, 3, 3], [2, 3], "SingleRow inside a transaction abandons it"),
        ([3, 1, 0, 0], [0], "an open transaction at the end stays unpublished"),
    ],
)
def test_malformed_flag_sequences(engine, tmp_path, flags, expect_rows, desc):
    p = tmp_path / LOG
    write_log(p, TRADE, trade_rows(0, len(flags)), flags, single_frame=True)
    loc = engine.location(KEY)
    ingest_file(loc, p)
    loc.flush()
    assert loc.read_table(["Size"]).column(0).to_pylist() == expect_rows, desc


def test_plan_spans_batches():
    plan = plan_transactions(np.array([0, 0, 2, 3], np.uint8), in_txn=True)
    assert (plan.last_commit, plan.open_at_end, plan.rollback_open) == (3, False, False)
    plan = plan_transactions(np.array([0, 3, 1], np.uint8), in_txn=True)
    assert plan.rollback_open and plan.keep.tolist() == [False, True, True] and plan.open_at_end
    plan = plan_transactions(np.array([], np.uint8), in_txn=False)
    assert plan.last_commit == -1


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
    ingest_file(loc, p, start=rp.offset)  # the tailer resends the whole frame
    loc.flush()
    assert loc.read_table(["Size"]).column(0).to_pylist() == [0, 1, 2, 3, 4]
    assert loc.resume_point.offset == end
    eng.close()


def test_one_location_in_error_others_keep_ingesting(engine, tmp_path):
    from disd import metrics

    other = LocationKey("Market", "Trade", "ip2", "2026-11-22")
    p1 = tmp_path / LOG
    p2 = tmp_path / "Market.Trade.System.ip2.2026-11-22.bin.2026-11-22.090000.000+0000"
    write_log(p1, TRADE, trade_rows(0, 20000), [3] * 20000)
    write_log(p2, TRADE, trade_rows(0, 20000), [3] * 20000)
    bad, good = engine.location(KEY), engine.location(other)

    def eio(*a, **k):
        raise OSError(errno.EIO, "Input/output error")

    bad.writers["Price.dat"].handle.pwrite = eio
    before = metrics.PARTITIONS_IN_ERROR._value.get()
    with pytest.raises(LocationError, match="Input/output error"):
        ingest_file(bad, p1)
    assert bad.in_error and metrics.PARTITIONS_IN_ERROR._value.get() == before + 1
    ingest_file(good, p2)
    good.flush()
    assert good.published_rows == 20000 and not good.in_error


def test_replaced_column_file_is_a_clear_error(tmp_path):
    eng = StorageEngine(str(tmp_path / "db"), SCHEMAS, StorageConfig(max_open_files=16))
    p = tmp_path / LOG
    write_log(p, TRADE, trade_rows(0, 10), [3] * 10)
    loc = eng.location(KEY)
    ingest_file(loc, p)
    loc.flush()
    h = loc.writers["Size.dat"].handle
    eng.file_handles.close_all()  # descriptors reclaimed
    tmp = h.path + ".new"
    with open(tmp, "wb") as f:
        f.write(b"\0" * 40)
    os.replace(tmp, h.path)
    with pytest.raises(FileIdentityError, match="replaced"):
        h.pread(4, 0)
    os.unlink(h.path)
    with pytest.raises(FileIdentityError, match="deleted"):
        h.pread(4, 0)


def test_many_column_files_stay_under_the_handle_limit(tmp_path):
    cols = [{"name": f"C{i}", "type": "long"} for i in range(10)]
    schema = TableSchema.from_dict({"namespace": "Wide", "table": "T", "columns": cols})
    reg = SchemaRegistry([schema])
    root = tmp_path / "db"
    eng = StorageEngine(str(root), reg, StorageConfig(max_open_files=64))
    p = tmp_path / "Wide.T.System.ip.d.bin.2026-11-22.000000.000+0000"
    data = {f"C{i}": np.arange(100, dtype=np.int64) * (i + 1) for i in range(10)}
    write_log(p, schema, data, [3] * 100)

    def fds_in_root() -> int:
        n = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{fd}").startswith(str(root)):
                    n += 1
            except OSError:
                pass
        return n

    peak = 0
    locs = []
    for j in range(200):  # 200 locations x 10 files = 2,000 column files
        loc = eng.location(LocationKey("Wide", "T", f"ip{j}", "d"))
        from .util import ingest_file as ingest

        ingest(loc, p, schema)
        loc.flush()
        locs.append(loc)
        peak = max(peak, fds_in_root())
    assert peak <= 64, peak
    assert eng.file_handles.reclaimed_total > 0
    for loc in locs[::17]:
        t = loc.read_table()
        assert t.column("C3").to_pylist() == (np.arange(100) * 4).tolist()
        peak = max(peak, fds_in_root())
    assert peak <= 64
    eng.close()
    assert fds_in_root() == 0


def test_fast_cycling_is_reported():
    from disd.storage.filehandles import TrackedFileHandleFactory

    f = TrackedFileHandleFactory(10)
    f._note_reclaims(2)
    assert f.fast_cycling_total == 1


def test_sentinel_values_read_back_as_null(tmp_path):
    """The documented cost of sentinels (docs/storage-format.md): a stored minimum value is null."""
    schema = TableSchema.from_dict({"namespace": "S", "table": "T", "columns": [{"name": "B", "type": "byte"}]})
    eng = StorageEngine(str(tmp_path / "db"), SchemaRegistry([schema]))
    p = tmp_path / "S.T.System.ip.d.bin.2026-11-22.000000.000+0000"
    write_log(p, schema, {"B": pa.array([-128, -127, None], pa.int8())}, [3, 3, 3])
    loc = eng.location(LocationKey("S", "T", "ip", "d"))
    ingest_file(loc, p, schema)
    loc.flush()
    assert loc.read_table().column("B").to_pylist() == [None, -127, None]
    eng.close()
