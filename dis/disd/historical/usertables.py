"""User tables: tables under ``<db>/Users/<Namespace>/``, published like merged locations.

* unpartitioned ("splayed"): ``Users/<Namespace>/Tables/<Table>/`` — one location;
* partitioned: ``Users/<Namespace>/Partitions/<InternalPartition>/<Value>/<Table>/`` — one location
  per value of the partition column (a string column, each value a valid name, e.g. a date),
  recorded in ``Users/<Namespace>/MetadataIndex/<Table>.tlmi``;
* the definition ``Users/<Namespace>/Definitions/<Table>.tbl``.

Each location is published like a merged one (``disd.historical.publish``): staged, fsynced, and
made visible by one atomic link switch; ``mode="replace"`` publishes a new version and leaves
the old files to readers that hold them.  Locations of a partitioned write appear one by one
(each whole).  A user namespace may not share its name with a system namespace.

This is the storage half: names, definition, lock, staging and publishing.  The rows come from a
``RowWriter`` that writes Parquet into a staging directory — Spark's, in
``disd.spark.usertables`` (``disd.spark.write_user_table``), which also maps Spark's types to
columns.
"""

from __future__ import annotations

import os
import pathlib
import shutil
from typing import Protocol, Sequence
from urllib.parse import unquote

from disd.errors import DisError
from disd.historical.definitions import DefinitionError, TableDefinition, read_definition, write_definition
from disd.historical.durable import TableLock, current_version, stage_dir, sweep_staging
from disd.historical.index import LocationRecord
from disd.historical.layout import TABLES, Layout, NamespaceRoot, NamespaceType, nested_locations
from disd.historical.publish import publish_location
from disd.names import InvalidNameError, NameKind, validate_name
from disd.schema import Column

MODES = ("error", "replace")


class UserTableError(DisError):
    """A user table that cannot be written as asked; nothing was made visible."""


class RowWriter(Protocol):
    """The rows of a user table, written on demand (inside the table's lock)."""

    def values(self, column: str) -> list[str | None]:
        """The distinct values of the partition column ``column``, sorted."""
        ...

    def write(self, directory: pathlib.Path, partition_by: Sequence[str] = ()) -> None:
        """Parquet files of every row into ``directory`` (which must not exist); with
        ``partition_by``, one ``<column>=<value>`` subdirectory per value."""
        ...


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise UserTableError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")


def user_namespace(db_root: str, namespace: str, table: str, internal_partition: str) -> NamespaceRoot:
    """The user namespace a table goes to, with its names checked and no system namespace of
    the same name."""
    try:
        ns = NamespaceRoot.user(db_root, namespace)
        validate_name(NameKind.TABLE, table)
        validate_name(NameKind.INTERNAL_PARTITION, internal_partition)
    except InvalidNameError as e:
        raise UserTableError(str(e)) from None
    system = NamespaceRoot.system(ns.db_root, namespace)
    if system.path.exists():
        raise UserTableError(f"{namespace} is a system namespace ({system.path}): user tables go elsewhere")
    return ns


def user_definition(namespace: str, table: str, columns: Sequence[Column], partition_column: str | None,
                    sort_by: Sequence[str] = ()) -> TableDefinition:
    try:
        return TableDefinition(namespace, table, NamespaceType.USER, tuple(columns), partition_column,
                               Layout.NESTED if partition_column else Layout.SPLAYED, tuple(sort_by))
    except (DefinitionError, InvalidNameError, ValueError) as e:
        raise UserTableError(str(e)) from None


def publish_user_table(ns: NamespaceRoot, defn: TableDefinition, rows: RowWriter, mode: str,
                       internal_partition: str = "0") -> list[LocationRecord]:
    """Write ``rows`` as ``defn`` under the table's lock; the records of the locations written.
    ``mode="error"`` refuses to touch a location that exists, ``"replace"`` publishes a new
    version of it (readers of the old one keep their files)."""
    with TableLock(ns.lock_path(defn.table)):
        old = read_definition(ns, defn.table)
        partitioned = defn.partition_column is not None
        if old is not None and not old.same_rows_as(defn) and (partitioned or mode != "replace"):
            raise UserTableError(f"user table {defn.key} exists with other columns or partitioning "
                                 f"({ns.definition_path(defn.table)}); "
                                 + ("replace it whole (mode='replace')" if not partitioned
                                    else "write it with the same columns"))
        if not partitioned:
            return [_write_splayed(ns, defn, old, rows, mode)]
        return _write_partitioned(ns, defn, old, rows, mode, internal_partition)


def _write_splayed(ns: NamespaceRoot, defn: TableDefinition, old: TableDefinition | None, rows: RowWriter,
                   mode: str) -> LocationRecord:
    parent = ns.path / TABLES
    sweep_staging(parent, defn.table)
    if current_version(parent, defn.table) is not None and mode == "error":
        raise UserTableError(f"user table {defn.key} exists ({parent / defn.table}); use mode='replace'")
    staging = stage_dir(parent, defn.table)
    try:
        rows.write(staging)
    except Exception:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if old != defn:
        write_definition(ns, defn)
    return publish_location(ns, defn.table, None, parent, staging, "", "", "", {"kind": "spark"},
                            {"sort_by": list(defn.sort_by)}, index=False)


def _write_partitioned(ns: NamespaceRoot, defn: TableDefinition, old: TableDefinition | None, rows: RowWriter,
                       mode: str, internal_partition: str) -> list[LocationRecord]:
    pc = defn.partition_column
    assert pc is not None  # a partitioned table (``publish_user_table``)
    given = rows.values(pc)
    if not given:
        raise UserTableError(f"no rows to write to {defn.key}")
    for v in given:
        if v is None:
            raise UserTableError(f"partition column {pc} has nulls; every row needs a partition value")
        try:
            validate_name(NameKind.COLUMN_PARTITION, v)
        except InvalidNameError as e:
            raise UserTableError(f"partition column {pc}: {e}") from None
    values = [v for v in given if v is not None]  # every one: checked above
    existing = {loc.value: loc for loc in nested_locations(ns, defn.table, set(values).__contains__)}
    elsewhere = [f"{v} (in {loc.internal_partition})" for v, loc in existing.items() if loc.internal_partition != internal_partition]
    if elsewhere:
        raise UserTableError(f"{defn.key}: partitions {', '.join(elsewhere)} live in another internal partition")
    if existing and mode == "error":
        raise UserTableError(f"{defn.key} already has partitions {', '.join(sorted(existing))}; use mode='replace'")
    ip_dir = ns.partitions_dir / internal_partition
    sweep_staging(ip_dir, defn.table)
    staging = stage_dir(ip_dir, defn.table)
    try:
        rows.write(staging, partition_by=[pc])
        by_value = {}
        for entry in os.scandir(staging):
            if entry.is_dir() and entry.name.startswith(pc + "="):
                by_value[unquote(entry.name[len(pc) + 1:])] = entry.path
        if sorted(by_value) != values:
            raise UserTableError(f"Spark wrote partitions {sorted(by_value)}, expected {values}")
        if old != defn:
            write_definition(ns, defn)
        out = []
        for v in values:
            parent = ns.location_parent(internal_partition, v)
            sweep_staging(parent, defn.table)
            out.append(publish_location(ns, defn.table, pc, parent, pathlib.Path(by_value[v]), internal_partition, v, "",
                                        {"kind": "spark"}, {"sort_by": list(defn.sort_by)}))
        return out
    finally:
        shutil.rmtree(staging, ignore_errors=True)
