"""Property tests of schema versions (docs/schema-versions.md).

Any sequence of allowed changes (add a column of any type, drop one, rename one with
``renamed_from``, widen a type) keeps every row of every earlier version readable: each version's
rows are written into a location of their own by the storage engine, the versions are recorded
with ``versionstore.save``, and the table is read back through the column files as its newest
version.  The expected rows are computed here from a model of its own: every column carries a
lineage (the column it is, whatever its name), so a newest column's value in an old row is the
old row's value of the same lineage, null when the lineage did not exist then, and a dropped
lineage is simply absent.

Any disallowed change (a type change that is not a widening, e.g. a narrowing or string <->
number; ``renamed_from`` naming a column the previous version does not have) is refused by
``check_change`` with a message naming the table, both versions and the column.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disd.binlog import LocationKey
from disd.blocks import LocalColumnFiles
from disd.client import table_from_blocks
from disd.schema import Column, ColumnType, TableSchema
from disd.schemaversions import WIDENINGS, SchemaChangeError, check_change, check_chain, widens
from disd.storage import versionstore
from disd.values import char_strings
from support.versions import python_values, random_column, write_location

NS, TABLE = "Test", "Versioned"
DAY = "2026-11-22"
TYPES = list(ColumnType)
POOL = ["A", "B", "C", "D", "E", "F"]  # small on purpose: dropped names come back as new columns
ID = "Id"  # the row's identity: a long in every version, never changed


# -- the model: versions as columns with lineages -------------------------------------------------
# A version is a list of (name, type, renamed_from, lineage); lineage 0 is the Id column.


@st.composite
def version_chains(draw):
    """2..5 versions, each one to two allowed changes away from the one before."""
    next_lineage = iter(range(1, 1000))
    first = [(ID, ColumnType.LONG, None, 0)]
    for name in draw(st.lists(st.sampled_from(POOL), min_size=1, max_size=3, unique=True)):
        first.append((name, draw(st.sampled_from(TYPES)), None, next(next_lineage)))
    chain = [first]
    for _ in range(draw(st.integers(1, 4))):
        prev = chain[-1]
        prev_names = {c[0] for c in prev}
        cols = [(n, t, None, lineage) for n, t, _, lineage in prev]  # renamed_from is said in its own step only
        touched: set[int] = set()
        ops = 0
        for _ in range(draw(st.integers(1, 2))):
            # New names (added or rename targets) are never names of the previous version: from
            # names alone, dropping B and adding another B in one step is keeping B.
            free = [n for n in POOL if n not in prev_names and n not in {c[0] for c in cols}]
            others = [i for i, c in enumerate(cols) if c[3] != 0 and c[3] not in touched]
            wideable = [i for i in others if cols[i][1] in WIDENINGS]
            choices = (["add"] if free else []) + (["drop", "rename"] if others else []) + (
                ["widen"] if wideable else [])
            if not free:
                choices = [c for c in choices if c != "rename"]
            op = draw(st.sampled_from(choices))
            if op == "add":
                lineage = next(next_lineage)
                cols.insert(draw(st.integers(1, len(cols))),
                            (draw(st.sampled_from(free)), draw(st.sampled_from(TYPES)), None, lineage))
            elif op == "drop":
                i = draw(st.sampled_from(others))
                lineage = cols.pop(i)[3]
            elif op == "rename":
                i = draw(st.sampled_from(others))
                name, t, _, lineage = cols[i]
                if t in WIDENINGS and draw(st.booleans()):
                    t = draw(st.sampled_from(sorted(WIDENINGS[t], key=lambda x: x.value)))
                cols[i] = (draw(st.sampled_from(free)), t, name, lineage)
            else:
                i = draw(st.sampled_from(wideable))
                name, t, _, lineage = cols[i]
                cols[i] = (name, draw(st.sampled_from(sorted(WIDENINGS[t], key=lambda x: x.value))), None, lineage)
            touched.add(lineage)
            ops += 1
        chain.append(cols)
    return chain


def as_schema(cols, version: int) -> TableSchema:
    return TableSchema(NS, TABLE, tuple(Column(n, t, r) for n, t, r, _ in cols), version=version)


def expected_rows(chain, written: dict[int, pa.Table]) -> list[dict]:
    """Each written row as the newest version presents it, computed from the lineages alone."""
    newest = chain[-1]
    out = []
    for v, rows in written.items():
        # a char reads as its one-character string (disd.values.char_strings), as readers get it
        by_lineage = {lineage: python_values(char_strings(rows.column(n)) if t is ColumnType.CHAR else rows.column(n))
                      for n, t, _, lineage in chain[v - 1]}
        for i in range(rows.num_rows):
            out.append({n: (by_lineage[lineage][i] if lineage in by_lineage else None) for n, _, _, lineage in newest})
    return sorted(out, key=lambda r: r[ID])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chain=version_chains(), seed=st.integers(0, 2**32 - 1), sizes=st.lists(st.integers(0, 12), min_size=5,
                                                                               max_size=5))
def test_allowed_changes_keep_every_earlier_row_readable(tmp_path_factory, chain, seed, sizes):
    schemas = [as_schema(cols, v) for v, cols in enumerate(chain, start=1)]
    for old, new in zip(schemas, schemas[1:]):
        check_change(old, new)  # the model only makes allowed changes
    check_chain(schemas)

    db = tmp_path_factory.mktemp("prop") / "db"
    db.mkdir()
    rng = np.random.default_rng(seed)
    written: dict[int, pa.Table] = {}
    next_id = 0
    for v, schema in enumerate(schemas, start=1):
        n = sizes[v - 1] + 1
        cols = {c.name: (pa.array(np.arange(next_id, next_id + n, dtype=np.int64)) if c.name == ID
                         else random_column(c.type, n, rng)) for c in schema.columns}
        next_id += n
        written[v] = pa.table(cols)
        write_location(db, schema, LocationKey(NS, TABLE, f"ip{v}", DAY), written[v])
    versionstore.save(str(db), schemas)

    # A reader knows the newest version from its YAML (no history) and the rest from the database.
    plain = schemas[-1]
    newest = versionstore.with_stored_history(str(db), plain)
    assert list(newest.versions) == list(range(1, len(schemas) + 1))
    with LocalColumnFiles(str(db), [newest]) as source:
        snaps = source.locations(NS, TABLE)
        assert sorted(s.schema_version for s in snaps) == list(range(1, len(schemas) + 1)), snaps
        table = table_from_blocks(source, newest)
    assert table.column_names == [*plain.column_names, plain.partition_column]
    assert table.schema.remove(table.schema.get_field_index(plain.partition_column)) == plain.read_arrow_schema()
    got = [{n: v for n, v in zip(plain.column_names, row)} for row in zip(
        *(python_values(table.column(n)) for n in plain.column_names))]
    assert sorted(got, key=lambda r: r[ID]) == expected_rows(chain, written)
    assert set(table.column(plain.partition_column).to_pylist()) == {DAY}


# -- disallowed changes ---------------------------------------------------------------------------
def refused(old: TableSchema, new: TableSchema, column: str) -> str:
    with pytest.raises(SchemaChangeError) as e:
        check_change(old, new)
    msg = str(e.value)
    assert f"{NS}.{TABLE}" in msg, msg
    assert re.search(rf"\b{old.version}\b", msg) and re.search(rf"\b{new.version}\b", msg), msg
    assert column in msg, msg
    assert (e.value.old_version, e.value.new_version, e.value.column) == (old.version, new.version, column)
    return msg


NUMBERS = [ColumnType.BYTE, ColumnType.SHORT, ColumnType.INT, ColumnType.LONG, ColumnType.FLOAT, ColumnType.DOUBLE]
NARROWINGS = [(wide, narrow) for narrow, wider in WIDENINGS.items() for wide in wider]


@st.composite
def base_schemas(draw):
    names = draw(st.lists(st.sampled_from(POOL), min_size=1, max_size=4, unique=True))
    cols = tuple(Column(n, draw(st.sampled_from(TYPES))) for n in names)
    return TableSchema(NS, TABLE, (Column(ID, ColumnType.LONG), *cols), version=draw(st.integers(1, 40)))


def replaced(schema: TableSchema, name: str, col: Column, version: int) -> TableSchema:
    return TableSchema(NS, TABLE, tuple(col if c.name == name else c for c in schema.columns), version=version)


@settings(max_examples=40, deadline=None)
@given(base=base_schemas(), data=st.data())
def test_a_type_change_other_than_widening_is_refused(base, data):
    """Every type change that is not in WIDENINGS (narrowing, string <-> number, bool, char,
    timestamp) is refused; every widening is allowed.  Also through a rename."""
    col = data.draw(st.sampled_from([c for c in base.columns if c.name != ID]))
    kind = data.draw(st.sampled_from(["narrow", "string<->number", "any"]))
    if kind == "narrow":
        wide, narrow = data.draw(st.sampled_from(NARROWINGS))
        col = Column(col.name, wide)
        base = replaced(base, col.name, col, base.version)
        new_type = narrow
    elif kind == "string<->number":
        number = data.draw(st.sampled_from(NUMBERS))
        old_type, new_type = data.draw(st.sampled_from([(ColumnType.STRING, number), (number, ColumnType.STRING)]))
        col = Column(col.name, old_type)
        base = replaced(base, col.name, col, base.version)
    else:
        new_type = data.draw(st.sampled_from(TYPES))
    step = data.draw(st.integers(1, 3))
    rename = data.draw(st.sampled_from([None] + [n for n in POOL if n not in base.column_names]))
    new_col = Column(rename or col.name, new_type, col.name if rename else None)
    new = replaced(base, col.name, new_col, base.version + step)
    if widens(col.type, new_type):
        check_change(base, new)
    else:
        refused(base, new, new_col.name)


@settings(max_examples=25, deadline=None)
@given(base=base_schemas(), data=st.data())
def test_renamed_from_a_missing_column_is_refused(base, data):
    missing = data.draw(st.sampled_from([n for n in [*POOL, "Gone", "Zed"] if n not in base.column_names]))
    target = data.draw(st.sampled_from([n for n in ["New1", "New2", *POOL] if n not in base.column_names
                                        and n != missing]))
    ctype = data.draw(st.sampled_from(TYPES))
    cols = list(base.columns)
    cols.insert(data.draw(st.integers(1, len(cols))), Column(target, ctype, missing))
    new = TableSchema(NS, TABLE, tuple(cols), version=base.version + 1)
    msg = refused(base, new, target)
    assert missing in msg, msg
