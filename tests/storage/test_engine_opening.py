"""Opening locations: a location held up by its disk holds up nobody else.

Creating a location writes its directory, ``table.size`` and column files with fsyncs; on a busy
disk each fsync can take tens of milliseconds.  Done under the engine's lock, a burst over 200 new
locations waited for them one after another, and so did every listing and clock.  These tests
hold one location's creation at its first directory fsync and check what may go on meanwhile.
"""

from __future__ import annotations

import os
import threading

import pytest

from disd.binlog import LocationKey
from disd.storage import StorageEngine
from disd.storage.fsio import OsFileSystem

from .util import SCHEMAS

SLOW = LocationKey("Market", "Trade", "slow", "2026-11-22")
FAST = LocationKey("Market", "Trade", "fast", "2026-11-22")


class HeldDisk(OsFileSystem):
    """Blocks the fsync of any directory under a path containing ``hold`` until released."""

    def __init__(self, hold: str) -> None:
        self.hold = hold
        self.reached = threading.Event()
        self.release = threading.Event()

    def fsync_dir(self, path: str) -> None:
        if self.hold in path:
            self.reached.set()
            assert self.release.wait(30), "never released"
        super().fsync_dir(path)


@pytest.fixture
def held(tmp_path):
    disk = HeldDisk("/slow")
    eng = StorageEngine(str(tmp_path / "db"), SCHEMAS, fs=disk)
    # the table's directory exists first, so that only the slow location's own fsyncs are held
    eng.location(LocationKey("Market", "Trade", "first", "2026-11-22"))
    yield eng, disk
    disk.release.set()
    eng.close()


def _another_opens_meanwhile(eng: StorageEngine, waiting: str) -> None:
    """While ``waiting`` is held at its fsync: another location is created, and listing answers."""
    done = threading.Event()

    def other() -> None:
        eng.location(FAST)
        eng.locations()
        done.set()

    threading.Thread(target=other, daemon=True).start()
    assert done.wait(10), f"opening another location waited for {waiting} held at its fsync"


def test_other_locations_open_and_list_while_one_waits_for_its_disk(held):
    eng, disk = held
    opened: list = []
    t = threading.Thread(target=lambda: opened.append(eng.location(SLOW)), daemon=True)
    t.start()
    assert disk.reached.wait(10)
    _another_opens_meanwhile(eng, "the one")
    assert not opened and t.is_alive()
    disk.release.set()
    t.join(10)
    assert opened and opened[0].key == SLOW and not opened[0].in_error


def test_threads_asking_for_the_same_new_location_get_one_location(held):
    eng, disk = held
    got: list = []
    threads = [threading.Thread(target=lambda: got.append(eng.location(SLOW)), daemon=True) for _ in range(8)]
    for th in threads:
        th.start()
    assert disk.reached.wait(10)
    assert not got  # every caller waits for the one creating it
    disk.release.set()
    for th in threads:
        th.join(10)
    assert len(got) == 8 and all(loc is got[0] for loc in got)
    assert [loc.key for loc in eng.locations()].count(SLOW) == 1


def test_a_failed_open_lets_the_next_caller_try_again(tmp_path):
    eng = StorageEngine(str(tmp_path / "db"), SCHEMAS)
    try:
        with pytest.raises(LookupError):
            eng.location(SLOW, create=False)
        assert eng.location(SLOW).key == SLOW  # not left marked as being opened
    finally:
        eng.close()


def test_open_many_makes_new_locations_together_and_holds_up_nobody_else(held):
    """``open_many`` (a request's opens, ``disd.server.ingestmux``) makes its new locations in one
    operation, each step for all of them (``fsio.create_locations``): while it waits for its
    disk, another location is opened and the engine lists; at the end every one is open."""
    eng, disk = held
    others = [LocationKey("Market", "Trade", f"fast{i}", "2026-11-22") for i in range(5)]
    t = threading.Thread(target=eng.open_many, args=([(SLOW, None)] + [(k, None) for k in others],))
    t.start()
    assert disk.reached.wait(10)
    _another_opens_meanwhile(eng, "the batch")
    assert t.is_alive()
    disk.release.set()
    t.join(10)
    opened = {loc.key for loc in eng.open_locations()}
    assert not t.is_alive() and {SLOW, FAST, *others} <= opened
    assert eng.location(SLOW).schema_version == eng.schemas.get("Market", "Trade").version
    assert not any(eng.location(k).in_error for k in [SLOW, *others])


def test_open_many_leaves_failures_to_the_caller(tmp_path):
    eng = StorageEngine(str(tmp_path / "db"), SCHEMAS)
    try:
        unknown = LocationKey("Market", "Nope", "x", "2026-11-22")
        eng.open_many([(unknown, None), (SLOW, None), (FAST, None)])  # no error raised here
        assert {SLOW, FAST} <= {loc.key for loc in eng.open_locations()}
        with pytest.raises(LookupError, match="unknown table Market.Nope"):
            eng.location(unknown)
    finally:
        eng.close()
    eng.open_many([(LocationKey("Market", "Trade", "late", "2026-11-22"), None)] * 2)  # closed: a no-op
    assert not (tmp_path / "db" / "Intraday" / "Market" / "Trade" / "late").exists()


def test_a_location_whose_creation_a_power_cut_interrupted_is_made_by_its_first_stream(tmp_path):
    """A power cut while a new location is being made may leave its directory without a
    ``table.size`` (a real power cut on ext4 did: tests/realfaults).  That directory holds no
    rows and no version yet: a DIS starting on it must not make the location in the table's
    newest version, or the location's own log, of the version it was made for (written before
    a schema change the DIS was restarted with), is refused for ever.  It is left for its first
    stream, which makes it in its log's version; one holding data without a record is still
    opened, in error, at start."""
    from disd.schema import SchemaRegistry, TableSchema
    from disd.storage.checkpoint import TEMP_NAME
    from disd.storage.engine import location_path

    v2 = TableSchema.from_dict({"namespace": "Market", "table": "Trade", "version": 2,
                                "columns": [*SCHEMAS.get("Market", "Trade").canonical()["columns"],
                                            {"name": "Venue", "type": "string"}]})
    db = tmp_path / "db"
    eng = StorageEngine(str(db), SCHEMAS)
    eng.location(FAST)  # the table exists in version 1
    eng.close()
    path = location_path(str(db), SLOW)
    os.makedirs(path)
    with open(os.path.join(path, TEMP_NAME), "wb") as f:
        f.write(b"DISCK")  # a torn temp record: the rename never happened
    eng = StorageEngine(str(db), SchemaRegistry([v2, SCHEMAS.get("Market", "Quote")]))
    try:
        assert SLOW not in {loc.key for loc in eng.locations()}
        loc = eng.location(SLOW, version=1)  # the tailer's stream for a version-1 log
        assert loc.schema_version == 1 and not loc.in_error
    finally:
        eng.close()
    damaged = LocationKey("Market", "Trade", "damaged", "2026-11-22")
    os.makedirs(location_path(str(db), damaged))
    with open(os.path.join(location_path(str(db), damaged), "Size.dat"), "wb") as f:
        f.write(b"\1\0\0\0")
    eng = StorageEngine(str(db), SchemaRegistry([v2, SCHEMAS.get("Market", "Quote")]))
    try:
        bad = {loc.key: loc for loc in eng.locations()}[damaged]
        assert bad.in_error and "table.size is missing" in bad.error
    finally:
        eng.close()
