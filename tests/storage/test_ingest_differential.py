"""The compiled ingest path (``disd.storage.ingestcore``) against the Python reference
(``binlog.format``'s scan and decode, ``storage.decodedrows``, ``PyWriteState``), fed the same
random chunks through the same entry (``storage.ingest.ingest_chunks``).

Each example is a program over two locations of one table (every column type, with nulls,
chars, timestamps, one string column or two, or none): rows with random transaction flags
appended to their logs, sent as chunks of one or more frames, several locations' chunks in one
batch; chunks cut short (torn), with a byte flipped, or with mutated rows re-sealed under correct
checksums (so the decoder's own checks are reached: flags, string lengths, null strings, UTF-8);
wrong offsets; new log files; streams that end (their open transaction rolled back) and resume
from the resume point.  After every step the two agree on every chunk's answer (ack or refusal,
with its message) and on every count; at the end, after a flush and a checkpoint, on every
column file's bytes and on ``table.size``.
"""

from __future__ import annotations

import dataclasses
import pathlib
import struct

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disd.binlog import LocationKey
from disd.binlog.format import crc32c, encode_frame, encode_header, encode_rows, layout_for
from disd.schema import ColumnType, SchemaRegistry, TableSchema
from disd.storage import StorageEngine, ingestcore
from disd.storage.checkpoint import read_record
from disd.storage.ingest import ChunkResult, LocationIngest, ingest_chunks
from support.rows import ALL_TYPES, TRADE

FIXED_ONLY = TableSchema.from_dict({
    "namespace": "Test", "table": "Fixed",
    "columns": [{"name": "Flag", "type": "bool"}, {"name": "C", "type": "char"},
                {"name": "T", "type": "timestamp"}, {"name": "F", "type": "float"}],
})
TABLES = {"trade": TRADE, "all": ALL_TYPES, "fixed": FIXED_ONLY}
REGISTRY = SchemaRegistry(TABLES.values())
IPS = ("ip0", "ip1")
STRINGS = st.text(st.characters(codec="utf-8"), max_size=6)


def _value(t: ColumnType):
    if t is ColumnType.BOOL:
        return st.booleans()
    if t is ColumnType.FLOAT:
        return st.floats(width=32)
    if t is ColumnType.DOUBLE:
        return st.floats()
    if t is ColumnType.STRING:
        return STRINGS
    if t is ColumnType.CHAR:
        return st.integers(0, 0xFFFF)
    info = np.iinfo(t.numpy_dtype)  # the sentinel itself included: it is stored as it is
    return st.integers(int(info.min), int(info.max))


@st.composite
def frame_rows(draw, schema: TableSchema) -> tuple[list[pa.Array], list[int]]:
    n = draw(st.integers(0, 5))
    # frames without a null as often as not: the compiled path copies those a column at a time
    dense = draw(st.booleans())
    cols = []
    for c in schema.columns:
        value = _value(c.type) if dense else st.one_of(st.none(), _value(c.type))
        vals = draw(st.lists(value, min_size=n, max_size=n))
        cols.append(pa.array(vals, c.type.arrow_type if c.type is not ColumnType.CHAR else pa.uint16()))
    flags = draw(st.lists(st.sampled_from([0, 1, 2, 3, 3, 3]), min_size=n, max_size=n))
    return cols, flags


def _frame(schema: TableSchema, cols: list[pa.Array], flags: list[int]) -> bytes:
    payload, n = encode_rows(schema, cols, np.asarray(flags, np.uint8))
    return encode_frame(payload, n)


BAD_UTF8 = [b"\xed\xa0\x80", b"\xc0\x80\x41", b"\xf4\x90\x80", b"\xe2\x82\x41", b"\xff\x41\x41", b"\x80\x41\x41"]


def _reseal(schema: TableSchema, frame: bytes, how: str, pos: int, value: int) -> bytes:
    """The frame with its rows mutated, under correct checksums: a byte set anywhere (``reseal``),
    a row's flag past the known ones (``flag``), a string with a length made null (``nullstr``),
    bytes of the heap made invalid UTF-8 (``utf8``)."""
    payload = bytearray(frame[16:])
    rows = struct.unpack_from("<I", frame, 4)[0]
    lay = layout_for(schema)
    rs = lay.row_size
    if how == "reseal" and payload:
        payload[pos % len(payload)] = value
    elif how == "flag" and rows:
        payload[(pos % rows) * rs] = 4 + value % 252
    elif how == "nullstr" and rows and lay.string_columns:
        j = lay.string_columns[pos % len(lay.string_columns)]
        r = pos % rows
        field = lay.dtype.fields[f"c{j}"][1]
        if struct.unpack_from("<I", payload, r * rs + field)[0] == 0:
            struct.pack_into("<I", payload, r * rs + field, 1)
        payload[r * rs + 1 + j // 8] |= 1 << (j % 8)
    elif how == "utf8" and len(payload) - rows * rs >= 3:
        heap = rows * rs
        at = heap + pos % (len(payload) - heap - 2)
        payload[at:at + 3] = BAD_UTF8[value % len(BAD_UTF8)]
    head = struct.pack("<III", len(payload), rows, crc32c(bytes(payload)))
    return head + struct.pack("<I", crc32c(head)) + bytes(payload)


@dataclasses.dataclass
class Chunk:
    file_name: str
    offset: int
    data: bytes
    caught_up: bool


class Log:
    """A location's logs as a tailer sees them: the current file's bytes and frame ends, and how
    far the stream has sent."""

    def __init__(self, schema: TableSchema, ip: str) -> None:
        self.schema, self.ip, self.files = schema, ip, 0
        self.new_file()

    def new_file(self) -> None:
        self.files += 1
        self.name = (f"{self.schema.namespace}.{self.schema.table}.System.{self.ip}.2026-11-22.bin."
                     f"2026-11-22.{self.files:02d}0000.000+0000")
        self.data = encode_header(self.schema)
        self.ends = [len(self.data)]
        self.sent = 0

    def resume(self, file_name: str | None, offset: int) -> None:
        """Send again from a resume point (at least the file it names is this one's)."""
        if file_name == self.name:
            self.sent = offset
        elif file_name is None or file_name < self.name:
            self.sent = 0


def _location(engine: StorageEngine, schema: TableSchema, ip: str):
    return engine.location(LocationKey(schema.namespace, schema.table, ip, "2026-11-22"))


def _stream(loc, schema: TableSchema) -> LocationIngest:
    """A stream's open: what the last one left uncommitted rolled back, then its resume point."""
    loc.rollback()
    rp, epoch = loc.resume()
    return LocationIngest(loc, schema, rp, epoch)


def _answer(r: ChunkResult | None):
    if r is None:
        return None
    refused = (r.refused.kind, r.refused.message) if r.refused is not None else None
    return (r.file_name, r.offset, r.committed_rows, refused, r.took)


def _send_to_both(schema: TableSchema, engines, locs, streams, logs: dict[str, Log],
                  batch: list[tuple[str, Chunk]]) -> None:
    """``batch`` to both engines' streams, which must answer alike; then each log's sent offset
    moves on, or, where the stream ended, both engines' streams open again at the resume point."""
    answers = {kind: [_answer(r) for r in ingest_chunks([(streams[kind][ip], ch, None) for ip, ch in batch])]
               for kind in engines}
    assert answers["c"] == answers["py"], batch
    for (ip, ch), r in zip(batch, answers["c"]):
        if r is not None and r[3] is None:
            logs[ip].sent = ch.offset + len(ch.data)
        elif r is not None:  # the stream ended: a new one resumes
            for kind in engines:
                streams[kind][ip] = _stream(locs[kind][ip], schema)
            rp = locs["c"][ip].resume_point
            logs[ip].resume(rp.file_name, rp.offset)


def _counts(loc):
    return (loc.written_rows, loc.committed_rows, loc.txn_open, loc.source, dict(loc.import_state),
            loc.committed_sizes)


_op = st.one_of(
    st.tuples(st.just("rows"), st.sampled_from(IPS), st.integers(1, 3)),
    st.tuples(st.just("send"), st.lists(st.tuples(st.sampled_from(IPS), st.integers(1, 3),
                                                  st.sampled_from([None, None, None, None, "torn", "flip", "reseal",
                                                                   "flag", "nullstr", "utf8", "offset"]),
                                                  st.integers(0, 10_000), st.integers(0, 255), st.booleans()),
                                        min_size=1, max_size=4)),
    st.tuples(st.just("newfile"), st.sampled_from(IPS)),
    st.tuples(st.just("reconnect"), st.sampled_from(IPS)),
)

_FUZZ = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.function_scoped_fixture])


@pytest.mark.skipif(ingestcore is None, reason="the compiled path is not built")
@_FUZZ
@given(data=st.data(), table=st.sampled_from(sorted(TABLES)), program=st.lists(_op, min_size=1, max_size=14))
def test_the_compiled_path_makes_what_the_reference_makes(tmp_path_factory, data, table, program):
    schema = TABLES[table]
    root = tmp_path_factory.mktemp("diff")
    engines = {kind: StorageEngine(str(root / kind), REGISTRY, compiled=kind == "c") for kind in ("c", "py")}
    try:
        locs = {kind: {ip: _location(e, schema, ip) for ip in IPS} for kind, e in engines.items()}
        streams = {kind: {ip: _stream(locs[kind][ip], schema) for ip in IPS} for kind in engines}
        logs = {ip: Log(schema, ip) for ip in IPS}
        for op in program:
            if op[0] == "rows":
                _, ip, frames = op
                for _ in range(frames):
                    cols, flags = data.draw(frame_rows(schema))
                    logs[ip].data += _frame(schema, cols, flags)
                    logs[ip].ends.append(len(logs[ip].data))
            elif op[0] == "newfile":
                logs[op[1]].new_file()
            elif op[0] == "reconnect":
                ip = op[1]
                for kind in engines:
                    streams[kind][ip] = _stream(locs[kind][ip], schema)
                rp = locs["c"][ip].resume_point
                assert rp == locs["py"][ip].resume_point
                logs[ip].resume(rp.file_name, rp.offset)
            else:
                batch = _chunks(schema, logs, op[1])
                if not batch:
                    continue
                _send_to_both(schema, engines, locs, streams, logs, batch)
            for ip in IPS:
                assert _counts(locs["c"][ip]) == _counts(locs["py"][ip]), (op, ip)
        for kind in engines:
            for ip in IPS:
                locs[kind][ip].flush()
                locs[kind][ip].checkpoint()
        for ip in IPS:
            c, py = locs["c"][ip], locs["py"][ip]
            assert c.published_rows == py.published_rows and c.column_files() == py.column_files()
            for name in c.file_names:
                assert (c.path / name).read_bytes() == (py.path / name).read_bytes(), name
            assert _record(c.path) == _record(py.path)
    finally:
        for e in engines.values():
            e.close()


def _record(path: pathlib.Path) -> dict:
    d = dataclasses.asdict(read_record(path))
    d.pop("time")
    return d


def _chunks(schema: TableSchema, logs: dict[str, Log], sends) -> list[tuple[str, Chunk]]:
    """One batch: per send, the next frames of a location's log (at most one chunk a location:
    after a refusal its stream ends), mutated as asked."""
    out, seen = [], set()
    for ip, frames, mutation, pos, value, caught_up in sends:
        log = logs[ip]
        if ip in seen or log.sent >= len(log.data):
            continue
        seen.add(ip)
        start = log.sent
        later = [e for e in log.ends if e > start]
        if not later:
            continue
        end = later[min(frames, len(later)) - 1]
        data = log.data[start:end]
        offset = start
        body = max(0, log.ends[0] - start)  # header bytes in the chunk (a file's first)
        if mutation == "torn" and len(data) > 1:
            data = data[: max(1, len(data) - 1 - pos % max(1, len(data) - 1))]
        elif mutation == "flip" and len(data) > body:
            p = body + pos % (len(data) - body)
            data = data[:p] + bytes([data[p] ^ (1 << (value % 8))]) + data[p + 1:]
        elif mutation in ("reseal", "flag", "nullstr", "utf8") and len(data) > body + 16:
            first = next(e for e in log.ends if e > max(start, log.ends[0])) - start  # its first frame's end
            data = data[:body] + _reseal(schema, data[body:first], mutation, pos, value) + data[first:]
        elif mutation == "offset":
            offset = start + 1 + pos % 7
        out.append((ip, Chunk(log.name, offset, data, caught_up)))
    return out


def test_the_build_has_the_compiled_path():
    """The product's build has the C modules (a build without a compiler would fall back to the
    reference quietly, and the tests above would compare nothing): a new location's write state
    is compiled, the real file system writes compiled states and makes new locations in C."""
    from disd.storage import fsio
    from disd.storage.writestate import is_compiled, new_write_state

    assert ingestcore is not None, "disd.storage.ingestcore was not built (no C compiler?)"
    assert is_compiled(new_write_state(TRADE, 65536))
    assert fsio.OS.write_states is not None and fsio.OS.create_locations is not None


# -- cases a random program rarely reaches --------------------------------------------------------


@pytest.mark.skipif(ingestcore is None, reason="the compiled path is not built")
@settings(max_examples=400, deadline=None)
@given(st.one_of(st.binary(max_size=12),
                 st.lists(st.sampled_from(BAD_UTF8 + [b"a", "é".encode(), "日".encode(), "🚀".encode(), b"\xef\xbf\xbf",
                                          b"\xf0\x90\x80\x80", b"\xed\x9f\xbf", b"\xee\x80\x80"]),
                          max_size=5).map(b"".join)))
def test_utf8_is_checked_as_the_reference_checks_it(raw):
    """Arrow's full validation of a string array (the reference's) and the compiled check agree
    on every value: surrogates, overlong forms, code points past U+10FFFF, cut sequences."""
    arr = pa.StringArray.from_buffers(1, pa.py_buffer(np.array([0, len(raw)], np.int32)), pa.py_buffer(raw))
    try:
        arr.validate(full=True)
        valid = True
    except pa.ArrowInvalid:
        valid = False
    assert ingestcore.utf8_valid(raw) == valid


def _heaps_across_frames(schema: TableSchema) -> bytes:
    """Two frames whose string lengths add up to their heaps only together: the reference decodes
    a chunk's frames as one batch (heaps joined), so it takes them, its strings shifted."""
    f1, _ = encode_rows(schema, _one_row(schema, "abc"), np.array([3], np.uint8))
    f2, _ = encode_rows(schema, _one_row(schema, "de"), np.array([3], np.uint8))
    rs = layout_for(schema).row_size  # one row's record, then its heap
    # move the first frame's last heap byte to the head of the second frame's heap
    return encode_frame(f1[:-1], 1) + encode_frame(f2[:rs] + f1[-1:] + f2[rs:], 1)


def _one_row(schema: TableSchema, s: str) -> list[pa.Array]:
    cols = []
    for c in schema.columns:
        if c.type is ColumnType.STRING:
            cols.append(pa.array([s]))
        elif c.type is ColumnType.TIMESTAMP:
            cols.append(pa.array([1], pa.timestamp("ns", tz="UTC")))
        elif c.type is ColumnType.BOOL:
            cols.append(pa.array([True]))
        else:
            cols.append(pa.array([1], c.type.arrow_type))
    return cols


@pytest.mark.skipif(ingestcore is None, reason="the compiled path is not built")
@pytest.mark.parametrize("table", ["trade", "all"])
def test_heaps_that_add_up_only_across_frames_are_taken_as_the_reference_takes_them(tmp_path, table):
    schema = TABLES[table]
    log = Log(schema, "ip0")
    log.data += _heaps_across_frames(schema)
    results, files = {}, {}
    for kind in ("c", "py"):
        e = StorageEngine(str(tmp_path / kind), REGISTRY, compiled=kind == "c")
        try:
            loc = _location(e, schema, "ip0")
            r = ingest_chunks([(_stream(loc, schema), Chunk(log.name, 0, log.data, True), None)])[0]
            results[kind] = _answer(r)
            loc.flush()
            files[kind] = {n: (loc.path / n).read_bytes() for n in loc.file_names}
        finally:
            e.close()
    assert results["c"] == results["py"] and results["c"][3] is None and results["c"][2] == 2
    assert files["c"] == files["py"]


@st.composite
def dense_frames(draw, schema: TableSchema) -> list[tuple[list[pa.Array], list[int]]]:
    """Frames of up to 40 rows without a null, as an application's logs mostly are: single rows,
    or transactions that may span frames (the commit inside a frame, at its end, or later)."""
    frames = []
    for _ in range(draw(st.integers(1, 6))):
        n = draw(st.integers(1, 40))
        cols = [pa.array(draw(st.lists(_value(c.type), min_size=n, max_size=n)),
                         c.type.arrow_type if c.type is not ColumnType.CHAR else pa.uint16())
                for c in schema.columns]
        flags = draw(st.one_of(st.just([3] * n), st.lists(st.sampled_from([0, 1, 2, 3]), min_size=n, max_size=n)))
        frames.append((cols, flags))
    return frames


@pytest.mark.skipif(ingestcore is None, reason="the compiled path is not built")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), table=st.sampled_from(sorted(TABLES)))
def test_frames_without_nulls_make_what_the_reference_makes(tmp_path_factory, data, table):
    """The compiled path copies a frame whose rows are all kept and hold no null a column at a
    time: the same column files, records and answers as the reference's row by row."""
    schema = TABLES[table]
    log = Log(schema, "ip0")
    for cols, flags in data.draw(dense_frames(schema)):
        log.data += _frame(schema, cols, flags)
        log.ends.append(len(log.data))
    cuts = sorted(set(data.draw(st.lists(st.sampled_from(log.ends), max_size=4))) | {log.ends[-1]})
    root = tmp_path_factory.mktemp("dense")
    answers, files, records = {}, {}, {}
    for kind in ("c", "py"):
        e = StorageEngine(str(root / kind), REGISTRY, compiled=kind == "c")
        try:
            loc = _location(e, schema, "ip0")
            stream, start, answers[kind] = _stream(loc, schema), 0, []
            for end in cuts:
                if end > start:
                    r = ingest_chunks([(stream, Chunk(log.name, start, log.data[start:end], True), None)])[0]
                    answers[kind].append((_answer(r), _counts(loc)))
                    start = end
            loc.flush()
            loc.checkpoint()
            files[kind] = {n: (loc.path / n).read_bytes() for n in loc.file_names}
            records[kind] = _record(loc.path)
        finally:
            e.close()
    assert answers["c"] == answers["py"]
    assert files["c"] == files["py"] and records["c"] == records["py"]


@pytest.mark.skipif(ingestcore is None, reason="the compiled path is not built")
@pytest.mark.parametrize("n", [0, 1, 7, 8, 767, 768, 769, 3 * 768 + 5, 24575, 24576, 24577, 2 * 24576 + 800,
                               (3 << 20) + 3])
def test_the_compiled_crc_is_the_reference_crc(n):
    """The compiled CRC32C runs three streams at once over blocks of 256 and 8,192 bytes and joins
    them: every length around those blocks gives the reference's value."""
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()
    assert ingestcore.crc32c(data) == crc32c(data)


@pytest.mark.skipif(ingestcore is None, reason="the compiled path is not built")
def test_the_compiled_engine_takes_chunks_in_c(tmp_path, monkeypatch):
    """The differential test compares two paths only if the compiled engine really takes its
    chunks in C: one call for a batch of two locations' chunks."""
    calls = []
    real = ingestcore.ingest_batch
    monkeypatch.setattr(ingestcore, "ingest_batch", lambda items: calls.append(len(items)) or real(items))
    e = StorageEngine(str(tmp_path / "db"), REGISTRY, compiled=True)
    try:
        logs = {ip: Log(TRADE, ip) for ip in IPS}
        for log in logs.values():
            log.data += _frame(TRADE, *_trade_rows())
        streams = {ip: _stream(_location(e, TRADE, ip), TRADE) for ip in IPS}
        results = ingest_chunks([(streams[ip], Chunk(logs[ip].name, 0, logs[ip].data, True), None) for ip in IPS])
        assert [r.refused for r in results] == [None, None] and [r.committed_rows for r in results] == [2, 2]
        assert calls == [2]
    finally:
        e.close()


def _trade_rows() -> tuple[list[pa.Array], list[int]]:
    return ([pa.array([1, 2], pa.timestamp("ns", tz="UTC")), pa.array(["a", None]), pa.array([1.5, None]),
             pa.array([None, 7], pa.int32())], [3, 3])
