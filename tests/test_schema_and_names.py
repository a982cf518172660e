import pathlib

import pytest

from disd.names import InvalidNameError, NameKind, legalize, validate_name
from disd.schema import ColumnType, SchemaError, SchemaRegistry, TableSchema, column_differences, load_schema

from support import SCHEMAS


@pytest.mark.parametrize(
    "bad",
    ["", "..", ".", "a/b", "a\\b", "a\x00b", "x" * 129, "../etc", "a.b", ".hidden", "sp ace", "é", 5, None],
)
def test_bad_names_are_refused(bad):
    with pytest.raises(InvalidNameError):
        validate_name(NameKind.TABLE, bad)


@pytest.mark.parametrize("good", ["Market", "feed_host1", "2026-11-22", "A+B", "_x", "x" * 128])
def test_good_names_pass(good):
    assert validate_name(NameKind.NAMESPACE, good) == good


def test_legalize_host_name():
    assert legalize("feed.host-1.example.com") == "feed_host-1_example_com"
    validate_name(NameKind.INTERNAL_PARTITION, legalize("..weird/host"))


def test_reference_schema_loads():
    s = load_schema(SCHEMAS / "Market.Trade.yaml")
    assert s.key == "Market.Trade"
    assert s.partition_column == "Date"
    assert [(c.name, c.type) for c in s.columns] == [
        ("Timestamp", ColumnType.TIMESTAMP),
        ("Sym", ColumnType.STRING),
        ("Price", ColumnType.DOUBLE),
        ("Size", ColumnType.INT),
    ]
    assert len(s.fingerprint) == 32


def test_fingerprint_depends_on_columns():
    a = TableSchema.from_dict({"namespace": "A", "table": "T", "columns": [{"name": "X", "type": "int"}]})
    b = TableSchema.from_dict({"namespace": "B", "table": "U", "columns": [{"name": "X", "type": "int"}]})
    c = TableSchema.from_dict({"namespace": "A", "table": "T", "columns": [{"name": "X", "type": "long"}]})
    assert a.fingerprint == b.fingerprint != c.fingerprint


def _cols(*cols: tuple[str, str]) -> TableSchema:
    return TableSchema.from_dict({"namespace": "A", "table": "T",
                                  "columns": [{"name": n, "type": t} for n, t in cols]})


def test_column_differences_name_added_removed_and_retyped_columns():
    table = _cols(("X", "int"), ("Y", "double"), ("Z", "string"))
    assert column_differences(table, table) == ""
    log = _cols(("X", "long"), ("Z", "string"), ("V", "string"))
    assert column_differences(table, log) == "added V (string); removed Y (double); changed type X (table int, log long)"
    reordered = _cols(("Y", "double"), ("X", "int"), ("Z", "string"))
    assert column_differences(table, reordered) == "same columns in another order (table X, Y, Z; log Y, X, Z)"


def write(tmp_path: pathlib.Path, name: str, text: str) -> pathlib.Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    "text,key,problem",
    [
        ("table: T\ncolumns: [{name: X, type: int}]\n", "namespace", "missing"),
        ("namespace: A\ntable: T\ncolumns: [{name: X, type: integer}]\n", "columns[0].type", "unknown type"),
        ("namespace: A\ntable: T\ncolumns: [{name: X, type: int}, {name: X, type: int}]\n", "columns[1].name", "duplicate"),
        ("namespace: A\ntable: T\ncolumns: []\n", "columns", "non-empty"),
        ("namespace: ..x\ntable: T\ncolumns: [{name: X, type: int}]\n", "namespace", "'..'"),
        ("namespace: A\ntable: T\ncolumns: [{name: X, type: int, width: 3}]\n", "columns[0].width", "unknown key"),
        ("namespace: A\ntable: T\ncolums: [{name: X, type: int}]\n", "colums", "unknown key"),
        ("namespace: A\ntable: T\ncolumns: [{name: Date, type: int}]\n", "columns[0].name", "partition column"),
        ("namespace: [\n", "<yaml>", "not valid YAML"),
    ],
)
def test_bad_schema_errors_name_file_key_and_problem(tmp_path, text, key, problem):
    p = write(tmp_path, "A.T.yaml", text)
    with pytest.raises(SchemaError) as ei:
        load_schema(p)
    msg = str(ei.value)
    assert str(p) in msg and key in msg and problem in msg


def test_schema_file_name_must_match(tmp_path):
    p = write(tmp_path, "Wrong.yaml", "namespace: A\ntable: T\ncolumns: [{name: X, type: int}]\n")
    with pytest.raises(SchemaError, match="must be named A.T.yaml"):
        load_schema(p)


def test_registry_loads_directory():
    reg = SchemaRegistry.load_dir(SCHEMAS)
    assert reg.get("Market", "Trade") is not None
    assert reg.get("Market", "Nope") is None


def test_every_type_has_a_null_and_arrow_type():
    for t in ColumnType:
        assert t.arrow_type is not None
        if t.is_fixed_width:
            assert t.null_sentinel is not None
