"""Where historical tables live under a database root: the one home of every historical path.

The seeds' layouts (docs/historical.md has the full picture)::

    <db>/Systems/<Namespace>/                       a system namespace (tables with a DIS schema)
        Definitions/<Table>.tbl                     the table definition (disd.historical.definitions)
        Partitions/<InternalPartition>/<Date>/<Table>/   one location: Parquet files
        WritablePartitions/<name> -> ../Partitions/<name>   the internal partitions merges write to
        MetadataIndex/<Table>.tlmi                  the index of merged locations (disd.historical.index)
        Extended/<Table>/                           extended layouts written by other tools
    <db>/Users/<Namespace>/                         a user namespace (tables written from Spark)
        Definitions/<Table>.tbl
        Tables/<Table>/                             an unpartitioned ("splayed") user table
        Partitions/<InternalPartition>/<Value>/<Table>/   a partitioned user table
        MetadataIndex/<Table>.tlmi
        Extended/<Table>/

A location directory (``.../<Date>/<Table>``, ``Tables/<Table>``) written by dis is a symbolic
link to a hidden version directory next to it (``.<Table>.v<stamp>-<id>``), so a newer version
replaces it with one atomic rename while readers of the old one keep their files.  Names that
start with ``.`` or ``_`` are never data: staging directories, versions, manifests, locks.
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass
from enum import Enum

from disd.names import NameKind, validate_name

SYSTEMS = "Systems"
USERS = "Users"
DEFINITIONS = "Definitions"
PARTITIONS = "Partitions"
WRITABLE = "WritablePartitions"
INDEX_DIR = "MetadataIndex"
TABLES = "Tables"
EXTENDED = "Extended"
DEFINITION_SUFFIX = ".tbl"
INDEX_SUFFIX = ".tlmi"
#: The internal partition a namespace gets when a merge finds no writable partition.
DEFAULT_INTERNAL_PARTITION = "0"
#: Files in a location that hold rows; everything else (manifests, checksums) is skipped.
PARQUET_SUFFIX = ".parquet"


class NamespaceType(str, Enum):
    SYSTEM = "system"
    USER = "user"

    @property
    def directory(self) -> str:
        return SYSTEMS if self is NamespaceType.SYSTEM else USERS


class Layout(str, Enum):
    """How a table's Parquet files are arranged (the ``layout`` of its definition)."""

    NESTED = "nested"  # Partitions/<InternalPartition>/<Value>/<Table>/*.parquet (merged, partitioned)
    SPLAYED = "splayed"  # Tables/<Table>/*.parquet (unpartitioned user table)
    PARQUET_FLAT = "parquet:flat"  # Extended/<Table>/*.parquet, no partitioning column
    PARQUET_KV = "parquet:kv"  # Extended/<Table>/<Key>=<Value>/.../*.parquet
    COREPLUS_HIVE = "coreplus:hive"  # the same key=value directories
    PARQUET_METADATA = "parquet:metadata"  # Extended/<Table>/_metadata (+ _common_metadata)

    @property
    def extended(self) -> bool:
        return self in (Layout.PARQUET_FLAT, Layout.PARQUET_KV, Layout.COREPLUS_HIVE, Layout.PARQUET_METADATA)


def is_hidden(name: str) -> bool:
    """Staging, versions, manifests, locks, Spark's and Hadoop's markers: never data."""
    return name.startswith(".") or name.startswith("_")


@dataclass(frozen=True)
class NamespaceRoot:
    """The directory of one namespace of one type under a database root."""

    db_root: str
    kind: NamespaceType
    namespace: str

    def __post_init__(self) -> None:
        validate_name(NameKind.NAMESPACE, self.namespace)

    @classmethod
    def system(cls, db_root: str | os.PathLike[str], namespace: str) -> "NamespaceRoot":
        return cls(str(db_root), NamespaceType.SYSTEM, namespace)

    @classmethod
    def user(cls, db_root: str | os.PathLike[str], namespace: str) -> "NamespaceRoot":
        return cls(str(db_root), NamespaceType.USER, namespace)

    @property
    def path(self) -> pathlib.Path:
        return pathlib.Path(self.db_root) / self.kind.directory / self.namespace

    def definition_path(self, table: str) -> pathlib.Path:
        return self.path / DEFINITIONS / (validate_name(NameKind.TABLE, table) + DEFINITION_SUFFIX)

    def index_path(self, table: str) -> pathlib.Path:
        return self.path / INDEX_DIR / (validate_name(NameKind.TABLE, table) + INDEX_SUFFIX)

    def lock_path(self, table: str) -> pathlib.Path:
        """Held (flock) by whoever writes the table: a merge, a user-table write."""
        return self.path / INDEX_DIR / f".{validate_name(NameKind.TABLE, table)}.lock"

    @property
    def partitions_dir(self) -> pathlib.Path:
        return self.path / PARTITIONS

    @property
    def writable_dir(self) -> pathlib.Path:
        return self.path / WRITABLE

    def location_parent(self, internal_partition: str, value: str) -> pathlib.Path:
        """``Partitions/<InternalPartition>/<Value>``: the directory holding the location link."""
        validate_name(NameKind.INTERNAL_PARTITION, internal_partition)
        validate_name(NameKind.COLUMN_PARTITION, value)
        return self.partitions_dir / internal_partition / value

    def writable_parent(self, internal_partition: str, value: str) -> pathlib.Path:
        """The same directory reached through ``WritablePartitions/<name>`` (how merges write)."""
        validate_name(NameKind.INTERNAL_PARTITION, internal_partition)
        validate_name(NameKind.COLUMN_PARTITION, value)
        return self.writable_dir / internal_partition / value

    def location_path(self, internal_partition: str, value: str, table: str) -> pathlib.Path:
        return self.location_parent(internal_partition, value) / validate_name(NameKind.TABLE, table)

    def splayed_path(self, table: str) -> pathlib.Path:
        return self.path / TABLES / validate_name(NameKind.TABLE, table)

    def extended_path(self, table: str) -> pathlib.Path:
        return self.path / EXTENDED / validate_name(NameKind.TABLE, table)

    def relative(self, p: pathlib.Path) -> str:
        """``p`` relative to the namespace directory (as the index records paths)."""
        return str(pathlib.PurePosixPath(os.path.relpath(p, self.path)))


def subdirs(path: pathlib.Path) -> list[str]:
    """Visible subdirectories (symbolic links to directories included), sorted."""
    try:
        return sorted(e.name for e in os.scandir(path) if not is_hidden(e.name) and e.is_dir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def parquet_files(directory: pathlib.Path) -> list[pathlib.Path]:
    """The data files of a location directory, in name order (the order of their rows)."""
    try:
        entries = sorted(e.name for e in os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [directory / n for n in entries if not is_hidden(n) and n.endswith(PARQUET_SUFFIX)]


@dataclass(frozen=True)
class LocationDir:
    """One historical location as found on disk."""

    internal_partition: str
    value: str  # the column partition (e.g. the date)
    path: pathlib.Path  # the location directory (usually a link to its current version)


def nested_locations(ns: NamespaceRoot, table: str, wanted=None) -> list[LocationDir]:  # noqa: ANN001
    """Every ``Partitions/<ip>/<value>/<table>`` directory, optionally only values ``wanted(v)``
    accepts (pruning happens before any file is listed)."""
    validate_name(NameKind.TABLE, table)
    out = []
    for ip in subdirs(ns.partitions_dir):
        for value in subdirs(ns.partitions_dir / ip):
            if wanted is not None and not wanted(value):
                continue
            p = ns.partitions_dir / ip / value / table
            if p.is_dir():
                out.append(LocationDir(ip, value, p))
    return sorted(out, key=lambda loc: (loc.value, loc.internal_partition))
