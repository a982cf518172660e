"""A new location in one operation of the file system (``fsio.create_location``).

The real file system makes a new location's directories, first record and column files in C
(``disd.storage.newlocation``), giving up the interpreter's lock once instead of some thirty
times; every other file system (the tests' recording and failing disks) gets the composition of
its own operations.  These tests hold the two to the same result, on success and on failure,
and check that the product's build has the C one (a build without a compiler would fall back
quietly)."""

from __future__ import annotations

import errno
import os
import pathlib
import re
import shutil
import subprocess
import sys
import threading
import time

import pytest

from disd.storage import StorageEngine, fsio
from disd.storage.checkpoint import FILE_NAME, TEMP_NAME, read_record
from disd.storage.fsio import MeteredFileSystem, OsFileSystem
from disd.storage.metrics import IO_ERRORS

from .util import KEY, SCHEMAS

NAMES = ["Timestamp.dat", "Sym.off", "Sym.dat", "Price.dat", "Size.dat"]
RECORD = b"any bytes: create_location does not read its record\n"


class Composed(OsFileSystem):
    """The real calls, but a subclass: it gets the composed operation."""


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def tree(root: str) -> list[tuple[str, str, int]]:
    out = []
    for d, dirs, files in os.walk(root):
        for name in dirs:
            out.append((os.path.relpath(os.path.join(d, name), root), "dir", 0))
        for name in files:
            p = os.path.join(d, name)
            out.append((os.path.relpath(p, root), "file", os.path.getsize(p)))
    return sorted(out)


def test_the_build_has_the_c_operation():
    assert fsio.OS.create_location is not None, "disd.storage.newlocation was not built (no C compiler?)"
    assert MeteredFileSystem(fsio.OS).create_location is not None
    assert Composed().create_location is None
    assert MeteredFileSystem(Composed()).create_location is None


@pytest.mark.parametrize("fs", [fsio.OS, Composed()], ids=["c", "composed"])
def test_a_new_location_is_made_with_its_parents_record_and_files(tmp_path, fs):
    path = str(tmp_path / "db" / "Intraday" / "Market" / "Trade" / "ip1" / "2026-11-22" / "Trade")
    before = open_fds()
    opened = fsio.create_location(fs, path, TEMP_NAME, FILE_NAME, RECORD, NAMES)
    assert opened is not None and len(opened) == len(NAMES)
    try:
        for name, (fd, identity) in zip(NAMES, opened):
            st = os.stat(os.path.join(path, name))
            assert identity == (st.st_dev, st.st_ino) == (os.fstat(fd).st_dev, os.fstat(fd).st_ino)
            assert os.fstat(fd).st_size == 0
            assert os.get_blocking(fd) and os.get_inheritable(fd) is False  # O_CLOEXEC
            assert os.pwrite(fd, b"x", 0) == 1  # opened for writing
        with open(os.path.join(path, FILE_NAME), "rb") as f:
            assert f.read() == RECORD
        assert sorted(os.listdir(path)) == sorted(NAMES + [FILE_NAME])  # the temp record renamed
    finally:
        for fd, _ in opened:
            os.close(fd)
    assert open_fds() == before


def test_both_operations_leave_the_same_tree(tmp_path):
    made = []
    for fs, root in ((fsio.OS, tmp_path / "c"), (Composed(), tmp_path / "composed")):
        for ip in ("ip1", "ip2"):
            for day in ("2026-11-21", "2026-11-22"):
                p = str(root / "Intraday" / "Market" / "Trade" / ip / day / "Trade")
                for fd, _ in fsio.create_location(fs, p, TEMP_NAME, FILE_NAME, RECORD, NAMES):
                    os.close(fd)
        made.append(tree(str(root)))
    assert made[0] == made[1] and len(made[0]) == 3 + 2 + 4 * 2 + 4 * (len(NAMES) + 1)


@pytest.mark.parametrize("fs", [fsio.OS, Composed()], ids=["c", "composed"])
def test_an_existing_directory_is_left_to_the_caller(tmp_path, fs):
    path = tmp_path / "loc"
    path.mkdir()
    before = open_fds()
    assert fsio.create_location(fs, str(path), TEMP_NAME, FILE_NAME, RECORD, NAMES) is None
    assert list(path.iterdir()) == [] and open_fds() == before


@pytest.mark.parametrize("fs", [fsio.OS, Composed()], ids=["c", "composed"])
def test_a_failure_names_the_call_and_file_and_closes_what_was_opened(tmp_path, fs):
    path = str(tmp_path / "loc")
    metered = MeteredFileSystem(fs)
    counted = IO_ERRORS.labels("open", "ENOTDIR")
    n0 = counted._value.get()  # noqa: SLF001 - prometheus_client has no public read of one counter
    before = open_fds()
    # the second "file" lies under the first, a regular file: its open fails with ENOTDIR
    with pytest.raises(NotADirectoryError) as e:
        fsio.create_location(metered, path, TEMP_NAME, FILE_NAME, RECORD, ["a.dat", "a.dat/b.dat"])
    assert e.value.errno == errno.ENOTDIR and e.value.filename == os.path.join(path, "a.dat/b.dat")
    assert fsio.failed_op(e.value) == "open"
    assert counted._value.get() == n0 + 1  # noqa: SLF001 - prometheus_client has no public read of one counter
    assert open_fds() == before


@pytest.mark.parametrize("fs", [fsio.OS, Composed()], ids=["c", "composed"])
def test_a_path_under_a_file_is_refused(tmp_path, fs):
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(NotADirectoryError):
        fsio.create_location(fs, str(tmp_path / "file" / "loc"), TEMP_NAME, FILE_NAME, RECORD, NAMES)


def test_the_engine_makes_new_locations_in_one_call_and_reopens_them(tmp_path):
    """A location made by the C operation is a location like any other: the record is the
    engine's, and reopening it from disk finds it."""
    eng = StorageEngine(str(tmp_path / "db"), SCHEMAS)
    opens = eng.file_handles.peak_open
    loc = eng.location(KEY)
    files = loc.column_files()
    assert eng.file_handles.peak_open == opens + len(files)  # the descriptors were adopted
    record = read_record(str(loc.path))
    assert record.rows == 0 and record.files == {n: 0 for n in files}
    assert record.schema_version == loc.schema_version == loc.schema.version
    assert sorted(os.listdir(loc.path)) == sorted([*files, FILE_NAME])
    eng.close()
    eng = StorageEngine(str(tmp_path / "db"), SCHEMAS)
    again = eng.location(KEY, create=False)
    assert not again.in_error and again.committed_rows == 0
    eng.close()


def test_a_busy_interpreter_does_not_hold_up_new_locations(tmp_path):
    """What the C operation is for: made from Python, each of a new location's calls waited for
    the interpreter's lock behind a thread running Python (up to a switch interval each time)."""
    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            x += 1

    def make(fs, root) -> float:
        t0 = time.perf_counter()
        for i in range(20):
            p = str(root / f"ip{i}" / "d" / "T")
            for fd, _ in fsio.create_location(fs, p, TEMP_NAME, FILE_NAME, RECORD, NAMES):
                os.close(fd)
        return time.perf_counter() - t0

    # the best of five interleaved rounds each: the disk's own time (fsyncs on a shared disk)
    # varies from round to round, the waits for the interpreter's lock do not (with three, a
    # busy disk's slowest rounds could leave the C operation's best within a factor of two)
    composed, native = [], []
    t = threading.Thread(target=spin, daemon=True)
    t.start()
    try:
        for r in range(5):
            composed.append(make(Composed(), tmp_path / f"composed{r}"))
            native.append(make(fsio.OS, tmp_path / f"c{r}"))
    finally:
        stop.set()
        t.join()
    assert min(native) < min(composed) / 2, (native, composed)


_TRACED = "mkdir,openat,fsync,rename,pwrite64,close,newfstatat,fstat"
_CALL = re.compile(r"^\d+\s+(\w+)\((.*)\)\s+=\s+(-?\d+)")


def traced_calls(kind: str, root: pathlib.Path) -> list[tuple[str, ...]]:
    """The file-system calls ``create_location`` makes under ``root`` (``strace -y``: each
    descriptor with its path), as (call, paths...) with ``root`` replaced by ``ROOT``."""
    script = ("import sys\nfrom disd.storage import fsio\nfrom disd.storage.fsio import OsFileSystem\n"
              "class Composed(OsFileSystem): pass\n"
              "fs = fsio.OS if sys.argv[1] == 'c' else Composed()\n"
              "assert (fs.create_location is not None) == (sys.argv[1] == 'c')\n"
              "out = fsio.create_location(fs, sys.argv[2], 'table.size.tmp', 'table.size', b'rec\\n', ['A.dat', 'B.dat'])\n"
              "[__import__('os').close(fd) for fd, _ in out]\n")
    root.mkdir()
    trace = root.parent / f"{root.name}.strace"
    r = subprocess.run(["strace", "-f", "-y", "-e", f"trace={_TRACED}", "-o", str(trace), sys.executable, "-c", script,
                        kind, str(root / "x" / "y" / "T")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    calls = []
    for line in trace.read_text().splitlines():
        m = _CALL.match(line)
        if m is None or str(root) not in line:
            continue
        paths = [a or b for a, b in re.findall(r'"([^"]*)"|<([^>]*)>', m.group(2))]
        calls.append((m.group(1), *[p.replace(str(root), "ROOT") for p in paths if str(root) in p]))
    return calls


def test_the_c_operation_makes_the_composed_ones_calls_in_their_order(tmp_path):
    """Crash safety rests on the order (docs/storage-format.md, "A new location"): each new
    directory's parent fsynced, the record durable and renamed before any column file exists.
    The tests' failing and recording disks check that order on the composed operation; strace
    checks that the C one makes the very same calls."""
    assert shutil.which("strace"), "strace is needed (apt-get install strace; .ci/run installs it)"
    c = traced_calls("c", tmp_path / "c")
    composed = traced_calls("composed", tmp_path / "composed")
    tmp, rec, loc = "ROOT/x/y/T/table.size.tmp", "ROOT/x/y/T/table.size", "ROOT/x/y/T"
    assert composed == [
        ("newfstatat", loc), ("newfstatat", "ROOT/x/y"), ("newfstatat", "ROOT/x"), ("newfstatat", "ROOT"),
        ("mkdir", "ROOT/x"), ("openat", "ROOT"), ("fsync", "ROOT"), ("close", "ROOT"),
        ("mkdir", "ROOT/x/y"), ("openat", "ROOT/x"), ("fsync", "ROOT/x"), ("close", "ROOT/x"),
        ("mkdir", loc), ("openat", "ROOT/x/y"), ("fsync", "ROOT/x/y"), ("close", "ROOT/x/y"),
        ("openat", tmp), ("pwrite64", tmp), ("fsync", tmp), ("close", tmp), ("rename", tmp, rec),
        ("openat", loc), ("fsync", loc), ("close", loc),
        ("openat", f"{loc}/A.dat"), ("newfstatat", f"{loc}/A.dat"),
        ("openat", f"{loc}/B.dat"), ("newfstatat", f"{loc}/B.dat"),
        ("close", f"{loc}/A.dat"), ("close", f"{loc}/B.dat"),
    ], composed
    assert c == composed


# -- many locations together (fsio.create_locations, StorageEngine.open_many) --------------------

BATCH = [f"ROOT/{ip}/{d}/T" for ip in ("p", "q") for d in ("d1", "d2", "d3")]


def traced_batch(kind: str, root: pathlib.Path, traced: str = _TRACED) -> list[tuple[str, ...]]:
    """The calls ``create_locations`` makes for six new locations under two parents, as
    ``traced_calls`` gives them (the C one's waits overlap on threads: ``strace -f``)."""
    script = ("import sys, os\nfrom disd.storage import fsio\nfrom disd.storage.fsio import OsFileSystem\n"
              "class Composed(OsFileSystem): pass\n"
              "fs = fsio.OS if sys.argv[1] == 'c' else Composed()\n"
              "assert (fs.create_locations is not None) == (sys.argv[1] == 'c')\n"
              "paths = [p.replace('ROOT', sys.argv[2]) for p in sys.argv[3:]]\n"
              "out = fsio.create_locations(fs, [(p, 'table.size.tmp', 'table.size', b'rec\\n', ['A.dat', 'B.dat'], k % 2 == 0)"
              " for k, p in enumerate(paths)])\n"
              "assert all(isinstance(o, list) for o in out), out\n"
              "[os.close(fd) for o in out for fd, _ in o if fd >= 0]\n")
    root.mkdir()
    trace = root.parent / f"{root.name}.strace"
    r = subprocess.run(["strace", "-f", "-y", "-e", f"trace={traced}", "-o", str(trace), sys.executable, "-c", script,
                        kind, str(root), *BATCH], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    calls = []
    for line in trace.read_text().splitlines():
        m = _CALL_OR_UNFINISHED.match(line)
        if m is None or str(root) not in line:
            continue
        paths = [a or b for a, b in re.findall(r'"([^"]*)"|<([^>]*)>', m.group(2))]
        calls.append((m.group(1), *[p.replace(str(root), "ROOT") for p in paths if str(root) in p]))
    return calls


#: a call, whole or (on a thread, while another's call runs) "unfinished"
_CALL_OR_UNFINISHED = re.compile(r"^\d+\s+(\w+)\((.*?)(?:\)\s+=\s+-?\d+| <unfinished \.\.\.>)")


def test_many_locations_are_made_with_the_composed_calls_each_in_its_order(tmp_path):
    """``create_locations`` in C makes the calls the composition makes (each step for every
    location before the next; some steps' waits on threads, so the order within a step is
    free) and keeps each location's own order: its directories and their parents' fsyncs, its
    record written, fsynced, renamed and its directory fsynced, then its column files.  Each
    directory that gained entries is fsynced once."""
    assert shutil.which("strace"), "strace is needed (apt-get install strace; .ci/run installs it)"
    c = traced_batch("c", tmp_path / "c")
    composed = traced_batch("composed", tmp_path / "composed")
    significant = {"mkdir", "fsync", "rename", "pwrite64"}
    assert sorted(x for x in c if x[0] in significant) == sorted(x for x in composed if x[0] in significant)
    for calls in (c, composed):
        at = {x: i for i, x in reversed(list(enumerate(calls)))}  # each call's first place
        synced = [x[1] for x in calls if x[0] == "fsync" and not x[1].endswith(".tmp")]
        assert len(synced) == len(set(synced)), synced
        assert synced.count("ROOT") == 1 and synced.count("ROOT/p") == 1  # once for all their children
        for loc in BATCH:
            parent = os.path.dirname(loc)
            tmp = f"{loc}/table.size.tmp"
            steps = [("mkdir", loc), ("fsync", parent), ("pwrite64", tmp), ("fsync", tmp),
                     ("rename", tmp, f"{loc}/table.size"), ("fsync", loc), ("openat", f"{loc}/A.dat")]
            assert [at[s] for s in steps] == sorted(at[s] for s in steps), (loc, [at[s] for s in steps])
            grand = os.path.dirname(parent)  # it gained the parent's entry: fsynced after, before the record
            assert at[("mkdir", parent)] < at[("fsync", grand)] < at[("pwrite64", tmp)]


def test_many_locations_records_all_go_to_the_disk_before_the_first_is_fsynced(tmp_path):
    """In C, every first record of the batch has its writeback started (``sync_file_range``,
    no wait) before any record is fsynced: a journaling file system allocates a file's blocks
    as its writeback starts, so the first fsync's journal commit covers every record and the
    others find theirs committed, instead of a commit per thread's turn (docs/storage-format.md,
    "A new location").  Each record is still fsynced itself, before its rename."""
    assert shutil.which("strace"), "strace is needed (apt-get install strace; .ci/run installs it)"
    calls = traced_batch("c", tmp_path / "c", _TRACED + ",sync_file_range")
    tmps = [f"{loc}/table.size.tmp" for loc in BATCH]
    started = [i for i, x in enumerate(calls) if x[0] == "sync_file_range"]
    assert sorted(calls[i][1] for i in started) == sorted(tmps), calls
    first_fsync = min(i for i, x in enumerate(calls) if x[0] == "fsync" and x[1].endswith(".tmp"))
    assert max(started) < first_fsync
    assert sorted(x[1] for x in calls if x[0] == "fsync" and x[1].endswith(".tmp")) == sorted(tmps)


@pytest.mark.parametrize("fs", [fsio.OS, Composed()], ids=["c", "composed"])
def test_many_locations_fail_alone(tmp_path, fs):
    """A location that cannot be made (here: a file where its directory goes) fails with the
    call and path named; the others of the batch are made; one that exists is left to the
    caller; descriptors not kept are closed."""
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "blocked").write_text("a file")
    (tmp_path / "p" / "there" / "T").mkdir(parents=True)
    before = open_fds()
    paths = [str(tmp_path / "p" / "ok1" / "T"), str(tmp_path / "p" / "blocked" / "T"),
             str(tmp_path / "p" / "there" / "T"), str(tmp_path / "p" / "ok2" / "T")]
    out = fsio.create_locations(MeteredFileSystem(fs), [(p, TEMP_NAME, FILE_NAME, RECORD, NAMES, k == 0)
                                                        for k, p in enumerate(paths)])
    assert isinstance(out[1], NotADirectoryError) and "blocked" in str(out[1].filename)
    assert out[2] is None
    assert [fd >= 0 for fd, _ in out[0]] == [True] * len(NAMES)
    assert [fd for fd, _ in out[3]] == [-1] * len(NAMES)  # closed again: not kept
    for fd, _ in out[0]:
        os.close(fd)
    assert open_fds() == before
    for p in (paths[0], paths[3]):
        assert (pathlib.Path(p) / FILE_NAME).read_bytes() == RECORD and sorted(os.listdir(p)) == sorted(NAMES + [FILE_NAME])
    assert os.path.isfile(tmp_path / "p" / "blocked")
