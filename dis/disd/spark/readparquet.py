"""Spark tasks that read historical Parquet: input partitions of row groups, and their read.

Planning (``plan_files``) wraps the groups of row groups ``disd.historical.scan`` packs (from the
files ``disd.historical.discover`` found) into input partitions: every core gets work, a large
file is read by several tasks.  A task (``read_historical``) opens each file with pyarrow, reads
the row groups and columns it needs in ``batchRows``-row batches, fills the columns a path gives
(the partition column, ``K=v`` directories) and casts each column to the exact Arrow type Spark
expects.  A column the definition has but a file lacks is an error naming both: the definition
is the schema.  Except across schema versions: a file merged in an older version of the table
(its ``dis.schema_version`` metadata, or the version whose columns it has) is read in that
version and projected onto the newest (``file_sources``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.datasource import InputPartition

from disd.historical.scan import FilePiece, plan_row_groups
from disd.spark.arrow import Projection
from disd.spark.errors import DisSourceError


@dataclass(frozen=True)
class HistoricalSpec:
    projection: Projection
    batch_rows: int


class HistoricalInputPartition(InputPartition):
    def __init__(self, index: int, pieces: Sequence[FilePiece], spec: HistoricalSpec) -> None:
        super().__init__(index)
        self.index = index
        self.pieces = tuple(pieces)
        self.spec = spec

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.pieces)

    def __repr__(self) -> str:
        return f"HistoricalInputPartition({self.index}: {len(self.pieces)} pieces, {self.rows} rows)"


def plan_files(files: Sequence, spec: HistoricalSpec, rows_per_partition: int,
               min_partitions: int) -> list[HistoricalInputPartition]:
    """Input partitions over ``files`` (``ParquetFileInfo``), balanced by row-group sizes
    (``disd.historical.scan.plan_row_groups``)."""
    return [HistoricalInputPartition(i, pieces, spec)
            for i, pieces in enumerate(plan_row_groups(files, rows_per_partition, min_partitions))]


def _constant(value: str | None, n: int, typ: pa.DataType, column: str, path: str) -> pa.Array:
    if value is None:
        return pa.nulls(n, typ)
    try:
        scalar = pa.array([value], pa.string()).cast(typ)[0]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise DisSourceError(f"{path}: value {value!r} of column {column} in its path is not a {typ}") from None
    return pa.repeat(scalar, n)


def _cast(arr: pa.Array, typ: pa.DataType, column: str, path: str) -> pa.Array:
    if arr.type == typ:
        return arr
    try:
        # Timestamps finer than Spark's microseconds are truncated, as on the intraday path.
        return arr.cast(typ, safe=not pa.types.is_timestamp(typ))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise DisSourceError(f"{path}: column {column} is {arr.type}, cannot read it as {typ}: {e}") from None


#: Parquet key-value metadata a merge writes: the schema version the file's rows are in, and
#: every version of the table then (``TableSchema.history_json()``).
VERSION_KEY, VERSIONS_KEY = b"dis.schema_version", b"dis.schema_versions"


def file_sources(pf: pq.ParquetFile, path: str, table, wanted: Sequence[str]) -> dict[str, str | None]:  # noqa: ANN001
    """For each wanted column of ``table`` (the version the read presents, with the others), the
    column of the file to read it from (None: all null in this file).

    A file with a recorded version (``dis.schema_version``, written by merges) is projected from
    that version (renamed, widened, added columns null), the versions it records completing the
    table's.  A file without one is read by column name; when it lacks a wanted column, the
    newest version of the table whose columns the file has says what it holds (a file merged
    before versions were recorded).  Otherwise a missing column is an error: the definition is
    the schema."""
    from disd.blocks import BlockSourceError, version_projection
    from disd.schema import SchemaError, TableSchema

    names = pf.schema_arrow.names
    meta = pf.schema_arrow.metadata or {}
    raw = meta.get(VERSION_KEY)
    version = None
    if raw is not None:
        try:
            version = int(raw)
            if VERSIONS_KEY in meta:
                recorded = TableSchema.from_history_json(meta[VERSIONS_KEY].decode(), path)
                table = table.with_history([*recorded.versions.values(), *table.versions.values()])
        except (ValueError, SchemaError) as e:
            raise DisSourceError(f"{path}: unreadable schema version metadata: {e}") from None
    elif any(c not in names for c in wanted):
        fits = [v for v, s in table.versions.items() if all(c in names for c in s.column_names)]
        if fits:
            version = max(fits)
    if version is None or version == table.version:
        missing = [c for c in wanted if c not in names]
        if missing:
            raise DisSourceError(f"{path} has no column {missing[0]!r} (its columns: {', '.join(names)}); "
                                 "the table definition lists it")
        return {c: c for c in wanted}
    try:
        sources = version_projection(table, version, wanted, "the file").sources
    except (BlockSourceError, SchemaError, KeyError) as e:
        raise DisSourceError(f"{path}: {e}") from None
    missing = [s for s in sources.values() if s is not None and s not in names]
    if missing:
        raise DisSourceError(f"{path} has no column {missing[0]!r} (its columns: {', '.join(names)}), which its "
                             f"schema version {version} has")
    return sources


def read_historical(part: HistoricalInputPartition) -> Iterator[pa.RecordBatch]:
    spec = part.spec
    proj = spec.projection
    target = proj.arrow_schema()
    table = proj.table()
    for piece in part.pieces:
        values = dict(piece.values)
        try:
            pf = pq.ParquetFile(piece.path)
        except (OSError, pa.ArrowInvalid) as e:
            raise DisSourceError(f"cannot open {piece.path}: {e}") from None
        wanted = []
        for c in proj.columns:
            if c.source not in values and not c.is_partition and c.source not in wanted:
                wanted.append(c.source)
        sources = file_sources(pf, piece.path, table, wanted) if wanted else {}
        want = list(dict.fromkeys(s for s in sources.values() if s is not None))
        counted: Iterator[tuple[pa.RecordBatch | None, int]]  # (the batch read, if any; its rows)
        if want:
            batches = pf.iter_batches(batch_size=spec.batch_rows, row_groups=list(piece.row_groups),
                                      columns=want, use_threads=False)
            counted = ((b, b.num_rows) for b in batches)
        else:  # only path columns or columns this file predates: row counts from the footer
            counted = ((None, min(spec.batch_rows, piece.rows - a)) for a in range(0, piece.rows, spec.batch_rows))
        for batch, n in counted:
            arrays = []
            for c, field in zip(proj.columns, target):
                if c.source in values or c.is_partition:
                    arrays.append(_constant(values.get(c.source), n, field.type, c.source, piece.path))
                elif sources[c.source] is None:
                    arrays.append(pa.nulls(n, field.type))
                else:
                    assert batch is not None  # a column of the file: read (``want``)
                    arrays.append(_cast(batch.column(sources[c.source]), field.type, c.source, piece.path))
            yield pa.RecordBatch.from_arrays(arrays, schema=target)
