"""What the power-cut tests log: Market.Trade through the real logger, every row in a
transaction of ``TXN`` rows (whole batches and ``transaction()`` blocks of two batches),
hourly rollovers driven by the logger's clock, locations that start part-way, and a location of
schema version 2 after the DIS restarts with that version declared.

Row ``i`` of every location has Size ``i`` (``support.trade_rows``; version 2 adds Venue
``V<i>``), so a location holds every row exactly once exactly when its Size column is
``0 .. rows-1``, and a crash kept whole transactions only when ``rows`` is a multiple of ``TXN``.
"""

from __future__ import annotations

import datetime as dt
import pathlib
import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from disd.logger import IntradayLoggerBuilder
from disd.schema import TableSchema
from server.versions_support import V2_YAML
from support import SCHEMAS, trade_rows

TXN = 100
DAY = "2026-11-22"


def schemas_dirs(tmp: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """Two schema directories: the repository's (Market.Trade version 1), and the same with
    Market.Trade at version 2 (a Venue column added)."""
    import shutil

    v1, v2 = tmp / "schemas-v1", tmp / "schemas-v2"
    for d in (v1, v2):
        if not d.exists():
            shutil.copytree(SCHEMAS, d)
    (v2 / "Market.Trade.yaml").write_text(V2_YAML)
    return v1, v2


def rows(version: int, start: int, n: int) -> pa.Table:
    t = trade_rows(start, n)
    if version >= 2:
        t = t.append_column("Venue", pa.array([f"V{i}" for i in range(start, start + n)]))
    return t


@dataclass
class Feed:
    """One location's logger and the rows it logged."""
    ip: str
    version: int
    logger: object
    logged: int = 0
    batches: int = 0
    base: int = 0  # the Size of its first row
    times: list[tuple[float, int]] = field(default_factory=list)  # (time.time(), rows logged) per transaction

    def log_transaction(self, flush: bool = True) -> None:
        """``TXN`` rows as one transaction: alternately one atomic batch and two batches in a
        ``transaction()`` block."""
        t = rows(self.version, self.base + self.logged, TXN)
        if self.batches % 2 == 0:
            self.logger.log_batch(t, atomic=True)
        else:
            with self.logger.transaction():
                self.logger.log_batch(t.slice(0, TXN // 2))
                self.logger.log_batch(t.slice(TXN // 2))
        self.logged += TXN
        self.batches += 1
        if flush:
            self.logger.flush()
        self.times.append((time.time(), self.logged))


    def log_rows(self, n: int) -> None:
        """``n`` rows (a multiple of ``TXN``) as one transaction: a backlog, quickly."""
        assert n % TXN == 0
        self.logger.log_batch(rows(self.version, self.base + self.logged, n), atomic=True)
        self.logged += n
        self.batches += 1
        self.times.append((time.time(), self.logged))


@dataclass
class Loggers:
    """The applications' loggers of one log directory, sharing a clock the test moves."""
    log_dir: pathlib.Path
    schemas: dict[int, pathlib.Path]  # version -> schema file
    now: list[dt.datetime] = field(default_factory=lambda: [dt.datetime(2026, 11, 22, 9, tzinfo=dt.timezone.utc)])
    feeds: dict[str, Feed] = field(default_factory=dict)

    def add(self, ip: str, version: int = 1, base: int = 0) -> Feed:
        lg = (IntradayLoggerBuilder(str(self.schemas[version])).set_process_name(f"app-{ip}")
              .set_log_dir(str(self.log_dir)).set_column_partition_value(DAY).set_internal_partition(ip)
              .set_rollover("hourly").set_clock(lambda: self.now[0]).build())
        self.feeds[ip] = Feed(ip, version, lg, base=base)
        return self.feeds[ip]

    def roll_over(self) -> None:
        """An hour passes: each logger's next row goes to a new file."""
        self.now[0] += dt.timedelta(hours=1)

    def close(self) -> None:
        for f in self.feeds.values():
            f.logger.close()

    def logged(self) -> dict[str, int]:
        return {ip: f.logged for ip, f in self.feeds.items()}

    def versions(self) -> dict[str, int]:
        return {ip: f.version for ip, f in self.feeds.items()}


def prefix_problem(ip: str, table: pa.Table, version: int) -> str | None:
    """Why ``table`` (one location's rows) is not rows ``0 .. n-1`` exactly once, whole
    transactions; None when it is."""
    n = table.num_rows
    size = table.column("Size").to_numpy(zero_copy_only=False)
    if not np.array_equal(size, np.arange(n)):
        bad = int(np.flatnonzero(size != np.arange(n))[0]) if len(size) else 0
        return f"{ip}: row {bad} has Size {size[bad]}: rows lost, duplicated or out of order"
    if n % TXN:
        return f"{ip}: {n} rows, not a whole number of {TXN}-row transactions"
    if version >= 2 and "Venue" in table.column_names:
        if table.column("Venue").to_pylist() != [f"V{i}" for i in range(n)]:
            return f"{ip}: the version-2 column Venue differs from what was logged"
    return None


def version2(schemas_v2: pathlib.Path) -> TableSchema:
    from disd.schema import SchemaRegistry

    return SchemaRegistry.load_dir(schemas_v2).get("Market", "Trade")
