"""A location's flush in one operation of the file system (``fsio.pwrite_all``).

The real file system makes several positional writes in C (``disd.storage.batchwrite``), giving
up the interpreter's lock once instead of once per column file; every other file system (the
tests' recording and failing disks) gets the composition of its own ``pwrite``.  These tests
hold the two to the same result, on success and on failure; check that the handles' descriptors
stay theirs while a batch reopens some of them (``filehandles.pwrite_files``); and check that
the product's build has the C one and the engine's flush uses it."""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import pytest

from disd.storage import StorageEngine, fsio, ingestcore
from disd.storage.filehandles import TrackedFileHandleFactory, pwrite_files
from disd.storage.fsio import MeteredFileSystem, OsFileSystem
from disd.storage.metrics import IO_ERRORS
from support import trade_rows, write_log

from .util import KEY, LOG, SCHEMAS, TRADE, ingest_file


class Composed(OsFileSystem):
    """The real calls, but a subclass: it gets the composed operation."""


class ShortWrites(Composed):
    """A disk that writes at most 3 bytes a call: a short write must be continued."""

    def pwrite(self, fd: int, data, offset: int) -> int:
        return os.pwrite(fd, memoryview(data)[:3], offset)


def open_files(tmp_path, n: int, flags: int = 0) -> list[int]:
    return [os.open(tmp_path / f"f{i}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | flags, 0o644) for i in range(n)]


def test_the_build_has_the_c_operation():
    assert fsio.OS.pwrite_all is not None, "disd.storage.batchwrite was not built (no C compiler?)"
    assert MeteredFileSystem(fsio.OS).pwrite_all is not None
    assert Composed().pwrite_all is None
    assert MeteredFileSystem(Composed()).pwrite_all is None


@pytest.mark.parametrize("fs", [fsio.OS, Composed(), ShortWrites()], ids=["c", "composed", "short-writes"])
def test_each_write_lands_whole_at_its_offset(tmp_path, fs):
    fds = open_files(tmp_path, 3)
    try:
        os.pwrite(fds[2], b"0123456789", 0)
        fsio.pwrite_all(fs, [
            (fds[0], b"hello", 0),
            (fds[1], bytearray(b"a block of bytes"), 100),  # a hole before it
            (fds[2], memoryview(b"XYZxyz")[1:5], 4),  # a slice, over existing bytes
            (fds[0], b" world", 5),  # the same descriptor again, after the first
        ])
        assert (tmp_path / "f0").read_bytes() == b"hello world"
        assert (tmp_path / "f1").read_bytes() == b"\0" * 100 + b"a block of bytes"
        assert (tmp_path / "f2").read_bytes() == b"0123YZxy89"
        fsio.pwrite_all(fs, [])  # nothing to write is no call at all
    finally:
        for fd in fds:
            os.close(fd)


@pytest.mark.parametrize("fs", [fsio.OS, Composed()], ids=["c", "composed"])
def test_a_failed_write_stops_the_batch_and_says_which(tmp_path, fs):
    fds = open_files(tmp_path, 3)
    ro = os.open(tmp_path / "f1", os.O_RDONLY | os.O_CLOEXEC)
    metered = MeteredFileSystem(fs)
    counted = IO_ERRORS.labels("pwrite", "EBADF")
    n0 = counted._value.get()  # noqa: SLF001 - the test reads the internal it checks
    try:
        with pytest.raises(OSError) as e:
            fsio.pwrite_all(metered, [(fds[0], b"first", 0), (ro, b"second", 0), (fds[2], b"third", 0)])
        assert e.value.errno == errno.EBADF and e.value.writes_done == 1
        assert fsio.failed_op(e.value) == "pwrite" and counted._value.get() == n0 + 1  # noqa: SLF001 - the test reads the internal it checks
        assert (tmp_path / "f0").read_bytes() == b"first"  # made before the failure
        assert (tmp_path / "f2").read_bytes() == b""  # nothing after it
    finally:
        for fd in [*fds, ro]:
            os.close(fd)


def test_bad_arguments_are_refused_before_any_write(tmp_path):
    fd = open_files(tmp_path, 1)[0]
    try:
        with pytest.raises(TypeError):
            fsio.pwrite_all(fsio.OS, [(fd, b"x", 0), (fd, "not bytes", 1)])
        with pytest.raises(ValueError):
            fsio.pwrite_all(fsio.OS, [(fd, b"x", 0), (fd, b"y", -1)])
        assert (tmp_path / "f0").read_bytes() == b""
    finally:
        os.close(fd)


def test_descriptors_reopened_by_a_batch_are_not_closed_under_it(tmp_path):
    """Looking up a batch's descriptors may reopen them, and a reopen at the limit closes the
    least recently opened descriptors that nobody is using: one already looked up for the batch
    must not be among them (its number would be reused by the next open, and the batch would
    write one file's bytes into another)."""
    factory = TrackedFileHandleFactory(max_open_files=8)
    batch = [factory.open(str(tmp_path / f"b{i}")) for i in range(2)]
    for h in batch:  # their descriptors were closed (a reclaim) and are reopened by the batch
        with h.lock:
            factory._release(h)  # noqa: SLF001 - the test reads the internal it checks
    busy = [factory.open(str(tmp_path / f"o{i}")) for i in range(7)]
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # another thread in the middle of operations on every other handle
        for h in busy:
            h.lock.acquire()
        held.set()
        release.wait(10)
        for h in busy:
            h.lock.release()

    t = threading.Thread(target=hold)
    t.start()
    assert held.wait(10)
    try:
        pwrite_files([(h, f"data of b{i}".encode(), 0) for i, h in enumerate(batch)])
    finally:
        release.set()
        t.join()
    assert [(tmp_path / f"b{i}").read_bytes() for i in range(2)] == [b"data of b0", b"data of b1"]
    assert all(h.pins == 0 for h in batch)
    for h in batch + busy:
        h.close()
    assert factory.open_count == 0


def test_a_batch_of_a_closed_handle_is_refused_and_unpins_the_rest(tmp_path):
    factory = TrackedFileHandleFactory(max_open_files=64)
    a, b = factory.open(str(tmp_path / "a")), factory.open(str(tmp_path / "b"))
    b.close()
    with pytest.raises(ValueError, match="closed"):
        pwrite_files([(a, b"x", 0), (b, b"y", 0)])
    assert a.pins == 0 and (tmp_path / "a").read_bytes() == b""
    a.close()
    assert factory.open_count == 0


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_the_engines_flush_is_one_call(tmp_path, monkeypatch, compiled):
    """A location's flush is one call of the file system for all its column files: of the
    compiled write states' (``ingestcore.write_out``), or of ``pwrite_all`` for the reference."""
    calls = []
    if compiled:
        native = ingestcore.write_out

        def spy(jobs):
            calls.append(len(jobs[0][0].sizes()))
            return native(jobs)

        monkeypatch.setattr(ingestcore, "write_out", spy)
    else:
        native = fsio._native_pwrite_all  # noqa: SLF001 - the test reads the internal it checks

        def spy(writes):
            calls.append(len(writes))
            return native(writes)

        monkeypatch.setattr(fsio, "_native_pwrite_all", spy)
    eng = StorageEngine(str(tmp_path / "db"), SCHEMAS, compiled=compiled)
    try:
        write_log(tmp_path / LOG, TRADE, trade_rows(0, 100), [3] * 100)
        loc = eng.location(KEY)
        ingest_file(loc, tmp_path / LOG)
        loc.flush()
        assert calls == [len(loc.column_files())]  # every column file's bytes, one call
        assert loc.published_rows == 100
        assert all(os.path.getsize(loc.path / name) == size for name, size in loc.column_files().items())
    finally:
        eng.close()


def test_a_busy_interpreter_does_not_hold_up_a_flush(tmp_path):
    """What the C operation is for: made from Python, each of a flush's writes waited for the
    interpreter's lock behind a thread running Python (up to a switch interval each time).

    The writes are synchronous (``O_DSYNC``, a quarter of a millisecond each here): a thread
    waiting for the lock takes it only when it is given up for longer than that thread takes to
    wake.  Page-cache writes of a block (20 us here) are over sooner, so whether the spinning
    thread took the lock at them depended on its happening to be awake (one CI run: the Python
    writes 1.9 ms in all, never contended, the C call's 93 ms)."""
    stop, spinning = threading.Event(), threading.Event()

    def spin() -> None:
        x = 0
        spinning.set()
        while not stop.is_set():
            x += 1

    fds = open_files(tmp_path, 5, os.O_DSYNC)
    block = b"x" * 65536  # a block

    def flushes(fs) -> float:
        t0 = time.perf_counter()
        for i in range(20):
            fsio.pwrite_all(fs, [(fd, block, len(block) * i) for fd in fds])
        return time.perf_counter() - t0

    t = threading.Thread(target=spin, daemon=True)
    t.start()
    try:
        assert spinning.wait(5)
        composed = flushes(Composed())
        native = flushes(fsio.OS)
    finally:
        stop.set()
        t.join()
        for fd in fds:
            os.close(fd)
    assert native < composed / 2, (native, composed)


_CALL = re.compile(r"^\d+\s+pwrite64\((\d+)<([^>]*)>, .*, (\d+), (\d+)\)\s+=\s+(\d+)")


def traced_writes(kind: str, root) -> list[tuple[str, ...]]:
    """The pwrite calls ``pwrite_all`` makes under ``root`` (``strace -y``), as (file, size,
    offset, written) with ``root`` replaced by ``ROOT``."""
    script = ("import os, sys\nfrom disd.storage import fsio\nfrom disd.storage.fsio import OsFileSystem\n"
              "class Composed(OsFileSystem): pass\n"
              "fs = fsio.OS if sys.argv[1] == 'c' else Composed()\n"
              "assert (fs.pwrite_all is not None) == (sys.argv[1] == 'c')\n"
              "fds = [os.open(os.path.join(sys.argv[2], n), os.O_RDWR | os.O_CREAT, 0o644) for n in 'ABC']\n"
              "fsio.pwrite_all(fs, [(fds[0], b'a' * 10, 0), (fds[1], b'b' * 70000, 5), (fds[2], b'c', 9),"
              " (fds[0], b'd' * 3, 10)])\n")
    root.mkdir()
    trace = root.parent / f"{root.name}.strace"
    r = subprocess.run(["strace", "-f", "-y", "-e", "trace=pwrite64", "-o", str(trace), sys.executable, "-c", script,
                        kind, str(root)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    out = []
    for line in trace.read_text().splitlines():
        m = _CALL.match(line)
        if m is not None and str(root) in m.group(2):
            out.append((m.group(2).replace(str(root), "ROOT"), *m.group(3, 4, 5)))
    return out


def test_the_c_operation_makes_the_composed_ones_calls_in_their_order(tmp_path):
    assert shutil.which("strace"), "strace is needed (apt-get install strace; .ci/run installs it)"
    c = traced_writes("c", tmp_path / "c")
    composed = traced_writes("composed", tmp_path / "composed")
    assert composed == [("ROOT/A", "10", "0", "10"), ("ROOT/B", "70000", "5", "70000"), ("ROOT/C", "1", "9", "1"),
                        ("ROOT/A", "3", "10", "3")], composed
    assert c == composed
