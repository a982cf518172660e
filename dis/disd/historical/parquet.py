"""How dis writes Parquet from Spark (merges and user tables alike).

One place for the writer settings every historical file shares: INT64 ``TIMESTAMP(MICROS, UTC)``
timestamps rather than Spark's default INT96 (which other readers treat as legacy), the row-group
limits in rows (``parquet.block.row.count.limit``) and bytes (``parquet.block.size``), a cap on
rows per file, the codec, and no ``_SUCCESS`` marker.  The output goes to a staging directory
(a ``file://`` URI: the database root is a local or shared POSIX filesystem, whatever Spark's
default filesystem is) that ``disd.historical.publish`` turns into a location, recording the
schema version of the rows in each file's metadata on the way (``stamp``).
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass
from typing import Sequence

from disd.errors import DisError

TIMESTAMP_CONF = "spark.sql.parquet.outputTimestampType"


class ParquetSettingsError(DisError, ValueError):
    """A Parquet setting out of range; the message names it."""


@dataclass(frozen=True)
class ParquetSettings:
    row_group_rows: int = 1_000_000
    row_group_bytes: int = 128 << 20
    max_rows_per_file: int = 10_000_000
    compression: str = "snappy"

    def __post_init__(self) -> None:
        for name in ("row_group_rows", "row_group_bytes", "max_rows_per_file"):
            if getattr(self, name) < 1:
                raise ParquetSettingsError(f"{name} must be at least 1, got {getattr(self, name)}")


def write_parquet(df, directory: os.PathLike[str] | str, settings: ParquetSettings,  # noqa: ANN001
                  partition_by: Sequence[str] = ()) -> None:
    """Write ``df`` as Parquet into ``directory`` (which must not exist)."""
    spark = df.sparkSession
    before = spark.conf.get(TIMESTAMP_CONF, None)
    spark.conf.set(TIMESTAMP_CONF, "TIMESTAMP_MICROS")
    try:
        w = (df.write.mode("errorifexists")
             .option("compression", settings.compression)
             .option("parquet.block.size", str(settings.row_group_bytes))
             .option("parquet.block.row.count.limit", str(settings.row_group_rows))
             .option("maxRecordsPerFile", str(settings.max_rows_per_file))
             .option("mapreduce.fileoutputcommitter.marksuccessfuljobs", "false"))
        if partition_by:
            w = w.partitionBy(*partition_by)
        w.parquet(pathlib.Path(os.path.abspath(directory)).as_uri())
    finally:
        if before is None:
            spark.conf.unset(TIMESTAMP_CONF)
        else:
            spark.conf.set(TIMESTAMP_CONF, before)


def stamp(path: os.PathLike[str] | str, metadata: dict[str, str], compression: str = "snappy") -> None:
    """Add ``metadata`` to the key-value metadata of the Parquet file at ``path`` (replaced through
    a temporary file beside it).  Spark's writer takes no file metadata of ours, so a merge's
    files are rewritten once by pyarrow, row group by row group (the same row groups, types and
    codec), keeping Spark's own keys."""
    import pyarrow.parquet as pq

    path = pathlib.Path(path)
    pf = pq.ParquetFile(path)
    schema = pf.schema_arrow
    merged = {**(schema.metadata or {}), **{k.encode(): v.encode() for k, v in metadata.items()}}
    codec = "none" if compression in ("none", "uncompressed") else compression
    tmp = path.with_name(f".stamping-{path.name}")
    try:
        with pq.ParquetWriter(tmp, schema.with_metadata(merged), compression=codec) as w:
            for i in range(pf.num_row_groups):
                group = pf.read_row_group(i)
                w.write_table(group, row_group_size=max(1, group.num_rows))
        os.replace(tmp, path)
    finally:
        pf.close()
        if tmp.exists():
            tmp.unlink()
