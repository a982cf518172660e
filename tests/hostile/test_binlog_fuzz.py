"""Fuzzing the binary-log decoder (`disd.binlog.format`) with hypothesis.

The decoder's contract on any bytes at all: it returns (a header, a run of whole frames, decoded
rows whose columns all have the run's row count and pass Arrow's full validation) or it raises
``CorruptLogError`` naming an offset.  Any other exception is a crash of the DIS's ingest path; a
truncated valid log is never corruption, only a torn tail.

Mutations of raw bytes mostly stop at a checksum, so a second family re-seals mutated payloads
with correct checksums, which is what a hostile sender who knows the format would do: those reach
the row-record, null-bitmap, flag and string-heap checks.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from disd.binlog import CorruptLogError, decode_frames, decode_header, scan_frames
from disd.binlog.format import encode_header, layout_for
from disd.schema import TableSchema
from support import ALL_TYPES, TRADE

from .helpers import seal, split_frames, valid_log

SCHEMAS = {"trade": TRADE, "all": ALL_TYPES}


def _all_types_log(tmp) -> bytes:
    from disd.binlog import BinlogWriter, normalize_columns

    p = tmp / "all.bin"
    n = 6
    cols = {"Bool": [True, None, False, True, False, True], "Byte": [1, -2, None, 4, 5, 6],
            "Short": [1, 2, 3, None, 5, 6], "Int": [1, 2, 3, 4, None, 6], "Long": [1, 2, 3, 4, 5, None],
            "Float": [0.5] * n, "Double": [None, 1.5, 2.5, 3.5, 4.5, 5.5], "Char": ["a", "b", None, "ż", "e", "f"],
            "String": ["x", "", None, "日本", "yy", "z"], "Timestamp": [0, 1, 2, 3, None, 5],
            "Other": [None, "a", "bb", "", "ccc", "d"]}
    with BinlogWriter(p, ALL_TYPES) as w:
        w.write_rows(normalize_columns(ALL_TYPES, cols), np.array([3, 3, 1, 0, 2, 3], np.uint8))
        w.write_rows(normalize_columns(ALL_TYPES, {k: v[:2] for k, v in cols.items()}), np.array([3, 3], np.uint8))
    return p.read_bytes()


_SAMPLES: dict[str, bytes] = {}


def sample(name: str, tmp_factory) -> bytes:
    if name not in _SAMPLES:
        tmp = tmp_factory.mktemp(f"sample-{name}")
        _SAMPLES[name] = valid_log(tmp, TRADE) if name == "trade" else _all_types_log(tmp)
    return _SAMPLES[name]


def decode_all(data: bytes, schema: TableSchema, header_required: bool = True):
    """What the ingest path does with a first chunk: header, frames, rows.  Asserts the
    decoder's contract and returns ("corrupt", error), ("short", None) or ("ok", rows)."""
    try:
        start = 0
        if header_required:
            hdr = decode_header(data)
            if hdr is None:
                return "short", None
            start = hdr.size
        run = scan_frames(data, 0, schema, start=start)
        assert start <= run.end_offset <= len(data)
        assert run.starts == sorted(run.starts) and all(s < e for s, e in zip(run.starts, run.ends))
        assert all(a == b for a, b in zip(run.ends, run.starts[1:]))
        if not run.starts:
            return "ok", None
        rows = decode_frames(data, 0, run, schema)
    except CorruptLogError as e:
        assert isinstance(e.offset, int) and 0 <= e.offset <= len(data)
        assert "corrupt binary log at byte" in str(e)
        return "corrupt", e
    assert rows.num_rows == run.rows
    assert set(np.unique(rows.flags).tolist()) <= {0, 1, 2, 3}
    for col, c in zip(rows.columns, schema.columns):
        assert len(col) == rows.num_rows
        assert col.type == c.type.arrow_type
        col.validate(full=True)
    pa.Table.from_arrays(rows.columns, schema=schema.arrow_schema()).validate(full=True)
    return "ok", rows


FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(data=st.binary(max_size=4096), which=st.sampled_from(sorted(SCHEMAS)), with_header=st.booleans())
def test_random_bytes_never_crash_the_decoder(data, which, with_header):
    schema = SCHEMAS[which]
    if with_header:
        data = encode_header(schema) + data
    decode_all(data, schema)
    decode_all(data, schema, header_required=False)


_op = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 1 << 20), st.integers(0, 7)),
    st.tuples(st.just("set"), st.integers(0, 1 << 20), st.integers(0, 255)),
    st.tuples(st.just("insert"), st.integers(0, 1 << 20), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("delete"), st.integers(0, 1 << 20), st.integers(1, 16)),
)


def mutate(buf: bytearray, ops) -> bytearray:
    for kind, pos, arg in ops:
        if not buf:
            break
        p = pos % len(buf)
        if kind == "flip":
            buf[p] ^= 1 << arg
        elif kind == "set":
            buf[p] = arg
        elif kind == "insert":
            buf[p:p] = arg
        else:
            del buf[p:p + arg]
    return buf


@FUZZ
@given(which=st.sampled_from(sorted(SCHEMAS)), ops=st.lists(_op, min_size=1, max_size=6))
def test_mutated_valid_logs_are_decoded_or_reported_corrupt(tmp_path_factory, which, ops):
    data = bytes(mutate(bytearray(sample(which, tmp_path_factory)), ops))
    decode_all(data, SCHEMAS[which])


@FUZZ
@given(which=st.sampled_from(sorted(SCHEMAS)), frame=st.integers(0, 1), ops=st.lists(_op, min_size=1, max_size=6),
       rows_delta=st.sampled_from([0, 0, 0, 1, -1, 2, 1000, 1 << 31]))
def test_resealed_mutated_frames_reach_the_field_checks(tmp_path_factory, which, frame, ops, rows_delta):
    header, frames = split_frames(sample(which, tmp_path_factory))
    out = bytearray(header)
    for i, f in enumerate(frames):
        if i == frame:
            out += seal(mutate(bytearray(f.payload), ops), f.row_count + rows_delta)
        else:
            out += seal(f.payload, f.row_count)
    status, err = decode_all(bytes(out), SCHEMAS[which])
    event(status if status != "corrupt" else f"corrupt: {err.problem[:24]}")


@FUZZ
@given(which=st.sampled_from(sorted(SCHEMAS)), payload=st.binary(max_size=2048), row_count=st.integers(0, 300))
def test_random_sealed_payloads_are_decoded_or_reported_corrupt(which, payload, row_count):
    schema = SCHEMAS[which]
    data = encode_header(schema) + seal(payload, row_count)
    status, _ = decode_all(data, schema)
    if row_count * layout_for(schema).row_size > len(payload):
        assert status == "corrupt"


def test_flags_and_string_lengths_of_hostile_frames_are_corruption(tmp_path):
    """Hand-made frames with correct checksums: an unknown flag, a string length pointing past
    the heap, a null string with a length, more rows than fit: each is a CorruptLogError."""
    header, frames = split_frames(valid_log(tmp_path, TRADE))
    lay = layout_for(TRADE)
    f = frames[0]
    rec = np.frombuffer(bytes(f.payload[: f.row_count * lay.row_size]), dtype=lay.dtype).copy()
    heap = bytes(f.payload[f.row_count * lay.row_size:])
    sym = f"c{TRADE.column_names.index('Sym')}"
    cases = {}
    r = rec.copy()
    r["_flag"][0] = 7
    cases["unknown flag"] = r.tobytes() + heap
    r = rec.copy()
    r[sym][-1] = 0xFFFFFFFF
    cases["string length past the heap"] = r.tobytes() + heap
    r = rec.copy()
    r["_nulls"][0] |= 1 << TRADE.column_names.index("Sym")
    cases["null string with a length"] = r.tobytes() + heap
    for what, payload in cases.items():
        status, err = decode_all(header + seal(payload, f.row_count), TRADE)
        assert status == "corrupt", what
    status, err = decode_all(header + seal(f.payload, f.row_count + 10_000), TRADE)
    assert status == "corrupt" and "do not fit" in str(err)


def test_every_truncation_of_a_valid_log_is_a_torn_tail_not_corruption(tmp_path_factory):
    for which in sorted(SCHEMAS):
        data = sample(which, tmp_path_factory)
        header, frames = split_frames(data)
        boundaries = {f.offset for f in frames} | {len(data)}
        total = sum(f.row_count for f in frames)
        for cut in range(len(data) + 1):
            status, rows = decode_all(data[:cut], SCHEMAS[which])
            assert status != "corrupt", (which, cut)
            if cut < len(header):
                assert status == "short"
                continue
            run = scan_frames(data[:cut], 0, SCHEMAS[which], start=len(header))
            assert run.end_offset in boundaries | {len(header)}
            assert run.end_offset <= cut and run.torn == (cut != run.end_offset)
            if cut == len(data):
                assert rows is not None and rows.num_rows == total
