"""A partition's new location (its first message of a new date) is claimed durably before any
other location's offset moves past its rows.

The resume point after a restart is the smallest next offset among the partition's locations
whose checkpoint names the partition.  A new location's first checkpoint used to come up to a
checkpoint interval after its first rows, while the batch's other locations moved their offsets
past those rows at once: a crash in between lost them (the location's record, the creation's
empty one, did not count).  The test leaves the database in that state, as a SIGKILL would (only
checkpoints are on disk), reopens it, and reads what a restarted DIS would resume from, with the
storage engine and the consumer's own routing over real files.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from disd.kafka.config import parse_kafka_config
from disd.kafka.consumer import PartitionState, SourceConsumer
from disd.kafka.fetcher import OFFSET_COLUMN
from disd.schema import SchemaRegistry
from disd.storage import StorageEngine
from support import SCHEMAS, trade_rows

REG = SchemaRegistry.load_dir(SCHEMAS)
DAY_NS = 86_400_000_000_000
DAY1 = 1_795_392_000_000_000_000  # 2026-11-23T00:00:00Z


def consumer(db) -> tuple[StorageEngine, SourceConsumer, PartitionState]:
    cfg = parse_kafka_config({"bootstrap_servers": "b:1", "sources": {"trades": {
        "topic": "trades", "table": "Market.Trade", "column_partition": {"column": "Timestamp"}}}},
        "dis.yaml", REG)
    engine = StorageEngine(str(db), REG)  # its clocks are not started: nothing is checkpointed unasked
    c = SourceConsumer(cfg, cfg.sources[0], engine)
    st = PartitionState(c.src.name, c.src.topic, 0, c.src.schema.key, c.src.internal_partition(0))
    c._find_locations(st)  # noqa: SLF001 - the test drives the consumer's steps one by one
    c.partitions[0] = st
    return engine, c, st


def batch(first: int, n: int, day2_from: int) -> pa.RecordBatch:
    """Messages ``first``..``first+n-1`` of partition 0; those from ``day2_from`` on are of the next day."""
    t = trade_rows(first, n)
    offsets = np.arange(first, first + n, dtype=np.int64)
    ts = DAY1 + offsets * 1000 + np.where(offsets >= day2_from, DAY_NS, 0)
    t = t.set_column(0, "Timestamp", pa.array(ts).cast(pa.timestamp("ns", tz="UTC")))
    return pa.RecordBatch.from_arrays([col.combine_chunks() for col in t.columns] + [pa.array(offsets)],
                                      [*t.column_names, OFFSET_COLUMN])


def test_a_crash_before_the_new_locations_first_checkpoint_loses_none_of_its_rows(tmp_path):
    engine, c, st = consumer(tmp_path / "db")
    c._process(st, batch(0, 10, day2_from=100), 0, 10, 10, 0, [])  # day 1 only  # noqa: SLF001 - the test drives the consumer's steps one by one
    day1 = st.locations["2026-11-23"]
    assert day1.checkpoint()
    c._process(st, batch(10, 10, day2_from=15), 10, 20, 10, 0, [])  # 10..14 day 1, 15..19 day 2: new location  # noqa: SLF001 - the test drives the consumer's steps one by one
    day2 = st.locations["2026-11-24"]
    assert (day1.committed_rows, day2.committed_rows) == (15, 5)
    assert day1.checkpoint()  # the checkpointer reached day 1 (offset 20) and not yet day 2: then the crash

    _, c2, st2 = consumer(tmp_path / "db")  # what a DIS restarted after SIGKILL finds
    rows = {cp: loc.committed_rows for cp, loc in st2.locations.items()}
    assert rows == {"2026-11-23": 15, "2026-11-24": 0}
    resume = c2._resume_offset(st2)  # noqa: SLF001 - the test drives the consumer's steps one by one
    assert resume is not None and resume <= 15, f"resumes at {resume}: messages 15..19 of the new date lost"
    # consumed again from there (as ``_assign`` would set it up): each location takes only what it lacks
    st2.epochs = {cp: loc.epoch for cp, loc in st2.locations.items()}
    st2.next_offset = resume
    c2._process(st2, batch(resume, 20 - resume, day2_from=15), resume, 20, 20 - resume, 0, [])  # noqa: SLF001 - the test drives the consumer's steps one by one
    got = {cp: loc.committed_rows for cp, loc in st2.locations.items()}
    assert got == {"2026-11-23": 15, "2026-11-24": 5}
    day2 = st2.locations["2026-11-24"]
    day2.flush()
    assert sorted(day2.read_table().column("Size").to_pylist()) == list(range(15, 20))
