"""The table definition file, ``Definitions/<Table>.tbl``: what a historical table's rows are.

Every historical table has one, in its namespace (system or user).  Readers take the columns,
their types, the partitioning column and the layout from it, never from the Parquet files, so a
file that disagrees is an error rather than a silent change of schema.  JSON::

    {"format": "dis-table-definition", "version": 1,
     "namespace": "Market", "table": "Trade", "namespace_type": "system",
     "columns": [{"name": "Timestamp", "type": "timestamp"}, {"name": "Sym", "type": "string"}, ...],
                                            # a column may say "renamed_from" (disd.schemaversions)
     "partition_column": "Date",            # null for an unpartitioned table
     "layout": "nested",                    # see disd.historical.layout.Layout
     "sort_by": ["Sym", "Timestamp"],       # the order merges write rows in (may be empty)
     "schema_version": 2}                   # the table's schema version (absent: 1)

Column types are the DIS's (``disd.schema.ColumnType``); a merge copies them from the table's
DIS schema, ``write_user_table`` maps them from the DataFrame's Spark types.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass
from typing import Any, Iterable

from disd.errors import DisError
from disd.historical.durable import write_atomic
from disd.historical.layout import Layout, NamespaceRoot, NamespaceType
from disd.names import InvalidNameError, NameKind, validate_name
from disd.schema import Column, ColumnType, TableSchema

FORMAT = "dis-table-definition"
VERSION = 1
#: The partition column of the TableSchema that stands for an unpartitioned table (never shown).
NO_PARTITION = "__dis_no_partition"


class DefinitionValueError(DisError, ValueError):
    """A field of a definition that is out of range; ``TableDefinition.from_dict`` reports it as a
    ``DefinitionError`` naming the file."""


class DefinitionError(DisError):
    """A definition file that is missing, damaged or contradicts the data or the request."""


@dataclass(frozen=True)
class TableDefinition:
    namespace: str
    table: str
    namespace_type: NamespaceType
    columns: tuple[Column, ...]
    partition_column: str | None
    layout: Layout
    sort_by: tuple[str, ...] = ()
    # The schema version of the table these columns are (a merge writes its intraday schema's
    # version; 1 for definitions written before versions, and for user tables).
    schema_version: int = 1

    def __post_init__(self) -> None:
        where = f"definition of {self.namespace}.{self.table}"
        try:
            validate_name(NameKind.NAMESPACE, self.namespace)
            validate_name(NameKind.TABLE, self.table)
            for c in self.columns:
                validate_name(NameKind.COLUMN, c.name)
            if self.partition_column is not None:
                validate_name(NameKind.COLUMN, self.partition_column)
        except InvalidNameError as e:
            raise DefinitionError(f"{where}: {e}") from None
        if not self.columns:
            raise DefinitionError(f"{where}: no columns")
        names = [c.name for c in self.columns]
        if len(set(names)) != len(names):
            raise DefinitionError(f"{where}: a column is named twice")
        if self.partition_column in names:
            raise DefinitionError(f"{where}: partition column {self.partition_column!r} is also a data column")
        if NO_PARTITION in names:
            raise DefinitionError(f"{where}: {NO_PARTITION!r} is a reserved column name")
        if self.layout is Layout.NESTED and self.partition_column is None:
            raise DefinitionError(f"{where}: layout 'nested' needs a partition column")
        if self.layout in (Layout.SPLAYED, Layout.PARQUET_FLAT) and self.partition_column is not None:
            raise DefinitionError(f"{where}: layout {self.layout.value!r} has no partition column")
        for s in self.sort_by:
            if s not in names:
                raise DefinitionError(f"{where}: sort column {s!r} is not a data column")

    @property
    def key(self) -> str:
        return f"{self.namespace}.{self.table}"

    @property
    def partitioned(self) -> bool:
        return self.partition_column is not None

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    def table_schema(self) -> TableSchema:
        """The columns as a ``TableSchema`` (what the Spark type mapping takes).  An
        unpartitioned table gets the reserved partition column ``NO_PARTITION``, which readers
        never put in their schema."""
        return TableSchema(self.namespace, self.table, self.columns, self.partition_column or NO_PARTITION,
                           version=self.schema_version)

    def output_columns(self) -> tuple[str, ...]:
        """The columns a reader shows by default: the data columns, then the partition column."""
        return tuple(self.column_names + ([self.partition_column] if self.partition_column else []))

    def same_rows_as(self, other: "TableDefinition") -> bool:
        """Whether both describe rows the same way (columns, types, partitioning)."""
        return (self.columns, self.partition_column) == (other.columns, other.partition_column)

    @classmethod
    def from_schema(cls, schema: TableSchema, namespace_type: NamespaceType = NamespaceType.SYSTEM,
                    layout: Layout = Layout.NESTED, sort_by: tuple[str, ...] = ()) -> "TableDefinition":
        columns = tuple(schema.columns)  # with renamed_from: how the version follows the one before
        return cls(schema.namespace, schema.table, namespace_type, columns, schema.partition_column,
                   layout, tuple(sort_by), schema.version)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "version": VERSION,
            "namespace": self.namespace, "table": self.table, "namespace_type": self.namespace_type.value,
            "columns": [{"name": c.name, "type": c.type.value}
                        | ({"renamed_from": c.renamed_from} if c.renamed_from else {}) for c in self.columns],
            "partition_column": self.partition_column, "layout": self.layout.value, "sort_by": list(self.sort_by),
        } | ({"schema_version": self.schema_version} if self.schema_version != 1 else {})

    def to_bytes(self) -> bytes:
        return (json.dumps(self.to_dict()) + "\n").encode()

    @classmethod
    def from_dict(cls, d: Any, where: str) -> "TableDefinition":
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise DefinitionError(f"{where}: not a table definition (no \"format\": \"{FORMAT}\")")
        if d.get("version") != VERSION:
            raise DefinitionError(f"{where}: unsupported definition version {d.get('version')!r} (reads {VERSION})")
        try:
            cols = tuple(Column(str(c["name"]), ColumnType(c["type"]),
                                str(c["renamed_from"]) if c.get("renamed_from") else None) for c in d["columns"])
            layout = Layout(d.get("layout", Layout.NESTED.value))
            kind = NamespaceType(d.get("namespace_type", NamespaceType.SYSTEM.value))
            version = d.get("schema_version", 1)
            if not isinstance(version, int) or isinstance(version, bool) or version < 1:
                raise DefinitionValueError(f"schema_version must be a positive integer, not {version!r}")
            return cls(str(d["namespace"]), str(d["table"]), kind, cols, d.get("partition_column"), layout,
                       tuple(d.get("sort_by") or ()), version)
        except (KeyError, TypeError, ValueError) as e:
            raise DefinitionError(f"{where}: unreadable definition: {e!r} (types: "
                                  f"{', '.join(t.value for t in ColumnType)}; layouts: "
                                  f"{', '.join(layout.value for layout in Layout)})") from None


def with_versions(defn: TableDefinition, versions: Iterable[TableSchema] | None = None,
                  db_root: str | None = None) -> TableSchema:
    """The schema historical reads of ``defn``'s table present: the newest known version of the
    table, carrying the others, so files merged in an older version are projected onto it.

    The versions are ``versions`` when given (a DIS's or the schemas directory's), else those the
    database under ``db_root`` stores for the intraday table (``disd.storage.versionstore``).
    They are used only when they agree with the definition (the definition's version, with the
    same columns, is one of them): an unpartitioned table, a user table or a table whose
    intraday schema has nothing in common with it is just the definition's columns."""
    schema = defn.table_schema()
    if not defn.partitioned:
        return schema
    if versions is None:
        if not db_root:
            return schema
        from disd.storage.versionstore import VersionStoreError, load

        try:
            versions = load(db_root, defn.namespace, defn.table)
        except VersionStoreError as e:
            raise DefinitionError(f"{defn.key}: {e}") from None
    known = {s.version: s for s in versions if s.partition_column == defn.partition_column}
    same = known.get(schema.version)
    if same is None or tuple(same.columns) != tuple(schema.columns):
        return schema
    known[schema.version] = same
    newest = known[max(known)]
    return newest.with_history(known.values())


def read_definition(ns: NamespaceRoot, table: str) -> TableDefinition | None:
    path = ns.definition_path(table)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise DefinitionError(f"{path}: not JSON: {e}") from None
    defn = TableDefinition.from_dict(d, str(path))
    if (defn.namespace, defn.table, defn.namespace_type) != (ns.namespace, table, ns.kind):
        raise DefinitionError(f"{path}: describes {defn.namespace_type.value} table {defn.key}, "
                              f"not {ns.kind.value} table {ns.namespace}.{table}")
    return defn


def write_definition(ns: NamespaceRoot, defn: TableDefinition) -> pathlib.Path:
    path = ns.definition_path(defn.table)
    write_atomic(path, defn.to_bytes())
    return path


def find_definition(db_root: str, namespace: str, table: str) -> tuple[NamespaceRoot, TableDefinition]:
    """The definition of ``namespace.table`` in the system namespace, else the user namespace."""
    for ns in (NamespaceRoot.system(db_root, namespace), NamespaceRoot.user(db_root, namespace)):
        defn = read_definition(ns, table)
        if defn is not None:
            return ns, defn
    raise DefinitionError(
        f"no historical table {namespace}.{table} under {db_root}: neither "
        f"{NamespaceRoot.system(db_root, namespace).definition_path(table)} nor "
        f"{NamespaceRoot.user(db_root, namespace).definition_path(table)} exists")
