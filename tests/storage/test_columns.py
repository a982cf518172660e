"""The column file format: every type and its null round-trips, byte layout as documented, and the
pure decoder rebuilds any row range from the files' bytes or from their 64 KiB blocks."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disd.schema import Column, ColumnType, SchemaRegistry
from disd.storage import StorageEngine, decode_column, decode_table
from disd.storage import columns as colfmt
from support import ALL_TYPES, write_log

from .util import ALL_KEY, ALL_LOG, all_types_table, ingest_file

N = 5000


@pytest.fixture
def all_types_location(tmp_path):
    """A location holding N rows of every type (written in several batches), flushed."""
    eng = StorageEngine(str(tmp_path / "db"), SchemaRegistry([ALL_TYPES]))
    t = all_types_table(N)
    p = tmp_path / ALL_LOG
    for a in range(0, N, 1700):  # several frames, several ingest calls
        part = t.slice(a, 1700)
        write_log(p, ALL_TYPES, {c: part.column(c) for c in part.column_names}, [3] * part.num_rows)
    loc = eng.location(ALL_KEY)
    ingest_file(loc, p, ALL_TYPES, frames_per_call=1)
    loc.flush()
    yield eng, loc, t.cast(ALL_TYPES.arrow_schema())
    eng.close()


def test_every_type_round_trips_with_nulls_and_non_ascii(all_types_location, tmp_path):
    eng, loc, expect = all_types_location
    got = loc.read_table()
    assert got.schema == ALL_TYPES.arrow_schema()
    assert got.equals(expect)
    for c in expect.column_names:
        assert got.column(c).null_count == expect.column(c).null_count > 0, c
    strings = set(got.column("String").to_pylist())
    assert {"żółć", "日本語", "emoji 🚀 ✓", "", "\u0000nul"} <= strings
    assert got.column("Byte").to_pylist()[:2] == [-127, 127]  # next to the sentinel, not null
    assert loc.read_table(["String", "Char"], 1000, 1700).equals(expect.select(["String", "Char"]).slice(1000, 700))
    assert loc.read_table(["Other"], 4990, 99999).equals(expect.select(["Other"]).slice(4990))
    eng.close()
    eng2 = StorageEngine(eng.db_root, SchemaRegistry([ALL_TYPES]))  # and again after recovery
    assert eng2.location(ALL_KEY).read_table().equals(expect)
    eng2.close()


def test_decode_column_from_the_files_alone(all_types_location):
    """What another process does: read the files, decode with nothing but the column's type."""
    _eng, loc, expect = all_types_location
    files = {name: (loc.path / name).read_bytes()[:size] for name, size in loc.column_files().items()}
    for c in ALL_TYPES.columns:
        arr = decode_column(c, files, N)
        assert arr.type == c.type.arrow_type
        assert arr.equals(expect.column(c.name).combine_chunks()), c.name
        assert decode_column(c, files, 123, start=4000).equals(expect.column(c.name).combine_chunks().slice(4000, 123))
        assert len(decode_column(c, files, 0, start=17)) == 0
    assert decode_table(ALL_TYPES, files, N).equals(expect)


def test_decode_from_64k_blocks_of_any_row_range(all_types_location):
    """The client's path: fetch whole blocks with read_block, rebuild rows [a, b)."""
    _eng, loc, expect = all_types_location
    bs = 65536
    fetched: dict[tuple[str, int], bytes] = {}

    def fetch(name: str, start: int, stop: int) -> bytes:
        parts = []
        for b in range(start // bs, (stop - 1) // bs + 1 if stop > start else start // bs):
            if (name, b) not in fetched:
                fetched[(name, b)] = loc.read_block(name, b, bs)
            parts.append(fetched[(name, b)])
        data = b"".join(parts)
        off = start - (start // bs) * bs
        return data[off : off + stop - start]

    rng = np.random.default_rng(3)
    for _ in range(20):
        a, b = sorted(rng.integers(0, N + 1, 2).tolist())
        got = colfmt.read_rows(ALL_TYPES, None, a, b, fetch)
        assert got.equals(expect.slice(a, b - a)), (a, b)


def test_batched_reads_ask_once_from_row_zero_and_twice_after_it(all_types_location):
    """read_rows_batched: one fetch_many for a read from row 0 when the sizes are known (a
    string column's data is then [0, size)), two otherwise (the data after its offsets); the
    rows are read_rows' in every case, also when the sizes cover more rows, or fewer."""
    _eng, loc, expect = all_types_location
    files = {name: (loc.path / name).read_bytes()[:size] for name, size in loc.column_files().items()}
    calls: list[list[tuple[str, int, int]]] = []

    def fetch_many(ranges):
        calls.append(list(ranges))
        return [files[n][a:b] for n, a, b in ranges]

    def read(a: int, b: int, sizes=None):
        calls.clear()
        got = colfmt.read_rows_batched(ALL_TYPES, None, a, b, fetch_many, sizes)
        assert got.equals(colfmt.read_rows(ALL_TYPES, None, a, b, lambda n, x, y: files[n][x:y])), (a, b)
        assert got.equals(expect.slice(a, b - a)), (a, b)
        return len(calls)

    sizes = {n: len(d) for n, d in files.items()}
    assert read(0, N, sizes) == 1
    assert read(0, 2000, sizes) == 1  # sizes covering more rows than read: the data is cut by the offsets
    assert read(0, N) == 2
    assert read(1200, N, sizes) == 2  # after row 0 the data's first byte is in the offsets
    short = {n: 10 for n in sizes}  # sizes that cover fewer rows than read: the data is asked for again
    assert read(0, N, short) == 2
    assert read(17, 17, sizes) == 0

    # DataEnds: a read from where an earlier one stopped knows its strings' first byte
    ends: dict = {}

    def follow(a: int, b: int, sizes=None):
        calls.clear()
        got = colfmt.read_rows_batched(ALL_TYPES, None, a, b, fetch_many, sizes, ends)
        assert got.equals(expect.slice(a, b - a)), (a, b)
        return len(calls)

    assert follow(1000, 2500) == 2 and follow(2500, N, sizes) == 1
    assert follow(2500, 3000) == 2  # not to the sizes' end: the data is located by the offsets, as before
    assert follow(3000, 4000, sizes) == 1  # sizes covering more rows than read
    assert follow(4000, N, short) == 2  # the sizes short of the rows: the data is asked for again


def test_byte_layout_is_as_documented(tmp_path):
    """Pin the format: little-endian values, sentinels, bool as i8 0/1/-1, string end offsets with
    bit 63 marking null."""
    from disd.binlog import LocationKey
    from disd.schema import TableSchema

    schema = TableSchema.from_dict({"namespace": "L", "table": "T", "columns": [
        {"name": "B", "type": "bool"}, {"name": "I", "type": "int"}, {"name": "D", "type": "double"},
        {"name": "C", "type": "char"}, {"name": "S", "type": "string"}]})
    eng = StorageEngine(str(tmp_path / "db"), SchemaRegistry([schema]))
    p = tmp_path / "L.T.System.ip.d.bin.2026-11-22.000000.000+0000"
    write_log(p, schema, {"B": [True, False, None], "I": [1, None, -2], "D": [0.5, None, 2.0],
                          "C": ["a", None, "é"], "S": ["ab", None, "ż"]}, [3, 3, 3])
    loc = eng.location(LocationKey("L", "T", "ip", "d"))
    ingest_file(loc, p, schema)
    loc.flush()
    raw = {n: (loc.path / n).read_bytes() for n in loc.column_files()}
    assert raw["B.dat"] == bytes([1, 0, 0xFF])
    assert np.frombuffer(raw["I.dat"], "<i4").tolist() == [1, -(2**31), -2]
    assert np.frombuffer(raw["D.dat"], "<f8").tolist() == [0.5, -np.finfo(np.float64).max, 2.0]
    assert np.frombuffer(raw["C.dat"], "<u2").tolist() == [ord("a"), 0xFFFF, ord("é")]
    assert np.frombuffer(raw["S.off"], "<u8").tolist() == [2, (1 << 63) | 2, 4]
    assert raw["S.dat"] == "abż".encode()
    eng.close()


def test_nan_and_infinities_are_values_not_nulls():
    col = Column("F", ColumnType.DOUBLE)
    vals = np.array([np.nan, np.inf, -np.inf, -np.finfo(np.float64).max], "<f8")
    arr = decode_column(col, {"F.dat": vals.tobytes()}, 4)
    assert arr.null_count == 1 and not arr[3].is_valid
    assert math.isnan(arr[0].as_py()) and arr[1].as_py() == math.inf and arr[2].as_py() == -math.inf


def test_damaged_string_offsets_raise_instead_of_building_a_bad_array():
    col = Column("S", ColumnType.STRING)
    off = np.array([3, 2, 5], "<u8").tobytes()  # goes backwards
    with pytest.raises(ValueError, match="damaged"):
        decode_column(col, {"S.off": off, "S.dat": b"abcde"}, 3)
    off = np.array([3, 9], "<u8").tobytes()  # past the data
    with pytest.raises(ValueError):
        decode_column(col, {"S.off": off, "S.dat": b"abc"}, 2)
    with pytest.raises(KeyError):
        decode_column(col, {"S.off": off}, 2)


_FIXED = [t for t in ColumnType if t is not ColumnType.STRING]


def _values(t: ColumnType):
    if t is ColumnType.BOOL:
        return st.booleans()
    if t in (ColumnType.FLOAT, ColumnType.DOUBLE):
        w = 32 if t is ColumnType.FLOAT else 64
        return st.floats(width=w, allow_nan=False).filter(lambda v: v != float(t.null_sentinel))
    if t is ColumnType.CHAR:
        return st.integers(0, 0xFFFE)
    info = np.iinfo(t.numpy_dtype)
    return st.integers(int(info.min) + 1, int(info.max))


@st.composite
def _column_data(draw):
    t = draw(st.sampled_from(list(ColumnType)))
    vals = st.text(max_size=12) if t is ColumnType.STRING else _values(t)
    data = draw(st.lists(st.one_of(st.none(), vals), max_size=60))
    return t, data


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_column_data(), st.data())
def test_encode_decode_property(col_data, data):
    """Any values of any type, any nulls, appended in pieces of any size, decode to themselves
    for every row range."""
    t, values = col_data
    col = Column("X", t)
    arr = pa.array([None if v is None else v for v in values], t.arrow_type if t is not ColumnType.TIMESTAMP else pa.int64())
    if t is ColumnType.TIMESTAMP:
        arr = arr.cast(pa.timestamp("ns", tz="UTC"))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(values)), max_size=4)))
    files: dict[str, bytearray] = {n: bytearray() for n in colfmt.file_names(col)}
    for a, b in zip([0, *cuts], [*cuts, len(values)]):
        piece = arr.slice(a, b - a)
        if t is ColumnType.STRING:
            ends, _lens, raw = colfmt.encode_string(piece, len(files["X.dat"]))
            files["X.off"] += ends.tobytes()
            files["X.dat"] += bytes(raw)
        else:
            files["X.dat"] += colfmt.encode_fixed(col, piece).tobytes()
    n = len(values)
    assert decode_column(col, files, n).equals(arr)
    a = data.draw(st.integers(0, n))
    b = data.draw(st.integers(a, n))
    assert decode_column(col, files, b - a, start=a).equals(arr.slice(a, b - a))


def file_sizes(schema, rows: int, string_data_sizes: dict[str, int]) -> dict[str, int]:
    """Sizes of every column file holding exactly ``rows`` rows."""
    out: dict[str, int] = {}
    for c in schema.columns:
        names = colfmt.file_names(c)
        if c.type is ColumnType.STRING:
            out[names[0]], out[names[1]] = rows * colfmt.OFFSET_WIDTH, string_data_sizes[c.name]
        else:
            out[names[0]] = rows * c.type.width
    return out


def test_sizes_check():
    schema = ALL_TYPES
    good = file_sizes(schema, 10, {"String": 30, "Other": 0})
    assert colfmt.check_sizes(schema, 10, good) is None
    bad = dict(good, **{"Int.dat": 39})
    assert "Int.dat" in colfmt.check_sizes(schema, 10, bad)
