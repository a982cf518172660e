"""The schema version a logger writes, against the logs already in its directory.

A log directory is usually read by one tailer that feeds one DIS: a logger built from a schema
whose change from the logs already there the rules refuse (``disd.schemaversions``) would write
files the DIS can never take.  Refusing at ``build()`` tells the person who made the change, at
once and in the process that made it, instead of a DIS refusal found later in a status page.

Only the newest file of the table (any internal or column partition, any namespace set) is looked
at: one header read, however many files the directory holds.  It stands for the version the
directory was last written in; an older version further back was checked when its successor was
written.  Files whose header is incomplete (just created) or unreadable are passed over (at most
``MAX_FILES_TRIED`` of them): a broken file is the tailer's to report, not a reason to stop
logging.
"""

from __future__ import annotations

import os
import pathlib

from disd.binlog import BinlogError, LogFileName, read_header
from disd.logger.errors import LoggerSchemaError
from disd.schema import TableSchema, column_differences
from disd.schemaversions import SchemaChangeError, check_change

#: How many of the newest files are tried for a readable header before giving up (quietly).
MAX_FILES_TRIED = 8


def newest_logged(log_dir: pathlib.Path, schema: TableSchema) -> tuple[pathlib.Path, TableSchema] | None:
    """(path, header schema) of the newest file of ``schema``'s table in ``log_dir`` whose header
    reads; None when there is none."""
    try:
        names = os.listdir(log_dir)
    except OSError:
        return None
    prefix = f"{schema.namespace}.{schema.table}."
    files = []
    for name in names:
        if name.startswith(prefix):
            parsed = LogFileName.try_parse(name)
            if parsed is not None and parsed.namespace == schema.namespace and parsed.table == schema.table:
                files.append((parsed.sort_key, name))
    files.sort(reverse=True)
    for _, name in files[:MAX_FILES_TRIED]:
        path = log_dir / name
        try:
            header = read_header(path)
        except (OSError, BinlogError):
            continue
        if header is not None:
            return path, header.schema
    return None


def check_log_dir(log_dir: pathlib.Path, schema: TableSchema) -> None:
    """Refuse (LoggerSchemaError) to write ``schema`` into ``log_dir`` when the newest log of the
    table there is in another version and the change between the two (older to newer, whichever
    this logger's is) is not allowed, or is in the same version with other columns."""
    found = newest_logged(log_dir, schema)
    if found is None:
        return
    path, logged = found
    if logged.version == schema.version:
        if logged.fingerprint != schema.fingerprint:
            raise LoggerSchemaError(
                f"{schema.key} version {schema.version}: the log directory holds {path.name}, written in "
                f"version {logged.version} with other columns (fingerprint {logged.fingerprint}, this "
                f"logger's {schema.fingerprint}; the file against this logger: "
                f"{column_differences(schema, logged)}); a changed schema needs a new version number")
        return
    older, newer = sorted((logged, schema), key=lambda s: s.version)
    try:
        check_change(older, newer)
    except SchemaChangeError as e:
        raise LoggerSchemaError(
            f"{e.problem}; this logger writes version {schema.version} of {schema.key} and the log "
            f"directory's newest file of the table, {path.name}, is version {logged.version}") from e
