"""Input partitions: which row ranges of which locations each Spark task reads.

A scan (or a micro-batch) is a set of row ranges ``[start, stop)`` of locations, each with the
location's column file sizes at planning time.  Ranges are cut at multiples of a split size
(aligned to 65536 rows, so fixed-width columns split on 64 KiB block boundaries) and packed into
as many input partitions as keep every core busy: a large location is read by several tasks, many
small ones by one.  An input partition holds plain values only: no connection, no client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from pyspark.sql.datasource import InputPartition

from disd.binlog import LocationKey
from disd.blocks import DEFAULT_RETRY_S, LocationSnapshot
from disd.historical.scan import split_size
from disd.routing import Routing
from disd.security import ClientSecurity
from disd.spark.arrow import Projection


@dataclass(frozen=True)
class Slice:
    """Rows [start, stop) of one location, read from ``address`` (the replica that listed it;
    another replica of its set that has published ``stop`` rows when that one is down)."""

    address: str
    namespace: str
    table: str
    internal_partition: str
    column_partition: str
    start: int
    stop: int
    files: tuple[tuple[str, int], ...]
    block_size: int
    # The schema version the location is written in (0: not said, the scan's own version): the
    # task decodes it in that version and projects its rows onto the scan's columns.
    schema_version: int = 0

    @property
    def rows(self) -> int:
        return self.stop - self.start

    def snapshot(self) -> LocationSnapshot:
        key = LocationKey(self.namespace, self.table, self.internal_partition, self.column_partition)
        return LocationSnapshot(key, self.stop, dict(self.files), self.block_size, self.address, self.schema_version)


@dataclass(frozen=True)
class ReadSpec:
    """Everything a task needs besides its slices."""

    projection: Projection
    security: ClientSecurity
    timeout_s: float
    batch_rows: int
    db_root: str | None = None  # read the column files under it (disd.blocks.open_block_source)
    retry_s: float = DEFAULT_RETRY_S  # ride out an unreachable DIS this long (option retrySeconds)
    # The DISes of the read (options 'address'/'routing'): a task reads each slice from the
    # replica that listed it and fails over to the other replicas of its set (disd.blocks.GrpcBlocks).
    routing: Routing | None = None


class DisInputPartition(InputPartition):
    def __init__(self, index: int, slices: Sequence[Slice], spec: ReadSpec) -> None:
        super().__init__(index)
        self.index = index
        self.slices = tuple(slices)
        self.spec = spec

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.slices)

    def __repr__(self) -> str:
        parts = ", ".join(f"{s.internal_partition}/{s.column_partition}[{s.start}:{s.stop}]" for s in self.slices)
        return f"DisInputPartition({self.index}: {parts})"


@dataclass(frozen=True)
class Range:
    """A location (as listed) and the rows of it to read."""

    snap: LocationSnapshot
    start: int
    stop: int


def cut(r: Range, split: int) -> list[tuple[int, int]]:
    """[start, stop) cut at the multiples of ``split`` inside it."""
    out = []
    a = r.start
    while a < r.stop:
        b = min(r.stop, (a // split + 1) * split)
        out.append((a, b))
        a = b
    return out


def plan_partitions(ranges: Iterable[Range], spec: ReadSpec, rows_per_partition: int,
                    min_partitions: int) -> list[DisInputPartition]:
    ranges = [r for r in ranges if r.stop > r.start]
    total = sum(r.stop - r.start for r in ranges)
    if total == 0:
        return []
    split, n = split_size(total, rows_per_partition, min_partitions)
    pieces: list[tuple[int, int, Range, int, int]] = []
    for i, r in enumerate(ranges):
        for a, b in cut(r, split):
            pieces.append((b - a, i, r, a, b))
    # Longest first onto the least loaded partition: balanced tasks.
    pieces.sort(key=lambda p: (-p[0], p[1], p[3]))
    bins: list[list[tuple[int, Range, int, int]]] = [[] for _ in range(n)]
    loads = [0] * n
    for rows, i, r, a, b in pieces:
        j = min(range(n), key=lambda k: (loads[k], k))
        bins[j].append((i, r, a, b))
        loads[j] += rows
    out: list[DisInputPartition] = []
    for items in bins:
        if not items:
            continue
        items.sort(key=lambda t: (t[0], t[2]))
        slices = [_slice(r, a, b) for _, r, a, b in items]
        out.append(DisInputPartition(len(out), slices, spec))
    return out


def _slice(r: Range, a: int, b: int) -> Slice:
    s = r.snap
    k = s.key
    return Slice(s.address, k.namespace, k.table, k.internal_partition, k.column_partition, a, b,
                 tuple(sorted(s.files.items())), s.block_size, s.schema_version)
