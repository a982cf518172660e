"""The checkpoint record, ``table.size``: what a location guarantees after a crash.

A small text file, readable by people and other programs::

    DISCKPT 1
    {"rows": 1200, "files": {"Price.dat": 9600, ...}, "source": {"file": "...", "offset": 4096, "skip_rows": 0}, ...}
    crc32c 1a2b3c4d

The JSON line holds the committed row count, each column file's size at that count, the source
record (log file name and byte offset just past the last committed row, plus ``skip_rows`` when
that row is inside a frame) and the time.  The last line is the CRC32C of the JSON line, so a
torn or damaged record is detected rather than trusted.

Writing follows the order that makes a crash at any point safe: the column files were fsynced
before this is called; the record goes to ``table.size.tmp``, which is fsynced, renamed over
``table.size``, and the directory fsynced so the rename itself is durable.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from disd.binlog.format import crc32c

FILE_NAME = "table.size"
TEMP_NAME = "table.size.tmp"
MAGIC = "DISCKPT 1"


class CheckpointError(Exception):
    """table.size exists but cannot be trusted."""


@dataclass(frozen=True)
class SourcePosition:
    """Where ingestion of a location resumes: the log file and the byte offset just past the last
    committed row; ``skip_rows`` rows of the frame at that offset are already committed."""

    file_name: str | None
    offset: int
    skip_rows: int = 0


@dataclass(frozen=True)
class CheckpointRecord:
    rows: int
    files: dict[str, int]
    source: SourcePosition
    fingerprint: str
    time: float = field(default_factory=time.time)
    version: int = 1

    def to_bytes(self) -> bytes:
        body = json.dumps(
            {
                "rows": self.rows,
                "files": self.files,
                "source": {"file": self.source.file_name, "offset": self.source.offset,
                           "skip_rows": self.source.skip_rows},
                "fingerprint": self.fingerprint,
                "time": self.time,
            },
            sort_keys=True, separators=(",", ":"),
        ).encode()
        return MAGIC.encode() + b"\n" + body + b"\n" + f"crc32c {crc32c(body):08x}\n".encode()

    @classmethod
    def from_bytes(cls, data: bytes, path: str = FILE_NAME) -> "CheckpointRecord":
        lines = data.split(b"\n")
        if len(lines) < 3 or lines[0] != MAGIC.encode():
            raise CheckpointError(f"{path}: not a checkpoint record (bad first line)")
        body, crc_line = lines[1], lines[2]
        if not crc_line.startswith(b"crc32c ") or crc_line[7:].decode(errors="replace") != f"{crc32c(body):08x}":
            raise CheckpointError(f"{path}: checkpoint record checksum mismatch")
        try:
            d = json.loads(body)
            src = d["source"]
            return cls(
                rows=int(d["rows"]), files={str(k): int(v) for k, v in d["files"].items()},
                source=SourcePosition(src["file"], int(src["offset"]), int(src.get("skip_rows", 0))),
                fingerprint=str(d["fingerprint"]), time=float(d["time"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{path}: checkpoint record unreadable: {e}") from None


def read_record(directory: str) -> CheckpointRecord | None:
    """The location's checkpoint; None when it has never been checkpointed."""
    path = os.path.join(directory, FILE_NAME)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    return CheckpointRecord.from_bytes(data, path)


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileOps:
    """The file-system operations a checkpoint makes, so a test can record or break them."""

    def write_file(self, path: str, data: bytes) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)

    def rename(self, src: str, dst: str) -> None:
        os.rename(src, dst)

    def fsync_dir(self, directory: str) -> None:
        fsync_dir(directory)


def write_record(directory: str, record: CheckpointRecord, ops: FileOps | None = None,
                 before_rename: Callable[[], None] | None = None) -> None:
    ops = ops or FileOps()
    tmp = os.path.join(directory, TEMP_NAME)
    ops.write_file(tmp, record.to_bytes())
    if before_rename is not None:
        before_rename()
    ops.rename(tmp, os.path.join(directory, FILE_NAME))
    ops.fsync_dir(directory)


def to_json(record: CheckpointRecord) -> dict[str, Any]:
    return json.loads(record.to_bytes().split(b"\n")[1])
