"""Rows of a location as a reader presents them: decoded from the bytes a ``BlockSource`` serves,
in the schema version the location is written in, projected onto the reader's columns.

Turning bytes into Arrow arrays is ``disd.storage.columns``'s job alone; the rules of versions
are ``disd.schemaversions``'s.  This module joins the two for one location's rows.
"""

from __future__ import annotations

from typing import Sequence

import pyarrow as pa

from disd.blocks.protocol import BlockSource, BlockSourceError, LocationSnapshot
from disd.schema import TableSchema
from disd.schemaversions import VersionProjection, projection
from disd.storage.columns import DataEnds, read_rows_batched


def read_location(source: BlockSource, schema: TableSchema, snap: LocationSnapshot,
                  columns: Sequence[str] | None = None, start: int = 0, stop: int | None = None,
                  ends: DataEnds | None = None) -> pa.Table:
    """Rows ``[start, stop)`` of one location (at most ``snap.rows``) as a pyarrow Table of
    ``schema``'s columns and Arrow types, decoded by ``disd.storage.columns`` from the bytes
    ``source`` serves.

    ``schema`` is the version a reader presents (the table's newest) carrying the others
    (``TableSchema.history``).  A location written in another version (``snap.schema_version``;
    0 means ``schema``'s own) is decoded in that version, from its files' names then, and only
    the columns the presented ones come from; ``version_projection`` turns those into
    ``schema``'s columns.  A location in ``schema``'s own version is decoded as it is: nothing
    extra on the common path.

    The bytes come in one ``source.read_ranges`` when the read goes to the snapshot's end and
    starts at row 0, or where ``ends`` (this location's ``DataEnds``) knows the string data to
    start; otherwise in two, the second for string data the offsets locate."""
    stop = snap.rows if stop is None else min(stop, snap.rows)
    fetch = lambda ranges: source.read_ranges(snap, ranges)  # noqa: E731
    # The snapshot's sizes cover at least its rows: a read to its end knows every range at once.
    sizes = snap.files if stop == snap.rows else None
    version = snap.schema_version or schema.version
    if version == schema.version:
        return read_rows_batched(schema, columns, start, max(start, stop), fetch, sizes, ends)
    proj = version_projection(schema, version, columns, f"location {snap.key}")
    stored = read_rows_batched(proj.stored, proj.stored_columns, start, max(start, stop), fetch, sizes, ends)
    try:
        return proj.apply(stored)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        # Only a newer location read as an older version narrows (see version_projection).
        raise BlockSourceError(
            f"location {snap.key} (schema version {version}) holds values that do not fit {schema.key} "
            f"version {schema.version}'s types ({e}); read the table in its newest version") from None


def version_projection(schema: TableSchema, version: int, columns: Sequence[str] | None = None,
                       what: str = "a location") -> VersionProjection:
    """How rows stored in ``version`` of ``schema``'s table read as ``schema``'s columns (all, or
    ``columns``): ``disd.schemaversions.projection`` (an older version: renamed, widened, added
    columns null; a newer one, for a reader that started before the table moved on: renamed
    back, narrowed back only where every value fits).  A ``version`` that ``schema.versions``
    does not hold is a BlockSourceError naming ``what``."""
    if version not in schema.versions:
        known = ", ".join(str(v) for v in schema.versions)
        raise BlockSourceError(f"{what} is written in schema version {version} of {schema.key}, which this "
                               f"reader does not know (it knows versions {known}); read again to pick up "
                               "the table's newest version")
    return projection(schema, version, columns)

