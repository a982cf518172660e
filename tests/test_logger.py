"""disd.logger: real files written by the logger and read back with disd.binlog.read_file."""

import datetime as dt
import os
import socket
import tempfile
import threading
import time

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disd.binlog import LogFileName, RowFlag, normalize_columns, read_file
from disd.binlog.format import MAX_FRAME_PAYLOAD
from disd.logger import IntradayLoggerBuilder, LoggerClosedError, LoggerWriterError, Rollover
from disd.names import InvalidNameError
from disd.schema import TableSchema, load_schema

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRADE = load_schema(os.path.join(ROOT, "config", "schemas", "Market.Trade.yaml"))

S, N, E, ONE = (int(RowFlag.START_TRANSACTION), int(RowFlag.NONE), int(RowFlag.END_TRANSACTION),
                int(RowFlag.SINGLE_ROW))

TYPES = ["bool", "byte", "short", "int", "long", "float", "double", "char", "string", "timestamp"]
ALL = TableSchema.from_dict({
    "namespace": "Test",
    "table": "AllTypes",
    "columns": [{"name": t.capitalize(), "type": t} for t in TYPES] + [{"name": "Note", "type": "string"}],
})
UTC = dt.timezone.utc


def builder(schema, tmp_path, partition="2026-11-22"):
    b = IntradayLoggerBuilder(schema).set_log_dir(tmp_path / "logs").set_internal_partition("ip1")
    return b.set_column_partition_value(partition) if partition else b


def read_all(log):
    parts = [read_file(f) for f in log.files]
    return pa.concat_tables([p.table for p in parts]), np.concatenate([p.flags for p in parts]).tolist()


def expected_table(schema, rows):
    """Rows as dicts of normalized values (timestamps as int ns, chars as int)."""
    return pa.Table.from_arrays(
        [pa.array([r.get(c.name) for r in rows], c.type.arrow_type) for c in schema.columns],
        schema=schema.arrow_schema())


def ts_ns(*args):
    d = dt.datetime(*args, tzinfo=UTC) - dt.datetime(1970, 1, 1, tzinfo=UTC)
    return (d.days * 86400 + d.seconds) * 10**9 + d.microseconds * 1000


class Clock:
    """An injectable clock; with ``gate`` set up, the writer blocks in it until released."""

    def __init__(self, t):
        self.t = t
        self.gate = None
        self.called = threading.Event()

    def hold(self):
        self.gate = threading.Event()
        return self

    def release(self):
        self.gate.set()

    def __call__(self):
        self.called.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        return self.t


def stalled(schema, tmp_path, **kw):
    """A logger whose writer blocks on its clock until ``clock.release()``: lets a test queue
    several calls so the writer takes them together."""
    clock = Clock(dt.datetime(2026, 11, 22, 12, tzinfo=UTC)).hold()
    b = builder(schema, tmp_path, **kw).set_clock(clock)
    return b, clock


# ---------------------------------------------------------------------------------------------
# Types and values


def test_round_trip_every_type_single_rows_with_nulls_and_non_ascii(tmp_path):
    log = builder(ALL, tmp_path).build()
    given_rows = [
        dict(Bool=True, Byte=-128, Short=32767, Int=-(2**31), Long=2**63 - 1, Float=1.5, Double=-2.25,
             Char="é", String="日本語 żółć 🎉", Timestamp=dt.datetime(2026, 11, 22, 9, 30, 0, 123456, tzinfo=UTC),
             Note=""),
        dict(),  # every column null
        dict(Bool=np.bool_(False), Byte=np.int8(127), Short=-32768, Int=2**31 - 1, Long=-(2**63),
             Float=np.float32(-0.25), Double=float("inf"), Char=0x263A, String="ascii", Note="ß" * 300,
             Timestamp=np.datetime64("2026-11-22T09:30:00.000000001")),
        dict(String=None, Int=None, Bool=0, Char=65, Timestamp=1_763_800_000_123_456_789,
             Double=np.float64(3.0), Note=None),
        dict(Timestamp=dt.datetime(2026, 1, 1)),  # naive: UTC
    ]
    for r in given_rows:
        log.log(**r)
    log.log({"Int": 7, "String": "from a mapping"})
    log.close()
    t, flags = read_all(log)
    assert flags == [ONE] * 6
    expect = expected_table(ALL, [
        dict(Bool=True, Byte=-128, Short=32767, Int=-(2**31), Long=2**63 - 1, Float=1.5, Double=-2.25,
             Char=0xE9, String="日本語 żółć 🎉", Timestamp=ts_ns(2026, 11, 22, 9, 30, 0, 123456), Note=""),
        dict(),
        dict(Bool=False, Byte=127, Short=-32768, Int=2**31 - 1, Long=-(2**63), Float=-0.25, Double=float("inf"),
             Char=0x263A, String="ascii", Note="ß" * 300, Timestamp=ts_ns(2026, 11, 22, 9, 30) + 1),
        dict(Bool=False, Char=65, Timestamp=1_763_800_000_123_456_789, Double=3.0),
        dict(Timestamp=ts_ns(2026, 1, 1)),
        dict(Int=7, String="from a mapping"),
    ])
    assert t.equals(expect), (t.to_pylist(), expect.to_pylist())
    assert t.column("String")[0].as_py() == "日本語 żółć 🎉"
    assert all(v is None for v in t.slice(1, 1).to_pylist()[0].values())


def test_round_trip_every_type_log_batch(tmp_path):
    log = builder(ALL, tmp_path).build()
    n = 5
    data = {
        "Bool": [True, None, False, True, False],
        "Byte": np.array([-128, 0, 1, 2, 127], np.int8),
        "Short": pa.array([1, None, 3, 4, -32768], pa.int16()),
        "Int": np.arange(n, dtype=np.int32) - 2,
        "Long": [2**62, None, -1, 0, 1],
        "Float": np.array([0.5, -1.5, 2.0, np.inf, 0.0], np.float32),
        "Double": [0.1, None, 2.5, -3.5, 1e300],
        "Char": ["a", "é", None, "☺", "Z"],
        "String": ["", None, "naïve café", "漢字", "x" * 1000],
        "Timestamp": np.array(["2026-11-22T09:30", "NaT", "1970-01-01", "2262-04-11", "1900-01-01"],
                              "datetime64[ns]"),
        # Note missing: all null
    }
    log.log_batch(data)
    tbl = pa.table({"Int": pa.array([10, 11], pa.int32()), "String": ["ž", None],
                    "Timestamp": pa.array([5, None], pa.timestamp("ns", tz="UTC"))})
    log.log_batch(tbl)
    log.close()
    t, flags = read_all(log)
    assert flags == [ONE] * 7
    assert t.num_rows == 7
    assert t.column("Bool").to_pylist()[:5] == [True, None, False, True, False]
    assert t.column("Short").to_pylist()[:5] == [1, None, 3, 4, -32768]
    assert t.column("Char").to_pylist()[:5] == [ord("a"), ord("é"), None, ord("☺"), ord("Z")]
    assert t.column("String").to_pylist() == ["", None, "naïve café", "漢字", "x" * 1000, "ž", None]
    ts = t.column("Timestamp").cast(pa.int64()).to_pylist()
    assert ts[1] is None and ts[0] == ts_ns(2026, 11, 22, 9, 30) and ts[2] == 0 and ts[5:] == [5, None]
    assert t.column("Note").null_count == 7
    assert t.column("Float").to_pylist()[:5] == [0.5, -1.5, 2.0, float("inf"), 0.0]
    assert t.column("Long").to_pylist()[:5] == [2**62, None, -1, 0, 1]


def test_numpy_buffers_may_be_reused_after_log_batch(tmp_path):
    b, clock = stalled(TRADE, tmp_path)
    log = b.build()
    sizes = np.arange(100, dtype=np.int32)
    log.log_batch({"Size": sizes})
    sizes[:] = -1  # the caller reuses its buffer before the writer has encoded the batch
    clock.release()
    log.close()
    t, _ = read_all(log)
    assert t.column("Size").to_pylist() == list(range(100))


def test_bad_values_raise_at_the_call_and_the_logger_keeps_working(tmp_path):
    log = builder(TRADE, tmp_path).build()
    with pytest.raises(ValueError, match="no column 'Nope'"):
        log.log(Nope=1)
    with pytest.raises(TypeError, match="Size"):
        log.log(Size="12")
    with pytest.raises(ValueError, match="out of range"):
        log.log(Size=2**31)
    with pytest.raises(TypeError, match="Sym"):
        log.log(Sym=b"bytes")
    with pytest.raises(ValueError, match="UTF-8"):
        log.log(Sym="\ud800")
    with pytest.raises(TypeError, match="Timestamp"):
        log.log(Timestamp="2026-11-22")
    with pytest.raises(ValueError, match="no column"):
        log.log_batch({"Size": [1], "Nope": [2]})
    log.log(Size=1)
    log.close()
    t, flags = read_all(log)
    assert t.column("Size").to_pylist() == [1] and flags == [ONE]


def test_log_batch_errors_name_the_table_the_column_and_the_row(tmp_path):
    log = builder(ALL, tmp_path).build()
    where = r"Test\.AllTypes: column "
    cases = [
        (pa.table({"Char": pa.array(["A", "B", "CD"])}), ValueError, where + r"Char \(char\), row 2: .*'CD'"),
        ({"Char": ["A", "\U0001F600"]}, ValueError, where + r"Char \(char\), row 1: "),
        ({"Char": np.array([65, 70000])}, ValueError, where + r"Char \(char\), row 1: .*70000"),
        ({"Int": [1, 2, 2**31]}, ValueError, where + r"Int \(int\), row 2: .*2147483648"),
        ({"Byte": np.array([1, 300, 2])}, ValueError, where + r"Byte \(byte\), row 1: .*300"),
        ({"Long": [1, "x"]}, ValueError, where + r"Long \(long\), row 1: .*'x'"),
        ({"Bool": [True, False, 2]}, ValueError, where + r"Bool \(bool\), row 2: .*2"),
        ({"Bool": pa.array(["true", "maybe"])}, ValueError, where + r"Bool \(bool\), row 1: .*'maybe'"),
        ({"Timestamp": [0, "noon"]}, TypeError, where + r"Timestamp \(timestamp\), row 1: .*'noon'"),
        ({"Timestamp": pa.array([1.5])}, TypeError, where + r"Timestamp \(timestamp\), row 0: "),
        ({"String": ["a", "b", "\ud800"]}, ValueError, where + r"String \(string\), row 2: "),
        ({"Note": ["a"], "Int": [1, 2]}, ValueError, where + r"Int has 2 values, expected 1"),
    ]
    for data, kind, pattern in cases:
        with pytest.raises(kind, match=pattern):
            log.log_batch(data)
    with pytest.raises(TypeError, match=where + r"Int \(int\): cannot log str '12'"):
        log.log(Int="12")
    # a char column takes one-character strings from pyarrow and numpy, as from log() and lists
    log.log_batch(pa.table({"Char": pa.array(["A", "B", None, "é", "€"])}))
    log.log_batch({"Char": pa.chunked_array([["x"], ["y"]]).slice(1)})
    log.log_batch({"Char": np.array(["z"])})
    log.log_batch({"Char": ["w"]})
    log.log(Char="v")
    log.close()
    t, _ = read_all(log)
    assert t.column("Char").to_pylist() == [65, 66, None, 233, 8364, ord("y"), ord("z"), ord("w"), ord("v")]


def test_frame_limit_errors_state_the_limit_and_name_the_column_and_the_row(tmp_path):
    log = builder(TRADE, tmp_path).build()
    limit = rf"frame limit of {MAX_FRAME_PAYLOAD} bytes"
    with pytest.raises(ValueError, match=rf"Market\.Trade: column Sym \(string\), row 1: .*{limit}"):
        log.log_batch({"Sym": ["y", "x" * (MAX_FRAME_PAYLOAD + 1)]})
    with pytest.raises(ValueError, match=rf"Market\.Trade: column Sym \(string\): .*{limit}"):
        log.log(Sym="x" * (MAX_FRAME_PAYLOAD + 1))
    log.close()


def test_rows_bigger_than_a_frame_are_refused_and_big_batches_are_cut_below_the_frame_limit(tmp_path):
    log = builder(TRADE, tmp_path).build()
    with pytest.raises(ValueError, match="frame limit"):
        log.log(Sym="x" * (MAX_FRAME_PAYLOAD + 1))
    with pytest.raises(ValueError, match="frame limit"):
        log.log_batch({"Sym": ["y", "x" * (MAX_FRAME_PAYLOAD + 1)]})
    big = "é" * (6 << 20)  # 12 MiB of UTF-8
    log.log_batch({"Sym": [big, "a", big, big], "Size": [1, 2, 3, 4]})
    log.close()
    r = read_file(log.files[0])
    assert r.table.column("Size").to_pylist() == [1, 2, 3, 4]
    assert r.table.column("Sym").to_pylist() == [big, "a", big, big]
    sizes = np.diff([r.header.size, *r.frame_ends])
    assert len(sizes) >= 2 and sizes.max() <= MAX_FRAME_PAYLOAD + 16


# ---------------------------------------------------------------------------------------------
# Flags and transactions


def test_single_rows_are_single_row_flags_in_order(tmp_path):
    log = builder(TRADE, tmp_path).build()
    for i in range(500):
        log.log(Size=i, Sym=f"s{i}")
    log.close()
    t, flags = read_all(log)
    assert t.column("Size").to_pylist() == list(range(500))
    assert flags == [ONE] * 500


def test_transaction_flags(tmp_path):
    log = builder(TRADE, tmp_path).build()
    log.log(Size=0)
    with log.transaction():
        log.log(Size=1)
        log.log(Size=2)
        log.log(Size=3)
        log.log(Size=4)
    with log.transaction() as t:
        t.log(Size=5)  # a one-row transaction is a SingleRow
    with log.transaction():
        pass  # nothing written
    with log.transaction():
        log.log(Size=6)
        log.log_batch({"Size": [7, 8]})  # joins the transaction
        log.log(Size=9)
    with log.transaction():
        with pytest.raises(RuntimeError, match="nest"):
            with log.transaction():
                pass
        log.log(Size=10)
        log.log(Size=11)
    log.close()
    t, flags = read_all(log)
    assert t.column("Size").to_pylist() == list(range(12))
    assert flags == [ONE, S, N, N, E, ONE, S, N, N, E, S, E]
    # every transaction starts a frame
    r = read_file(log.files[0])
    starts = np.cumsum([0, *r.frame_row_counts])[:-1].tolist()
    assert {1, 6, 10} <= set(starts)


def test_abandoned_transaction_is_not_written_and_following_rows_start_a_new_frame(tmp_path):
    b, clock = stalled(TRADE, tmp_path)
    log = b.build()
    log.log(Sym="first", Size=0)
    assert clock.called.wait(5)  # the writer holds "first": it will take all that follows at once
    log.log(Sym="before", Size=1)
    with pytest.raises(ZeroDivisionError):
        with log.transaction():
            log.log(Sym="GONE", Size=-1)
            log.log(Sym="GONE", Size=-2)
            log.log_batch({"Sym": ["GONE"], "Size": [-3]})
            1 / 0
    log.log(Sym="after", Size=2)
    log.log(Sym="after", Size=3)
    clock.release()  # the writer takes all of the above at once
    log.close()
    r = read_file(log.files[0])
    assert r.table.column("Size").to_pylist() == [0, 1, 2, 3]
    assert "GONE" not in r.table.column("Sym").to_pylist()
    assert E not in r.flags.tolist() and r.flags.tolist() == [ONE] * 4
    assert r.frame_row_counts == [1, 1, 2]  # the rows after the abandoned transaction begin a new frame


def test_transactions_of_different_threads_never_interleave(tmp_path):
    log = builder(TRADE, tmp_path).build()
    n_threads, n_txn, size = 4, 15, 7

    def work(k):
        for j in range(n_txn):
            with log.transaction():
                for i in range(size):
                    log.log(Sym=f"t{k}", Size=j * 100 + i)
            log.log(Sym=f"t{k}", Size=-1)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    log.close()
    t, flags = read_all(log)
    syms, sizes = t.column("Sym").to_pylist(), t.column("Size").to_pylist()
    assert len(flags) == n_threads * n_txn * (size + 1)
    i, seen = 0, 0
    while i < len(flags):
        if flags[i] == ONE:
            assert sizes[i] == -1
            i += 1
            continue
        assert flags[i] == S
        block = list(range(i, i + size))
        assert [flags[k] for k in block] == [S] + [N] * (size - 2) + [E]
        assert len({syms[k] for k in block}) == 1
        base = sizes[i]
        assert [sizes[k] for k in block] == [base + x for x in range(size)]
        seen += 1
        i += size
    assert seen == n_threads * n_txn


def test_long_transactions_are_compacted_on_the_caller_and_written_whole(tmp_path, monkeypatch):
    import disd.logger.api

    monkeypatch.setattr(disd.logger.api, "TXN_COMPACT_ROWS", 4)
    log = builder(TRADE, tmp_path).build()
    with log.transaction():
        for i in range(10):
            log.log(Size=i, Sym=f"r{i}")
        log.log_batch({"Size": [10, 11], "Sym": ["b", None]})
        log.log(Size=12)
    log.close()
    t, flags = read_all(log)
    assert t.column("Size").to_pylist() == list(range(13))
    assert t.column("Sym").to_pylist()[9:] == ["r9", "b", None, None]
    assert flags == [S] + [N] * 11 + [E]


def test_log_batch_atomic_and_not(tmp_path):
    log = builder(TRADE, tmp_path).build()
    log.log_batch({"Sym": ["a", "b", "c"], "Size": [1, 2, 3]})
    log.log_batch(pa.table({"Sym": ["d", "e"], "Size": pa.array([4, 5], pa.int32())}), atomic=True)
    log.log_batch({"Size": [6]}, atomic=True)  # one row: SingleRow
    log.log_batch({"Size": []}, atomic=True)  # nothing
    big = 70_000
    log.log_batch({"Size": np.arange(big, dtype=np.int32)}, atomic=True)
    log.close()
    t, flags = read_all(log)
    assert t.column("Size").to_pylist()[:6] == [1, 2, 3, 4, 5, 6]
    assert flags[:6] == [ONE, ONE, ONE, S, E, ONE]
    tail = np.array(flags[6:])
    assert len(tail) == big and tail[0] == S and tail[-1] == E and (tail[1:-1] == N).all()
    r = read_file(log.files[0])
    starts = np.cumsum([0, *r.frame_row_counts])[:-1].tolist()
    assert 3 in starts and 6 in starts  # frames begin at each Start
    assert max(r.frame_row_counts) <= 65536


# ---------------------------------------------------------------------------------------------
# Files, partitions, rollover


def test_hourly_rollover_names_files_by_creation_time_in_the_zone(tmp_path):
    clock = Clock(dt.datetime(2026, 11, 22, 9, 59, 59, 999_400, tzinfo=UTC))
    log = builder(TRADE, tmp_path).set_clock(clock).build()
    log.log(Size=1)
    log.flush()
    clock.t = dt.datetime(2026, 11, 22, 10, 0, 0, 1000, tzinfo=UTC)
    log.log(Size=2)
    log.flush()
    clock.t = dt.datetime(2026, 11, 22, 10, 59, tzinfo=UTC)
    log.log(Size=3)
    log.flush()
    clock.t = dt.datetime(2026, 11, 22, 9, 0, tzinfo=UTC)  # a clock that steps back does not reopen 9:00
    log.log(Size=4)
    log.close()
    names = [LogFileName.parse(f.name) for f in log.files]
    assert [f.name for f in log.files] == [
        "Market.Trade.System.ip1.2026-11-22.bin.2026-11-22.095959.999+0000",
        "Market.Trade.System.ip1.2026-11-22.bin.2026-11-22.100000.001+0000",
    ]
    assert all(n.column_partition == "2026-11-22" for n in names)
    assert [read_file(f).table.column("Size").to_pylist() for f in log.files] == [[1], [2, 3, 4]]


def test_hourly_rollover_follows_the_time_zone(tmp_path):
    clock = Clock(dt.datetime(2026, 11, 22, 9, 29, tzinfo=UTC))  # 14:59 in Kolkata (+05:30)
    log = builder(TRADE, tmp_path).set_time_zone_name("Asia/Kolkata").set_clock(clock).build()
    log.log(Size=1)
    log.flush()
    clock.t = dt.datetime(2026, 11, 22, 9, 31, tzinfo=UTC)  # 15:01 there: a new hour
    log.log(Size=2)
    log.close()
    assert [f.name.split(".bin.")[1] for f in log.files] == ["2026-11-22.145900.000+0530",
                                                               "2026-11-22.150100.000+0530"]


def test_daily_rollover_follows_the_date_partition_in_the_zone(tmp_path):
    clock = Clock(dt.datetime(2026, 11, 22, 22, 0, tzinfo=UTC))  # 17:00 in New York
    log = (builder(TRADE, tmp_path, partition=None).set_time_zone_name("America/New_York")
           .set_rollover(Rollover.DAILY).set_clock(clock).build())
    log.log(Size=1)
    log.flush()
    clock.t = dt.datetime(2026, 11, 23, 4, 30, tzinfo=UTC)  # 23:30 on the 22nd there: no new file
    log.log(Size=2)
    log.flush()
    clock.t = dt.datetime(2026, 11, 23, 5, 30, tzinfo=UTC)  # 00:30 on the 23rd there
    with log.transaction():
        log.log(Size=3)
        log.log(Size=4)
    log.close()
    names = [LogFileName.parse(f.name) for f in log.files]
    assert [n.column_partition for n in names] == ["2026-11-22", "2026-11-23"]
    assert [n.timestamp.utcoffset() for n in names] == [dt.timedelta(hours=-5)] * 2
    assert [read_file(f).table.column("Size").to_pylist() for f in log.files] == [[1, 2], [3, 4]]
    assert read_file(log.files[1]).flags.tolist() == [S, E]


def test_daily_rollover_with_a_fixed_partition_keeps_one_file(tmp_path):
    clock = Clock(dt.datetime(2026, 11, 22, 9, 0, tzinfo=UTC))
    log = builder(TRADE, tmp_path).set_rollover("daily").set_clock(clock).build()
    for h in range(9, 14):
        clock.t = dt.datetime(2026, 11, 22, h, 0, tzinfo=UTC)
        log.log(Size=h)
        log.flush()
    log.close()
    assert len(log.files) == 1
    assert read_file(log.files[0]).table.column("Size").to_pylist() == [9, 10, 11, 12, 13]


def test_fixed_name_mode_one_file_per_partition_and_appends_across_restarts(tmp_path):
    stamp = dt.datetime(2026, 11, 22, 0, 0, tzinfo=UTC)
    clock = Clock(dt.datetime(2026, 11, 22, 9, 0, tzinfo=UTC))
    for i in range(2):
        log = (builder(TRADE, tmp_path, partition=None).set_column_partition_function(lambda r: r["Sym"])
               .set_rollover("fixed", stamp).set_clock(clock).build())
        for h in (9, 15, 23):
            clock.t = dt.datetime(2026, 11, 22, h, 0, tzinfo=UTC)
            log.log(Sym="A", Size=i * 10 + h)
            log.log(Sym="B", Size=i * 10 + h)
            log.flush()
        log.close()
    files = sorted(f for f in (tmp_path / "logs").iterdir() if not f.name.startswith("."))  # not lock files
    assert [f.name for f in files] == [f"Market.Trade.System.ip1.{p}.bin.2026-11-22.000000.000+0000" for p in "AB"]
    for f in files:
        assert read_file(f).table.column("Size").to_pylist() == [9, 15, 23, 19, 25, 33]
    # without a stamp, the build time names the files
    clock.t = dt.datetime(2026, 11, 24, 8, 0, 0, 250_000, tzinfo=UTC)
    log = builder(TRADE, tmp_path).set_rollover("fixed").set_clock(clock).build()
    clock.t = dt.datetime(2026, 11, 24, 10, 0, tzinfo=UTC)
    log.log(Size=1)
    log.close()
    assert log.files[0].name.endswith(".bin.2026-11-24.080000.250+0000")


def test_new_files_sort_after_existing_files_of_the_location(tmp_path):
    later = Clock(dt.datetime(2026, 11, 22, 12, 0, tzinfo=UTC))
    log = builder(TRADE, tmp_path).set_clock(later).build()
    log.log(Size=1)
    log.close()
    earlier = Clock(dt.datetime(2026, 11, 22, 11, 0, tzinfo=UTC))  # e.g. a restart with a skewed clock
    log2 = builder(TRADE, tmp_path).set_clock(earlier).build()
    log2.log(Size=2)
    log2.close()
    files = sorted((f for f in (tmp_path / "logs").iterdir() if not f.name.startswith(".")),
                   key=lambda p: LogFileName.parse(p.name).sort_key)
    assert [read_file(f).table.column("Size").to_pylist() for f in files] == [[1], [2]]
    assert files[1].name.endswith("120000.001+0000")


def test_namespace_set_user_and_default_time_partition(tmp_path):
    clock = Clock(dt.datetime(2026, 11, 22, 23, 30, tzinfo=UTC))
    log = builder(TRADE, tmp_path, partition=None).set_namespace_set("User").set_clock(clock).build()
    log.log(Size=1)
    log.close()
    name = LogFileName.parse(log.files[0].name)
    assert name.namespace_set.value == "User" and name.column_partition == "2026-11-22"
    with pytest.raises(ValueError):
        IntradayLoggerBuilder(TRADE).set_namespace_set("Other")


def test_internal_partition_from_host_name_with_suffixes(tmp_path, monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "host1.example.com")
    b = IntradayLoggerBuilder(TRADE).set_log_dir(tmp_path).set_column_partition_value("2026-11-22")
    assert b.internal_partition() == "host1_example_com"
    b.set_internal_partition_suffix("A")
    assert b.internal_partition() == "host1_example_com_A"
    b.set_log_format_suffix(2)
    assert b.internal_partition() == "host1_example_com_A_2"
    b.set_process_name("feed")
    assert b.internal_partition() == "feed_host1_example_com_A_2"
    log = b.build()
    log.log(Size=1)
    log.close()
    assert LogFileName.parse(log.files[0].name).internal_partition == "feed_host1_example_com_A_2"
    # configuration wins over the host name and the process name; suffixes still apply
    b.set_internal_partition("cfg")
    assert b.internal_partition() == "cfg_A_2"
    assert IntradayLoggerBuilder(TRADE).set_internal_partition("cfg").internal_partition() == "cfg"
    with pytest.raises(InvalidNameError):
        IntradayLoggerBuilder(TRADE).set_internal_partition("cfg").set_internal_partition_suffix("a.b").build()
    with pytest.raises(InvalidNameError):
        IntradayLoggerBuilder(TRADE).set_internal_partition("../x")
    with pytest.raises(InvalidNameError):
        IntradayLoggerBuilder(TRADE).set_column_partition_value("2026/11/22")


def test_schema_from_a_yaml_path(tmp_path):
    path = os.path.join(ROOT, "config", "schemas", "Market.Trade.yaml")
    log = builder(path, tmp_path).build()
    log.log(Sym="A")
    log.close()
    assert read_file(log.files[0], schema=TRADE).table.column("Sym").to_pylist() == ["A"]


def by_partition(log):
    out = {}
    for f in log.files:
        r = read_file(f)
        out.setdefault(LogFileName.parse(f.name).column_partition, []).extend(
            zip(r.table.column("Size").to_pylist(), r.flags.tolist()))
    return out


def test_partition_function_of_the_row(tmp_path):
    log = (builder(TRADE, tmp_path, partition=None)
           .set_column_partition_function(lambda row: "P" + str(row["Size"] % 2)).build())
    log.log(Size=5)
    log.log(Size=6)
    log.log_batch({"Size": [1, 2, 3, 4]})  # spans two partitions: split, order kept
    with log.transaction():
        log.log(Size=8)
        log.log(Size=10)
    log.close()
    assert by_partition(log) == {"P1": [(5, ONE), (1, ONE), (3, ONE)],
                                 "P0": [(6, ONE), (2, ONE), (4, ONE), (8, S), (10, E)]}


def test_partition_function_on_columns_is_called_once_per_distinct_value(tmp_path):
    calls = []

    def fn(row):
        calls.append(dict(row))
        day = dt.datetime.fromtimestamp(row["Timestamp"] // 10**9, UTC).date().isoformat()
        return f"{day}-{row['Sym'] or 'none'}"

    log = (builder(TRADE, tmp_path, partition=None)
           .set_column_partition_function(fn, columns=["Timestamp", "Sym"]).build())
    day1, day2 = ts_ns(2026, 11, 22), ts_ns(2026, 11, 23)
    n = 30_000
    ts = np.where(np.arange(n) % 3 == 0, day2, day1)
    syms = np.array(["AAPL", "MSFT"])[np.arange(n) % 2].astype(object)
    syms[7] = None
    log.log_batch({"Timestamp": ts, "Sym": syms, "Size": np.arange(n, dtype=np.int32)})
    log.log(Timestamp=day1, Sym="AAPL", Size=-1)
    log.close()
    assert len(calls) == 6  # 5 distinct combinations in the batch, 1 for the single row
    assert set(calls[0]) == {"Timestamp", "Sym"}
    got = by_partition(log)
    assert set(got) == {"2026-11-22-AAPL", "2026-11-22-MSFT", "2026-11-23-AAPL", "2026-11-23-MSFT",
                        "2026-11-22-none"}
    for part, rows in got.items():
        sizes = [s for s, _ in rows]
        assert sizes == sorted(sizes) or sizes[-1] == -1
    assert [s for s, _ in got["2026-11-22-none"]] == [7]
    expect = [i for i in range(n) if i % 3 and i % 2 == 0 and i != 7] + [-1]
    assert [s for s, _ in got["2026-11-22-AAPL"]] == expect


def test_vectorized_partition_function_and_atomic_batches_spanning_partitions(tmp_path):
    import pyarrow.compute as pc

    def fn(table):
        assert isinstance(table, pa.Table)
        return pc.if_else(pc.greater(table.column("Size"), 10), "Big", "Small")

    log = (builder(TRADE, tmp_path, partition=None)
           .set_column_partition_function(fn, columns="Size", vectorized=True).build())
    log.log_batch({"Size": [1, 20, 2, 30]})
    log.log(Size=50)
    with pytest.raises(ValueError, match="one column partition"):
        log.log_batch({"Size": [1, 20]}, atomic=True)
    with pytest.raises(ValueError, match="one column partition"):
        with log.transaction():
            log.log(Size=1)
            log.log(Size=2)
            log.log(Size=99)  # another partition: the transaction is abandoned
    log.log_batch({"Size": [11, 12]}, atomic=True)
    log.close()
    assert by_partition(log) == {"Small": [(1, ONE), (2, ONE)],
                                 "Big": [(20, ONE), (30, ONE), (50, ONE), (11, S), (12, E)]}


def test_fixed_value_takes_precedence_over_the_function_and_bad_partitions_are_refused(tmp_path):
    log = (builder(TRADE, tmp_path).set_column_partition_function(lambda r: "nope")
           .set_column_partition_value("2026-11-22").build())
    log.log(Size=1)
    log.close()
    assert LogFileName.parse(log.files[0].name).column_partition == "2026-11-22"
    log = builder(TRADE, tmp_path / "b", partition=None).set_column_partition_function(lambda r: "../etc").build()
    with pytest.raises(InvalidNameError):
        log.log(Size=1)
    with pytest.raises(InvalidNameError):
        log.log_batch({"Size": [1, 2]})
    log.close()
    assert log.files == []


# ---------------------------------------------------------------------------------------------
# Queue, writer thread, errors, durability


def test_backpressure_a_full_queue_blocks_the_caller(tmp_path):
    normalize_columns(TRADE, {"Size": [1]})  # warm up (pyarrow's first conversion imports pandas)
    b, clock = stalled(TRADE, tmp_path)
    log = b.set_queue_size(2).build()
    log.log(Size=0)
    assert clock.called.wait(5)  # the writer took row 0 and is now stuck in the clock
    log.log(Size=1)
    log.log(Size=2)  # the queue now holds 2 rows: full
    done = threading.Event()
    threading.Thread(target=lambda: (log.log_batch({"Size": [3, 4]}), done.set()), daemon=True).start()
    assert not done.wait(0.3), "the caller should block while the queue is full"
    clock.release()
    assert done.wait(5)
    log.close()
    t, _ = read_all(log)
    assert t.column("Size").to_pylist() == [0, 1, 2, 3, 4]


def test_rows_reach_the_file_promptly_without_flush(tmp_path):
    log = builder(TRADE, tmp_path).build()
    try:
        for k in range(3):
            t0 = time.perf_counter()
            log.log(Size=k)
            while True:
                if log.files and read_file(log.files[0]).table.num_rows == k + 1:
                    break
                assert time.perf_counter() - t0 < 1.0, "row not written to the OS within 1 s"
                time.sleep(0.001)
    finally:
        log.close()


def test_writer_errors_surface_on_the_next_call_and_on_close(tmp_path):
    clock = Clock(dt.datetime(2026, 11, 22, 9, 0, tzinfo=UTC))
    log = builder(TRADE, tmp_path).set_clock(clock).build()
    log.log(Size=1)
    log.flush()
    (tmp_path / "logs").rename(tmp_path / "moved")
    (tmp_path / "logs").write_text("not a directory")  # the next file cannot be created
    clock.t = dt.datetime(2026, 11, 22, 10, 0, tzinfo=UTC)  # rollover: a new file is needed
    log.log(Size=2)
    with pytest.raises(LoggerWriterError) as err:
        for _ in range(500):
            log.log(Size=3)
            time.sleep(0.01)
    assert isinstance(err.value.__cause__, OSError)
    with pytest.raises(LoggerWriterError):
        log.flush()
    with pytest.raises(LoggerWriterError):
        log.close()
    assert read_file(tmp_path / "moved" / log.files[0].name).table.column("Size").to_pylist() == [1]
    with pytest.raises(FileExistsError):  # a log directory that cannot exist fails at once
        builder(TRADE, tmp_path).build()


def test_a_failing_writer_releases_callers_blocked_on_a_full_queue(tmp_path):
    clock = Clock(dt.datetime(2026, 11, 22, 9, 0, tzinfo=UTC)).hold()
    log = builder(TRADE, tmp_path).set_clock(clock).set_queue_size(1).build()
    log.log(Size=0)
    assert clock.called.wait(5)
    log.log(Size=1)
    outcome = []
    th = threading.Thread(target=lambda: outcome.append(_catch(lambda: log.log(Size=2))), daemon=True)
    th.start()
    time.sleep(0.1)
    clock.t = "not a datetime"  # the writer fails
    clock.release()
    th.join(5)
    assert outcome and isinstance(outcome[0], LoggerWriterError)
    with pytest.raises(LoggerWriterError, match="not a datetime"):
        log.close()


def _catch(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return e
    return None


def test_close_fsyncs_and_refuses_further_rows(tmp_path, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    log = builder(TRADE, tmp_path).build()
    for i in range(100):
        log.log(Size=i)
    log.flush()
    assert synced == []  # no fsync per row or per flush
    log.flush(fsync=True)
    assert len(synced) == 1
    log.close()
    assert len(synced) >= 2
    log.close()  # idempotent
    with pytest.raises(LoggerClosedError):
        log.log(Size=1)
    with pytest.raises(LoggerClosedError):
        log.log_batch({"Size": [1]})
    with pytest.raises(LoggerClosedError):
        with log.transaction():
            pass
    assert read_all(log)[0].num_rows == 100


def test_context_manager_closes(tmp_path):
    with builder(TRADE, tmp_path).build() as log:
        log.log(Size=1)
    assert log.closed
    assert read_all(log)[0].column("Size").to_pylist() == [1]


# ---------------------------------------------------------------------------------------------
# Property: any sequence of rows and flags survives write + decode

PROP = TableSchema.from_dict({
    "namespace": "Test", "table": "Prop",
    "columns": [{"name": "B", "type": "bool"}, {"name": "I", "type": "int"}, {"name": "L", "type": "long"},
                {"name": "D", "type": "double"}, {"name": "C", "type": "char"}, {"name": "S", "type": "string"},
                {"name": "T", "type": "timestamp"}, {"name": "F", "type": "float"}],
})
_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
_row = st.fixed_dictionaries({}, optional={
    "B": st.none() | st.booleans(),
    "I": st.none() | st.integers(-(2**31), 2**31 - 1),
    "L": st.none() | st.integers(-(2**63), 2**63 - 1),
    "D": st.none() | st.floats(allow_nan=False),
    "C": st.none() | st.integers(0, 0xFFFF),
    "S": st.none() | _text,
    "T": st.none() | st.integers(-(2**63), 2**63 - 1),
    "F": st.none() | st.floats(width=32, allow_nan=False),
})
_op = st.one_of(
    st.tuples(st.just("row"), _row),
    st.tuples(st.just("txn"), st.lists(_row, min_size=0, max_size=5), st.booleans()),
    st.tuples(st.just("batch"), st.lists(_row, min_size=0, max_size=6), st.booleans()),
)


def _txn_flags(n):
    return [] if n == 0 else [ONE] if n == 1 else [S] + [N] * (n - 2) + [E]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_op, max_size=10), stall=st.booleans())
def test_property_any_sequence_of_rows_and_flags_survives(ops, stall):
    with tempfile.TemporaryDirectory() as d:
        clock = Clock(dt.datetime(2026, 11, 22, 12, tzinfo=UTC))
        if stall:
            clock.hold()
        log = (IntradayLoggerBuilder(PROP).set_log_dir(d).set_internal_partition("p")
               .set_column_partition_value("2026-11-22").set_clock(clock).build())
        rows, flags = [], []
        for op in ops:
            if op[0] == "row":
                log.log(**op[1])
                rows.append(op[1])
                flags.append(ONE)
            elif op[0] == "txn":
                _, txn_rows, abandon = op
                try:
                    with log.transaction():
                        for r in txn_rows:
                            log.log(**r)
                        if abandon:
                            raise KeyError("abandon")
                except KeyError:
                    continue
                rows += txn_rows
                flags += _txn_flags(len(txn_rows))
            else:
                _, batch_rows, atomic = op
                cols = {c.name: [r.get(c.name) for r in batch_rows] for c in PROP.columns}
                log.log_batch({k: pa.array(v, PROP.column(k).type.arrow_type) for k, v in cols.items()},
                              atomic=atomic)
                rows += batch_rows
                flags += _txn_flags(len(batch_rows)) if atomic else [ONE] * len(batch_rows)
        if stall:
            clock.release()
        log.close()
        if not rows:
            assert log.files == []
            return
        t, got_flags = read_all(log)
        assert got_flags == flags
        expect = expected_table(PROP, rows)
        assert t.equals(expect), (t.to_pylist(), expect.to_pylist())


# ---------------------------------------------------------------------------------------------
# Schema versions


def quote(version, size="int", venue=False, sym="Sym", renamed_from=None):
    cols = [{"name": "Timestamp", "type": "timestamp"}, {"name": sym, "type": "string"},
            {"name": "Size", "type": size}]
    if renamed_from:
        cols[1]["renamed_from"] = renamed_from
    if venue:
        cols.append({"name": "Venue", "type": "string"})
    return TableSchema.from_dict({"namespace": "Market", "table": "Quote", "version": version, "columns": cols})


Q1 = quote(1)
Q2 = quote(2, size="long", venue=True)  # allowed: Size widens, Venue is added


def test_version_suffix_is_appended_after_the_other_suffixes(tmp_path):
    b = IntradayLoggerBuilder(Q2).set_log_dir(tmp_path).set_internal_partition("ABC")
    assert b.internal_partition() == "ABC"
    b.set_suffix_internal_partition_with_log_format()
    assert b.internal_partition() == "ABC-2"
    b.set_internal_partition_suffix("x").set_log_format_suffix(7)
    assert b.internal_partition() == "ABC_x_7-2"
    b.set_suffix_internal_partition_with_log_format(False)
    assert b.internal_partition() == "ABC_x_7"
    log = (IntradayLoggerBuilder(quote(4)).set_log_dir(tmp_path).set_internal_partition("ABC")
           .set_suffix_internal_partition_with_log_format(True).set_column_partition_value("2026-11-22").build())
    log.log(Sym="A", Size=1)
    log.close()
    assert LogFileName.parse(log.files[0].name).internal_partition == "ABC-4"
    assert read_file(log.files[0]).schema.version == 4


def _one_row(schema, tmp_path, ip, **row):
    log = builder(schema, tmp_path).set_internal_partition(ip).build()
    log.log(**row)
    log.close()
    return log.files[0]


def test_logger_refuses_a_narrowing_against_the_newest_log_in_its_directory(tmp_path):
    from disd.logger import LoggerError, LoggerSchemaError

    _one_row(Q1, tmp_path, "feed-1", Sym="A", Size=1)
    listed = sorted(os.listdir(tmp_path / "logs"))
    before = [f for f in listed if not f.startswith(".")]  # the log, not its lock file
    narrowed = quote(2, size="short")
    with pytest.raises(LoggerSchemaError) as ei:
        builder(narrowed, tmp_path).set_internal_partition("feed-2").build()
    msg = str(ei.value)
    assert isinstance(ei.value, LoggerError) and isinstance(ei.value, ValueError)
    assert "Market.Quote version 1 -> 2" in msg and "'Size'" in msg and "narrows" in msg, msg
    assert before[0] in msg, msg  # the file it compared with
    assert sorted(os.listdir(tmp_path / "logs")) == listed  # nothing written, not even a lock file
    # an older build refused the other way round: the directory's newest file is version 2
    other = tmp_path / "other"
    _one_row(Q2, other, "feed-2", Sym="A", Size=1)
    with pytest.raises(LoggerSchemaError, match=r"Market.Quote version 1 -> 2: column 'Size': type double in "
                                                r"version 1 cannot become long .*this logger writes version 1"):
        builder(quote(1, size="double"), other).build()
    # a rename naming no column of the older version
    with pytest.raises(LoggerSchemaError, match="renamed_from 'Ticker' names no column of version 1"):
        builder(quote(3, sym="Symbol", renamed_from="Ticker"), tmp_path).build()
    # an allowed change builds
    builder(quote(3, sym="Symbol", renamed_from="Sym"), tmp_path).build().close()


def test_logger_refuses_the_same_version_with_other_columns(tmp_path):
    from disd.logger import LoggerSchemaError

    f = _one_row(Q1, tmp_path, "feed", Sym="A", Size=1)
    same_number = quote(1, size="long")
    with pytest.raises(LoggerSchemaError) as ei:
        builder(same_number, tmp_path).build()
    msg = str(ei.value)
    assert f.name in msg and Q1.fingerprint in msg and same_number.fingerprint in msg, msg
    assert "Size" in msg and "new version number" in msg, msg
    # the same schema, or the table's files written by another table, are fine
    builder(Q1, tmp_path).build().close()
    builder(TRADE, tmp_path).build().close()


def test_loggers_of_two_versions_write_one_directory_at_the_same_time(tmp_path):
    """v1 and v2 loggers (each version its own internal partition by the suffix, and two more
    without it sharing column partitions) log concurrently; every file reads back whole, in its
    own version."""
    logs = [builder(s, tmp_path).set_internal_partition("feed").set_suffix_internal_partition_with_log_format()
            .build() for s in (Q1, Q2)]
    logs += [builder(s, tmp_path).set_internal_partition(f"plain{s.version}").build() for s in (Q2, Q1)]
    n = 2000

    def run(log):
        for i in range(n):
            log.log(Sym=f"S{i}", Size=i)
            if i % 500 == 0:
                log.flush()

    threads = [threading.Thread(target=run, args=(lg,)) for lg in logs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for lg in logs:
        lg.close()
    files = sorted(f for f in os.listdir(tmp_path / "logs") if not f.startswith("."))
    by_ip = {LogFileName.parse(f).internal_partition: read_file(tmp_path / "logs" / f) for f in files}
    assert sorted(by_ip) == ["feed-1", "feed-2", "plain1", "plain2"], files
    for ip, contents in by_ip.items():
        version = int(ip[-1])
        assert contents.schema.version == version
        assert contents.table.column("Size").to_pylist() == list(range(n)), ip
        assert contents.table.column_names == (Q1 if version == 1 else Q2).column_names
    # a logger built afterwards, of either version, still builds against the mixed directory
    for s in (Q1, Q2):
        builder(s, tmp_path).set_internal_partition("later").build().close()


def test_one_logger_per_location_the_second_is_refused_naming_the_first(tmp_path):
    from disd.logger import LocationInUseError

    schema = TRADE
    first = builder(schema, tmp_path).set_internal_partition("ip1").build()
    try:
        with pytest.raises(LocationInUseError) as ei:
            builder(schema, tmp_path, partition="2026-11-23").set_internal_partition("ip1").build()
        msg = str(ei.value)
        assert f"Market.Trade internal partition 'ip1' in {tmp_path / 'logs'}" in msg, msg
        assert f"(pid {os.getpid()} on host {socket.gethostname()}, since " in msg, msg
        assert "set_process_name" in msg and "set_on_location_in_use('new_partition')" in msg, msg
        # another internal partition, or another table, is another location
        other = builder(schema, tmp_path).set_internal_partition("ip2").build()
        quotes = builder(Q1, tmp_path).set_internal_partition("ip1").build()
        other.close()
        quotes.close()
    finally:
        first.close()
    again = builder(schema, tmp_path).set_internal_partition("ip1").build()  # closed: free again
    again.close()


def test_new_partition_takes_the_first_free_numbered_internal_partition(tmp_path):
    schema = quote(3)
    b = builder(schema, tmp_path).set_suffix_internal_partition_with_log_format().set_on_location_in_use("new_partition")
    base = b.internal_partition()
    logs = [b.build() for _ in range(3)]
    try:
        assert [lg.internal_partition for lg in logs] == [base, base.replace("-3", "_2-3"), base.replace("-3", "_3-3")]
        for i, lg in enumerate(logs):
            lg.log(Sym="A", Size=i)
            lg.flush()
            assert LogFileName.parse(lg.files[0].name).internal_partition == lg.internal_partition
    finally:
        for lg in logs:
            lg.close()
    with pytest.raises(ValueError, match="'refuse' or 'new_partition'"):
        builder(schema, tmp_path).set_on_location_in_use("steal")


def test_the_loggers_errors_are_dis_errors_and_keep_their_builtin_base(tmp_path):
    """Every error the logger raises on purpose is a ``DisError`` (one ``except`` catches them all)
    and still the builtin its callers catch."""
    from disd.errors import DisError
    from disd.logger import LoggerError, LoggerTypeError, LoggerValueError

    cases = []
    b = builder(TRADE, tmp_path)
    for call, builtin in ((lambda: b.set_rollover("weekly"), ValueError),
                          (lambda: b.set_queue_size("x"), ValueError),
                          (lambda: b.set_column_partition_function(lambda row: "p", columns=["Nope"]), KeyError)):
        with pytest.raises(builtin) as e:
            call()
        cases.append(e.value)
    log = b.build()
    with pytest.raises(TypeError) as e:
        log.log(Size=object())
    assert isinstance(e.value, LoggerTypeError)
    cases.append(e.value)
    with pytest.raises(ValueError) as e:
        log.log(Sym="x" * (MAX_FRAME_PAYLOAD + 1))
    assert isinstance(e.value, LoggerValueError)
    cases.append(e.value)
    with log.transaction():
        with pytest.raises(RuntimeError) as e:
            with log.transaction():
                pass
    assert isinstance(e.value, LoggerError)
    cases.append(e.value)
    log.close()
    assert [type(c).__name__ for c in cases if not isinstance(c, DisError)] == []
    assert isinstance(cases[0], LoggerValueError) and isinstance(cases[1], LoggerValueError)
    assert "weekly" in str(cases[0]) and "hourly" in str(cases[0]) and "'x'" in str(cases[1])


def test_a_value_log_batch_cannot_convert_raises_a_dis_error(tmp_path):
    from disd.errors import DisError

    log = builder(TRADE, tmp_path).build()
    for batch, builtin in (({"Size": [1, "x"]}, ValueError), ({"Size": [1, object()]}, (TypeError, ValueError))):
        with pytest.raises(builtin, match=r"Market\.Trade: column Size \(int\), row 1") as e:
            log.log_batch(batch)
        assert isinstance(e.value, DisError)
    log.close()
