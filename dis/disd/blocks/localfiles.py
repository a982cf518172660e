"""The column files of a database root as a block source: ``LocalColumnFiles`` reads them with
``pread`` (on the DIS host or a shared mount) and lists locations at their ``table.size``
checkpoints (``checkpointed_locations``), with no DIS: the rows a checkpoint covers never change.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Self, Sequence

from disd.blocks.protocol import ColumnFileError, LocationSnapshot, Range, Wanted
from disd.config import DEFAULT_BLOCK_SIZE_BYTES
from disd.names import InvalidNameError, LocationKey
from disd.schema import SchemaError, TableSchema
from disd.storage.checkpoint import FILE_NAME as CHECKPOINT_FILE
from disd.storage.checkpoint import CheckpointError, CheckpointRecord, read_record
from disd.storage.engine import location_path, subdirs
from disd.storage.versionstore import VersionStoreError, with_stored_history


@dataclass(frozen=True)
class CheckpointedLocation:
    """An intraday location as its files on disk show it: the rows of its ``table.size``."""

    key: LocationKey
    path: str
    rows: int
    files: dict[str, int] = field(hash=False)
    bytes_past_checkpoint: int = 0  # column file bytes beyond the checkpoint (all of them without one)
    checkpoint_age_s: float | None = None  # since table.size last changed; None without one
    schema_version: int = 0  # the version its files are written in (0: no checkpoint yet)

    def snapshot(self, db_root: str) -> LocationSnapshot:
        return LocationSnapshot(self.key, self.rows, dict(self.files), DEFAULT_BLOCK_SIZE_BYTES, f"file:{db_root}",
                                self.schema_version)


def table_versions(db_root: str, schema: TableSchema) -> TableSchema:
    """``schema`` with the versions the database stores for its table (``schema.versions`` under
    the table's directory): the newest of them, carrying the rest.  What every reader of column
    files without a DIS presents."""
    try:
        return with_stored_history(db_root, schema)
    except (VersionStoreError, SchemaError) as e:
        raise ColumnFileError(f"{schema.key}: {e}") from None


def checkpointed_locations(db_root: str, schema: TableSchema, wanted: Wanted | None = None,
                           now: float | None = None) -> list[CheckpointedLocation]:
    """Every location of ``schema``'s table under ``<db_root>/Intraday`` whose column partition
    ``wanted(value)`` accepts (all when None), at its checkpoint, with the schema version it is
    written in (the table's versions: ``table_versions``).  Read on the DIS host, whether or not
    the DIS runs: only rows a checkpoint covers are taken, and those never change."""
    now = time.time() if now is None else now
    schema = table_versions(db_root, schema)
    base = os.path.join(db_root, "Intraday", schema.namespace, schema.table)
    out = []
    for ip in subdirs(base):
        for value in subdirs(os.path.join(base, ip)):
            if wanted is not None and not wanted(value):
                continue
            try:
                key = LocationKey(schema.namespace, schema.table, ip, value)
            except InvalidNameError:
                continue
            path = location_path(db_root, key)
            if os.path.isdir(path):
                out.append(_checkpointed(key, path, schema, now))
    return sorted(out, key=lambda loc: (loc.key.column_partition, loc.key.internal_partition))


def record_version(key: LocationKey, rec: CheckpointRecord, schema: TableSchema) -> int:
    """The schema version a checkpoint says its location is written in: its ``schema_version``
    (which must be one of ``schema.versions``, with the fingerprint the record names), or, in a
    record written before versions existed (0), the newest version with the record's
    fingerprint.  ColumnFileError when no version of the table matches."""
    versions = schema.versions
    if rec.schema_version:
        found = versions.get(rec.schema_version)
        if found is None:
            raise ColumnFileError(
                f"location {key} was written in schema version {rec.schema_version} of {schema.key}, which the "
                f"database's versions do not hold (known: {', '.join(str(v) for v in versions)}): check the "
                "schemas directory")
        if found.fingerprint != rec.fingerprint:
            raise ColumnFileError(
                f"location {key} was written for schema {rec.fingerprint} (version {rec.schema_version}), but "
                f"{schema.key} version {rec.schema_version} is {found.fingerprint}: check the schemas directory")
        return rec.schema_version
    matching = [v for v, s in versions.items() if s.fingerprint == rec.fingerprint]
    if not matching:
        raise ColumnFileError(f"location {key} was written for schema {rec.fingerprint}, the table's schema is "
                              f"{schema.fingerprint}: check the schemas directory")
    return max(matching)


def _checkpointed(key: LocationKey, path: str, schema: TableSchema, now: float) -> CheckpointedLocation:
    try:
        rec = read_record(path)
    except CheckpointError as e:
        raise ColumnFileError(f"location {key}: {e}") from None
    actual = _sizes(path)
    if rec is None:
        return CheckpointedLocation(key, path, 0, {}, bytes_past_checkpoint=sum(actual.values()))
    version = record_version(key, rec, schema)
    # a file the record counts as empty may be missing: a power cut after a new location's first
    # record and before anything synced its column files' directory entries (the DIS makes them)
    short = [n for n, size in rec.files.items() if actual.get(n, 0) < size]
    if short:
        raise ColumnFileError(f"location {key}: {', '.join(sorted(short))} shorter than its checkpoint "
                              "(run `dis verify`)")
    past = sum(max(0, actual.get(n, 0) - size) for n, size in rec.files.items())
    age = now - os.stat(os.path.join(path, CHECKPOINT_FILE)).st_mtime
    return CheckpointedLocation(key, path, rec.rows, dict(rec.files), past, age, version)


def _sizes(path: str) -> dict[str, int]:
    out = {}
    for e in os.scandir(path):
        if e.is_file() and (e.name.endswith(".dat") or e.name.endswith(".off")):
            out[e.name] = e.stat().st_size
    return out


class LocalColumnFiles:
    """The column files of a database root, read with ``pread``; files are opened on first use
    and closed by ``close``.

    Snapshots listed by a DIS are served at their published sizes (safe: those bytes never
    change); ``locations`` lists at the checkpoints and needs the tables' schemas (``tables``) to
    check them, each with the versions the database stores for it (``table_versions``); each
    snapshot says its location's version.  ``origin`` names the root in errors the way the user
    gave it (default: the path)."""

    def __init__(self, db_root: str, tables: Sequence[TableSchema] = (), origin: str | None = None) -> None:
        self.db_root = db_root
        self.origin = origin or f"database root {db_root}"
        self._tables = {(t.namespace, t.table): t for t in tables}
        self._fds: dict[str, int] = {}

    def locations(self, namespace: str, table: str, wanted: Wanted | None = None) -> list[LocationSnapshot]:
        """Locations with checkpointed rows, at their checkpoints."""
        schema = self._tables.get((namespace, table))
        if schema is None:
            raise ColumnFileError(f"no schema for {namespace}.{table} to read its column files with")
        locs = checkpointed_locations(self.db_root, schema, wanted)
        return [loc.snapshot(self.db_root) for loc in locs if loc.rows > 0]

    def schema(self, schema: TableSchema) -> TableSchema:
        """``schema`` as a read of these files presents it: with the versions stored for its
        table (``table_versions``)."""
        return table_versions(self.db_root, schema)

    def path(self, snap: LocationSnapshot, name: str) -> str:
        if not name or os.path.basename(name) != name or name in (".", ".."):
            raise ColumnFileError(f"{snap.key}: refusing column file name {name!r}")
        return os.path.join(location_path(self.db_root, snap.key), name)

    def read_range(self, snap: LocationSnapshot, file: str, start: int, stop: int) -> bytes:
        """Bytes [start, stop) of a column file, at most its size in ``snap``."""
        stop = min(stop, snap.files.get(file, 0))
        if stop <= start:
            return b""
        path = self.path(snap, file)
        fd = self._fds.get(path)
        if fd is None:
            try:
                fd = self._fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as e:
                raise ColumnFileError(
                    f"{self.origin}: cannot open {path}: {e.strerror} (it must be the DIS's database root "
                    "as seen from every reader)") from None
        data = os.pread(fd, stop - start, start)
        if len(data) != stop - start:
            # A file shorter than its published size: not this DIS's root, or the DIS recovered
            # to an earlier checkpoint after the snapshot was taken.
            raise ColumnFileError(
                f"{snap.key}: {path} holds {start + len(data)} bytes, the DIS published {stop}; "
                f"is {self.origin} the root of the DIS at {snap.address}?")
        return data

    def read_ranges(self, snap: LocationSnapshot, ranges: Sequence[Range]) -> list[bytes]:
        """``read_range`` of each range (a ``pread`` costs the same however it is asked for)."""
        return [self.read_range(snap, f, a, b) for f, a, b in ranges]

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:  # noqa: ANN002
        self.close()
