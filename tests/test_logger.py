import datetime as dt
import socket
import threading
import time

import numpy as np
import pyarrow as pa
import pytest

from disd.binlog import LogFileName, RowFlag, read_file
from disd.logger import IntradayLoggerBuilder, Rollover
from disd.names import legalize


def builder(schema, tmp_path, **kw):
    b = IntradayLoggerBuilder(schema).set_log_dir(tmp_path).set_internal_partition("ip1")
    return b


def read_all(log):
    tables, flags = [], []
    for f in sorted(set(log.files)):
        r = read_file(f)
        tables.append(r.table)
        flags.append(r.flags)
    return pa.concat_tables(tables), np.concatenate(flags)


def test_round_trip_every_type(all_types_schema, tmp_path):
    log = builder(all_types_schema, tmp_path).set_column_partition_value("2026-11-22").build()
    rows = [
        dict(Bool=True, Byte=-5, Short=300, Int=-70000, Long=2**40, Float=1.5, Double=-2.25, Char="é",
             String="日本語 żółć", Timestamp=dt.datetime(2026, 11, 22, 9, 30, tzinfo=dt.timezone.utc), Other=""),
        dict(),  # every column null
        dict(String=None, Int=None, Bool=False, Char=65),
    ]
    for r in rows:
        log.log(**r)
    log.close()
    t, flags = read_all(log)
    assert (flags == RowFlag.SINGLE_ROW).all()
    got = t.to_pylist()
    assert got[0]["String"] == "日本語 żółć" and got[0]["Char"] == ord("é") and got[0]["Long"] == 2**40
    assert got[0]["Timestamp"] == dt.datetime(2026, 11, 22, 9, 30, tzinfo=dt.timezone.utc)
    assert all(v is None for v in got[1].values())
    assert got[2]["Bool"] is False and got[2]["Char"] == 65 and got[2]["String"] is None


def test_transaction_flags_and_abandoned_transaction(trade_schema, tmp_path):
    log = builder(trade_schema, tmp_path).set_column_partition_value("2026-11-22").build()
    log.log(Sym="A", Size=1)
    with log.transaction():
        log.log(Sym="B", Size=2)
        log.log(Sym="C", Size=3)
        log.log(Sym="D", Size=4)
    with pytest.raises(ZeroDivisionError):
        with log.transaction():
            log.log(Sym="GONE", Size=-1)
            1 / 0
    with log.transaction():
        log.log(Sym="E", Size=5)  # a one-row transaction is a SingleRow
    log.close()
    t, flags = read_all(log)
    assert t.column("Sym").to_pylist() == ["A", "B", "C", "D", "E"]
    assert flags.tolist() == [3, 1, 0, 2, 3]


def test_log_batch_atomic_and_not(trade_schema, tmp_path):
    log = builder(trade_schema, tmp_path).set_column_partition_value("2026-11-22").build()
    log.log_batch({"Sym": ["a", "b", "c"], "Size": [1, 2, 3]})
    log.log_batch(pa.table({"Sym": ["d", "e"], "Size": pa.array([4, 5], pa.int32())}), atomic=True)
    log.close()
    t, flags = read_all(log)
    assert t.column("Size").to_pylist() == [1, 2, 3, 4, 5]
    assert flags.tolist() == [3, 3, 3, 1, 2]
    # a new frame starts at the transaction's Start
    assert read_file(log.files[0]).frame_row_counts == [3, 2]


class Clock:
    def __init__(self, t):
        self.t = t

    def __call__(self):
        return self.t


def test_hourly_rollover(trade_schema, tmp_path):
    clock = Clock(dt.datetime(2026, 11, 22, 9, 59, 59, tzinfo=dt.timezone.utc))
    log = builder(trade_schema, tmp_path).set_column_partition_value("2026-11-22").set_clock(clock).build()
    log.log(Size=1)
    log.flush()
    clock.t = dt.datetime(2026, 11, 22, 10, 0, 1, tzinfo=dt.timezone.utc)
    log.log(Size=2)
    log.close()
    names = [LogFileName.parse(f.name) for f in log.files]
    assert [n.timestamp.hour for n in names] == [9, 10]
    assert [read_file(f).table.column("Size").to_pylist() for f in log.files] == [[1], [2]]


def test_daily_rollover_follows_time_zone_date(trade_schema, tmp_path):
    clock = Clock(dt.datetime(2026, 11, 22, 22, 0, tzinfo=dt.timezone.utc))  # 17:00 in New York
    log = (builder(trade_schema, tmp_path).set_time_zone_name("America/New_York").set_rollover(Rollover.DAILY)
           .set_clock(clock).build())
    log.log(Size=1)
    clock.t = dt.datetime(2026, 11, 22, 23, 30, tzinfo=dt.timezone.utc)  # still the 22nd there
    log.log(Size=2)
    log.flush()
    clock.t = dt.datetime(2026, 11, 23, 5, 30, tzinfo=dt.timezone.utc)  # 00:30 on the 23rd in New York
    log.log(Size=3)
    log.close()
    parts = [LogFileName.parse(f.name).column_partition for f in log.files]
    assert parts == ["2026-11-22", "2026-11-23"]
    assert [read_file(f).table.column("Size").to_pylist() for f in log.files] == [[1, 2], [3]]


def test_fixed_name_mode_appends_across_restarts(trade_schema, tmp_path):
    stamp = dt.datetime(2026, 11, 22, 0, 0, tzinfo=dt.timezone.utc)
    for i in range(2):
        log = (builder(trade_schema, tmp_path).set_column_partition_value("2026-11-22")
               .set_rollover("fixed", stamp).build())
        log.log(Size=i)
        log.close()
    files = list(tmp_path.iterdir())
    assert len(files) == 1
    assert read_file(files[0]).table.column("Size").to_pylist() == [0, 1]


def test_internal_partition_from_host_name_with_suffixes(trade_schema, tmp_path):
    b = IntradayLoggerBuilder(trade_schema).set_log_dir(tmp_path).set_internal_partition_suffix("A").set_log_format_suffix("v2")
    assert b.internal_partition() == f"{legalize(socket.gethostname())}_A_v2"
    assert "." not in b.internal_partition()


def test_partition_function(trade_schema, tmp_path):
    log = (builder(trade_schema, tmp_path)
           .set_column_partition_function(lambda row: "P" + str(row["Size"] % 2)).build())
    log.log_batch({"Size": [1, 2, 3, 4]})
    log.log(Size=5)
    log.close()
    by_part = {}
    for f in log.files:
        by_part.setdefault(LogFileName.parse(f.name).column_partition, []).extend(
            read_file(f).table.column("Size").to_pylist())
    assert by_part == {"P1": [1, 3, 5], "P0": [2, 4]}


def test_backpressure_blocks_caller_on_full_queue(trade_schema, tmp_path):
    log = builder(trade_schema, tmp_path).set_column_partition_value("2026-11-22").set_queue_size(1).build()
    gate = threading.Event()
    original = log._write

    def slow_write(batches):
        gate.wait(5)
        original(batches)

    log._write = slow_write
    log.log(Size=0)  # taken by the writer, which now waits on the gate
    time.sleep(0.1)
    log.log(Size=1)  # fills the queue
    done = threading.Event()
    threading.Thread(target=lambda: (log.log(Size=2), done.set()), daemon=True).start()
    assert not done.wait(0.3), "caller should block while the queue is full"
    gate.set()
    assert done.wait(5)
    log.close()
    t, _ = read_all(log)
    assert t.column("Size").to_pylist() == [0, 1, 2]


def test_writer_error_surfaces_to_caller(trade_schema, tmp_path):
    log = builder(trade_schema, tmp_path).set_column_partition_value("2026-11-22").build()

    def broken(batches):
        raise OSError(28, "No space left on device")

    log._write = broken
    log.log(Size=1)
    with pytest.raises(RuntimeError, match="No space left"):
        for _ in range(100):
            log.log(Size=2)
            time.sleep(0.01)


def test_unknown_column_is_refused(trade_schema, tmp_path):
    log = builder(trade_schema, tmp_path).set_column_partition_value("2026-11-22").build()
    with pytest.raises(ValueError, match="no column 'Nope'"):
        log.log(Nope=1)
    log.close()
