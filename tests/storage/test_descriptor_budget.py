"""Column-file descriptors when new locations arrive in batches from several streams at once (a
burst's start: every tailer's ``Multiplex`` request opens its new locations with
``StorageEngine.open_many``), and when making one of them fails half-way.

The handle factory's limit (``storage.max_open_files``) is what keeps a DIS within its process's
descriptor limit; a batch that cannot open a file must close only what it opened.  Break either
and a column file's descriptor is closed under its handle, its number goes to another file, and
readers are served that file's bytes (docs/reliability.md, "Readers get the bytes of the file
they read")."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import threading

from disd.binlog import LocationKey
from disd.storage import StorageConfig, StorageEngine
from disd.storage import engine as engine_module
from support import TESTS, subprocess_env

from .util import SCHEMAS

CHILD = pathlib.Path(__file__).with_name("descriptors_child.py")


def column_fds(db_root: pathlib.Path) -> int:
    """Descriptors this process holds on files under ``db_root``'s locations."""
    held = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            held += os.readlink(f"/proc/self/fd/{fd}").startswith(str(db_root / "Intraday"))
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return held


def test_batches_of_new_locations_deciding_together_stay_within_max_open_files(tmp_path, monkeypatch):
    """Four batches reach the building of their records at the same moment, each then deciding
    which of its new locations keep their descriptors: together they keep no more than the
    factory has room for, so its peak stays within ``max_open_files``."""
    gate = threading.Barrier(4, timeout=10)
    met = threading.local()
    original = engine_module.new_record

    def new_record(schema):  # noqa: ANN001, ANN202
        if not getattr(met, "done", False):
            met.done = True
            gate.wait()
        return original(schema)

    monkeypatch.setattr(engine_module, "new_record", new_record)
    eng = StorageEngine(str(tmp_path / "db"), SCHEMAS, StorageConfig(max_open_files=200))
    keys = [[LocationKey("Market", "Trade", f"t{t}ip{j}", "2026-11-22") for j in range(60)] for t in range(4)]
    try:
        threads = [threading.Thread(target=eng.open_many, args=([(k, None) for k in mine],)) for mine in keys]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not gate.broken
        assert not any(eng.location(k).in_error for mine in keys for k in mine)
        assert eng.file_handles.peak_open <= 200
        assert column_fds(tmp_path / "db") == eng.file_handles.open_count <= 200
    finally:
        eng.close()


FAILING_HALF_WAY = r"""
import json, os, resource, sys
from disd.storage import fsio
root = sys.argv[1]
# Every descriptor number the limit allows taken, then exactly five given back: the first
# location takes three, the second opens two of its three and fails (EMFILE), the third takes
# the two the second gave back.
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
taken = []
while True:
    try:
        taken.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        break
for fd in taken[-5:]:
    os.close(fd)
items = [(os.path.join(root, name), "table.size.tmp", "table.size", b"rec\n", files, True)
         for name, files in (("a", ["A1", "A2", "A3"]), ("b", ["B1", "B2", "B3"]), ("c", ["C1", "C2"]))]
out = fsio.create_locations(fsio.OS, items, 1)
for fd in taken[:-5]:
    os.close(fd)
def state(fd, ino):
    try:
        return "own file" if os.fstat(fd).st_ino == ino else "another file"
    except OSError as e:
        return os.strerror(e.errno)
print(json.dumps([repr(o) if isinstance(o, OSError) else [state(fd, ino) for fd, (_, ino) in o] for o in out]))
"""


def test_a_location_that_fails_half_way_closes_only_its_own_descriptors(tmp_path):
    """``create_locations`` (in C): a location whose third column file cannot be opened (no
    descriptor left) closes the two it opened, once.  The next location of the batch is given
    those two numbers; they stay its files' descriptors."""
    r = subprocess.run([sys.executable, "-c", FAILING_HALF_WAY, str(tmp_path)], capture_output=True, text=True,
                       timeout=60, env=subprocess_env(), cwd=TESTS)
    assert r.returncode == 0, r.stderr[-2000:]
    a, b, c = json.loads(r.stdout)
    assert a == ["own file"] * 3
    assert "Too many open files" in b
    assert c == ["own file"] * 2


def test_readers_get_right_bytes_while_batches_of_new_locations_fill_the_descriptor_limit(tmp_path):
    """The whole path under a process descriptor limit a little above ``max_open_files`` (the
    DIS's own margin for what is not a column file): four batches of 300 new locations opened
    at once, their string rows ingested and published through the compiled path, while readers
    check every snapshot through ``Location.read_range``.  No location fails for want of a
    descriptor, and every string column reads back exactly as written."""
    r = subprocess.run([sys.executable, str(CHILD), str(tmp_path / "db"), "1000", "600", "4", "300"],
                       capture_output=True, text=True, timeout=120, env=subprocess_env(), cwd=TESTS)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(next(line for line in r.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert got["errors"] == {}
    assert got["bad"] == [] and got["bad_count"] == 0
    assert got["peak"] <= 600
