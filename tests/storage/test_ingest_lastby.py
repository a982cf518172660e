"""Last-by locations on the compiled ingest path: their chunks are taken in C, and the rows each
C call appended reach the state from the write state's buffers (``WriteState.take_tail``,
``storage.ingest._feed_lastby``), with no read of the column files and no Python decode.

The differential test feeds the compiled engine and the reference (``compiled=False``) the
same random chunks (every column type as a key, nulls and sentinels, NaNs; random transaction
flags, so rows are rolled back and transactions abandoned; torn, flipped and re-sealed chunks;
two chunks of one location in one batch; streams that end and resume) and, at every publish,
requires both states to be identical and equal to the last-by of the published rows, each
taken from memory.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disd.config import ImportConfig
from disd.schema import ColumnType, TableSchema
from disd.storage import StorageEngine, ingest, ingestcore
from disd.storage import columns as colfmt
from disd.storage.ingest import LocationIngest, ingest_chunks
from disd.storage.lastby import last_by, stored
from disd.storage.lastbyfeed import tail_columns
from disd.storage.writestate import is_compiled, new_write_state
from support.rows import ALL_TYPES, TRADE, bits

from .test_ingest_differential import (IPS, REGISTRY, TABLES, Chunk, Log, _counts, _frame, _location,
                                       _reseal, _send_to_both, _stream, _trade_rows, frame_rows)

#: key columns per table: one column of each kind, and keys of several columns
KEYS = {
    "trade": [("Sym",), ("Size",), ("Sym", "Price")],
    "all": [("String",), ("Bool",), ("Byte",), ("Char",), ("Float",), ("Double",), ("Timestamp",), ("Long",),
            ("Short", "Other"), ("Int", "Bool", "String"), ("Double", "Float")],
    "fixed": [("Flag",), ("C", "T"), ("F",)],
}


def _engine(root, schema: TableSchema, keys: tuple[str, ...], compiled: bool) -> StorageEngine:
    return StorageEngine(str(root), REGISTRY, compiled=compiled,
                         import_tables={schema.key: ImportConfig(last_by=keys, lastby_max_keys=1 << 20)})



def _chunks(schema: TableSchema, logs: dict[str, Log], sends) -> list[tuple[str, Chunk]]:
    """One batch: per send, the next frames of a location's log after those already in the batch
    (so a location may send two chunks in one batch), mutated as asked."""
    out, sent = [], {ip: log.sent for ip, log in logs.items()}
    for ip, frames, mutation, pos, value, caught_up in sends:
        log, start = logs[ip], sent[ip]
        later = [e for e in log.ends if e > start]
        if not later:
            continue
        end = later[min(frames + (start == 0), len(later)) - 1]  # (a file's header and its first frames)
        data, offset = log.data[start:end], start
        sent[ip] = end
        body = max(0, log.ends[0] - start)  # header bytes in the chunk (a file's first)
        if mutation == "torn" and len(data) > 1:
            data = data[: max(1, len(data) - 1 - pos % max(1, len(data) - 1))]
        elif mutation == "flip" and len(data) > body:
            p = body + pos % (len(data) - body)
            data = data[:p] + bytes([data[p] ^ (1 << (value % 8))]) + data[p + 1:]
        elif mutation in ("reseal", "flag", "utf8") and len(data) > body + 16:
            first = next(e for e in log.ends if e > max(start, log.ends[0])) - start  # its first frame's end
            data = data[:body] + _reseal(schema, data[body:first], mutation, pos, value) + data[first:]
        out.append((ip, Chunk(log.name, offset, data, caught_up)))
    return out


_send = st.tuples(st.just("send"), st.lists(st.tuples(st.sampled_from(IPS), st.integers(1, 3), st.integers(1, 3),
                                                      st.sampled_from([None] * 10 + ["torn", "flip", "reseal", "flag",
                                                                                     "utf8"]),
                                                      st.integers(0, 10_000), st.integers(0, 255), st.booleans()),
                                            min_size=1, max_size=4))
_op = st.one_of(  # (sends drawn more often than the rest: most programs publish rows)
    _send, _send, _send,
    st.tuples(st.just("publish"), st.sampled_from(IPS)),
    st.tuples(st.just("checkpoint"), st.sampled_from(IPS)),
    st.tuples(st.just("newfile"), st.sampled_from(IPS)),
    st.tuples(st.just("reconnect"), st.sampled_from(IPS)),
    st.tuples(st.just("resend"), st.sampled_from(IPS)),
)


def _check_states(locs: dict, ip: str) -> None:
    """After a publish: both states at the published rows, identical, equal to the last-by of
    the rows the files hold, and made from memory."""
    states = {}
    for kind in locs:
        loc = locs[kind][ip]
        state = loc.lastby.snapshot()
        assert state.rows == loc.published_rows, kind
        assert bits(state.table).equals(bits(last_by(loc.read_table(), loc.lastby.keys))), kind
        assert loc.lastby.rows_read_back == 0, kind
        states[kind] = state
    assert bits(states["c"].table).equals(bits(states["py"].table))


@pytest.mark.skipif(ingestcore is None, reason="the compiled path is not built")
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(data=st.data(), table=st.sampled_from(sorted(TABLES)), program=st.lists(_op, min_size=3, max_size=20))
def test_last_by_states_from_the_compiled_path_equal_the_reference(tmp_path_factory, monkeypatch, data, table,
                                                                   program):
    schema = TABLES[table]
    keys = data.draw(st.sampled_from(KEYS[table]))
    root = tmp_path_factory.mktemp("lastby")
    engines = {kind: _engine(root / kind, schema, keys, kind == "c") for kind in ("c", "py")}
    in_c: set[int] = set()  # the locations whose chunks went to the C call
    real = ingestcore.ingest_batch

    def counted(items):
        in_c.update(id(state) for state, *_ in items)
        return real(items)

    monkeypatch.setattr(ingestcore, "ingest_batch", counted)
    try:
        locs = {kind: {ip: _location(e, schema, ip) for ip in IPS} for kind, e in engines.items()}
        streams = {kind: {ip: _stream(locs[kind][ip], schema) for ip in IPS} for kind in engines}
        logs = {ip: Log(schema, ip) for ip in IPS}
        for op in program:
            if op[0] == "publish":
                for kind in engines:
                    locs[kind][op[1]].flush()
                _check_states(locs, op[1])
            elif op[0] == "checkpoint":
                for kind in engines:
                    locs[kind][op[1]].checkpoint()
            elif op[0] == "newfile":
                logs[op[1]].new_file()
            elif op[0] in ("reconnect", "resend"):  # a new stream from the resume point
                ip = op[1]
                for kind in engines:
                    if op[0] == "reconnect":  # its open transaction rolled back first
                        streams[kind][ip] = _stream(locs[kind][ip], schema)
                    else:  # left to the chunk at the resume point to roll back (in the C call)
                        streams[kind][ip] = LocationIngest(locs[kind][ip], schema, *locs[kind][ip].resume())
                rp = locs["c"][ip].resume_point
                logs[ip].resume(rp.file_name, rp.offset)
            else:
                for ip, new_frames, *_ in op[1]:  # each send's location logs rows first
                    for _ in range(new_frames):
                        cols, _ = data.draw(frame_rows(schema))
                        # (transactions more often than frame_rows draws them: left open at a
                        # chunk's end, then abandoned or ended by the next call)
                        flags = data.draw(st.lists(st.sampled_from([0, 0, 1, 1, 2, 3]), min_size=len(cols[0]),
                                                   max_size=len(cols[0])))
                        logs[ip].data += _frame(schema, cols, flags)
                        logs[ip].ends.append(len(logs[ip].data))
                batch = _chunks(schema, logs, [(ip, *rest) for ip, _, *rest in op[1]])
                if not batch:
                    continue
                _send_to_both(schema, engines, locs, streams, logs, batch)
            for ip in IPS:
                assert _counts(locs["c"][ip]) == _counts(locs["py"][ip]), (op, ip)
        for ip in IPS:
            for kind in engines:
                locs[kind][ip].flush()
            _check_states(locs, ip)
            loc = locs["c"][ip]
            if loc.written_rows:  # (rows were taken: by the C call, not the reference)
                assert id(loc.state) in in_c
    finally:
        for e in engines.values():
            e.close()


@pytest.mark.skipif(ingestcore is None, reason="the compiled path is not built")
def test_last_by_locations_take_their_chunks_in_c(tmp_path, monkeypatch):
    """A last-by location's chunks go to the C call with every other location's, its rows reach
    the state from the write state's buffers: no chunk decoded in Python, no row read back."""
    calls, decoded = [], []
    real = ingestcore.ingest_batch
    monkeypatch.setattr(ingestcore, "ingest_batch", lambda items: calls.append(len(items)) or real(items))
    real_decode = ingest.decode_frames
    monkeypatch.setattr(ingest, "decode_frames", lambda *a: decoded.append(a) or real_decode(*a))
    e = _engine(tmp_path / "db", TRADE, ("Sym",), compiled=True)
    try:
        logs = {ip: Log(TRADE, ip) for ip in IPS}
        streams: dict[str, LocationIngest] = {}
        for ip, log in logs.items():
            for _ in range(3):
                log.data += _frame(TRADE, *_trade_rows())
            streams[ip] = _stream(_location(e, TRADE, ip), TRADE)
        results = ingest_chunks([(streams[ip], Chunk(logs[ip].name, 0, logs[ip].data, True), None) for ip in IPS])
        assert [r.refused for r in results] == [None, None] and [r.committed_rows for r in results] == [6, 6]
        assert calls == [2] and decoded == []
        for ip in IPS:
            loc = _location(e, TRADE, ip)
            loc.flush()
            state = loc.lastby.snapshot()
            assert state.rows == 6 and loc.lastby.rows_read_back == 0
            assert state.table.equals(last_by(loc.read_table(), ["Sym"]))
            assert state.table.column("Sym").to_pylist() == ["a", None]
            assert state.table.column("Size").to_pylist() == [None, 7]  # the sentinel, as null
    finally:
        e.close()


def _rows(syms: list[str]) -> list[pa.Array]:
    n = len(syms)
    return [pa.array(range(n), pa.timestamp("ns", tz="UTC")), pa.array(syms), pa.array([float(i) for i in range(n)]),
            pa.array(range(n), pa.int32())]


@pytest.mark.skipif(ingestcore is None, reason="the compiled path is not built")
def test_rows_a_c_call_rolls_back_leave_the_state_as_the_reference_does(tmp_path):
    """Rollbacks made inside the C call: a stream resent from its resume point (a restart cuts
    the open transaction's rows, taken by an earlier call), a transaction abandoned by the next
    chunk of the same call, and one abandoned by the next call; the state equals the
    reference's and the last-by of the files, from memory."""
    states = {}
    for kind in ("c", "py"):
        e = _engine(tmp_path / kind, TRADE, ("Sym",), compiled=kind == "c")
        try:
            loc, log = _location(e, TRADE, "ip0"), Log(TRADE, "ip0")

            def frame(syms: list[str], flags: list[int]) -> tuple[int, int]:
                start = len(log.data)
                log.data += _frame(TRADE, _rows(syms), flags)
                return start, len(log.data)

            def send(stream: LocationIngest, *spans: tuple[int, int]) -> None:
                results = ingest_chunks([(stream, Chunk(log.name, a, log.data[a:b], True), None) for a, b in spans])
                assert all(r is not None and r.refused is None for r in results), results

            def publish() -> None:
                loc.flush()
                assert loc.lastby.snapshot().rows == loc.published_rows
                assert loc.lastby.snapshot().table.equals(last_by(loc.read_table(), ["Sym"]))

            stream = _stream(loc, TRADE)
            send(stream, (0, frame(["a", "b", "c", "d"], [3, 3, 1, 0])[1]))  # c, d: a transaction left open
            publish()
            _, end = frame(["c", "x"], [1, 2])
            rp, epoch = loc.resume()
            stream = LocationIngest(loc, TRADE, rp, epoch)  # resent: the call's restart cuts c, d
            send(stream, (rp.offset, end))
            assert loc.import_state["restarts"] == 1
            publish()
            # two chunks of one call: the second's Start abandons the first's open transaction (f, g)
            send(stream, frame(["e", "f", "g"], [3, 1, 0]), frame(["h", "a", "j"], [1, 0, 2]))
            send(stream, frame(["k", "l"], [1, 0]))  # left open, then abandoned by the next call
            publish()
            send(stream, frame(["m", "b"], [3, 3]))
            publish()
            assert loc.import_state["transactions_abandoned"] == 3 and loc.lastby.rows_read_back == 0
            states[kind] = loc.lastby.snapshot().table
        finally:
            e.close()
    assert states["c"].equals(states["py"])
    assert states["c"].column("Sym").to_pylist() == ["a", "b", "c", "x", "e", "h", "j", "m"]


def _append(state, schema: TableSchema, cols: list[pa.Array]) -> None:
    """Rows appended to a write state as the reference path appends them (``decodedrows``)."""
    parts, i = [], 0
    for c, arr in zip(schema.columns, cols):
        if c.type is ColumnType.STRING:
            ends, _, data = colfmt.encode_string(arr, state.size(i + 1))
            parts += [ends, data]
            i += 2
        else:
            parts.append(colfmt.encode_fixed(c, arr))
            i += 1
    state.append(parts, len(cols[0]))


def _all_types_rows(start: int) -> list[pa.Array]:
    values = {ColumnType.BOOL: [True, None, False], ColumnType.BYTE: [1, -128, None],
              ColumnType.SHORT: [None, 2, -3], ColumnType.INT: [4, None, 5], ColumnType.LONG: [None, 6, -(2**63)],
              ColumnType.FLOAT: [1.5, float("nan"), None], ColumnType.DOUBLE: [None, -0.0, 2.5],
              ColumnType.CHAR: [65, None, 0xFFFF], ColumnType.STRING: [f"s{start}", None, "日本"],
              ColumnType.TIMESTAMP: [None, start, 7]}
    return [pa.array(values[c.type] if c.name != "Other" else ["", f"o{start}", None],
                     pa.int64() if c.type is ColumnType.TIMESTAMP else c.type.arrow_type).cast(c.type.arrow_type)
            for c in ALL_TYPES.columns]


@pytest.mark.skipif(ingestcore is None, reason="the compiled path is not built")
def test_the_rows_past_the_mark_read_as_the_files_read_them():
    """``WriteState.take_tail``: the rows appended since the mark, every column type (nulls,
    sentinels, NaN, UTF-8), as the files read them once made ``stored``; the mark moves down with
    a rollback below it; None once the rows' bytes were written out of the buffers."""
    state = new_write_state(ALL_TYPES, 64)
    assert is_compiled(state)
    state.mark()
    rows = _all_types_rows(0)
    _append(state, ALL_TYPES, rows)
    first, n, parts = state.take_tail()
    assert (first, n) == (0, 3)
    got = tail_columns(ALL_TYPES, n, parts)
    for c, want, arr in zip(ALL_TYPES.columns, rows, got):
        assert bits(pa.table({"v": stored(c, arr)})).equals(bits(pa.table({"v": stored(c, want)}))), c.name
    state.commit(3, state.sizes())
    _append(state, ALL_TYPES, _all_types_rows(3))  # not committed, handed over
    assert state.take_tail()[:2] == (3, 3)
    state.rollback()  # below the mark: the next rows start at the committed ones
    _append(state, ALL_TYPES, _all_types_rows(6))
    first, n, parts = state.take_tail()
    assert (first, n) == (3, 3)
    assert tail_columns(ALL_TYPES, n, parts)[ALL_TYPES.column_names.index("String")].to_pylist() == ["s6", None, "日本"]
    _append(state, ALL_TYPES, _all_types_rows(9))
    state.take_io(False)  # whole 64-byte blocks written out: the rows' bytes are no longer all buffered
    assert state.take_tail() is None
