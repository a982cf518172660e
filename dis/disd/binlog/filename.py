"""The one parser and formatter of binary log file names.

    <Namespace>.<Table>.<System|User>.<InternalPartition>.<ColumnPartition>.bin.<yyyy-MM-dd.HHmmss.SSS+ZZZZ>

for example ``Market.Trade.System.feed_host1.2026-11-22.bin.2026-11-22.151353.472+0000``.
A name that does not match is reported (``InvalidLogFileName``, saying which part is wrong),
never guessed at.  Files of one location order by their timestamp, which ``LogFileName.sort_key``
gives as UTC nanoseconds.
"""

from __future__ import annotations

import calendar
import functools
import datetime as dt
import re
from dataclasses import dataclass
from enum import Enum

from disd.errors import DisError
from disd.names import InvalidNameError, LocationKey, NameKind, validate_name
from disd.values import datetime_to_ns


class NamespaceSet(str, Enum):
    SYSTEM = "System"
    USER = "User"


class InvalidLogFileName(DisError, ValueError):
    """A name outside the grammar.  ``part`` names the part that is wrong (``namespace_kind``,
    ``month``, ``suffix``, ... ``fields`` when parts are missing), ``problem`` says how
    ("month 13 is not 01..12")."""

    def __init__(self, name: str, problem: str | None = None, part: str = "name") -> None:
        super().__init__(f"{name!r} is not a binary log file name: {problem}" if problem else name)
        self.name = name
        self.part = part
        self.problem = problem or name


GRAMMAR = "<Namespace>.<Table>.<System|User>.<InternalPartition>.<ColumnPartition>.bin.<yyyy-MM-dd.HHmmss.SSS+ZZZZ>"


_FIELD = r"([^./]+)"
_RE = re.compile(
    rf"{_FIELD}\.{_FIELD}\.(System|User)\.{_FIELD}\.{_FIELD}\.bin\."
    r"(\d{4}-\d{2}-\d{2})\.(\d{2})(\d{2})(\d{2})\.(\d{3})([+-])(\d{2})(\d{2})"
)


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
            raise _diagnose(name)
        ns, table, nset, ip, cp, date, hh, mi, ss, ms, sign, oh, om = m.groups()
        try:
            validate_name(NameKind.NAMESPACE, ns)
            validate_name(NameKind.TABLE, table)
            validate_name(NameKind.INTERNAL_PARTITION, ip)
            validate_name(NameKind.COLUMN_PARTITION, cp)
            offset = dt.timedelta(hours=int(oh), minutes=int(om)) * (-1 if sign == "-" else 1)
            tz = dt.timezone(offset)
            y, mo, d = map(int, date.split("-"))
            ts = dt.datetime(y, mo, d, int(hh), int(mi), int(ss), int(ms) * 1000, tzinfo=tz)
        except ValueError:  # InvalidNameError too: say exactly which part is wrong
            raise _diagnose(name) from None
        return cls(ns, table, NamespaceSet(nset), ip, cp, ts)

    @classmethod
    def try_parse(cls, name: str) -> "LogFileName | None":
        """``parse``, or None for a name that is not a binary log's.  Remembered per name (the
        result is immutable): a tailer parses every file name at each rescan and in its workers'
        loops, thousands of times a second at thousands of locations."""
        return _try_parse(name)


_NAME_PARTS = (
    (NameKind.NAMESPACE, "namespace"),
    (NameKind.TABLE, "table"),
    (None, "namespace_kind"),
    (NameKind.INTERNAL_PARTITION, "internal_partition"),
    (NameKind.COLUMN_PARTITION, "column_partition"),
)
#: What each dot-separated field is, for "the name ends before ..." messages.
_FIELD_TEXT = ("the namespace", "the table", "the namespace kind (System or User)", "the internal partition",
               "the column partition", "'bin'", "the date (yyyy-MM-dd)", "the time (HHmmss)",
               "the milliseconds and zone offset (SSS+ZZZZ)")


def _range(what: str, value: str, low: int, high: int, part: str) -> tuple[str, str] | None:
    v = int(value)
    if low <= v <= high:
        return None
    return part, f"{what} {v} is not {low:0{len(value)}d}..{high:0{len(value)}d}"


def _problem(name: str) -> tuple[str, str]:
    """(part, problem) of a name the grammar refuses: the first part, left to right, that is wrong."""
    fields = name.split(".")
    for i, text in enumerate(_FIELD_TEXT):
        if i >= len(fields):
            after = f" after {fields[-1]!r}" if fields[-1] else ""
            return "fields", f"the name ends{after} where {text} should follow ({GRAMMAR})"
        f = fields[i]
        if i < len(_NAME_PARTS):
            kind, part = _NAME_PARTS[i]
            if kind is None:
                if f not in ("System", "User"):
                    return part, f"namespace kind {f!r} is not 'System' or 'User'"
                continue
            try:
                validate_name(kind, f)
            except InvalidNameError as e:
                return part, str(e)
        elif i == 5:
            if f != "bin":
                return "bin_mark", f"{f!r} where 'bin' should follow the column partition"
        elif i == 6:
            m = re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})", f)
            if not m:
                return "date", f"date {f!r} is not yyyy-MM-dd"
            y, mo, d = m.groups()
            bad = _range("month", mo, 1, 12, "month")
            if bad is None and int(y) == 0:
                bad = "year", "year 0000 is not 0001..9999"
            if bad is None:
                bad = _range("day", d, 1, calendar.monthrange(int(y), int(mo))[1], "day")
                if bad is not None:
                    bad = "day", f"{bad[1]} (in {y}-{mo})"
            if bad is not None:
                return bad
        elif i == 7:
            if not re.fullmatch(r"\d{6}", f):
                return "time", f"time {f!r} is not HHmmss"
            bad = (_range("hour", f[0:2], 0, 23, "hour") or _range("minute", f[2:4], 0, 59, "minute")
                   or _range("second", f[4:6], 0, 59, "second"))
            if bad is not None:
                return bad
        else:
            m = re.fullmatch(r"(\d{3})([+-])(\d{2})(\d{2})", f)
            if not m:
                return "zone", f"{f!r} is not SSS+ZZZZ (milliseconds, then the zone offset as +HHmm or -HHmm)"
            bad = (_range("zone offset hour", m.group(3), 0, 23, "zone")
                   or _range("zone offset minute", m.group(4), 0, 59, "zone"))
            if bad is not None:
                return bad
    if len(fields) > len(_FIELD_TEXT):
        return "suffix", f"unexpected suffix {'.' + '.'.join(fields[len(_FIELD_TEXT):])!r}"
    return "name", f"does not match {GRAMMAR}"


def _diagnose(name: str) -> InvalidLogFileName:
    part, problem = _problem(name)
    return InvalidLogFileName(name, problem, part)


@functools.lru_cache(maxsize=1 << 16)
def _try_parse(name: str) -> LogFileName | None:
    try:
        return LogFileName.parse(name)
    except InvalidLogFileName:
        return None
