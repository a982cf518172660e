"""What a merge wrote: the manifest of one location and the table's index of them (``.tlmi``).

A location's version directory holds its Parquet files and ``_dis_manifest.json`` (one
``LocationRecord``: rows, files with sizes and CRC32C, what it was merged from).  The table's
``MetadataIndex/<Table>.tlmi`` lists the record of every location dis wrote, so a reader or a
re-run learns the locations, their row counts and checksums without opening a directory.

Both are text, in the format of ``table.size`` (docs/historical.md)::

    DISTLMI 1
    {"locations": [...], "namespace": "Market", "table": "Trade", ...}
    crc32c 1a2b3c4d

The manifest is the JSON object alone (it sits next to the files it describes, and a torn one is
caught by its own fields: every file's size and checksum).
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import crc32c as _crc32c

from disd.binlog.format import crc32c
from disd.errors import DisError
from disd.records import RecordFormat
from disd.historical.durable import write_atomic

MANIFEST_NAME = "_dis_manifest.json"
MAGIC_WORD = "DISTLMI"
VERSION = 1
MAGIC = f"{MAGIC_WORD} {VERSION}"
CHUNK = 8 << 20


class MetadataIndexError(DisError):
    """An index or manifest that cannot be trusted (damaged, unknown version)."""


RECORD = RecordFormat(MAGIC_WORD, VERSION, "metadata index", "index", MetadataIndexError)


@dataclass(frozen=True)
class FileRecord:
    name: str
    rows: int
    bytes: int
    crc32c: str  # 8 hex digits over the whole file


@dataclass(frozen=True)
class LocationRecord:
    """One written location: where, how many rows, which files, and from what."""

    internal_partition: str
    value: str  # the column partition
    version: str  # the version directory's name
    rows: int
    files: tuple[FileRecord, ...]
    identity: str  # the source identity (disd.historical.intraday.SourceSnapshot.identity)
    source: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    written_at: float = 0.0

    @property
    def checksum(self) -> str:
        """CRC32C over the files' own checksums in order: one value for the whole location."""
        return f"{crc32c(''.join(f.crc32c for f in self.files).encode()):08x}"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["files"] = [asdict(f) for f in self.files]
        d["checksum"] = self.checksum
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LocationRecord":
        try:
            return cls(
                internal_partition=str(d["internal_partition"]), value=str(d["value"]), version=str(d["version"]),
                rows=int(d["rows"]),
                files=tuple(FileRecord(str(f["name"]), int(f["rows"]), int(f["bytes"]), str(f["crc32c"]))
                            for f in d["files"]),
                identity=str(d["identity"]), source=dict(d.get("source") or {}),
                settings=dict(d.get("settings") or {}), written_at=float(d.get("written_at", 0.0)),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise MetadataIndexError(f"location record unreadable: {e!r}") from None


def file_crc32c(path: pathlib.Path) -> str:
    value = 0
    with open(path, "rb") as f:
        while True:
            chunk = f.read(CHUNK)
            if not chunk:
                break
            value = _crc32c.crc32c(chunk, value)
    return f"{value:08x}"


def write_manifest(directory: pathlib.Path, record: LocationRecord) -> pathlib.Path:
    path = directory / MANIFEST_NAME
    data = json.dumps(record.to_dict(), sort_keys=True, indent=1).encode()
    with open(path, "wb") as f:
        f.write(data)
    return path


def read_manifest(directory: pathlib.Path) -> LocationRecord | None:
    try:
        text = (directory / MANIFEST_NAME).read_text()
    except FileNotFoundError:
        return None
    try:
        return LocationRecord.from_dict(json.loads(text))
    except json.JSONDecodeError as e:
        raise MetadataIndexError(f"{directory / MANIFEST_NAME}: not JSON: {e}") from None


def check_files(directory: pathlib.Path, record: LocationRecord, checksums: bool = False) -> str | None:
    """Why the files in ``directory`` are not the ones ``record`` lists, or None when they are
    (sizes always; CRC32C too when ``checksums``)."""
    for f in record.files:
        p = directory / f.name
        try:
            size = p.stat().st_size
        except FileNotFoundError:
            return f"{p} is missing"
        if size != f.bytes:
            return f"{p} is {size} bytes, the record says {f.bytes}"
        if checksums and file_crc32c(p) != f.crc32c:
            return f"{p} fails its CRC32C"
    return None


@dataclass(frozen=True)
class TableIndex:
    namespace: str
    table: str
    partition_column: str | None
    locations: tuple[LocationRecord, ...] = ()

    def find(self, value: str) -> list[LocationRecord]:
        return [loc for loc in self.locations if loc.value == value]

    def with_location(self, rec: LocationRecord) -> "TableIndex":
        """This index with ``rec`` replacing any record of the same column partition."""
        kept = [loc for loc in self.locations if loc.value != rec.value]
        locs = sorted([*kept, rec], key=lambda loc: (loc.value, loc.internal_partition))
        return replace(self, locations=tuple(locs))

    def to_bytes(self) -> bytes:
        return RECORD.encode({
            "namespace": self.namespace, "table": self.table, "partition_column": self.partition_column,
            "locations": [loc.to_dict() for loc in self.locations],
        })

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> "TableIndex":
        d = RECORD.decode(data, where)
        try:
            return cls(str(d["namespace"]), str(d["table"]), d.get("partition_column"),
                       tuple(LocationRecord.from_dict(loc) for loc in d["locations"]))
        except (KeyError, TypeError, ValueError) as e:
            raise MetadataIndexError(f"{where}: index unreadable: {e!r}") from None


def read_index(path: pathlib.Path) -> TableIndex | None:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return TableIndex.from_bytes(data, str(path))


def write_index(path: pathlib.Path, index: TableIndex) -> None:
    write_atomic(path, index.to_bytes())
