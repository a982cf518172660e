"""The one parser and formatter of binary log file names.

    <Namespace>.<Table>.<System|User>.<InternalPartition>.<ColumnPartition>.bin.<yyyy-MM-dd.HHmmss.SSS+ZZZZ>

for example ``Market.Trade.System.feed_host1.2026-11-22.bin.2026-11-22.151353.472+0000``.
A name that does not match is reported (``InvalidLogFileName``), never guessed at.  Files of
one location order by their timestamp, which ``LogFileName.sort_key`` gives as UTC nanoseconds.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from enum import Enum

from disd.names import InvalidNameError, NameKind, validate_name
from disd.values import datetime_to_ns


class NamespaceSet(str, Enum):
    SYSTEM = "System"
    USER = "User"


class InvalidLogFileName(ValueError):
    pass


_FIELD = r"([^./]+)"
_RE = re.compile(
    rf"{_FIELD}\.{_FIELD}\.(System|User)\.{_FIELD}\.{_FIELD}\.bin\."
    r"(\d{4}-\d{2}-\d{2})\.(\d{2})(\d{2})(\d{2})\.(\d{3})([+-])(\d{2})(\d{2})"
)


@dataclass(frozen=True, order=False)
class LocationKey:
    """Identifies one location: (namespace, table, internal partition, column partition)."""

    namespace: str
    table: str
    internal_partition: str
    column_partition: str

    def __post_init__(self) -> None:
        validate_name(NameKind.NAMESPACE, self.namespace)
        validate_name(NameKind.TABLE, self.table)
        validate_name(NameKind.INTERNAL_PARTITION, self.internal_partition)
        validate_name(NameKind.COLUMN_PARTITION, self.column_partition)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.table}/{self.internal_partition}/{self.column_partition}"

    @property
    def table_key(self) -> str:
        return f"{self.namespace}.{self.table}"


@dataclass(frozen=True)
class LogFileName:
    namespace: str
    table: str
    namespace_set: NamespaceSet
    internal_partition: str
    column_partition: str
    timestamp: dt.datetime  # timezone-aware

    @property
    def location(self) -> LocationKey:
        return LocationKey(self.namespace, self.table, self.internal_partition, self.column_partition)

    @property
    def sort_key(self) -> int:
        """UTC nanoseconds of the file's timestamp: the order of files within a location."""
        return datetime_to_ns(self.timestamp)

    def format(self) -> str:
        ts = self.timestamp
        off = ts.utcoffset() or dt.timedelta(0)
        sign = "-" if off < dt.timedelta(0) else "+"
        mins = abs(int(off.total_seconds())) // 60
        stamp = (
            f"{ts:%Y-%m-%d.%H%M%S}.{ts.microsecond // 1000:03d}{sign}{mins // 60:02d}{mins % 60:02d}"
        )
        return (
            f"{self.namespace}.{self.table}.{self.namespace_set.value}."
            f"{self.internal_partition}.{self.column_partition}.bin.{stamp}"
        )

    __str__ = format

    @classmethod
    def parse(cls, name: str) -> "LogFileName":
        m = _RE.fullmatch(name)
        if not m:
            raise InvalidLogFileName(
                f"{name!r} is not a binary log file name "
                "(<Namespace>.<Table>.<System|User>.<InternalPartition>.<ColumnPartition>"
                ".bin.<yyyy-MM-dd.HHmmss.SSS+ZZZZ>)"
            )
        ns, table, nset, ip, cp, date, hh, mi, ss, ms, sign, oh, om = m.groups()
        try:
            validate_name(NameKind.NAMESPACE, ns)
            validate_name(NameKind.TABLE, table)
            validate_name(NameKind.INTERNAL_PARTITION, ip)
            validate_name(NameKind.COLUMN_PARTITION, cp)
        except InvalidNameError as e:
            raise InvalidLogFileName(f"{name!r}: {e}") from None
        try:
            offset = dt.timedelta(hours=int(oh), minutes=int(om)) * (-1 if sign == "-" else 1)
            tz = dt.timezone(offset)
            y, mo, d = map(int, date.split("-"))
            ts = dt.datetime(y, mo, d, int(hh), int(mi), int(ss), int(ms) * 1000, tzinfo=tz)
        except ValueError as e:
            raise InvalidLogFileName(f"{name!r}: bad timestamp: {e}") from None
        return cls(ns, table, NamespaceSet(nset), ip, cp, ts)

    @classmethod
    def try_parse(cls, name: str) -> "LogFileName | None":
        try:
            return cls.parse(name)
        except InvalidLogFileName:
            return None
