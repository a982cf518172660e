"""The checkpoint record, ``table.size``: what a location guarantees after a crash.

A small text file, readable by people and other programs (three lines, each ending in ``\\n``)::

    DISCKPT 1
    {"files": {"Price.dat": 9600, ...}, "fingerprint": "...", "import_state": {...}, "rows": 1200, "source": {...}, "time": ...}
    crc32c 1a2b3c4d

Line 1 is the magic word and the format version.  Line 2 is one JSON object: the committed row
count, each column file's size at that count, the source record (log file name and byte offset
just past the last committed row, plus ``skip_rows`` when that row is inside a frame), the schema
fingerprint and version (``schema_version``, absent in records older than schema versions), the import state (counters carried across
restarts) and the time.  Line 3 is the
CRC32C of line 2 in 8 hex digits, so a torn or damaged record is detected rather than trusted.

Writing follows the order that makes a crash at any point safe: the column files were fsynced
before this is called; the record goes to ``table.size.tmp``, which is fsynced, renamed over
``table.size``, and the directory fsynced so the rename itself is durable.  A crash leaves either
the old record or the new one, never a mixture; a stale ``table.size.tmp`` is ignored and removed.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from disd.errors import DisError
from disd.records import RecordFormat
from disd.storage.fsio import OS, FileSystem, read_file, write_file

FILE_NAME = "table.size"
TEMP_NAME = "table.size.tmp"
MAGIC_WORD = "DISCKPT"
VERSION = 1
MAGIC = f"{MAGIC_WORD} {VERSION}"
MAX_RECORD_BYTES = 1 << 20


class CheckpointError(DisError):
    """table.size exists but cannot be trusted (damaged, unknown version, unreadable)."""


RECORD = RecordFormat(MAGIC_WORD, VERSION, "checkpoint record", "checkpoint format", CheckpointError)


@dataclass(frozen=True)
class SourcePosition:
    """Where ingestion of a location resumes: the log file and the byte offset just past the last
    committed row; ``skip_rows`` rows of the frame at that offset are already committed.

    A location fed by a Kafka partition (``disd.kafka``) has no log file: ``topic`` and
    ``partition`` name the Kafka partition and ``offset`` is the next Kafka offset to consume.
    Both are None for a tailed location, whose record then reads and writes exactly as before."""

    file_name: str | None
    offset: int
    skip_rows: int = 0
    topic: str | None = None
    partition: int | None = None


@dataclass(frozen=True)
class CheckpointRecord:
    rows: int
    files: dict[str, int]
    source: SourcePosition
    fingerprint: str
    import_state: dict[str, int] = field(default_factory=dict)
    time: float = field(default_factory=time.time)
    version: int = VERSION
    # The table's schema version the location is written in; never changes for a location.
    # 0 in a record written before schema versions existed: the version whose fingerprint
    # matches ``fingerprint`` (docs/schema-versions.md).
    schema_version: int = 0
    # The last-by state at exactly ``rows`` (docs/lastby.md): its file, rows, keys, bytes and
    # CRC32C; None for a table without last-by keys.
    lastby: dict[str, Any] | None = None

    def body(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "files": self.files,
            "source": {"file": self.source.file_name, "offset": self.source.offset,
                       "skip_rows": self.source.skip_rows}
            | ({"topic": self.source.topic, "partition": self.source.partition}
               if self.source.topic is not None else {}),
            "fingerprint": self.fingerprint,
            "import_state": self.import_state,
            "time": self.time,
        } | ({"schema_version": self.schema_version} if self.schema_version else {}) | (
            {"lastby": self.lastby} if self.lastby is not None else {})

    def to_bytes(self) -> bytes:
        return RECORD.encode(self.body())

    @classmethod
    def from_bytes(cls, data: bytes, path: str = FILE_NAME) -> "CheckpointRecord":
        d = RECORD.decode(data, path)
        try:
            src = d["source"]
            rec = cls(
                rows=int(d["rows"]),
                files={str(k): int(v) for k, v in d["files"].items()},
                source=SourcePosition(src["file"], int(src["offset"]), int(src.get("skip_rows", 0)),
                                      None if src.get("topic") is None else str(src["topic"]),
                                      None if src.get("topic") is None else int(src["partition"])),
                fingerprint=str(d["fingerprint"]),
                import_state={str(k): int(v) for k, v in (d.get("import_state") or {}).items()},
                time=float(d["time"]),
                schema_version=int(d.get("schema_version", 0)),
                lastby=dict(d["lastby"]) if d.get("lastby") is not None else None,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise CheckpointError(f"{path}: checkpoint record unreadable: {e}") from None
        if rec.schema_version < 0 or rec.rows < 0 or rec.source.offset < 0 or rec.source.skip_rows < 0 \
                or (rec.source.partition or 0) < 0 or any(v < 0 for v in rec.files.values()):
            raise CheckpointError(f"{path}: checkpoint record has a negative count")
        return rec


def read_record(directory: str | os.PathLike[str], fs: FileSystem = OS) -> CheckpointRecord | None:
    """The location's checkpoint; None when there is no ``table.size``."""
    path = os.path.join(directory, FILE_NAME)
    data = read_file(fs, path, MAX_RECORD_BYTES + 1)
    if data is None:
        return None
    if len(data) > MAX_RECORD_BYTES:
        raise CheckpointError(f"{path}: larger than {MAX_RECORD_BYTES} bytes, not a checkpoint record")
    return CheckpointRecord.from_bytes(data, path)


def write_record(directory: str | os.PathLike[str], record: CheckpointRecord, fs: FileSystem = OS) -> None:
    """Atomically replace ``table.size``: write temp, fsync, rename, fsync the directory.  The
    caller has fsynced the column files first."""
    directory = str(directory)
    tmp = os.path.join(directory, TEMP_NAME)
    write_file(fs, tmp, record.to_bytes())
    fs.rename(tmp, os.path.join(directory, FILE_NAME))
    fs.fsync_dir(directory)


def remove_stale_temp(directory: str | os.PathLike[str], fs: FileSystem = OS) -> bool:
    """Remove a ``table.size.tmp`` left by a crash mid-checkpoint (it was never renamed, so it
    was never the record)."""
    try:
        fs.unlink(os.path.join(directory, TEMP_NAME))
        return True
    except FileNotFoundError:
        return False


def to_json(record: CheckpointRecord) -> dict[str, Any]:
    fields: dict[str, Any] = json.loads(record.to_bytes().split(b"\n")[1])
    return fields
