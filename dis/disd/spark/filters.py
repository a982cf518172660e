"""Partition pruning: which locations a scan reads, decided by the ``partitions`` option.

The option names the column partitions to read; every other location is never listed into the
plan.  WHERE clauses do not prune: Spark applies them to the rows it reads (why the Python source
takes over no filter: the module docstring of ``disd.spark.source``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class PartitionFilter:
    """The column partitions a scan reads: those in ``allowed``, or all when it is None."""

    column: str
    allowed: frozenset[str] | None = None

    def __call__(self, value: str) -> bool:
        return self.allowed is None or value in self.allowed

    def select(self, values: Iterable[str]) -> list[str]:
        return [v for v in values if self(v)]
