"""The last-by state built ahead of its publish (``LastBy.stage``, the engine's stager thread):
from committed rows only, never served before a publish reaches its rows, equal to the
reference at every row count it is served at (built ahead or not, promoted or dropped), its
subscribers' changes complete, and a failure ahead of the publish reported by the publish."""

from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa
import pytest

from disd.schema import TableSchema
from disd.storage import lastby as lastby_mod
from disd.storage.lastby import LastBy, LastByLimitError, last_by
from support import Feeder

from .support_lastby import random_updates
from .test_lastby_state import KEY, _ingest, _server

SCHEMA = TableSchema.from_dict({
    "namespace": "Test", "table": "Stage", "partition_column": "Date",
    "columns": [{"name": "S", "type": "string"}, {"name": "I", "type": "long"}, {"name": "X", "type": "string"}]})


def _rows(rng: np.random.Generator, first: int, n: int, keys: int) -> pa.Table:
    k = rng.integers(0, keys, n)
    return pa.table({"S": pa.array([None if x == 0 else f"k{x}" for x in k], pa.string()),
                     "I": pa.array(np.arange(first, first + n, dtype=np.int64)),
                     "X": pa.array([f"x{first + i}" for i in range(n)], pa.string())})


def _upsert(replica: pa.Table, changes: pa.Table) -> pa.Table:
    return last_by(pa.concat_tables([replica, changes]), ["S"])


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_state_built_ahead_is_served_only_at_a_publish_and_equals_the_reference(seed, native):
    """Random appends (an uncommitted tail sometimes rolled back and replaced), commits, stages
    and catch-ups to any row count between the served state's and the committed one (a state
    built ahead is then promoted, or dropped when it is past the rows asked for); after each
    step the served state is the reference at its rows, never past the rows a catch-up asked
    for, and a subscriber's replica kept from ``changes_since`` equals it."""
    rng = np.random.default_rng(seed)
    lb = LastBy(SCHEMA, ("S",), 1 << 40, native=native)
    lb.subscribers = 1
    final = _rows(rng, 0, 0, 1)  # the committed rows
    tail = final  # rows written past them, not committed
    asked = 0  # the most rows a catch-up asked for
    replica, seen = final, 0
    staged = promoted = dropped = 0
    for _ in range(800):
        op = rng.integers(5)
        committed = len(final)
        if op == 0:  # append rows (pieces as the compiled path hands them over)
            n = int(rng.integers(1, 60))
            more = _rows(rng, committed + len(tail), n, int(rng.integers(2, 80)))
            lb.pending.put(committed + len(tail), more.columns)
            tail = pa.concat_tables([tail, more])
        elif op == 1 and len(tail):  # commit some of the tail
            c = int(rng.integers(1, len(tail) + 1))
            final, tail = pa.concat_tables([final, tail.slice(0, c)]), tail.slice(c)
        elif op == 2 and len(tail):  # roll the tail back (never below the committed rows)
            lb.pending.truncate(committed)
            tail = tail.slice(0, 0)
        elif op == 3:
            before = lb._ahead  # noqa: SLF001 - the test checks that the stage built something
            lb.stage(committed)
            staged += lb._ahead is not before  # noqa: SLF001
        else:  # a publish (or a checkpoint) catches up to some committed row count
            base = lb.snapshot().rows
            rows = committed if rng.random() < 0.6 else int(rng.integers(base, committed + 1))
            ahead = lb._ahead  # noqa: SLF001
            promoted += ahead is not None and ahead[0].rows <= rows
            dropped += ahead is not None and ahead[0].rows > rows
            lb.catch_up(rows, lambda a, b: lb.rows(a, b, lambda: final.slice(a, b - a)))
            asked = max(asked, rows)
            full, changes, seen, at = lb.changes_since(seen)
            replica = changes if full else _upsert(replica, changes)
            assert at == rows
        s = lb.snapshot()
        assert s.rows <= asked
        assert s.table.equals(last_by(final.slice(0, s.rows), ["S"]))
        if s.rows:
            assert replica.sort_by("S").equals(s.table.sort_by("S"))
    assert staged >= 10 and promoted >= 4 and dropped >= 1  # (the walk built ahead, served it, dropped it)


def test_the_key_limit_crossed_ahead_of_the_publish_is_reported_by_the_publish():
    lb = LastBy(SCHEMA, ("S",), 50, native=True)
    rng = np.random.default_rng(7)
    rows = _rows(rng, 0, 500, 200)
    lb.pending.put(0, rows.columns)
    lb.stage(500)  # over the limit: nothing is built, nothing raised here
    assert lb._ahead is None and lb.snapshot().rows == 0  # noqa: SLF001
    with pytest.raises(LastByLimitError, match="lastby_max_keys=50"):
        lb.catch_up(500, lambda a, b: lb.rows(a, b, lambda: rows.slice(a, b - a)))
    assert lb.snapshot().rows == 0


def test_the_stager_thread_builds_the_state_from_committed_rows_and_a_publish_serves_it(tmp_path, monkeypatch):
    """In a DIS: committed rows past ``STAGE_ROWS`` are absorbed by the stager thread before the
    publish (the served state does not move), rows of an open transaction are not; the publish
    then serves the state at its rows, equal to the last-by of the rows, none read back."""
    monkeypatch.setattr(lastby_mod, "STAGE_ROWS", 1000)
    srv = _server(tmp_path / "db")
    try:
        feeder = Feeder(srv)
        feeder.append(KEY, random_updates(0, 3000, 100, seed=8), publish=False)
        loc = srv.engine.location(KEY)
        lb = loc.lastby
        _ingest(srv, feeder, random_updates(3000, 500, 100, seed=8), [1] + [0] * 499)  # an open transaction
        deadline = time.monotonic() + 10
        while (lb._ahead is None or lb._ahead[0].rows < 3000) and time.monotonic() < deadline:  # noqa: SLF001
            time.sleep(0.01)
        ahead = lb._ahead  # noqa: SLF001
        assert ahead is not None and ahead[0].rows == 3000  # the committed rows, not the open ones
        assert lb.snapshot().rows == 0 and loc.published_rows == 0  # built, not served
        assert srv.engine.stager.visits >= 1
        loc.flush()
        state = lb.snapshot()
        assert state.rows == loc.published_rows == 3000
        assert state.table.equals(last_by(loc.read_table(), ["Sym"]))
        assert lb.rows_read_back == 0
    finally:
        srv.stop(0.5)


def test_a_stage_racing_an_ingest_between_its_commit_and_its_hand_over_takes_no_rolled_back_rows(tmp_path, monkeypatch):
    """The compiled path commits rows inside its C call and hands their arrays to ``Pending``
    after it, where rolled-back rows of an abandoned transaction may still lie in their place.
    A stage at that moment (here: from another thread, given 0.5 s) must wait for the hand-over;
    the state a publish then serves is the last-by of the rows, none of the rolled-back ones."""
    from disd.config import ImportConfig
    from disd.storage import StorageEngine, ingest
    from disd.storage.ingest import ingest_chunks

    from storage.test_ingest_differential import REGISTRY, Chunk, Log, _frame, _location, _stream
    from support.rows import TRADE

    e = StorageEngine(str(tmp_path / "db"), REGISTRY, compiled=True,
                      import_tables={TRADE.key: ImportConfig(last_by=("Sym",), lastby_max_keys=1000)})
    try:
        loc = _location(e, TRADE, "ip0")
        log = Log(TRADE, "ip0")

        def frame(syms: list[str], flags: list[int]) -> bytes:
            n = len(syms)
            return _frame(TRADE, [pa.array(np.arange(n), pa.timestamp("ns", tz="UTC")), pa.array(syms),
                                  pa.array(np.arange(n, dtype=np.float64)), pa.array(np.arange(n, dtype=np.int32))], flags)

        # two rows committed, then a transaction left open (its rows held in Pending, uncommitted)
        log.data += frame(["a", "b", "stale1", "stale2"], [3, 3, 1, 0])
        first = len(log.data)
        # a new transaction abandons the open one: its rows take their place and commit
        log.data += frame(["c", "d"], [1, 2])
        real, raced = ingest._feed_lastby, []  # noqa: SLF001 - the race is at its call

        def feed(where) -> None:  # noqa: ANN001
            if where.committed_rows == 4 and not raced:
                t = threading.Thread(target=where.stage_lastby)
                t.start()
                t.join(0.5)
                raced.append(t)
            real(where)

        monkeypatch.setattr(ingest, "_feed_lastby", feed)
        stream = _stream(loc, TRADE)
        for a, b in ((0, first), (first, len(log.data))):
            (r,) = ingest_chunks([(stream, Chunk(log.name, a, log.data[a:b], False), None)])
            assert r.refused is None
        raced[0].join()
        loc.flush()
        state = loc.lastby.snapshot()
        assert state.rows == 4
        assert state.table.column("Sym").to_pylist() == ["a", "b", "c", "d"]
        assert state.table.equals(last_by(loc.read_table(), ["Sym"]))
    finally:
        e.close()
