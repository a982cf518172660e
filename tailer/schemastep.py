"""Schema versions between two consecutive files of a location (docs/tailer.md, "Schema versions").

A stream carries the rows of one schema, named at its ``open``: a file of another fingerprint or
schema version needs a stream of its own.  Before that stream is opened, the change between the
two files' header schemas is checked with ``disd.schemaversions.check_change``, from the lower
version to the higher whichever file comes first (a file of a lower version after a higher one is
a location fed by two logger builds; the rule is the same), and a change the rules refuse stops
the location before the newer file.  Two files of one version number with other columns are not
judged here: the DIS refuses a log that is not its table's, as it did before versions.
"""

from __future__ import annotations

from disd.binlog import CorruptLogError, LogHeader
from disd.schema import TableSchema
from disd.schemaversions import SchemaChangeError, check_change
from disd.tailer.frames import FrameReader
from disd.tailer.watch import LocationFiles, order_of


def schema_of(header: LogHeader) -> tuple[str, int]:
    """What a stream is opened for: a file of another fingerprint or schema version needs its own."""
    return header.fingerprint, header.schema.version


def schema_step_problem(prev_name: str, prev: TableSchema, name: str, new: TableSchema) -> str | None:
    """Why file ``name`` (schema ``new``) may not follow ``prev_name`` (``prev``) in a location, or
    None when it may: a change ``check_change`` allows from the lower version to the higher
    (whichever file comes first).  Files of one version number are not judged here: other columns
    under one number (as in every log written before versions, all version 1) are the DIS's to
    refuse against the table's schema, as they always were."""
    if prev.version == new.version:
        return None
    older, newer = sorted((prev, new), key=lambda s: s.version)
    try:
        check_change(older, newer)
    except SchemaChangeError as e:
        return (f"schema change from {prev_name} (version {prev.version}) to {name} (version {new.version}) "
                f"is not allowed: {e.problem}; the location stops before {name}, its rows kept")
    return None


def header_of(path: str) -> LogHeader | None:
    """A log's header; None while it is incomplete or the file cannot be read.  CorruptLogError
    when it is bad."""
    with FrameReader(path) as r:
        return r.header()


def previous_header(lf: LocationFiles, name: str) -> tuple[str, LogHeader] | None:
    """(name, header) of the newest file before ``name`` whose header reads (a file with an
    unreadable header was never sent, so it does not count as the one before)."""
    k = order_of(name)
    for f in reversed([f for f in lf.files if f.order < k]):
        try:
            header = header_of(f.path)
        except (CorruptLogError, OSError):
            continue
        if header is not None:
            return f.name, header
    return None
