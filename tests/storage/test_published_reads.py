"""``Location.read_range``: the one way published bytes leave a location (TableData's three read
calls and the block endpoint use it).  Never past the published size, whatever the file holds
beyond it; right while rows come in and are flushed, and while the handle factory closes
descriptors under the readers to stay within ``max_open_files``."""

from __future__ import annotations

import os
import random
import threading
import types

import numpy as np
import pytest

from disd.binlog import LocationKey
from disd.storage import LocationError, StorageConfig, StorageEngine
from support import Feeder, trade_rows

from .util import SCHEMAS

KEYS = [LocationKey("Market", "Trade", f"ip{i}", "2026-11-22") for i in range(3)]


def engine_at(tmp_path, **storage) -> tuple[StorageEngine, Feeder]:
    eng = StorageEngine(str(tmp_path / "db"), SCHEMAS, StorageConfig(**storage))
    return eng, Feeder(types.SimpleNamespace(engine=eng, schemas=eng.schemas))


def sizes_of(data: bytes) -> list[int]:
    return np.frombuffer(data, dtype="<i4").tolist()


def test_a_range_is_cut_at_the_published_size_whatever_the_file_holds_past_it(tmp_path):
    eng, feed = engine_at(tmp_path)
    try:
        feed.append(KEYS[0], trade_rows(0, 1000))
        loc = eng.location(KEYS[0])
        published = loc.column_files()["Size.dat"]
        assert published == 4000
        # 20,000 rows more, not published: their full blocks are in the file already
        feed.append(KEYS[0], trade_rows(1000, 20_000), publish=False)
        assert os.path.getsize(loc.path / "Size.dat") > published
        assert sizes_of(loc.read_range("Size.dat", 0, 1 << 30)) == list(range(1000))
        assert sizes_of(loc.read_range("Size.dat", 400, 800)) == list(range(100, 200))
        assert loc.read_range("Size.dat", published, published + 100) == b""
        assert loc.read_range("Size.dat", 10, 10) == b""
        loc.flush()
        assert sizes_of(loc.read_range("Size.dat", published, 1 << 30)) == list(range(1000, 21_000))
    finally:
        eng.close()


def test_what_a_range_cannot_be_is_refused_by_name(tmp_path):
    eng, feed = engine_at(tmp_path)
    try:
        feed.append(KEYS[0], trade_rows(0, 10))
        loc = eng.location(KEYS[0])
        with pytest.raises(KeyError, match="no column file 'Nope.dat'"):
            loc.read_range("Nope.dat", 0, 1)
        with pytest.raises(ValueError, match="start must not be negative"):
            loc.read_range("Size.dat", -1, 4)
        loc.close()
        with pytest.raises(LocationError, match=f"location {KEYS[0]} is closed"):
            loc.read_range("Size.dat", 0, 4)
    finally:
        eng.close()


def test_ranges_read_right_while_rows_come_in_and_descriptors_cycle(tmp_path):
    """Three locations (15 column files) under a limit of 4 descriptors: every read reopens a
    file whose descriptor cleanup closed.  A writer appends and publishes (half its appends
    published later, so the files hold unpublished blocks); readers check every range of their
    snapshot against the rows: row i has Size i and Price i/4."""
    eng, feed = engine_at(tmp_path, max_open_files=4)
    batches, per_batch = 12, 7_000
    done = threading.Event()
    problems: list[str] = []
    checked = [0, 0]

    def write() -> None:
        try:
            for b in range(batches):
                for key in KEYS:
                    feed.append(key, trade_rows(b * per_batch, per_batch), publish=b % 2 == 0)
                    if b % 2:
                        eng.location(key).flush()
        except Exception as e:  # noqa: BLE001 - reported below
            problems.append(f"writer: {e!r}")
        finally:
            done.set()

    def read(me: int) -> None:
        rnd = random.Random(me)
        try:
            while not done.is_set() or checked[me] < 30:
                for key in KEYS:
                    loc = eng.location(key, create=False)
                    rows, sizes = loc.snapshot()
                    got = sizes_of(loc.read_range("Size.dat", 0, sizes["Size.dat"]))
                    if got != list(range(rows)):
                        problems.append(f"{key}: Size.dat at {rows} rows read {len(got)} values, not 0..{rows - 1}")
                        return
                    a = rnd.randrange(rows + 1)
                    b = rnd.randrange(a, rows + 1)
                    price = np.frombuffer(loc.read_range("Price.dat", a * 8, b * 8), "<f8")
                    if not np.array_equal(price, np.arange(a, b) * 0.25):
                        problems.append(f"{key}: Price.dat rows [{a}, {b}) read wrong")
                        return
                    # past the snapshot: at most what is published by now, and the same rows
                    more = sizes_of(loc.read_range("Size.dat", sizes["Size.dat"], 1 << 30))
                    if more != list(range(rows, rows + len(more))):
                        problems.append(f"{key}: Size.dat past row {rows} read wrong")
                        return
                    checked[me] += 1
        except Exception as e:  # noqa: BLE001 - reported below
            problems.append(f"reader {me}: {e!r}")

    for key in KEYS:
        feed.append(key, trade_rows(0, 0))
    threads = [threading.Thread(target=write)] + [threading.Thread(target=read, args=(i,)) for i in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads)
        assert problems == []
        assert min(checked) >= 30
        assert eng.file_handles.reclaimed_total > 0  # the descriptors did cycle under the reads
        # the limit, and one more for each reader opening a file while every held one is busy
        # (locked by the other reader or pinned by the writer): TrackedFileHandleFactory's rule
        assert eng.file_handles.peak_open <= 4 + 2
        for key in KEYS:
            loc = eng.location(key, create=False)
            assert sizes_of(loc.read_range("Size.dat", 0, 1 << 30)) == list(range(batches * per_batch))
    finally:
        eng.close()
