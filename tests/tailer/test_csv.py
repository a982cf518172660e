"""CSV-fed tables: complete lines transcoded into spool logs, restart-safe, streamed like logs."""

from __future__ import annotations

import json
import threading

import pyarrow as pa
import pytest

from disd.binlog import read_file
from disd.tailer import Tailer
from disd.tailer.csvfeed import CsvError, CsvTranscoder, parse_header, parse_lines
from disd.schema import SchemaRegistry
from support import SCHEMAS, wait_for

from .fakedis import FakeDis
from .helpers import config

QUOTE = SchemaRegistry.load_dir(SCHEMAS).get("Market", "Quote")
CSV = "Market.Quote.System.feed1.2026-11-22.csv.2026-11-22.090000.000+0000"
CSV2 = "Market.Quote.System.feed1.2026-11-22.csv.2026-11-22.100000.000+0000"
BIN = CSV.replace(".csv.", ".bin.")
BIN2 = CSV2.replace(".csv.", ".bin.")
HEADER = b"Sym,Bid,Timestamp,Exchange,BidSize,Halted\n"


def line(i: int) -> bytes:
    return f"S{i},{i}.5,{1_790_000_000_000_000_000 + i},N,{i},{'true' if i % 2 else 'false'}\n".encode()


def test_parse_types_nulls_and_timestamps():
    names = parse_header(b"Timestamp,Sym,Exchange,Bid,AskSize,Halted\n", QUOTE)
    body = (b"2026-11-22T09:00:00.5Z,A,N,1.5,10,true\n"
            b"2026-11-22 10:00:00+01:00,,,,,\n"
            b"2026-11-22T09:00:01,\"x,y\",Q,2,-3,0\n")
    t = parse_lines(b"Timestamp,Sym,Exchange,Bid,AskSize,Halted\n", body, names, QUOTE)
    assert t.column("Sym").to_pylist() == ["A", "", "x,y"]
    assert t.column("Exchange").to_pylist() == [ord("N"), None, ord("Q")]
    assert t.column("Bid").to_pylist() == [1.5, None, 2.0]
    assert t.column("AskSize").to_pylist() == [10, None, -3]
    assert t.column("Halted").to_pylist() == [True, None, False]
    ts = t.column("Timestamp").cast(pa.int64()).to_pylist()
    base = 1795338000 * 10**9  # 2026-11-22T09:00:00Z
    assert ts == [base + 5 * 10**8, base, base + 10**9]
    t = parse_lines(b"Timestamp\n", b"123\n\n-5\n", ["Timestamp"], QUOTE)  # integer nanoseconds
    assert t.column("Timestamp").cast(pa.int64()).to_pylist() == [123, -5]


@pytest.mark.parametrize("header,body,problem", [
    (b"Sym,Nope\n", None, "Nope"),
    (b"Sym,Sym\n", None, "twice"),
    (b"Bid\n", b"abc\n", ""),
    (b"Exchange\n", b"NY\n", "single character"),
    (b"Timestamp\n", b"yesterday\n", "timestamp"),
    (b"Sym,Bid\n", b"a,1,2\n", ""),
])
def test_bad_content_is_an_error(header, body, problem):
    with pytest.raises(CsvError) as ei:
        names = parse_header(header, QUOTE)
        parse_lines(header, body, names, QUOTE)
    assert problem in str(ei.value)


def transcoder(tmp_path, grace_s=0.2):
    halt = threading.Event()
    t = CsvTranscoder({"Market.Quote": QUOTE}, str(tmp_path / "state"), grace_s, 0.05, halt)
    (tmp_path / "state" / "spool").mkdir(parents=True, exist_ok=True)
    (tmp_path / "state" / "csv").mkdir(parents=True, exist_ok=True)
    return t


def feed(t, tmp_path):
    from disd.tailer.watch import scan_dirs

    t.update(scan_dirs([str(tmp_path / "logs")], set(), ["Market.Quote"]).csv_files)
    while t.pass_once():
        pass


def spool_sizes(tmp_path, bin_name=BIN) -> list[int]:
    c = read_file(tmp_path / "state" / "spool" / bin_name)
    assert set(c.flags.tolist()) <= {3}
    return c.table.column("BidSize").to_pylist()


def test_complete_lines_only_and_incremental(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    p = logs / CSV
    p.write_bytes(HEADER[:10])  # the header row is not complete yet
    t = transcoder(tmp_path)
    feed(t, tmp_path)
    assert not (tmp_path / "state" / "spool" / BIN).exists() or spool_sizes(tmp_path) == []
    p.write_bytes(HEADER + line(0) + line(1) + line(2)[:5])  # a partial third line
    feed(t, tmp_path)
    assert spool_sizes(tmp_path) == [0, 1]
    with open(p, "ab") as f:
        f.write(line(2)[5:] + b"\n" + line(3))  # blank lines are skipped
    feed(t, tmp_path)
    assert spool_sizes(tmp_path) == [0, 1, 2, 3]
    st = t.status()[str(p)]
    assert st["rows"] == 4 and st["csv_offset"] == p.stat().st_size and st["error"] is None
    t.stop()


def test_many_lines_become_frames_of_at_most_65536_rows(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    n = 70_000
    body = "".join(f"S,1.0,{i},N,{i},true\n" for i in range(n)).encode()
    (logs / CSV).write_bytes(HEADER + body)
    t = transcoder(tmp_path)
    feed(t, tmp_path)
    c = read_file(tmp_path / "state" / "spool" / BIN)
    assert c.table.column("BidSize").to_pylist() == list(range(n))
    assert c.frame_row_counts == [65536, n - 65536]
    t.stop()


@pytest.mark.parametrize("crash", ["before_frame", "after_frame"])
def test_restart_after_a_crash_mid_step_transcodes_each_line_once(tmp_path, crash, monkeypatch):
    logs = tmp_path / "logs"
    logs.mkdir()
    p = logs / CSV
    p.write_bytes(HEADER + line(0) + line(1))
    t = transcoder(tmp_path)
    feed(t, tmp_path)
    with open(p, "ab") as f:
        f.write(line(2) + line(3))
    # simulate a kill: the pending state is saved, then the frame is (or is not) written, then nothing
    from disd.binlog import BinlogWriter

    real = BinlogWriter.write_rows

    def dying(self, cols, flags):
        if crash == "after_frame":
            real(self, cols, flags)
        raise SystemExit("killed")

    monkeypatch.setattr(BinlogWriter, "write_rows", dying)
    with pytest.raises(SystemExit):
        feed(t, tmp_path)
    state = json.loads((tmp_path / "state" / "csv" / f"{CSV}.json").read_text())
    assert state["pending_csv_offset"] == p.stat().st_size
    monkeypatch.setattr(BinlogWriter, "write_rows", real)
    for f in t._files.values():  # the process died: its open files are gone  # noqa: SLF001 - the test kills the tailer's open files as a dead process would
        f.writer._file.close()  # noqa: SLF001 - the test kills the tailer's open files as a dead process would
    t2 = transcoder(tmp_path)
    feed(t2, tmp_path)
    assert spool_sizes(tmp_path) == [0, 1, 2, 3]
    t2.stop()


def test_a_torn_spool_frame_is_cut_and_redone(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    p = logs / CSV
    p.write_bytes(HEADER + line(0))
    t = transcoder(tmp_path)
    feed(t, tmp_path)
    t.stop()
    spool = tmp_path / "state" / "spool" / BIN
    good = spool.stat().st_size
    st_path = tmp_path / "state" / "csv" / f"{CSV}.json"
    state = json.loads(st_path.read_text())
    # a step was pending and its frame only half written when the tailer died
    state["pending_csv_offset"] = state["csv_offset"] + len(line(1))
    state["pending_rows"] = 1
    st_path.write_text(json.dumps(state))
    with open(p, "ab") as f:
        f.write(line(1))
    with open(spool, "ab") as f:
        f.write(b"\x10\x00\x00\x00\x01")
    t2 = transcoder(tmp_path)
    feed(t2, tmp_path)
    assert spool_sizes(tmp_path) == [0, 1]
    assert spool.stat().st_size > good
    t2.stop()


def test_bad_line_stops_the_file(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    p = logs / CSV
    p.write_bytes(HEADER + line(0) + b"S,notanumber,1,N,1,true\n" + line(2))
    t = transcoder(tmp_path)
    feed(t, tmp_path)
    st = t.status()[str(p)]
    assert st["error"] and st["rows"] == 0
    t.stop()


def test_next_csv_file_after_the_last_line_settles(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / CSV).write_bytes(HEADER + line(0) + line(1).rstrip(b"\n"))  # the last line lacks its break
    (logs / CSV2).write_bytes(HEADER + line(2))
    t = transcoder(tmp_path, grace_s=0.1)
    feed(t, tmp_path)
    wait_for(lambda: (feed(t, tmp_path), t.status()[str(logs / CSV)]["finished"])[1], 5, what="first file done")
    feed(t, tmp_path)
    assert spool_sizes(tmp_path) == [0, 1]
    assert spool_sizes(tmp_path, BIN2) == [2]
    t.stop()


def test_csv_tables_stream_end_to_end(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    dis = FakeDis().start()
    try:
        cfg = config(dis.address, logs, csv_tables=["Market.Quote"], schemas=str(SCHEMAS),
                     state_dir=str(tmp_path / "state"))
        (logs / CSV).write_bytes(HEADER + line(0) + line(1))
        with Tailer(cfg) as t:
            assert t.wait_idle(20)
            with open(logs / CSV, "ab") as f:
                f.write(line(2))
            assert t.wait_idle(20)
            st = dis.log_of("feed1")
            assert st.file_name == BIN and st.offset == (tmp_path / "state" / "spool" / BIN).stat().st_size
            assert t.csv_status()[str(logs / CSV)]["rows"] == 3
            assert t.status()["Market/Quote/feed1/2026-11-22"]["acked_offset"] == st.offset
        from disd.binlog import decode_frames, decode_header, scan_frames

        data = bytes(st.data[BIN])
        h = decode_header(data)
        rows = decode_frames(data, 0, scan_frames(data, 0, h.schema, start=h.size), h.schema).to_table()
        assert rows.column("BidSize").to_pylist() == [0, 1, 2]
        assert rows.column("Sym").to_pylist() == ["S0", "S1", "S2"]
        assert rows.column("Ask").null_count == 3  # not in the CSV: null
        # a restarted tailer transcodes nothing twice
        with open(logs / CSV, "ab") as f:
            f.write(line(3))
        with Tailer(cfg) as t:
            assert t.wait_idle(20)
        data = bytes(dis.log_of("feed1").data[BIN])
        rows = decode_frames(data, 0, scan_frames(data, 0, h.schema, start=h.size), h.schema).to_table()
        assert rows.column("BidSize").to_pylist() == [0, 1, 2, 3]
    finally:
        dis.stop()
