"""The checkpoint record's write on the real file system: the temp file and ``table.size`` swap
names, so a checkpoint writes over the record before last in place instead of creating a file
(a new inode and block, and a directory sync inside its fsync, were most of a checkpoint's
kernel CPU); recovery, reads racing a rewrite, and file systems that cannot swap."""

from __future__ import annotations

import os

import pytest

from disd.storage import StorageEngine, fsio
from disd.storage.checkpoint import FILE_NAME, TEMP_NAME, CheckpointError, read_record
from disd.storage.fsio import OsFileSystem
from support import trade_rows, write_log

from .util import KEY, LOG, SCHEMAS, TRADE, ingest_file


def _inode(path) -> int:
    return os.stat(path).st_ino


def _feed(loc, log, start: int, first_row: int) -> int:
    end = write_log(log, TRADE, trade_rows(first_row, 10), [3] * 10)
    ingest_file(loc, log, start=start)
    return end


def test_checkpoints_swap_the_record_with_the_temp_file_and_create_no_file(tmp_path):
    eng = StorageEngine(str(tmp_path / "db"), SCHEMAS)
    try:
        loc = eng.location(KEY)
        log = tmp_path / LOG
        end = _feed(loc, log, 0, 0)
        assert loc.checkpoint()
        record, temp = loc.path / FILE_NAME, loc.path / TEMP_NAME
        pair = {_inode(record), _inode(temp)}  # the temp file holds the record before
        for n in range(2, 5):
            before = _inode(temp)
            end = _feed(loc, log, end, 10 * (n - 1))
            assert loc.checkpoint()
            assert _inode(record) == before, "the new record is the file the temp name held"
            assert {_inode(record), _inode(temp)} == pair, "no file was created"
            assert read_record(loc.path).rows == 10 * n == loc.committed_rows
    finally:
        eng.close()


def test_a_crash_after_swaps_recovers_the_last_record_and_drops_the_temp_file(tmp_path):
    eng = StorageEngine(str(tmp_path / "db"), SCHEMAS)
    loc = eng.location(KEY)
    log = tmp_path / LOG
    end = _feed(loc, log, 0, 0)
    assert loc.checkpoint()
    end = _feed(loc, log, end, 10)
    assert loc.checkpoint()
    _feed(loc, log, end, 20)  # ingested, not checkpointed
    loc.flush()
    eng.file_handles.close_all()
    eng._locs.clear()  # noqa: SLF001 - dropped as a crash would (no final flush or checkpoint)
    eng2 = StorageEngine(eng.db_root, eng.schemas, eng.storage)
    try:
        loc2 = eng2.location(KEY)
        assert not loc2.in_error and loc2.committed_rows == 20 and loc2.resume_point.offset == end
        assert not (loc2.path / TEMP_NAME).exists() and read_record(loc2.path).rows == 20
    finally:
        eng2.close()


def test_exchange_swaps_two_names_and_renames_where_there_is_nothing_to_swap(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"new")
    b.write_bytes(b"old")
    fsio.OS.exchange(str(a), str(b))
    assert b.read_bytes() == b"new" and a.read_bytes() == b"old"
    c = tmp_path / "c"
    fsio.OS.exchange(str(a), str(c))  # no c: a is renamed to it
    assert c.read_bytes() == b"old" and not a.exists()
    with pytest.raises(FileNotFoundError):
        fsio.OS.exchange(str(tmp_path / "missing"), str(b))
    assert b.read_bytes() == b"new"


class TornOnce(OsFileSystem):
    """The real file system, except that the first read of ``table.size`` sees a byte of its
    record changed, as a read racing the rewrite of the file a swap made the temp file does."""

    def __init__(self) -> None:
        self.torn = 0

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        data = super().pread(fd, size, offset)
        if self.torn == 0 and data.startswith(b"DISCKPT"):
            self.torn += 1
            i = data.index(b'"rows"')
            data = data[:i] + b'"rowz"' + data[i + 6:]
        return data


def test_a_record_read_torn_by_a_rewrite_is_read_again_and_damage_still_raises(tmp_path):
    eng = StorageEngine(str(tmp_path / "db"), SCHEMAS)
    try:
        loc = eng.location(KEY)
        _feed(loc, tmp_path / LOG, 0, 0)
        assert loc.checkpoint()
        disk = TornOnce()
        assert read_record(loc.path, disk).rows == 10 and disk.torn == 1
        (loc.path / FILE_NAME).write_bytes(b"DISCKPT 1\n{}\ncrc32c 00000000\n")
        with pytest.raises(CheckpointError):
            read_record(loc.path)
    finally:
        eng.close()
