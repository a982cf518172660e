"""Scan planning: how many tasks a scan gets, and which Parquet row groups each one reads.

Pure arithmetic over sizes, shared by both kinds of rows the ``dis`` Spark source reads:

* ``split_size`` — the rows per task and the number of tasks for a scan, the same for intraday
  ranges (``disd.spark.plan``) and historical row groups: every core gets work, in whole waves,
  and splits land on multiples of ``SPLIT_ALIGN_ROWS`` (64 KiB blocks of every fixed-width
  column);
* ``plan_row_groups`` — a table's Parquet files (``disd.historical.discover``) with their
  row-group sizes packed into balanced groups of ``FilePiece``, so a large file is read by
  several tasks and many small ones by one.

No Spark here: ``disd.spark.readparquet`` turns each group into an input partition.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

#: Split points are multiples of this many rows (block-aligned for every fixed-width column).
SPLIT_ALIGN_ROWS = 1 << 16


def split_size(total: int, rows_per_partition: int, min_partitions: int) -> tuple[int, int]:
    """(split rows, number of partitions to aim for) for ``total`` rows."""
    if total <= 0:
        return max(1, rows_per_partition), 0
    n = max(min_partitions, math.ceil(total / rows_per_partition))
    n = math.ceil(n / min_partitions) * min_partitions  # whole waves on min_partitions cores
    split = math.ceil(total / n)
    if split > SPLIT_ALIGN_ROWS:
        split = math.ceil(split / SPLIT_ALIGN_ROWS) * SPLIT_ALIGN_ROWS
    else:
        split = max(split, min(SPLIT_ALIGN_ROWS, rows_per_partition))
    return split, max(1, math.ceil(total / split))


@dataclass(frozen=True)
class FilePiece:
    """Consecutive row groups of one Parquet file, and the values its path gives."""

    path: str
    row_groups: tuple[int, ...]  # indices in the file
    rows: int
    values: tuple[tuple[str, str | None], ...]


def plan_row_groups(files: Sequence, rows_per_partition: int,  # ParquetFileInfo
                    min_partitions: int) -> list[list[FilePiece]]:
    """The pieces of each task over ``files`` (``ParquetFileInfo``), balanced by row-group sizes:
    the largest row groups first, each onto the least loaded task."""
    units = [(rows, fi, rg) for fi, f in enumerate(files) for rg, rows in enumerate(f.row_groups) if rows > 0]
    total = sum(u[0] for u in units)
    if total == 0:
        return []
    _, n = split_size(total, rows_per_partition, min_partitions)
    n = max(1, min(n, len(units)))
    bins: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
    loads = [0] * n
    for rows, fi, rg in sorted(units, key=lambda u: (-u[0], u[1], u[2])):
        j = min(range(n), key=lambda k: (loads[k], k))
        bins[j].append((fi, rg, rows))
        loads[j] += rows
    out = []
    for items in bins:
        if not items:
            continue
        items.sort()
        pieces: list[FilePiece] = []
        for fi, rg, rows in items:
            f = files[fi]
            last = pieces[-1] if pieces else None
            if last is not None and last.path == f.path and last.row_groups[-1] == rg - 1:
                pieces[-1] = FilePiece(f.path, last.row_groups + (rg,), last.rows + rows, f.values)
            else:
                pieces.append(FilePiece(f.path, (rg,), rows, f.values))
        out.append(pieces)
    return out
