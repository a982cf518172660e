"""The schema versions a database holds for a table: ``<db_root>/Intraday/<Ns>/<Table>/schema.versions``.

The file lives beside the table's locations (its directories), so the database carries every
version its column files were written in and the operator never keeps that history by hand.
It is a checksummed record (``disd.records``)::

    DISVERSIONS 1
    {"versions": [<schema canonical JSON of version 1>, <of version 2>, ...]}
    crc32c 1a2b3c4d

oldest first, each with its ``version`` and its columns' ``renamed_from``.  It only ever gains
versions (``disd.schemaversions.declare`` / ``admit``), and is replaced as ``table.size`` is: temp
file, fsync, rename, directory fsync.  A table written before versions existed has no file: its
locations' ``table.size`` fingerprints are matched against the declared schema as before.
"""

from __future__ import annotations

import os
import threading

from disd.errors import DisError
from disd.records import RecordFormat
from disd.schema import SchemaError, TableSchema
from disd.schemaversions import admit, check_chain, declare
from disd.storage.fsio import OS, FileSystem, make_dirs, read_file, write_file

FILE_NAME = "schema.versions"
TEMP_NAME = "schema.versions.tmp"
MAX_BYTES = 16 << 20


class VersionStoreError(DisError):
    """``schema.versions`` exists but cannot be trusted (damaged, unknown format)."""


RECORD = RecordFormat("DISVERSIONS", 1, "schema versions record", "schema versions format", VersionStoreError)


def table_dir(db_root: str, namespace: str, table: str) -> str:
    return os.path.join(db_root, "Intraday", namespace, table)


def load(db_root: str, namespace: str, table: str, fs: FileSystem = OS) -> list[TableSchema]:
    """The stored versions of a table, oldest first; empty when none are stored."""
    path = os.path.join(table_dir(db_root, namespace, table), FILE_NAME)
    data = read_file(fs, path, MAX_BYTES + 1)
    if data is None:
        return []
    if len(data) > MAX_BYTES:
        raise VersionStoreError(f"{path}: larger than {MAX_BYTES} bytes, not a schema versions record")
    body = RECORD.decode(data, path)
    try:
        versions = [TableSchema.from_dict(d, path) for d in body["versions"]]
        check_chain(versions)
    except (KeyError, TypeError, SchemaError) as e:
        raise VersionStoreError(f"{path}: schema versions record unreadable: {e}") from None
    if len({v.version for v in versions}) != len(versions) or any(
            (v.namespace, v.table) != (namespace, table) for v in versions):
        raise VersionStoreError(f"{path}: schema versions record is not {namespace}.{table}'s")
    return sorted(versions, key=lambda s: s.version)


def save(db_root: str, versions: list[TableSchema], fs: FileSystem = OS) -> None:
    """Replace the table's record with ``versions`` (temp, fsync, rename, directory fsync)."""
    first = versions[0]
    directory = table_dir(db_root, first.namespace, first.table)
    make_dirs(fs, directory)
    tmp = os.path.join(directory, TEMP_NAME)
    write_file(fs, tmp, RECORD.encode({"versions": [v.canonical() for v in versions]}))
    fs.rename(tmp, os.path.join(directory, FILE_NAME))
    fs.fsync_dir(directory)


class VersionStore:
    """The versions of every table of one database root, as the DIS sees them: the newest
    declared schema of each table carries its history (``TableSchema.history``).

    ``declare`` is called with each YAML schema when the DIS starts (or reloads); ``admit`` when a
    log header shows a version the DIS has not stored.  Both persist before returning, so a
    location is never written in a version the database does not remember.
    """

    def __init__(self, db_root: str, fs: FileSystem = OS) -> None:
        self.db_root = db_root
        self.fs = fs
        self._lock = threading.Lock()
        self._tables: dict[tuple[str, str], TableSchema] = {}

    def declare(self, declared: TableSchema) -> TableSchema:
        """Record ``declared`` as the table's newest version; the schema with its history."""
        with self._lock:
            stored = load(self.db_root, declared.namespace, declared.table, self.fs)
            versions = declare(stored, declared)
            if len(versions) != len(stored):
                save(self.db_root, versions, self.fs)
            newest = declared.with_history(versions)
            self._tables[(declared.namespace, declared.table)] = newest
            return newest

    def admit(self, logged: TableSchema) -> TableSchema:
        """Make the version a log header carries known (inserting an older, allowed version the
        database never stored); the table's newest schema with its history.  SchemaError when
        the version conflicts or is newer than the declared one."""
        with self._lock:
            newest = self._tables[(logged.namespace, logged.table)]
            stored = list(newest.versions.values())
            versions = admit(stored, logged)
            if len(versions) != len(stored):
                save(self.db_root, versions, self.fs)
                newest = newest.with_history(versions)
                self._tables[(logged.namespace, logged.table)] = newest
            return newest

    def get(self, namespace: str, table: str) -> TableSchema | None:
        with self._lock:
            return self._tables.get((namespace, table))


def with_stored_history(db_root: str, schema: TableSchema, fs: FileSystem = OS) -> TableSchema:
    """``schema`` carrying the versions stored for its table (for offline readers: merge from
    column files, ``dis verify``).  A stored version newer than ``schema`` makes the newest one
    presented; it carries the rest."""
    stored = load(db_root, schema.namespace, schema.table, fs)
    if not stored:
        return schema
    newest = max([*stored, schema], key=lambda s: s.version)
    return newest.with_history([*stored, schema])


class LocationVersionError(DisError):
    """A location's ``table.size`` names a schema version (or fingerprint) the table does not
    have: its column files cannot be read, so it needs an operator."""


def location_schema(newest: TableSchema, schema_version: int, fingerprint: str) -> TableSchema:
    """The version of the table a location's checkpoint record was written in.

    ``schema_version`` is the record's ``schema_version`` (0 in records written before schema
    versions: then the version whose fingerprint equals the record's, the newest of them if
    several versions share their columns).  The version's fingerprint must equal the record's:
    a record that says version 2 with version 1's columns is damage, not a reason to guess.
    """
    versions = newest.versions
    known = ", ".join(f"{v} ({s.fingerprint})" for v, s in versions.items())
    if schema_version:
        schema = versions.get(schema_version)
        if schema is None:
            raise LocationVersionError(
                f"table.size was written in schema version {schema_version} of {newest.key}, which the database "
                f"does not hold (known versions: {known}); restore the table's schema.versions, or declare that "
                "version")
        if schema.fingerprint != fingerprint:
            raise LocationVersionError(
                f"table.size says schema version {schema_version} but fingerprint {fingerprint}; version "
                f"{schema_version} of {newest.key} has fingerprint {schema.fingerprint}")
        return schema
    matching = [s for s in versions.values() if s.fingerprint == fingerprint]
    if not matching:
        raise LocationVersionError(
            f"table.size was written for schema fingerprint {fingerprint}, which is no version of {newest.key} "
            f"(the table's schema is now {newest.fingerprint}; known versions: {known})")
    return matching[-1]
