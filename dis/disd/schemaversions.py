"""Schema versions: which changes a table may go through, and how rows of one version read as
another.  The rules are specified in docs/schema-versions.md; this module is their one home.

A table's versions form a chain ordered by version number.  Between two consecutive versions a
column is *kept* (same name), *renamed* (the newer column says ``renamed_from: <old name>``),
*added* (it has no origin: rows of the older version read it as null), or *dropped* (no newer
column comes from it: the older rows' values are not presented).  A kept or renamed column may
*widen* its type where no value changes (``WIDENINGS``); every other type change is refused.

Why a chain and not a per-column id: the YAML an operator edits only describes the newest
version, and a log header only its own; both name columns, so names plus ``renamed_from`` are
all a program can know.  Composing the steps gives the origin of every newest column in any
older version, which is all a reader needs (``origins``, ``project``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from disd.schema import ColumnType, SchemaError, TableSchema, column_differences

# Type changes that keep every value (and null) exactly: integers to wider integers, float to
# double.  Readers convert older values with an exact cast.
WIDENINGS: dict[ColumnType, frozenset[ColumnType]] = {
    ColumnType.BYTE: frozenset({ColumnType.SHORT, ColumnType.INT, ColumnType.LONG}),
    ColumnType.SHORT: frozenset({ColumnType.INT, ColumnType.LONG}),
    ColumnType.INT: frozenset({ColumnType.LONG}),
    ColumnType.FLOAT: frozenset({ColumnType.DOUBLE}),
}


def widens(old: ColumnType, new: ColumnType) -> bool:
    """True when ``old`` values may be presented as ``new`` (the same type, or a widening)."""
    return old is new or new in WIDENINGS.get(old, frozenset())


class SchemaChangeError(SchemaError):
    """A change between two versions of a table that the rules do not allow; names the table,
    both versions and the column."""

    def __init__(self, table: str, old_version: int, new_version: int, column: str, problem: str,
                 source: str = "<schema>") -> None:
        self.table = table
        self.old_version = old_version
        self.new_version = new_version
        self.column = column
        super().__init__(source, f"columns.{column}",
                         f"{table} version {old_version} -> {new_version}: column {column!r}: {problem}")


def step_origins(old: TableSchema, new: TableSchema) -> dict[str, str | None]:
    """For each column of ``new``, the name of the column of ``old`` it comes from (None: added).

    A column that says ``renamed_from: X`` comes from ``X`` when ``old`` has ``X``; otherwise a
    column comes from the ``old`` column of the same name, unless that one was renamed into
    another column (a swap of two names is two renames).
    """
    old_names = set(old.column_names)
    out: dict[str, str | None] = {}
    taken: set[str] = set()
    for c in new.columns:
        if c.renamed_from and c.renamed_from in old_names:
            out[c.name] = c.renamed_from
            taken.add(c.renamed_from)
    for c in new.columns:
        if c.name not in out:
            out[c.name] = c.name if c.name in old_names and c.name not in taken else None
    return {c.name: out[c.name] for c in new.columns}


def check_change(old: TableSchema, new: TableSchema) -> None:
    """Refuse (SchemaChangeError) a step from ``old`` to ``new`` that the rules do not allow."""
    if old.key != new.key:
        raise SchemaChangeError(new.key, old.version, new.version, "<table>", f"is another table than {old.key}",
                                new.source or "<schema>")
    src = new.source or "<schema>"
    if old.partition_column != new.partition_column:
        raise SchemaChangeError(new.key, old.version, new.version, new.partition_column,
                                f"the partition column changed from {old.partition_column!r}; it cannot change",
                                src)
    origins = step_origins(old, new)
    for c in new.columns:
        origin = origins[c.name]
        if origin is None:
            if c.renamed_from and c.name not in old.column_names:
                raise SchemaChangeError(new.key, old.version, new.version, c.name,
                                        f"renamed_from {c.renamed_from!r} names no column of version "
                                        f"{old.version} (its columns: {', '.join(old.column_names)})", src)
            continue
        was = old.column(origin).type
        if not widens(was, c.type):
            what = f"{origin!r} ({was.value})" if origin != c.name else f"type {was.value}"
            kind = "narrows" if c.type in _narrower(was) else "changes"
            raise SchemaChangeError(new.key, old.version, new.version, c.name,
                                    f"{what} in version {old.version} cannot become {c.type.value} in version "
                                    f"{new.version}: the change {kind} its values ({_allowed(was)})", src)


def _narrower(t: ColumnType) -> frozenset[ColumnType]:
    return frozenset(o for o, wider in WIDENINGS.items() if t in wider)


def _allowed(t: ColumnType) -> str:
    wider = sorted(w.value for w in WIDENINGS.get(t, ()))
    if not wider:
        return f"a {t.value} column keeps its type"
    return f"a {t.value} column may only widen to {' or '.join(wider)}"


def check_chain(versions: Iterable[TableSchema]) -> None:
    """Every consecutive step of ``versions`` (any order; sorted by version) is allowed."""
    ordered = sorted(versions, key=lambda s: s.version)
    for old, new in zip(ordered, ordered[1:]):
        check_change(old, new)


def origins(newest: TableSchema, version: int) -> dict[str, str | None]:
    """For each column of ``newest``, its name in ``version`` of the table (None: the column did
    not exist then, and rows of that version read it as null).  ``newest.history`` must hold
    ``version``; the origin is composed step by step through every known version between."""
    chain = [s for v, s in newest.versions.items() if version <= v <= newest.version]
    if not chain or chain[0].version != version:
        newest.at_version(version)  # raises naming the known versions
    current: dict[str, str | None] = {c: c for c in chain[-1].column_names}
    for old, new in reversed(list(zip(chain, chain[1:]))):
        step = step_origins(old, new)
        current = {name: (None if via is None else step[via]) for name, via in current.items()}
    return current


@dataclass(frozen=True)
class VersionProjection:
    """How to present rows stored in ``stored`` (a version of the table) as ``newest`` columns:
    ``sources`` maps each wanted newest column to the stored column to read (None: all null)."""

    stored: TableSchema
    newest: TableSchema
    sources: dict[str, str | None]

    @property
    def stored_columns(self) -> list[str]:
        """The stored columns to decode, each once, in the order first needed."""
        return list(dict.fromkeys(s for s in self.sources.values() if s is not None))

    @property
    def identity(self) -> bool:
        return self.stored.version == self.newest.version and all(
            k == v for k, v in self.sources.items())

    def listed(self) -> list[dict[str, str | None]]:
        """The projection as a listing carries it to a reader that does not apply these rules
        itself (the JVM reader; docs/grpc-contract.md): for each presented column, in order, its
        ``name`` and ``type``, the ``stored`` column it is read from and that column's
        ``stored_type`` (both None: the column is null in every row).  A reader converts a stored
        value whose type differs exactly (wider) or refuses it (a value the presented type
        cannot hold)."""
        return [{"name": name, "type": self.newest.column(name).type.value, "stored": src,
                 "stored_type": None if src is None else self.stored.column(src).type.value}
                for name, src in self.sources.items()]

    def apply(self, stored: pa.Table) -> pa.Table:
        """``stored`` (decoded with ``self.stored``'s types; at least ``stored_columns``) as the
        wanted newest columns: renamed, widened by an exact cast, absent ones all null."""
        arrays, fields = [], []
        for name, src in self.sources.items():
            f = self.newest.arrow_schema().field(name)
            if src is None:
                arrays.append(pa.nulls(stored.num_rows, f.type))
            else:
                col = stored.column(src)
                arrays.append(col if col.type == f.type else _exact_cast(col, f.type, name))
            fields.append(f)
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _exact_cast(col: pa.ChunkedArray, to: pa.DataType, name: str) -> pa.ChunkedArray:
    """``col`` as ``to`` with every value unchanged, else ``pyarrow.ArrowInvalid``.  Arrow's safe
    cast already refuses an integer out of range; a finite double beyond float's range it would
    turn into infinity, so that is checked here (only a reader whose schema is older than the
    rows, a streaming query across a version change, narrows)."""
    if pa.types.is_float64(col.type) and pa.types.is_float32(to):
        finite = pc.is_finite(col)
        over = pc.and_kleene(finite, pc.greater(pc.abs(col), _FLOAT32_MAX))
        if pc.any(over).as_py():
            bad = pc.filter(col, over)[0].as_py()
            raise pa.ArrowInvalid(f"column {name!r}: double value {bad!r} is out of float's range")
    return pc.cast(col, to, safe=True)


def projection(schema: TableSchema, version: int, columns: Sequence[str] | None = None) -> VersionProjection:
    """The projection of rows stored in ``version`` onto ``columns`` (default: every column) of
    ``schema``; ``schema.versions`` must hold ``version``.

    Normally ``version`` is older (or the same): each column is read from its ``origins``
    there.  It may also be newer, when ``schema`` is the version a long-running reader (a
    streaming query) started with and the table has moved on: each of ``schema``'s columns is
    then read from the column it became (renamed forward; none when a later version dropped it,
    and a column added since is no column's source), cast back to ``schema``'s type: exact
    unless a widened column holds a value the older type cannot hold, which ``VersionProjection.apply``
    refuses (``pyarrow.ArrowInvalid``)."""
    if version <= schema.version:
        found = origins(schema, version)
    else:
        newer = schema.at_version(version).with_history(schema.versions.values())
        back = {old: new for new, old in origins(newer, schema.version).items() if old is not None}
        found = {c: back.get(c) for c in schema.column_names}
    wanted = list(columns) if columns is not None else schema.column_names
    for c in wanted:
        schema.column(c)  # KeyError naming the table for an unknown column
    return VersionProjection(schema.at_version(version), schema, {c: found[c] for c in wanted})


def declare(stored: Sequence[TableSchema], declared: TableSchema) -> list[TableSchema]:
    """The versions a database holds after loading ``declared`` (the YAML's schema), given those
    it has ``stored``: unchanged when ``declared`` is stored already; with ``declared`` appended
    when it is a newer, allowed version.  SchemaChangeError (or SchemaError) otherwise, naming
    the table, the versions and the column."""
    by_version = {s.version: s for s in stored}
    src = declared.source or "<schema>"
    same = by_version.get(declared.version)
    if same is not None:
        if same.fingerprint != declared.fingerprint or _renames(same) != _renames(declared):
            diff = column_differences(same, declared) or "the same columns with other renamed_from"
            raise SchemaError(src, "version",
                              f"{declared.key} version {declared.version} is stored with other columns "
                              f"({diff}); a changed schema needs a new version number "
                              f"(version: {max(by_version) + 1})")
        return sorted(stored, key=lambda s: s.version)
    newest = max(by_version) if by_version else 0
    if declared.version < newest:
        raise SchemaError(src, "version",
                          f"{declared.key} declares version {declared.version}, but the database already holds "
                          f"version {newest}: a table's declared version never goes back (declare version "
                          f"{newest + 1} or later to change it again)")
    if by_version:
        check_change(by_version[newest], declared)
    return sorted([*stored, declared], key=lambda s: s.version)


def admit(stored: Sequence[TableSchema], logged: TableSchema) -> list[TableSchema]:
    """The versions after a log header shows ``logged``: unchanged when it is known (the same
    columns); inserted when it is an older version the database never stored, and both steps
    around it are allowed.  A version newer than every stored one is not admitted (the YAML
    declares the newest): SchemaError saying what to do."""
    by_version = {s.version: s for s in stored}
    known = by_version.get(logged.version)
    src = logged.source or "<log header>"
    if known is not None:
        if known.fingerprint != logged.fingerprint:
            raise SchemaError(src, "version",
                              f"{logged.key} version {logged.version} in the log has other columns than the "
                              f"version {logged.version} the DIS holds ({column_differences(known, logged)})")
        return sorted(stored, key=lambda s: s.version)
    newest = max(by_version)
    if logged.version > newest:
        raise SchemaError(src, "version",
                          f"{logged.key} version {logged.version} is newer than every version the DIS holds "
                          f"(newest {newest}): declare it in the table's schema file and restart the DIS")
    out = sorted([*stored, logged], key=lambda s: s.version)
    i = [s.version for s in out].index(logged.version)
    if i > 0:
        check_change(out[i - 1], logged)
    check_change(logged, out[i + 1])
    return out


def _renames(s: TableSchema) -> tuple[tuple[str, str | None], ...]:
    return tuple((c.name, c.renamed_from) for c in s.columns)
