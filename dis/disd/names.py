"""Validation of every name that becomes part of a path under the database root.

Namespaces, tables, internal partitions and column partitions all end up as directory names
(``<db>/Intraday/<Namespace>/<Table>/<InternalPartition>/<ColumnPartition>/<Table>/``) and as
dot-separated fields of binary log file names.  They are checked here, and only here, so that
nothing that could escape the database root (``..``, ``/``, NUL, an empty or absurdly long name)
is ever accepted by any entry point: schema files, log file names, gRPC requests, CLI flags.

The grammar is deliberately narrow: ASCII letters, digits, ``_``, ``-`` and ``+``, starting with
a letter, digit or underscore, at most 128 characters.  Dots are excluded because they separate
the fields of a log file name, which also rules out ``.`` and ``..``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from disd.errors import DisError

MAX_NAME_LENGTH = 128
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_+\-]*")


class NameKind(str, Enum):
    NAMESPACE = "namespace"
    TABLE = "table"
    INTERNAL_PARTITION = "internal partition"
    COLUMN_PARTITION = "column partition"
    COLUMN = "column"


class InvalidNameError(DisError, ValueError):
    """A name that may not be used as a path component or log file name field."""

    def __init__(self, kind: NameKind | str, value: object, reason: str) -> None:
        kind_text = kind.value if isinstance(kind, NameKind) else str(kind)
        super().__init__(f"invalid {kind_text} name {value!r}: {reason}")
        self.kind = kind_text
        self.value = value
        self.reason = reason


def validate_name(kind: NameKind | str, value: object) -> str:
    """Return ``value`` if it is a safe name of the given kind, else raise InvalidNameError."""
    if not isinstance(value, str):
        raise InvalidNameError(kind, value, f"must be a string, not {type(value).__name__}")
    if not value:
        raise InvalidNameError(kind, value, "must not be empty")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidNameError(kind, value[:40] + "...", f"longer than {MAX_NAME_LENGTH} characters")
    if "\x00" in value:
        raise InvalidNameError(kind, value, "contains NUL")
    if "/" in value or "\\" in value:
        raise InvalidNameError(kind, value, "contains a path separator")
    if ".." in value or value.startswith("."):
        raise InvalidNameError(kind, value, "contains '..' or starts with '.'")
    if not _NAME_RE.fullmatch(value):
        raise InvalidNameError(
            kind, value, "only ASCII letters, digits, '_', '-' and '+' are allowed (no '.')"
        )
    return value


def legalize(value: str) -> str:
    """Turn a free-form string (a host name, say) into a valid name: dots and other
    illegal characters become underscores."""
    out = re.sub(r"[^A-Za-z0-9_+\-]", "_", value)[:MAX_NAME_LENGTH]
    if not out or not re.match(r"[A-Za-z0-9_]", out[0]):
        out = "_" + out[: MAX_NAME_LENGTH - 1]
    return out


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
