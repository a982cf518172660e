"""Partition pruning: which filters Spark pushes can be decided from a location's partition value.

Spark pushes the WHERE conjuncts it can express as ``pyspark.sql.datasource.Filter`` objects.  A
filter on the partition column (``Date = '2026-11-22'``, ``Date IN (...)``, ``Date >= '...'``,
their negations, ``LIKE 'prefix%'``, IS [NOT] NULL) is answered exactly by the location's column
partition, so the source takes it over: locations it excludes are never read, and Spark does not
filter those rows again.  Every other filter is returned to Spark, which applies it to the rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringContains,
    StringEndsWith,
    StringStartsWith,
)

Predicate = Callable[[str], bool]


def _attr(f: Filter) -> tuple[str, ...] | None:
    return getattr(f, "attribute", None)


def _compile(f: Filter, column: str) -> Predicate | None:
    """A predicate over partition values equivalent to ``f``, or None when ``f`` is not a
    filter on the partition column that can be decided from its string value."""
    if isinstance(f, Not):
        inner = _compile(f.child, column)
        if inner is None:
            return None
        # The partition column is never null, so NOT is plain negation.
        return lambda v, inner=inner: not inner(v)
    attr = _attr(f)
    if attr is None or len(attr) != 1 or attr[0].lower() != column.lower():
        return None
    if isinstance(f, IsNull):
        return lambda v: False
    if isinstance(f, IsNotNull):
        return lambda v: True
    value = getattr(f, "value", None)
    if isinstance(f, In):
        vals = tuple(value) if isinstance(value, (list, tuple)) else None
        # A NULL in the list makes NOT IN null (never true): leave such lists to Spark.
        if vals is None or not all(isinstance(x, str) for x in vals):
            return None
        wanted = frozenset(vals)
        return lambda v, wanted=wanted: v in wanted
    if value is None and isinstance(f, EqualNullSafe):
        return lambda v: False
    if not isinstance(value, str):
        return None  # e.g. a user schema that reads the partition column as a date
    # Python compares str by code point, which is Spark's UTF-8 byte order.
    ops: dict[type, Predicate] = {
        EqualTo: lambda v: v == value,
        EqualNullSafe: lambda v: v == value,
        GreaterThan: lambda v: v > value,
        GreaterThanOrEqual: lambda v: v >= value,
        LessThan: lambda v: v < value,
        LessThanOrEqual: lambda v: v <= value,
        StringStartsWith: lambda v: v.startswith(value),
        StringEndsWith: lambda v: v.endswith(value),
        StringContains: lambda v: value in v,
    }
    return ops.get(type(f))


@dataclass
class PartitionFilter:
    """The conjunction of the filters taken over, plus the explicit ``partitions`` option."""

    column: str
    allowed: frozenset[str] | None = None
    predicates: tuple[Predicate, ...] = ()
    pushed: tuple[Filter, ...] = ()

    def push(self, filters: Sequence[Filter]) -> list[Filter]:
        """Take over the filters this can decide; return the others (for Spark to apply)."""
        rest: list[Filter] = []
        preds = list(self.predicates)
        pushed = list(self.pushed)
        for f in filters:
            p = _compile(f, self.column)
            if p is None:
                rest.append(f)
            else:
                preds.append(p)
                pushed.append(f)
        self.predicates = tuple(preds)
        self.pushed = tuple(pushed)
        return rest

    def __call__(self, value: str) -> bool:
        if self.allowed is not None and value not in self.allowed:
            return False
        return all(p(value) for p in self.predicates)

    def select(self, values: Iterable[str]) -> list[str]:
        return [v for v in values if self(v)]
