"""The storage engine's clocks over real files: the flusher visits only locations with rows to
flush and still publishes them within the interval; the checkpointer visits every location,
idle or not, once per interval; the flush age says how long a location's rows have waited."""

from __future__ import annotations

import threading
import time

from disd.binlog import LocationKey
from disd.storage import ImportConfig, StorageEngine
from support import trade_rows, wait_for, write_log

from .util import KEY, LOG, SCHEMAS, TRADE, ingest_file

IDLE = 120


def _engine(tmp_path, flush_ms: int, checkpoint_ms: int = 60_000) -> StorageEngine:
    return StorageEngine(str(tmp_path / "db"), SCHEMAS,
                         import_default=ImportConfig(flush_interval_ms=flush_ms, checkpoint_interval_ms=checkpoint_ms))


def _idle_locations(eng: StorageEngine, n: int) -> list:
    return [eng.location(LocationKey("Market", "Trade", f"idle{i}", "2026-11-22")) for i in range(n)]


def test_the_flusher_visits_only_locations_with_rows_and_publishes_them_within_the_interval(tmp_path):
    eng = _engine(tmp_path, flush_ms=20)
    try:
        idle = _idle_locations(eng, IDLE)
        loc = eng.location(KEY)
        published: dict[int, float] = {}
        got = threading.Condition()

        def on_publish(location, rows):
            if location is loc:
                with got:
                    published.setdefault(rows, time.monotonic())
                    got.notify_all()

        eng.subscribe(on_publish)
        eng.start()
        delays = []
        rows = 0
        t_end = time.monotonic() + 1.0
        while time.monotonic() < t_end:
            write_log(tmp_path / LOG, TRADE, trade_rows(rows, 10), [3] * 10)
            start = loc.resume_point.offset if rows else 0
            t0 = time.monotonic()
            ingest_file(loc, tmp_path / LOG, start=start)
            rows += 10
            with got:
                assert got.wait_for(lambda: rows in published, 5), f"{rows} rows never published"
            delays.append(published[rows] - t0)
        visits = eng.flusher.visits
        # A clock visiting every location would have made (IDLE + 1) visits per 20 ms: over 6,000.
        assert visits <= len(delays) + 5, (visits, len(delays))
        assert all(loc.last_flush_time is None for loc in idle)
        assert loc.published_rows == rows and loc.read_table().num_rows == rows
        # Rows wait for the next tick of the 20 ms grid: the median well under a second even on
        # a loaded machine, where a clock stuck behind idle locations would be far slower.
        delays.sort()
        assert delays[len(delays) // 2] < 0.2, delays
    finally:
        eng.close()


def test_the_checkpointer_visits_every_location_each_interval_even_idle(tmp_path):
    eng = _engine(tmp_path, flush_ms=20, checkpoint_ms=200)
    try:
        idle = _idle_locations(eng, 40)
        eng.start()
        t0 = time.time()
        wait_for(lambda: all(loc.last_checkpoint_time is not None and loc.last_checkpoint_time > t0 for loc in idle),
                 10, what="every idle location checkpointed")
        t1 = time.time()
        wait_for(lambda: all(loc.last_checkpoint_time > t1 for loc in idle), 10, what="and again one interval later")
        ages = [eng.flush_age(loc) for loc in idle]
        assert all(a is not None and a < 5 for a in ages), ages  # nothing to flush: as fresh as the flusher
    finally:
        eng.close()


def test_the_flush_age_counts_from_rows_waiting_for_their_flush(tmp_path):
    eng = _engine(tmp_path, flush_ms=60_000)
    try:
        loc = eng.location(KEY)
        eng.start()
        # ticks lie on a grid of the interval (multiples of 60 s of the monotonic clock): keep the
        # rows' 0.3 s wait clear of one, which would flush them as it should
        to_tick = 60.0 - time.monotonic() % 60.0
        if to_tick < 2.0:
            time.sleep(to_tick + 0.1)
        assert eng.flush_age(loc) < 5
        write_log(tmp_path / LOG, TRADE, trade_rows(0, 100), [3] * 100)
        ingest_file(loc, tmp_path / LOG)
        time.sleep(0.3)
        assert loc.published_rows == 0
        assert eng.flush_age(loc) >= 0.3
        assert eng.flusher.pending() == 1
        loc.flush()
        assert loc.published_rows == 100 and loc.dirty_since is None
        assert eng.flush_age(loc) < 5
    finally:
        eng.close()


def test_the_flusher_passes_over_a_location_already_flushed_since_it_was_marked(tmp_path):
    """A caught-up source's flush (``publish_soon``) publishes at once; the tick the location
    was marked for then has nothing to do and does not flush it again."""
    eng = _engine(tmp_path, flush_ms=20)
    try:
        loc = eng.location(KEY)
        eng.start()
        write_log(tmp_path / LOG, TRADE, trade_rows(0, 10), [3] * 10)
        ingest_file(loc, tmp_path / LOG)
        assert loc.publish_soon() and loc.published_rows == 10
        before = eng.flusher.visits
        time.sleep(0.2)  # ten ticks of its interval
        assert eng.flusher.visits == before
        write_log(tmp_path / LOG, TRADE, trade_rows(10, 5), [3] * 5)
        ingest_file(loc, tmp_path / LOG, start=loc.resume_point.offset)
        deadline = time.monotonic() + 5
        while loc.published_rows != 15 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert loc.published_rows == 15 and eng.flusher.visits == before + 1
    finally:
        eng.close()


def test_a_caught_up_flush_is_held_back_at_most_a_quarter_of_the_locations_flush_interval(tmp_path):
    """A caught-up source's rows wait for no flush tick while the last flush is more than a
    quarter of the location's ``flush_interval_ms`` old (at most 25 ms): with 40 ms flushes,
    a caught-up chunk 12 ms after the last flush publishes at once, one right after it waits."""
    eng = _engine(tmp_path, flush_ms=40)  # a quarter: 10 ms
    try:
        loc = eng.location(KEY)
        write_log(tmp_path / LOG, TRADE, trade_rows(0, 10), [3] * 10)
        ingest_file(loc, tmp_path / LOG)
        assert loc.publish_soon() and loc.published_rows == 10
        write_log(tmp_path / LOG, TRADE, trade_rows(10, 5), [3] * 5)
        ingest_file(loc, tmp_path / LOG, start=loc.resume_point.offset)
        early = time.time() - loc.last_flush_time < 0.008
        if early:  # (a loaded machine may have let the quarter pass already)
            assert not loc.publish_soon() and loc.published_rows == 10
        time.sleep(0.012)
        assert loc.publish_soon() and loc.published_rows == 15
    finally:
        eng.close()


def test_a_ticks_locations_are_flushed_together(tmp_path, monkeypatch):
    """The flush clock flushes every location due at a tick together: their writes in one call of
    the file system (``ingestcore.write_out``), each published and its subscribers told."""
    from disd.storage import ingestcore

    calls: list[int] = []
    real = ingestcore.write_out
    monkeypatch.setattr(ingestcore, "write_out", lambda jobs: calls.append(len(jobs)) or real(jobs))
    eng = _engine(tmp_path, flush_ms=200)
    try:
        locs = [eng.location(LocationKey("Market", "Trade", f"ip{i}", "2026-11-22")) for i in range(10)]
        seen: list = []
        eng.subscribe(lambda loc, rows: seen.append((loc.key, rows)))
        for i, loc in enumerate(locs):
            p = tmp_path / f"Market.Trade.System.ip{i}.2026-11-22.bin.2026-11-22.090000.000+0000"
            write_log(p, TRADE, trade_rows(0, 3), [3] * 3)
            ingest_file(loc, p)
        assert not calls  # nothing written yet: a 3-row chunk fills no block
        eng.start()
        wait_for(lambda: all(loc.published_rows == 3 for loc in locs), 5, what="every location published")
        assert calls == [10], calls  # one call for the ten
        assert {k for k, rows in seen if rows == 3} == {loc.key for loc in locs}
    finally:
        eng.close()


def test_locations_opened_together_have_their_first_checkpoints_spread_over_half_an_interval():
    """A burst of new locations must not all be due for their checkpoint at the same instant
    (thousands of fsyncs at once, every interval): each one's first turn falls between half an
    interval and one interval after it opened, fixed by its key."""
    from disd.storage.clock import CheckpointClock

    class Loc:
        def __init__(self, i: int) -> None:
            self.key = LocationKey("Market", "Trade", f"feed{i}", "2026-11-22")

    clock = CheckpointClock(lambda loc: None, lambda loc: 100.0, threading.Event())
    t0 = time.monotonic()
    for i in range(1000):
        clock.add(Loc(i))
    t1 = time.monotonic()
    offsets = sorted(due - t0 for due, _, _ in clock._heap)  # noqa: SLF001 - the clock's due times
    assert offsets[0] >= 50 and offsets[-1] <= 100 + (t1 - t0)
    deciles = [offsets[k * 100] for k in range(10)]
    assert all(b - a > 2 for a, b in zip(deciles, deciles[1:])), deciles  # spread, not bunched


def test_a_ticks_locations_are_flushed_in_bounded_groups_so_a_held_lock_stalls_only_its_own(tmp_path, monkeypatch):
    """A tick flushes its locations in groups of at most ``writeout.FLUSH_GROUP``, each group's
    locks released once it is published: while another thread holds one location's lock (a slow
    writer), the groups without it are readable with their rows, and that location's rows are
    published once the lock is let go."""
    import queue

    from disd.storage import writeout

    monkeypatch.setattr(writeout, "FLUSH_GROUP", 4)
    eng = _engine(tmp_path, flush_ms=50)
    try:
        locs = [eng.location(LocationKey("Market", "Trade", f"ip{i}", "2026-11-22")) for i in range(10)]
        for i, loc in enumerate(locs):
            p = tmp_path / f"Market.Trade.System.ip{i}.2026-11-22.bin.2026-11-22.090000.000+0000"
            write_log(p, TRADE, trade_rows(0, 3), [3] * 3)
            ingest_file(loc, p)
        by_id = sorted(locs, key=id)  # the order a tick takes locks in: the held one's group is the last
        slow, release = threading.Event(), threading.Event()

        def slow_writer() -> None:
            with by_id[-1].lock:
                slow.set()
                release.wait(30)

        threading.Thread(target=slow_writer, daemon=True).start()
        assert slow.wait(5)
        eng.start()
        seen: queue.Queue = queue.Queue()

        def read_first_groups() -> None:
            wait_for(lambda: all(loc.published_rows == 3 for loc in by_id[:8]), 5, what="the first groups flushed")
            seen.put([loc.snapshot()[0] for loc in by_id[:8]])  # under each one's lock, as readers read

        threading.Thread(target=read_first_groups, daemon=True).start()
        try:
            assert seen.get(timeout=10) == [3] * 8
        except queue.Empty:
            raise AssertionError("the groups without the held location were not readable while it was held")
        finally:
            release.set()
        wait_for(lambda: all(loc.snapshot()[0] == 3 for loc in locs), 5, what="every location published")
    finally:
        release.set()
        eng.close()
