"""Finding the Parquet files of a historical table, whatever its layout, and their row groups.

For each layout (``disd.historical.layout.Layout``) the files and the values their paths give:

* ``nested``: ``Partitions/<ip>/<value>/<Table>/*.parquet`` — the partition column is ``<value>``;
  the internal partition is not a column.
* ``splayed``: ``Tables/<Table>/*.parquet`` — no partition column.
* ``parquet:flat``: ``Extended/<Table>/*.parquet`` — no partition column.
* ``parquet:kv``, ``coreplus:hive``: ``Extended/<Table>/<K1>=<v1>/<K2>=<v2>/.../*.parquet`` — each
  ``K=v`` directory gives column ``K`` the value ``v`` (``%XX`` escapes decoded;
  ``__HIVE_DEFAULT_PARTITION__`` is null).  The definition's partition column must be one of the
  keys; other keys fill the data columns of that name.
* ``parquet:metadata``: ``Extended/<Table>/_metadata`` lists every row group and the file
  (relative path) holding it, so no directory is listed; ``K=v`` parts of those paths give values
  as above.  ``_common_metadata``, when present, gives the schema, checked against the definition.

Row-group sizes come from the footers (or ``_metadata``): the planner balances tasks by them.
Names starting with ``.`` or ``_`` are never data.
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass
from typing import Callable
from urllib.parse import unquote

import pyarrow.parquet as pq

from disd.historical.definitions import DefinitionError, TableDefinition
from disd.historical.layout import (
    PARQUET_SUFFIX,
    Layout,
    NamespaceRoot,
    is_hidden,
    nested_locations,
    parquet_files,
)

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
METADATA_FILE = "_metadata"
COMMON_METADATA_FILE = "_common_metadata"

Wanted = Callable[[str], bool]


@dataclass(frozen=True)
class ParquetFileInfo:
    """One data file: its row groups' row counts and the column values its path gives."""

    path: str
    row_groups: tuple[int, ...]  # rows of each row group, in file order
    values: tuple[tuple[str, str | None], ...]  # (column, value) from the path

    @property
    def rows(self) -> int:
        return sum(self.row_groups)

    def value_of(self, column: str) -> str | None:
        return dict(self.values).get(column)


def kv_values(relative_dir: pathlib.PurePath) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for part in relative_dir.parts:
        if "=" in part:
            k, v = part.split("=", 1)
            v = unquote(v)
            out[unquote(k)] = None if v == HIVE_NULL else v
    return out


def _footer_rows(path: pathlib.Path) -> tuple[int, ...]:
    md = pq.read_metadata(path)
    return tuple(md.row_group(i).num_rows for i in range(md.num_row_groups))


def table_files(ns: NamespaceRoot, defn: TableDefinition, wanted: Wanted | None = None) -> list[ParquetFileInfo]:
    """The table's files in row order (locations by value, then internal partition, then name),
    only those whose partition value ``wanted`` accepts."""
    layout = defn.layout
    pc = defn.partition_column
    out: list[ParquetFileInfo] = []
    if layout is Layout.NESTED:
        assert pc is not None  # a nested table has a partition column (``TableDefinition`` checks)
        for loc in nested_locations(ns, defn.table, wanted):
            for f in parquet_files(loc.path):
                out.append(ParquetFileInfo(str(f), _footer_rows(f), ((pc, loc.value),)))
        return out
    if layout is Layout.SPLAYED:
        return [ParquetFileInfo(str(f), _footer_rows(f), ()) for f in parquet_files(ns.splayed_path(defn.table))]
    root = ns.extended_path(defn.table)
    if not root.is_dir():
        raise DefinitionError(f"{defn.key} has layout {layout.value!r} but {root} is not a directory")
    if layout is Layout.PARQUET_FLAT:
        return [ParquetFileInfo(str(f), _footer_rows(f), ()) for f in parquet_files(root)]
    if layout is Layout.PARQUET_METADATA:
        return _metadata_files(root, defn, wanted)
    return _kv_files(root, defn, wanted)


def _keep(values: dict[str, str | None], defn: TableDefinition, where: str, wanted: Wanted | None) -> bool:
    pc = defn.partition_column
    if pc is None:
        return True
    if pc not in values:
        raise DefinitionError(f"{where}: no '{pc}=<value>' directory for the partition column of {defn.key}")
    v = values[pc]
    if v is None:
        raise DefinitionError(f"{where}: the partition column {pc} of {defn.key} is null")
    return wanted is None or wanted(v)


def _relevant(values: dict[str, str | None], defn: TableDefinition) -> tuple[tuple[str, str | None], ...]:
    names = set(defn.column_names) | {defn.partition_column}
    return tuple(sorted((k, v) for k, v in values.items() if k in names))


def _kv_files(root: pathlib.Path, defn: TableDefinition, wanted: Wanted | None) -> list[ParquetFileInfo]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not is_hidden(d))
        rel = pathlib.PurePath(os.path.relpath(dirpath, root))
        files = sorted(f for f in filenames if not is_hidden(f) and f.endswith(PARQUET_SUFFIX))
        if not files:
            continue
        values = kv_values(rel)
        if not _keep(values, defn, dirpath, wanted):
            continue
        for f in files:
            p = pathlib.Path(dirpath) / f
            out.append(ParquetFileInfo(str(p), _footer_rows(p), _relevant(values, defn)))
    return out


def _metadata_files(root: pathlib.Path, defn: TableDefinition, wanted: Wanted | None) -> list[ParquetFileInfo]:
    meta_path = root / METADATA_FILE
    if not meta_path.is_file():
        raise DefinitionError(f"{defn.key} has layout 'parquet:metadata' but {meta_path} does not exist")
    common = root / COMMON_METADATA_FILE
    schema = pq.read_schema(common if common.is_file() else meta_path)
    missing = [c for c in defn.column_names if c not in schema.names]
    md = pq.read_metadata(meta_path)
    order: list[str] = []
    groups: dict[str, list[int]] = {}
    for i in range(md.num_row_groups):
        rg = md.row_group(i)
        rel = rg.column(0).file_path if rg.num_columns else ""
        if not rel:
            raise DefinitionError(f"{meta_path}: row group {i} does not name its file (file_path is empty)")
        if rel not in groups:
            order.append(rel)
            groups[rel] = []
        groups[rel].append(rg.num_rows)
    out = []
    for rel in order:
        values = kv_values(pathlib.PurePosixPath(rel).parent)
        absent = [c for c in missing if c not in values]
        if absent:
            raise DefinitionError(f"{common if common.is_file() else meta_path}: no column {absent[0]!r} "
                                  f"of {defn.key} in the schema or the file paths")
        if not _keep(values, defn, f"{meta_path} ({rel})", wanted):
            continue
        path = (root / rel).resolve()
        if root.resolve() not in path.parents:
            raise DefinitionError(f"{meta_path}: file path {rel!r} points outside {root}")
        out.append(ParquetFileInfo(str(path), tuple(groups[rel]), _relevant(values, defn)))
    return out
