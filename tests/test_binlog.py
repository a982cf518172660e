import datetime as dt
import os

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disd.binlog import (
    BinlogWriter,
    CorruptLogError,
    InvalidLogFileName,
    LogFileName,
    RowFlag,
    SchemaMismatchError,
    normalize_columns,
    read_file,
    scan_frames,
)
from disd.binlog import format as format_module
from disd.binlog.format import FRAME_HEADER_SIZE, decode_header
from disd.binlog.io import split_points
from disd.schema import TableSchema
from support import write_log


def all_types_table(n: int) -> pa.Table:
    rng = np.random.default_rng(7)
    strs = np.array(["AAPL", "", "żółć", "日本語", "x" * 300, "MSFT"], dtype=object)
    def nulls(k):
        return rng.random(n) < 0.2
    cols = {
        "Bool": pa.array(rng.random(n) < 0.5, mask=nulls(0)),
        "Byte": pa.array(rng.integers(-127, 128, n, dtype=np.int8), mask=nulls(1)),
        "Short": pa.array(rng.integers(-(2**15) + 1, 2**15, n, dtype=np.int16), mask=nulls(2)),
        "Int": pa.array(rng.integers(-(2**31) + 1, 2**31, n, dtype=np.int32), mask=nulls(3)),
        "Long": pa.array(rng.integers(-(2**62), 2**62, n, dtype=np.int64), mask=nulls(4)),
        "Float": pa.array(rng.random(n).astype(np.float32), mask=nulls(5)),
        "Double": pa.array(rng.random(n), mask=nulls(6)),
        "Char": pa.array(rng.integers(0, 0xFFFE, n, dtype=np.uint16), mask=nulls(7)),
        "String": pa.array(strs[rng.integers(0, len(strs), n)].tolist(), pa.string(), mask=nulls(8)),
        "Timestamp": pa.array(rng.integers(0, 2**62, n, dtype=np.int64), mask=nulls(9)).cast(pa.timestamp("ns", tz="UTC")),
        "Other": pa.array(strs[rng.integers(0, len(strs), n)].tolist(), pa.string(), mask=nulls(10)),
    }
    return pa.table(cols)


def test_round_trip_every_type_with_nulls_and_non_ascii(tmp_path, all_types_schema):
    t = all_types_table(5000)
    p = tmp_path / "a.bin"
    write_log(p, all_types_schema, t, np.full(5000, RowFlag.SINGLE_ROW))
    got = read_file(p, all_types_schema)
    assert got.table.equals(t.select(all_types_schema.column_names).cast(all_types_schema.arrow_schema()))
    assert got.table.column("String").null_count > 0
    assert "żółć" in got.table.column("String").to_pylist()
    assert (got.flags == RowFlag.SINGLE_ROW).all()
    assert got.end_offset == os.path.getsize(p)
    assert not got.torn


def test_flags_and_transaction_frames(tmp_path, trade_schema):
    flags = [3, 3, 1, 0, 0, 2, 3, 1, 0]
    t = {"Sym": [f"S{i}" for i in range(len(flags))], "Size": list(range(len(flags)))}
    p = tmp_path / "t.bin"
    write_log(p, trade_schema, t, flags)
    got = read_file(p)
    assert got.flags.tolist() == flags
    assert [RowFlag(f) for f in got.flags[:3]] == [RowFlag.SINGLE_ROW, RowFlag.SINGLE_ROW, RowFlag.START_TRANSACTION]
    # a new frame starts at every StartTransaction
    assert got.frame_row_counts == [2, 5, 2]
    assert got.table.column("Size").to_pylist() == list(range(len(flags)))
    assert got.table.column("Price").null_count == len(flags)  # missing column -> nulls


def test_split_points_cap_rows():
    flags = np.full(10, RowFlag.SINGLE_ROW, np.uint8)
    flags[7] = RowFlag.START_TRANSACTION
    assert split_points(flags, max_rows=3) == [3, 6, 7]


def test_torn_tail_stops_at_last_complete_frame(tmp_path, trade_schema):
    p = tmp_path / "torn.bin"
    with BinlogWriter(p, trade_schema) as w:
        off1 = w.write_rows(normalize_columns(trade_schema, {"Size": [1, 2]}), [3, 3])
        w.write_rows(normalize_columns(trade_schema, {"Size": [3, 4]}), [3, 3])
    full = p.read_bytes()
    for cut in range(off1 + 1, len(full)):
        p.write_bytes(full[:cut])
        got = read_file(p)
        assert got.torn
        assert got.end_offset == off1
        assert got.table.column("Size").to_pylist() == [1, 2]
    # zero-filled tail (space allocated, never written) is a torn tail too
    p.write_bytes(full[:off1] + bytes(100))
    got = read_file(p)
    assert got.torn and got.end_offset == off1


def test_writer_reopen_truncates_torn_tail(tmp_path, trade_schema):
    p = tmp_path / "re.bin"
    with BinlogWriter(p, trade_schema) as w:
        off1 = w.write_rows(normalize_columns(trade_schema, {"Size": [1]}), [3])
        w.write_rows(normalize_columns(trade_schema, {"Size": [2]}), [3])
    p.write_bytes(p.read_bytes()[:-3])
    with BinlogWriter(p, trade_schema) as w:
        assert w.offset == off1
        w.write_rows(normalize_columns(trade_schema, {"Size": [5]}), [3])
    got = read_file(p)
    assert not got.torn
    assert got.table.column("Size").to_pylist() == [1, 5]


@pytest.mark.parametrize("where", ["header", "payload"])
def test_corrupt_frame_is_an_error_with_offset(tmp_path, trade_schema, where):
    p = tmp_path / "c.bin"
    with BinlogWriter(p, trade_schema) as w:
        off1 = w.write_rows(normalize_columns(trade_schema, {"Sym": ["A"], "Size": [1]}), [3])
        w.write_rows(normalize_columns(trade_schema, {"Sym": ["B"], "Size": [2]}), [3])
    data = bytearray(p.read_bytes())
    data[off1 + (2 if where == "header" else FRAME_HEADER_SIZE + 3)] ^= 0x40
    p.write_bytes(bytes(data))
    with pytest.raises(CorruptLogError) as ei:
        read_file(p)
    assert ei.value.offset == off1
    assert str(off1) in str(ei.value)


def test_bad_magic_and_header_checksum(tmp_path, trade_schema):
    p = tmp_path / "h.bin"
    write_log(p, trade_schema, {"Size": [1]}, [3])
    data = bytearray(p.read_bytes())
    bad = bytes(data)
    p.write_bytes(b"NOTALOG!" + bad[8:])
    with pytest.raises(CorruptLogError, match="bad magic"):
        read_file(p)
    data[40] ^= 1
    p.write_bytes(bytes(data))
    with pytest.raises(CorruptLogError, match="header"):
        read_file(p)


def test_wrong_schema_is_refused(tmp_path, trade_schema):
    p = tmp_path / "w.bin"
    write_log(p, trade_schema, {"Size": [1]}, [3])
    other = TableSchema.from_dict(
        {"namespace": "Market", "table": "Trade", "columns": [{"name": "Size", "type": "long"}]}
    )
    with pytest.raises(SchemaMismatchError, match="expected"):
        read_file(p, other)
    with pytest.raises(SchemaMismatchError):
        BinlogWriter(p, other)
    assert decode_header(p.read_bytes()).schema == trade_schema


def test_unknown_flag_is_corruption(tmp_path, trade_schema):
    p = tmp_path / "f.bin"
    write_log(p, trade_schema, {"Size": [1]}, [7])
    with pytest.raises(CorruptLogError, match="flag"):
        read_file(p)


@pytest.mark.parametrize("damage", ["checksum", "flag"])
def test_read_file_intact_only_ends_at_the_first_corrupt_frame(tmp_path, trade_schema, damage):
    p = tmp_path / "i.bin"
    with BinlogWriter(p, trade_schema) as w:
        off1 = w.write_rows(normalize_columns(trade_schema, {"Size": [1, 2]}), [3, 3])
        w.write_rows(normalize_columns(trade_schema, {"Size": [3]}), [7 if damage == "flag" else 3])
        w.write_rows(normalize_columns(trade_schema, {"Size": [4]}), [3])
    if damage == "checksum":
        data = bytearray(p.read_bytes())
        data[off1 + FRAME_HEADER_SIZE + 3] ^= 0x40
        p.write_bytes(bytes(data))
    with pytest.raises(CorruptLogError):
        read_file(p)
    got = read_file(p, intact_only=True)
    assert got.table.column("Size").to_pylist() == [1, 2] and got.flags.tolist() == [3, 3]
    assert got.end_offset == off1 and len(got.frame_ends) == 1
    assert got.corrupt.offset == off1 and str(p) in str(got.corrupt)
    with BinlogWriter(tmp_path / "ok.bin", trade_schema) as w:
        w.write_rows(normalize_columns(trade_schema, {"Size": [1]}), [3])
    assert read_file(tmp_path / "ok.bin", intact_only=True).corrupt is None


def test_scan_frames_in_pieces(tmp_path, trade_schema):
    p = tmp_path / "s.bin"
    with BinlogWriter(p, trade_schema) as w:
        for i in range(5):
            w.write_rows(normalize_columns(trade_schema, {"Size": [i, i]}), [3, 3])
    data = p.read_bytes()
    hdr = decode_header(data)
    run = scan_frames(data[: hdr.size + 30], 0, trade_schema, start=hdr.size)
    assert run.starts == [] and run.torn and run.end_offset == hdr.size
    run = scan_frames(data, 0, trade_schema, start=hdr.size)
    assert len(run.starts) == 5 and run.end_offset == len(data) and not run.torn


# ---------------------------------------------------------------------------------------------
# File names

def test_file_name_round_trip():
    name = "Market.Trade.System.feed_host1.2026-11-22.bin.2026-11-22.151353.472+0000"
    f = LogFileName.parse(name)
    assert (f.namespace, f.table, f.namespace_set.value, f.internal_partition, f.column_partition) == (
        "Market", "Trade", "System", "feed_host1", "2026-11-22")
    assert f.timestamp == dt.datetime(2026, 11, 22, 15, 13, 53, 472000, tzinfo=dt.timezone.utc)
    assert f.format() == name
    neg = LogFileName.parse("A.B.User.ip.2026-01-01.bin.2026-01-01.010203.004-0500")
    assert neg.format() == "A.B.User.ip.2026-01-01.bin.2026-01-01.010203.004-0500"


def test_file_names_order_by_timestamp_in_utc():
    a = LogFileName.parse("A.B.System.ip.cp.bin.2026-11-22.100000.000+0200")  # 08:00 UTC
    b = LogFileName.parse("A.B.System.ip.cp.bin.2026-11-22.090000.000+0000")  # 09:00 UTC
    assert sorted([b, a], key=lambda f: f.sort_key) == [a, b]


@pytest.mark.parametrize(
    "bad",
    [
        "Market.Trade.System.ip.2026-11-22.bin",
        "Market.Trade.Other.ip.cp.bin.2026-11-22.151353.472+0000",
        "Market.Trade.System.ip.cp.log.2026-11-22.151353.472+0000",
        "Market.Trade.System.ip.cp.bin.2026-13-22.151353.472+0000",
        "Market.Trade.System.ip.cp.bin.2026-11-22.151353.472+0000.tmp",
        "..Trade.System.ip.cp.bin.2026-11-22.151353.472+0000",
        "Market/x.Trade.System.ip.cp.bin.2026-11-22.151353.472+0000",
    ],
)
def test_bad_file_names_are_reported(bad):
    with pytest.raises(InvalidLogFileName):
        LogFileName.parse(bad)
    assert LogFileName.try_parse(bad) is None


_GOOD = "Market.Trade.System.ip1.2026-11-22.bin.2026-11-22.090000.000+0000"


@pytest.mark.parametrize(
    "bad,part,problem",
    [
        (_GOOD.replace("System", "Sytem"), "namespace_kind", "namespace kind 'Sytem' is not 'System' or 'User'"),
        (_GOOD.replace("bin.2026-11", "bin.2026-13"), "month", "month 13 is not 01..12"),
        (_GOOD + ".bak", "suffix", "unexpected suffix '.bak'"),
        (_GOOD.replace("bin.2026-11-22", "bin.2026-02-30"), "day", "day 30 is not 01..28 (in 2026-02)"),
        (_GOOD.replace("090000", "096000"), "minute", "minute 60 is not 00..59"),
        (_GOOD.replace("+0000", "+2400"), "zone", "zone offset hour 24 is not 00..23"),
        (_GOOD.replace(".bin.", ".log."), "bin_mark", "'log' where 'bin' should follow the column partition"),
        (_GOOD.replace("ip1", "ip$1"), "internal_partition", "invalid internal partition name 'ip$1'"),
        ("Market.Trade.System.ip1.2026-11-22.bin", "fields", "the name ends after 'bin' where the date (yyyy-MM-dd)"),
    ],
)
def test_bad_file_names_say_which_part_is_wrong(bad, part, problem):
    with pytest.raises(InvalidLogFileName) as ei:
        LogFileName.parse(bad)
    assert ei.value.part == part and ei.value.problem.startswith(problem), (ei.value.part, ei.value.problem)
    assert str(ei.value) == f"{bad!r} is not a binary log file name: {ei.value.problem}"


# ---------------------------------------------------------------------------------------------
# Property: any rows and flags survive write + decode

_SCHEMA = TableSchema.from_dict(
    {
        "namespace": "P",
        "table": "Q",
        "columns": [
            {"name": "I", "type": "int"},
            {"name": "S", "type": "string"},
            {"name": "D", "type": "double"},
            {"name": "T", "type": "string"},
            {"name": "B", "type": "bool"},
        ],
    }
)

_row = st.tuples(
    st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1)),
    st.one_of(st.none(), st.text(max_size=20)),
    st.one_of(st.none(), st.floats(allow_nan=False)),
    st.one_of(st.none(), st.text(max_size=5)),
    st.one_of(st.none(), st.booleans()),
    st.sampled_from(list(RowFlag)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(_row, min_size=0, max_size=30), min_size=1, max_size=6))
def test_property_any_rows_and_flags_round_trip(tmp_path_factory, batches):
    p = tmp_path_factory.mktemp("prop") / "p.bin"
    expect = []
    with BinlogWriter(p, _SCHEMA) as w:
        for batch in batches:
            cols = {name: [r[i] for r in batch] for i, name in enumerate(["I", "S", "D", "T", "B"])}
            cols = {
                "I": pa.array(cols["I"], pa.int32()),
                "S": pa.array(cols["S"], pa.string()),
                "D": pa.array(cols["D"], pa.float64()),
                "T": pa.array(cols["T"], pa.string()),
                "B": pa.array(cols["B"], pa.bool_()),
            }
            w.write_rows(normalize_columns(_SCHEMA, cols), np.array([int(r[5]) for r in batch], np.uint8))
            expect.extend(batch)
    got = read_file(p, _SCHEMA)
    assert got.table.num_rows == len(expect)
    rows = list(zip(*[got.table.column(n).to_pylist() for n in ["I", "S", "D", "T", "B"]], got.flags.tolist()))
    assert rows == [tuple(r[:5]) + (int(r[5]),) for r in expect]


# --------------------------------------------------------------------------------------------
# The C encoder writes the numpy encoder's bytes

_EVERY_TYPE = TableSchema.from_dict({"namespace": "P", "table": "E", "columns": [
    {"name": n, "type": t} for n, t in [("BO", "bool"), ("BY", "byte"), ("SH", "short"), ("IN", "int"),
                                        ("LO", "long"), ("FL", "float"), ("DO", "double"), ("CH", "char"),
                                        ("S1", "string"), ("TS", "timestamp"), ("S2", "string"),
                                        ("S3", "string"), ("I2", "int")]]})
_VALUES = {
    "bool": st.booleans(), "byte": st.integers(-128, 127), "short": st.integers(-(2**15), 2**15 - 1),
    "int": st.integers(-(2**31), 2**31 - 1), "long": st.integers(-(2**63), 2**63 - 1),
    "float": st.floats(width=32), "double": st.floats(), "char": st.integers(0, 0xFFFF),
    "string": st.text(max_size=12), "timestamp": st.integers(-(2**63), 2**63 - 1),
}


@st.composite
def _every_type_batch(draw):
    """A batch of every column type, nulls anywhere, sliced at a random row (an offset into
    its buffers), string nulls that span bytes of the data buffer."""
    n = draw(st.integers(0, 40))
    cut = draw(st.integers(0, 3))
    cols = []
    for c in _EVERY_TYPE.columns:
        values = draw(st.lists(st.one_of(st.none(), _VALUES[c.type.value]), min_size=n + cut, max_size=n + cut))
        if c.type.value == "timestamp":
            arr = pa.array(values, pa.int64()).view(c.type.arrow_type)
        elif c.type.value == "string" and draw(st.booleans()):
            # nulls over bytes: the values' bytes stay in the data buffer under a validity of nulls
            full = pa.array(["" if v is None else v for v in values], pa.string())
            valid = np.array([v is not None for v in values], dtype=bool)
            arr = pa.StringArray.from_buffers(len(full), full.buffers()[1], full.buffers()[2],
                                              pa.py_buffer(np.packbits(valid, bitorder="little")),
                                              int((~valid).sum()))
        else:
            arr = pa.array(values, c.type.arrow_type)
        cols.append(arr.slice(cut))
    flags = np.array(draw(st.lists(st.sampled_from([0, 1, 2, 3]), min_size=n, max_size=n)), np.uint8)
    return cols, flags


@pytest.mark.skipif(format_module.rowencode is None, reason="the C encoder was not built")  # see the test below
@settings(max_examples=300, deadline=None)
@given(batch=_every_type_batch())
def test_the_c_encoder_writes_the_numpy_encoders_bytes(batch):
    cols, flags = batch
    c_bytes, c_rows = format_module.encode_rows(_EVERY_TYPE, cols, flags)
    np_bytes, np_rows = format_module.encode_rows_numpy(_EVERY_TYPE, cols, flags)
    assert format_module._c_columns(_EVERY_TYPE, cols, len(flags)) is not None  # the C encoder wrote c_bytes
    assert (c_rows, bytes(c_bytes)) == (np_rows, bytes(np_bytes))


def test_the_c_encoder_is_built():
    """``make install`` builds the C encoder (setup.py), and ``encode_rows`` uses it."""
    assert format_module.rowencode is not None, "disd.binlog.rowencode was not built (no C compiler?)"


# --------------------------------------------------------------------------------------------
# Schema versions in the header


def _versioned(version: int, renamed: bool = False) -> TableSchema:
    cols = [{"name": "Timestamp", "type": "timestamp"}, {"name": "Symbol" if renamed else "Sym", "type": "string"},
            {"name": "Size", "type": "long"}]
    if renamed:
        cols[1]["renamed_from"] = "Sym"
    return TableSchema.from_dict({"namespace": "Market", "table": "Quote", "version": version, "columns": cols})


def test_header_round_trips_the_schema_version_and_renames(tmp_path):
    s = _versioned(3, renamed=True)
    p = tmp_path / "v3.bin"
    write_log(p, s, {"Size": [1, 2]}, [3, 3])
    h = decode_header(p.read_bytes())
    assert h.schema.version == 3 and h.schema.column("Symbol").renamed_from == "Sym"
    assert h.fingerprint == s.fingerprint
    contents = read_file(p)
    assert contents.schema.version == 3 and contents.table.column("Size").to_pylist() == [1, 2]


def test_header_written_before_versions_reads_as_version_1(tmp_path):
    """A header whose schema JSON has no ``version`` key (as every log before versions) is
    version 1; built here byte by byte, as an old writer wrote it."""
    import json
    import struct

    from disd.binlog.format import HEADER_FIXED, MAGIC, crc32c, encode_frame, encode_rows

    s = _versioned(1)
    old = {k: v for k, v in s.canonical().items() if k != "version"}
    body = json.dumps(old, separators=(",", ":"), sort_keys=True).encode()
    assert b"version" not in body
    head = HEADER_FIXED.pack(MAGIC, 1, 0, len(body), bytes.fromhex(s.fingerprint)) + body
    payload, n = encode_rows(s, normalize_columns(s, {"Size": [7]}), np.array([3], np.uint8))
    p = tmp_path / "old.bin"
    p.write_bytes(head + struct.pack("<I", crc32c(head)) + encode_frame(payload, n))
    h = decode_header(p.read_bytes())
    assert h.schema.version == 1 and h.schema == s
    assert read_file(p).table.column("Size").to_pylist() == [7]
    # a logger of version 1 appends to it; one of version 2 with the same columns does not
    with BinlogWriter(p, s) as w:
        w.write_rows(normalize_columns(s, {"Size": [8]}), np.array([3], np.uint8))
    assert read_file(p).table.column("Size").to_pylist() == [7, 8]
    with pytest.raises(SchemaMismatchError, match="version 1 of Market.Quote, not version 2"):
        BinlogWriter(p, _versioned(2))


# -- rows with several string columns: the row-major heap split per column --------------------------

TAGS = TableSchema.from_dict({"namespace": "Test", "table": "Tags", "columns": [
    {"name": "A", "type": "string"}, {"name": "N", "type": "int"}, {"name": "B", "type": "string"},
    {"name": "C", "type": "string"}]})


def _tags_frame(table: pa.Table, mutate=None) -> bytes:  # noqa: ANN001
    """A log of TAGS holding ``table`` in one frame; ``mutate(rec, heap)`` edits its records
    and string heap first and the frame is rebuilt (checksum included) around the result."""
    from disd.binlog.format import encode_frame, encode_header, encode_rows, layout_for

    n = table.num_rows
    payload, _ = encode_rows(TAGS, normalize_columns(TAGS, table), np.full(n, RowFlag.SINGLE_ROW, np.uint8))
    dtype = layout_for(TAGS).dtype
    rec = np.frombuffer(payload[: n * dtype.itemsize], dtype).copy()
    heap = bytearray(payload[n * dtype.itemsize:])
    if mutate is not None:
        heap = mutate(rec, heap)
    return encode_header(TAGS) + encode_frame(rec.tobytes() + bytes(heap), n)


def _read_tags(tmp_path, blob: bytes) -> pa.Table:  # noqa: ANN001
    p = tmp_path / "Test.Tags.System.ip.2026-11-22.bin.2026-11-22.000000.000+0000"
    p.write_bytes(blob)
    return read_file(p).table


def test_several_string_columns_with_nulls_round_trip(tmp_path):
    t = pa.table({"A": ["x", None, "żółć", "", "abc"], "N": [1, 2, 3, 4, 5], "B": [None, "日本", "b", None, ""],
                  "C": ["c1", "c2", None, "c4", "🚀"]})
    assert _read_tags(tmp_path, _tags_frame(t)).equals(t.cast(TAGS.arrow_schema()))


def test_several_string_columns_name_the_bad_column(tmp_path):
    t = pa.table({"A": ["aa", "bb"], "N": [1, 2], "B": ["cc", "dd"], "C": ["ee", "ff"]})

    def bad_utf8_in_c(rec, heap):  # noqa: ANN001
        heap[-1] = 0xFF  # the last byte of the heap is the last row's C
        return heap

    with pytest.raises(CorruptLogError, match="column C"):
        _read_tags(tmp_path, _tags_frame(t, bad_utf8_in_c))

    def null_b_with_bytes(rec, heap):  # noqa: ANN001
        rec["_nulls"][0] |= 1 << 2  # B of row 0 marked null, its two bytes still there
        return heap

    with pytest.raises(CorruptLogError, match="null B value with a non-zero length"):
        _read_tags(tmp_path, _tags_frame(t, null_b_with_bytes))

    def short_heap(rec, heap):  # noqa: ANN001
        return heap[:-1]

    with pytest.raises(CorruptLogError, match="heap size"):
        _read_tags(tmp_path, _tags_frame(t, short_heap))
