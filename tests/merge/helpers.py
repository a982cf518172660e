"""Intraday databases with known rows, written through the storage engine, for the merge tests."""

from __future__ import annotations

import pathlib
import types

import pyarrow as pa
import pyarrow.parquet as pq

from disd.binlog import LocationKey
from disd.schema import SchemaRegistry
from disd.storage import StorageEngine
from support import SCHEMAS as SCHEMAS_DIR, Feeder, trade_rows

SCHEMAS = SchemaRegistry.load_dir(SCHEMAS_DIR)
#: Two dates in the past whenever the tests run (a merge of today's date is refused).
D1, D2 = "2026-11-19", "2026-11-20"
#: (first Size, rows) per location: two internal partitions per date.
LOCS = {
    LocationKey("Market", "Trade", "feed1", D1): (0, 30_000),
    LocationKey("Market", "Trade", "feed2", D1): (30_000, 20_000),
    LocationKey("Market", "Trade", "feed1", D2): (50_000, 7_000),
    LocationKey("Market", "Trade", "feed3", D2): (57_000, 5_000),
}


def rows_of(value: str) -> int:
    return sum(n for k, (_, n) in LOCS.items() if k.column_partition == value)


class IntradayDb:
    """A database root whose intraday locations are written and checkpointed by the storage
    engine itself (no DIS process): what ``dis merge --db-root`` reads on the DIS host."""

    def __init__(self, db_root: pathlib.Path) -> None:
        self.db_root = db_root
        self.engine = StorageEngine(str(db_root), SCHEMAS)
        self.feeder = Feeder(types.SimpleNamespace(engine=self.engine, schemas=SCHEMAS))

    def append(self, key: LocationKey, table: pa.Table, checkpoint: bool = True) -> None:
        self.feeder.append(key, table)
        if checkpoint:
            self.engine.location(key).checkpoint()

    def close(self) -> None:
        self.engine.close()


def fill(db: IntradayDb, locs=LOCS) -> None:
    for key, (start, n) in locs.items():
        db.append(key, trade_rows(start, n, nulls=True))


def location_table(path: pathlib.Path) -> pa.Table:
    """The rows of one historical location, read by pyarrow alone (files in name order)."""
    files = sorted(p for p in path.iterdir() if p.suffix == ".parquet" and not p.name.startswith((".", "_")))
    return pa.concat_tables([pq.read_table(f) for f in files])
