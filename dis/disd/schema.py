"""Table schemas: the column types, their nulls, and the YAML files that declare them.

A schema file lives at ``config/schemas/<Namespace>.<Table>.yaml``::

    namespace: Market
    table: Trade
    partition_column: Date        # the column-partition column exposed to readers
    columns:
      - {name: Timestamp, type: timestamp}
      - {name: Sym, type: string}

Every type has a null.  In the binary log nulls are a per-row bitmap; in column files
fixed-width types use a sentinel value (the Deephaven convention, see docs/storage-format.md)
and strings a flag bit in their offsets file.  This module owns the facts about each type that
both formats, the decoders and the readers share: width, numpy dtype, Arrow type, sentinel.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import pathlib
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Iterable, Iterator

import numpy as np
import pyarrow as pa
import yaml

from disd.errors import DisError
from disd.names import InvalidNameError, NameKind, validate_name

__all__ = ["Column", "ColumnType", "SchemaError", "TableSchema", "load_schema"]


class ColumnType(str, Enum):
    BOOL = "bool"
    BYTE = "byte"
    SHORT = "short"
    INT = "int"
    LONG = "long"
    FLOAT = "float"
    DOUBLE = "double"
    CHAR = "char"
    STRING = "string"
    TIMESTAMP = "timestamp"

    @property
    def is_fixed_width(self) -> bool:
        return self is not ColumnType.STRING

    @property
    def numpy_dtype(self) -> np.dtype:
        """Little-endian storage dtype (for STRING: the dtype of its length/offset entries)."""
        return _NUMPY[self]

    @property
    def width(self) -> int:
        return _NUMPY[self].itemsize

    @property
    def arrow_type(self) -> pa.DataType:
        """The Arrow type values are held in: what the logger, the binary log, the column files'
        decoder and the DIS's own state use (a char: its uint16 code unit)."""
        return _ARROW[self]

    @property
    def read_arrow_type(self) -> pa.DataType:
        """The Arrow type a reader gets (the client, Spark, merged Parquet): ``arrow_type``, but a
        char as its one-character string (``disd.values.char_strings``)."""
        return pa.string() if self is ColumnType.CHAR else _ARROW[self]

    @property
    def null_sentinel(self) -> Any:
        """The stored value that means null in column files (fixed-width types only)."""
        return _SENTINEL[self]


_NUMPY: dict[ColumnType, np.dtype] = {
    ColumnType.BOOL: np.dtype("i1"),  # 0 false, 1 true, -1 null
    ColumnType.BYTE: np.dtype("i1"),
    ColumnType.SHORT: np.dtype("<i2"),
    ColumnType.INT: np.dtype("<i4"),
    ColumnType.LONG: np.dtype("<i8"),
    ColumnType.FLOAT: np.dtype("<f4"),
    ColumnType.DOUBLE: np.dtype("<f8"),
    ColumnType.CHAR: np.dtype("<u2"),  # one UTF-16 code unit, as Java's char
    ColumnType.STRING: np.dtype("<u4"),  # byte length of the UTF-8 value in the log
    ColumnType.TIMESTAMP: np.dtype("<i8"),  # nanoseconds since the epoch, UTC
}

_ARROW: dict[ColumnType, pa.DataType] = {
    ColumnType.BOOL: pa.bool_(),
    ColumnType.BYTE: pa.int8(),
    ColumnType.SHORT: pa.int16(),
    ColumnType.INT: pa.int32(),
    ColumnType.LONG: pa.int64(),
    ColumnType.FLOAT: pa.float32(),
    ColumnType.DOUBLE: pa.float64(),
    ColumnType.CHAR: pa.uint16(),
    ColumnType.STRING: pa.string(),
    ColumnType.TIMESTAMP: pa.timestamp("ns", tz="UTC"),
}

# Deephaven's null sentinels: the minimum value of each signed integer type, -MAX for floats,
# 0xFFFF for char, -1 for a boolean stored as a byte.
_SENTINEL: dict[ColumnType, Any] = {
    ColumnType.BOOL: np.int8(-1),
    ColumnType.BYTE: np.int8(-(2**7)),
    ColumnType.SHORT: np.int16(-(2**15)),
    ColumnType.INT: np.int32(-(2**31)),
    ColumnType.LONG: np.int64(-(2**63)),
    ColumnType.FLOAT: np.float32(-np.finfo(np.float32).max),
    ColumnType.DOUBLE: np.float64(-np.finfo(np.float64).max),
    ColumnType.CHAR: np.uint16(0xFFFF),
    ColumnType.STRING: None,
    ColumnType.TIMESTAMP: np.int64(-(2**63)),
}


class SchemaValueError(DisError, ValueError):
    """A table schema that cannot be (no columns, a duplicate name, a bad version), or rows stored in
    a version other than the one a reader decodes."""


class UnknownColumnError(DisError, KeyError):
    """A column name a table does not have."""


@dataclass(frozen=True)
class Column:
    name: str
    type: ColumnType
    # The column's name in the previous version of its table, when this version renames it
    # (see disd.schemaversions); not part of equality or of the fingerprint.
    renamed_from: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class TableSchema:
    namespace: str
    table: str
    columns: tuple[Column, ...]
    partition_column: str = "Date"
    source: str | None = field(default=None, compare=False)
    # The schema version this is (``version:`` in the YAML, 1 when absent).  Versions of one
    # table differ in columns; a reader of a table presents its newest version.
    version: int = field(default=1, compare=False)
    # Every earlier version of the table that is known (stored by the database, or carried by a
    # log header), oldest first; empty for a schema read from one YAML file or one log header.
    history: tuple["TableSchema", ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.version, int) or isinstance(self.version, bool) or self.version < 1:
            raise SchemaValueError(f"schema version must be a positive integer, not {self.version!r}")
        validate_name(NameKind.NAMESPACE, self.namespace)
        validate_name(NameKind.TABLE, self.table)
        validate_name(NameKind.COLUMN, self.partition_column)
        if not self.columns:
            raise SchemaValueError("a table needs at least one column")
        seen: set[str] = set()
        for c in self.columns:
            validate_name(NameKind.COLUMN, c.name)
            if c.name in seen:
                raise SchemaValueError(f"duplicate column {c.name!r}")
            seen.add(c.name)
        if self.partition_column in seen:
            raise SchemaValueError(f"partition column {self.partition_column!r} is also a data column")

    @property
    def key(self) -> str:
        """``<Namespace>.<Table>``, the name used in config files."""
        return f"{self.namespace}.{self.table}"

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise UnknownColumnError(f"{self.key} has no column {name!r}")

    def arrow_schema(self) -> pa.Schema:
        """The Arrow schema of the table's data columns (no partition column), as held in memory
        and decoded from column files (``ColumnType.arrow_type``)."""
        return pa.schema([pa.field(c.name, c.type.arrow_type, nullable=True) for c in self.columns])

    def read_arrow_schema(self) -> pa.Schema:
        """``arrow_schema`` as readers get it (``ColumnType.read_arrow_type``: chars as strings)."""
        return pa.schema([pa.field(c.name, c.type.read_arrow_type, nullable=True) for c in self.columns])

    def canonical(self) -> dict[str, Any]:
        """The schema as JSON-able data: what a log header and the DIS's TableInfo carry (not the
        history, which the DIS sends separately)."""
        return {
            "namespace": self.namespace,
            "table": self.table,
            "partition_column": self.partition_column,
            "version": self.version,
            "columns": [{"name": c.name, "type": c.type.value}
                        | ({"renamed_from": c.renamed_from} if c.renamed_from else {}) for c in self.columns],
        }

    @property
    def versions(self) -> dict[int, "TableSchema"]:
        """Every known version of the table by number, this one included."""
        out = {s.version: s for s in self.history}
        out[self.version] = self
        return dict(sorted(out.items()))

    def at_version(self, version: int) -> "TableSchema":
        """The table's schema in ``version``: a SchemaError naming the known versions otherwise."""
        found = self.versions.get(version)
        if found is None:
            known = ", ".join(str(v) for v in self.versions)
            raise SchemaError(self.source or "<schema>", "version",
                              f"{self.key} has no version {version} (known versions: {known})")
        return found

    def with_history(self, earlier: Iterable["TableSchema"]) -> "TableSchema":
        """This schema carrying ``earlier`` versions (each without its own history)."""
        olds = tuple(sorted((dataclasses.replace(s, history=()) for s in earlier if s.version != self.version),
                            key=lambda s: s.version))
        return dataclasses.replace(self, history=olds)

    def history_json(self) -> str:
        """Every version of the table, oldest first, as one JSON list of ``canonical()`` objects."""
        return json.dumps([s.canonical() for s in self.versions.values()], separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_history_json(cls, text: str, source: str = "<json>") -> "TableSchema":
        """The newest version of a ``history_json()`` list, carrying the others."""
        data = json.loads(text)
        if not isinstance(data, list) or not data:
            raise SchemaError(source, "<history>", "must be a non-empty list of schemas")
        schemas = [_parse_schema(d, source) for d in data]
        newest = max(schemas, key=lambda s: s.version)
        return newest.with_history(schemas)

    def to_json(self) -> str:
        return self._json

    @functools.cached_property
    def _json(self) -> str:
        """``to_json``, encoded once per schema (it is immutable): the decoders key their row
        layouts by it, once or twice per chunk ingested."""
        return json.dumps(self.canonical(), separators=(",", ":"), sort_keys=True)

    @functools.cached_property
    def fingerprint(self) -> str:
        """Hex SHA-256 (first 16 bytes) of the ordered column names and types.

        Namespace and table are not part of it: the fingerprint answers "can these bytes be
        decoded as that table's rows", which depends only on the columns.  Computed once per
        schema (it is immutable): the ingest path asks for it several times per new location.
        """
        cols = [[c.name, c.type.value] for c in self.columns]
        digest = hashlib.sha256(json.dumps(cols, separators=(",", ":")).encode()).digest()
        return digest[:16].hex()

    @classmethod
    def from_dict(cls, data: Any, source: str = "<dict>") -> "TableSchema":
        return _parse_schema(data, source)

    @classmethod
    def from_json(cls, text: str, source: str = "<json>") -> "TableSchema":
        return _parse_schema(json.loads(text), source)


def column_differences(table: TableSchema, log: TableSchema) -> str:
    """How a log's columns differ from its table's, for refusals and operators: the columns the
    log adds, those it lacks, those whose type changed, or (same columns) their order.  Empty when
    the fingerprints agree."""
    if table.fingerprint == log.fingerprint:
        return ""
    mine = {c.name: c.type.value for c in table.columns}
    theirs = {c.name: c.type.value for c in log.columns}
    parts = []
    added = [f"{c.name} ({c.type.value})" for c in log.columns if c.name not in mine]
    removed = [f"{c.name} ({c.type.value})" for c in table.columns if c.name not in theirs]
    changed = [f"{c.name} (table {c.type.value}, log {theirs[c.name]})" for c in table.columns
               if c.name in theirs and theirs[c.name] != c.type.value]
    if added:
        parts.append("added " + ", ".join(added))
    if removed:
        parts.append("removed " + ", ".join(removed))
    if changed:
        parts.append("changed type " + ", ".join(changed))
    if not parts:
        parts.append(f"same columns in another order (table {', '.join(table.column_names)}; "
                     f"log {', '.join(log.column_names)})")
    return "; ".join(parts)


class SchemaError(DisError, ValueError):
    """A schema file that cannot be used; the message names the file, the key and the problem."""

    def __init__(self, source: str, key: str, problem: str) -> None:
        super().__init__(f"{source}: {key}: {problem}")
        self.source = source
        self.key = key
        self.problem = problem


def _parse_schema(data: Any, source: str) -> TableSchema:
    if not isinstance(data, dict):
        raise SchemaError(source, "<top>", "must be a mapping with namespace, table and columns")
    unknown = set(data) - {"namespace", "table", "partition_column", "columns", "version"}
    if unknown:
        raise SchemaError(source, sorted(unknown)[0], "unknown key")

    def name(key: str, kind: NameKind, default: str | None = None) -> str:
        if key not in data:
            if default is not None:
                return default
            raise SchemaError(source, key, "missing")
        try:
            return validate_name(kind, data[key])
        except InvalidNameError as e:
            raise SchemaError(source, key, e.reason) from None

    namespace = name("namespace", NameKind.NAMESPACE)
    table = name("table", NameKind.TABLE)
    partition_column = name("partition_column", NameKind.COLUMN, "Date")
    version = data.get("version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise SchemaError(source, "version", f"must be a positive integer, not {version!r}")
    raw_cols = data.get("columns")
    if raw_cols is None:
        raise SchemaError(source, "columns", "missing")
    if not isinstance(raw_cols, list) or not raw_cols:
        raise SchemaError(source, "columns", "must be a non-empty list")
    cols: list[Column] = []
    seen: set[str] = set()
    valid_types = ", ".join(t.value for t in ColumnType)
    for i, rc in enumerate(raw_cols):
        where = f"columns[{i}]"
        if not isinstance(rc, dict):
            raise SchemaError(source, where, "must be a mapping {name: ..., type: ...}")
        extra = set(rc) - {"name", "type", "renamed_from"}
        if extra:
            raise SchemaError(source, f"{where}.{sorted(extra)[0]}", "unknown key")
        if "name" not in rc:
            raise SchemaError(source, f"{where}.name", "missing")
        try:
            cname = validate_name(NameKind.COLUMN, rc["name"])
        except InvalidNameError as e:
            raise SchemaError(source, f"{where}.name", e.reason) from None
        if cname in seen:
            raise SchemaError(source, f"{where}.name", f"duplicate column {cname!r}")
        if cname == partition_column:
            raise SchemaError(source, f"{where}.name", f"{cname!r} is the partition column")
        seen.add(cname)
        if "type" not in rc:
            raise SchemaError(source, f"{where}.type", "missing")
        try:
            ctype = ColumnType(rc["type"])
        except ValueError:
            raise SchemaError(
                source, f"{where}.type", f"unknown type {rc['type']!r} (one of {valid_types})"
            ) from None
        renamed_from = rc.get("renamed_from")
        if renamed_from is not None:
            try:
                renamed_from = validate_name(NameKind.COLUMN, renamed_from)
            except InvalidNameError as e:
                raise SchemaError(source, f"{where}.renamed_from", e.reason) from None
            if renamed_from == cname:
                raise SchemaError(source, f"{where}.renamed_from", "names the column itself")
        cols.append(Column(cname, ctype, renamed_from))
    renames = [c.renamed_from for c in cols if c.renamed_from]
    for i, c in enumerate(cols):
        if c.renamed_from and renames.count(c.renamed_from) > 1:
            raise SchemaError(source, f"columns[{i}].renamed_from",
                              f"{c.renamed_from!r} is renamed into more than one column")
    return TableSchema(namespace, table, tuple(cols), partition_column, source=source, version=version)


def load_schema(path: str | pathlib.Path) -> TableSchema:
    """Load and validate one schema YAML file."""
    path = pathlib.Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise SchemaError(str(path), "<file>", f"cannot read: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SchemaError(str(path), "<yaml>", f"not valid YAML: {e}") from None
    schema = _parse_schema(data, str(path))
    expected = f"{schema.namespace}.{schema.table}.yaml"
    if path.name not in (expected, f"{schema.namespace}.{schema.table}.yml"):
        raise SchemaError(str(path), "<file name>", f"must be named {expected}")
    return schema


class SchemaRegistry:
    """All known table schemas, keyed by ``(namespace, table)``."""

    def __init__(self, schemas: Iterable[TableSchema] = ()) -> None:
        self._by_key: dict[tuple[str, str], TableSchema] = {}
        for s in schemas:
            self.add(s)

    def add(self, schema: TableSchema) -> None:
        key = (schema.namespace, schema.table)
        if key in self._by_key:
            raise SchemaError(schema.source or "<schema>", "table", f"{schema.key} defined twice")
        self._by_key[key] = schema

    @classmethod
    def load_dir(cls, directory: str | pathlib.Path) -> "SchemaRegistry":
        directory = pathlib.Path(directory)
        if not directory.is_dir():
            raise SchemaError(str(directory), "<dir>", "schema directory does not exist")
        files = sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")])
        return cls(load_schema(p) for p in files)

    def get(self, namespace: str, table: str) -> TableSchema | None:
        return self._by_key.get((namespace, table))

    def __iter__(self) -> Iterator[TableSchema]:
        return iter(sorted(self._by_key.values(), key=lambda s: s.key))

    def __len__(self) -> int:
        return len(self._by_key)


def coerce_schema(schema: "TableSchema | str | pathlib.Path") -> TableSchema:
    return schema if isinstance(schema, TableSchema) else load_schema(schema)
