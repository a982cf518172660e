"""The rules of schema versions (disd.schemaversions) and the database's record of them
(disd.storage.versionstore), on real files."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from disd.errors import DisError
from disd.schema import SchemaError, TableSchema, load_schema
from disd.schemaversions import (SchemaChangeError, admit, check_change, declare, origins, projection,
                                 step_origins)
from disd.storage import versionstore
from disd.storage.versionstore import VersionStore, VersionStoreError, with_stored_history


def schema(version: int, *cols: tuple, table: str = "Trade") -> TableSchema:
    return TableSchema.from_dict({
        "namespace": "Market", "table": table, "version": version,
        "columns": [{"name": c[0], "type": c[1]} | ({"renamed_from": c[2]} if len(c) > 2 else {}) for c in cols],
    })


V1 = schema(1, ("Sym", "string"), ("Size", "int"), ("Price", "float"), ("Venue", "string"))
V2 = schema(2, ("Symbol", "string", "Sym"), ("Size", "long"), ("Price", "double"), ("Side", "char"))
V3 = schema(3, ("Symbol", "string", "Sym"), ("Size", "long"), ("Price", "double"), ("Side", "char"),
            ("Venue", "string"))


def test_yaml_declares_version_and_renames(tmp_path):
    p = tmp_path / "Market.Trade.yaml"
    p.write_text("namespace: Market\ntable: Trade\nversion: 3\ncolumns:\n"
                 "  - {name: Symbol, type: string, renamed_from: Sym}\n")
    s = load_schema(p)
    assert s.version == 3 and s.columns[0].renamed_from == "Sym"
    assert TableSchema.from_json(s.to_json()).columns[0].renamed_from == "Sym"
    # The fingerprint is the byte layout's: neither version nor renamed_from change it.
    assert s.fingerprint == schema(1, ("Symbol", "string")).fingerprint


@pytest.mark.parametrize("version", [0, -1, "2", True, 1.5])
def test_a_bad_version_is_refused_by_key(tmp_path, version):
    with pytest.raises(SchemaError, match="version: must be a positive integer"):
        TableSchema.from_dict({"namespace": "Market", "table": "Trade", "version": version,
                               "columns": [{"name": "A", "type": "int"}]})


def test_a_missing_version_is_one_and_old_headers_read():
    old = TableSchema.from_json('{"namespace":"Market","table":"Trade","partition_column":"Date",'
                                '"columns":[{"name":"A","type":"int"}]}')
    assert old.version == 1


def test_origins_compose_renames_drops_and_adds():
    newest = V3.with_history([V1, V2])
    assert origins(newest, 1) == {"Symbol": "Sym", "Size": "Size", "Price": "Price", "Side": None,
                                  "Venue": None}  # Venue was dropped in 2 and added again in 3
    assert origins(newest, 2) == {"Symbol": "Symbol", "Size": "Size", "Price": "Price", "Side": "Side",
                                  "Venue": None}
    assert origins(newest, 3) == {c: c for c in V3.column_names}


def test_a_swap_of_two_names_is_two_renames():
    a = schema(1, ("X", "int"), ("Y", "int"))
    b = schema(2, ("X", "int", "Y"), ("Y", "int", "X"))
    check_change(a, b)
    assert step_origins(a, b) == {"X": "Y", "Y": "X"}


def test_projection_widens_exactly_and_keeps_nulls():
    newest = V3.with_history([V1, V2])
    p = projection(newest, 1)
    assert p.stored_columns == ["Sym", "Size", "Price"]
    stored = pa.table({
        "Sym": ["a", None], "Size": pa.array([2**31 - 1, None], pa.int32()),
        "Price": pa.array([1.5, None], pa.float32()), "Venue": ["x", "y"]})
    out = p.apply(stored)
    assert out.schema == newest.arrow_schema()
    assert out.to_pydict() == {"Symbol": ["a", None], "Size": [2**31 - 1, None], "Price": [1.5, None],
                               "Side": [None, None], "Venue": [None, None]}
    assert projection(newest, 3, ["Price"]).identity


@pytest.mark.parametrize("old_type,new_type,word", [
    ("long", "int", "narrows"), ("double", "float", "narrows"), ("string", "int", "changes"),
    ("int", "double", "changes"), ("timestamp", "long", "changes")])
def test_a_disallowed_type_change_names_table_versions_and_column(old_type, new_type, word):
    with pytest.raises(SchemaChangeError) as e:
        check_change(schema(4, ("A", "int"), ("Qty", old_type)), schema(5, ("A", "int"), ("Qty", new_type)))
    msg = str(e.value)
    assert "Market.Trade version 4 -> 5" in msg and "'Qty'" in msg and word in msg
    assert isinstance(e.value, DisError) and isinstance(e.value, ValueError)


def test_a_rename_of_a_missing_column_is_refused():
    with pytest.raises(SchemaChangeError, match="renamed_from 'Prize' names no column of version 1"):
        check_change(schema(1, ("Price", "double")), schema(2, ("Cost", "double", "Prize")))


def test_declare_appends_newer_refuses_reuse_and_going_back():
    assert [s.version for s in declare([], V1)] == [1]
    assert [s.version for s in declare([V1], V2)] == [1, 2]
    assert [s.version for s in declare([V1, V2], V2)] == [1, 2]
    with pytest.raises(SchemaError, match="version 1 is stored with other columns.*version: 3"):
        declare([V1, V2], schema(1, ("Sym", "string")))
    with pytest.raises(SchemaError, match="declares version 1, but the database already holds version 2"):
        declare([V2], V1)


def test_admit_inserts_an_older_version_and_refuses_a_newer_one():
    assert [s.version for s in admit([V2], V1)] == [1, 2]
    with pytest.raises(SchemaError, match="newer than every version the DIS holds"):
        admit([V1, V2], V3)
    with pytest.raises(SchemaError, match="in the log has other columns"):
        admit([V1, V2], schema(2, ("Sym", "string")))
    with pytest.raises(SchemaChangeError):
        admit([V2], schema(1, ("Symbol", "string"), ("Size", "long"), ("Price", "string")))


def test_the_store_persists_versions_and_detects_damage(tmp_path):
    db = str(tmp_path / "db")
    store = VersionStore(db)
    assert store.declare(V1).versions.keys() == {1}
    newest = VersionStore(db).declare(V2)  # a restart with the changed YAML
    assert list(newest.versions) == [1, 2]
    assert [s.version for s in versionstore.load(db, "Market", "Trade")] == [1, 2]
    assert list(with_stored_history(db, V1).versions) == [1, 2]  # an offline reader with an old YAML
    with pytest.raises(SchemaChangeError):
        VersionStore(db).declare(schema(3, ("Symbol", "int")))
    assert [s.version for s in versionstore.load(db, "Market", "Trade")] == [1, 2]  # nothing stored
    path = os.path.join(db, "Intraday", "Market", "Trade", "schema.versions")
    data = bytearray(open(path, "rb").read())
    data[20] ^= 1
    open(path, "wb").write(bytes(data))
    with pytest.raises(VersionStoreError, match="checksum mismatch"):
        versionstore.load(db, "Market", "Trade")


def test_rows_newer_than_the_reader_narrow_back_only_when_every_value_fits():
    """A streaming query keeps the version it started with; rows of a newer version whose
    column was widened are cast back, and a value the older type cannot hold is refused rather
    than changed (Arrow would turn a large double into infinity as a float)."""
    from disd.schemaversions import VersionProjection

    old = schema(1, ("P", "float"), ("N", "int"))
    new = schema(2, ("P", "double"), ("N", "long"))
    back = VersionProjection(new, old, {"P": "P", "N": "N"})
    ok = back.apply(pa.table({"P": pa.array([1.5, None, float("-inf")]), "N": pa.array([2**31 - 1, None, -5])}))
    assert ok.to_pydict() == {"P": [1.5, None, float("-inf")], "N": [2**31 - 1, None, -5]}
    with pytest.raises(pa.ArrowInvalid, match="column 'P': double value 1e\\+300 is out of float's range"):
        back.apply(pa.table({"P": pa.array([1e300]), "N": pa.array([1])}))
    with pytest.raises(pa.ArrowInvalid, match="not in range"):
        back.apply(pa.table({"P": pa.array([1.0]), "N": pa.array([2**40])}))
