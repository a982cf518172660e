"""Publishing one location: from a writer's output directory to files every reader may see.

A Spark job (a merge, a user-table write) writes Parquet into a hidden staging directory next to
the location (``durable.stage_dir``).  ``publish_location`` then, with the table's lock held:

1. ``finalize`` — keeps the writer's ``part-*.parquet`` files, renamed ``part-00000.parquet``,
   ``part-00001.parquet``, ... in the writer's order (row order), and removes its markers
   (``_SUCCESS``, ``.crc`` files, ``_temporary``); reads each footer's row count and computes each
   file's CRC32C;
2. writes the location's manifest (``_dis_manifest.json``) and fsyncs every file and the
   directory (``sealed``);
3. renames the staging directory to a new hidden version directory (``renamed``);
4. points the location's link at it with one atomic rename (``linked``): readers now see it;
5. records it in the table's ``MetadataIndex/<Table>.tlmi`` (``indexed``).

A process killed before step 4 leaves nothing a reader can see (staging and unlinked versions
are hidden names); killed after it, readers see the whole new version, and a re-run finds it and
only repairs the index.  Files of an earlier version are never touched.  ``on_step`` is called
after each named step (a test kills the process there).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import time
from typing import Any, Callable

import pyarrow.parquet as pq

from disd.errors import DisError
from disd.historical.durable import current_version, rename_dir, seal, switch_link, version_name
from disd.historical.index import (
    FileRecord,
    LocationRecord,
    MetadataIndexError,
    TableIndex,
    file_crc32c,
    read_index,
    read_manifest,
    write_index,
    write_manifest,
)
from disd.historical.layout import PARQUET_SUFFIX, NamespaceRoot, nested_locations
from disd.historical.parquet import stamp

Step = Callable[[str], None]
STEPS = ("finalized", "sealed", "renamed", "linked", "indexed")


class OutputError(DisError):
    """The writer's output is not what a location needs (no data file, an unreadable footer)."""


def finalize(staging: pathlib.Path, metadata: dict[str, str] | None = None,
             compression: str = "snappy") -> list[FileRecord]:
    """Rename the writer's data files to ``part-NNNNN.parquet`` in order, drop everything else,
    add ``metadata`` to each file's key-value metadata (``disd.historical.parquet.stamp``: a merge
    records the schema version there) and describe the files (rows from the footers, sizes,
    CRC32C)."""
    parts = []
    for e in sorted(os.scandir(staging), key=lambda e: e.name):
        if e.is_file() and e.name.startswith("part-") and e.name.endswith(PARQUET_SUFFIX):
            parts.append(e.name)
        elif e.is_dir(follow_symlinks=False):
            shutil.rmtree(e.path)  # _temporary of the output committer: empty after a commit
        else:
            os.unlink(e.path)  # _SUCCESS, .part-*.crc (Hadoop's local checksums of old names)
    if not parts:
        raise OutputError(f"{staging}: the writer produced no Parquet file")
    names = [f"part-{i:05d}{PARQUET_SUFFIX}" for i in range(len(parts))]
    if parts != names:
        for i, old in enumerate(parts):  # via temporary names: an old name may be a new one
            os.rename(staging / old, staging / f".renaming-{i:05d}")
        for i, new in enumerate(names):
            os.rename(staging / f".renaming-{i:05d}", staging / new)
    out = []
    for name in names:
        path = staging / name
        if metadata:
            try:
                stamp(path, metadata, compression)
            except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds for a bad file
                raise OutputError(f"{path}: cannot record {', '.join(metadata)} in it: {e}") from None
        try:
            rows = pq.read_metadata(path).num_rows
        except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds for a bad footer
            raise OutputError(f"{path}: unreadable Parquet footer: {e}") from None
        out.append(FileRecord(name, rows, path.stat().st_size, file_crc32c(path)))
    return out


def publish_location(ns: NamespaceRoot, table: str, partition_column: str | None, parent: pathlib.Path,
                     staging: pathlib.Path, internal_partition: str, value: str, identity: str,
                     source: dict[str, Any], settings: dict[str, Any], index: bool = True,
                     files: list[FileRecord] | None = None, on_step: Step | None = None) -> LocationRecord:
    """Steps 1-5 of the module docstring for ``<parent>/<table>`` (step 1 done already when
    ``files`` is given); the caller holds the table's lock.  Returns the location's record."""
    step = on_step or (lambda name: None)
    current_version(parent, table)  # refuses early when something foreign is in the way
    if files is None:
        files = finalize(staging)
        step("finalized")
    version = version_name(table)
    rec = LocationRecord(internal_partition, value, version, sum(f.rows for f in files), tuple(files), identity,
                         source, settings, time.time())
    manifest = write_manifest(staging, rec)
    seal(staging, [staging / f.name for f in files] + [manifest])
    step("sealed")
    rename_dir(staging, parent / version)
    step("renamed")
    switch_link(parent, table, version)
    step("linked")
    if index:
        record_in_index(ns, table, partition_column, rec)
        step("indexed")
    return rec


def record_in_index(ns: NamespaceRoot, table: str, partition_column: str | None, rec: LocationRecord) -> None:
    """Put ``rec`` into the table's index, replacing the record of its column partition."""
    path = ns.index_path(table)
    try:
        idx = read_index(path) or TableIndex(ns.namespace, table, partition_column)
    except MetadataIndexError:
        idx = rebuild_index(ns, table, partition_column)  # derived data: rebuilt, never trusted damaged
    if rec not in idx.locations:
        write_index(path, idx.with_location(rec))


def rebuild_index(ns: NamespaceRoot, table: str, partition_column: str | None) -> TableIndex:
    """The index as the linked locations' manifests describe them."""
    records = []
    for loc in nested_locations(ns, table):
        rec = read_manifest(loc.path)
        if rec is not None:
            records.append(rec)
    return TableIndex(ns.namespace, table, partition_column,
                      tuple(sorted(records, key=lambda r: (r.value, r.internal_partition))))
