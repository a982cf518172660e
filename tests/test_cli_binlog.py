import json
import subprocess
import sys

import numpy as np

from disd.binlog import BinlogWriter, normalize_columns
from disd.cli import main


def test_dump_human_and_json(tmp_path, trade_schema, capsys):
    p = tmp_path / "Market.Trade.System.ip.2026-11-22.bin.2026-11-22.000000.000+0000"
    with BinlogWriter(p, trade_schema) as w:
        w.write_rows(normalize_columns(trade_schema, {"Sym": ["AAPL", None], "Size": [1, 2]}), np.array([1, 2], np.uint8))
    assert main(["binlog", "dump", str(p)]) == 0
    out = capsys.readouterr().out
    assert "Market.Trade" in out and "START_TRANSACTION" in out and "AAPL" in out and "null" in out
    assert main(["binlog", "dump", "--json", str(p)]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert lines[0]["rows"] == 2 and lines[0]["schema"]["table"] == "Trade"
    assert lines[1] == {"flag": "START_TRANSACTION", "Timestamp": None, "Sym": "AAPL", "Price": None, "Size": 1}
    assert lines[2]["flag"] == "END_TRANSACTION" and lines[2]["Sym"] is None


def test_dump_corrupt_file_is_a_clear_error(tmp_path, trade_schema):
    p = tmp_path / "x.bin"
    p.write_bytes(b"garbage garbage garbage garbage garbage")
    r = subprocess.run([sys.executable, "-m", "disd.cli", "binlog", "dump", str(p)], capture_output=True, text=True)
    assert r.returncode == 1
    assert "not a binary log" in r.stderr and "Traceback" not in r.stderr


def _dump(*args):
    return subprocess.run([sys.executable, "-m", "disd.cli", "binlog", "dump", *map(str, args)],
                          capture_output=True, text=True, encoding="utf-8")


def test_dump_into_a_pipe_closed_early_exits_quietly(tmp_path, trade_schema):
    p = tmp_path / "many.bin"
    n = 50_000
    with BinlogWriter(p, trade_schema) as w:
        w.write_rows(normalize_columns(trade_schema, {"Sym": ["AAPL"] * n, "Size": list(range(n))}),
                     np.full(n, 3, np.uint8))
    for extra in ([], ["--json"]):
        r = subprocess.Popen([sys.executable, "-m", "disd.cli", "binlog", "dump", *extra, str(p)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        r.stdout.readline()
        r.stdout.close()  # as `| head` does
        err = r.stderr.read().decode()
        assert r.wait(60) == 0
        assert "Traceback" not in err and "BrokenPipeError" not in err and err == ""


def test_dump_caps_the_width_of_long_values_and_json_keeps_them_whole(tmp_path, trade_schema):
    p = tmp_path / "big.bin"
    big = "x" * 10_000_000
    with BinlogWriter(p, trade_schema) as w:
        w.write_rows(normalize_columns(trade_schema, {"Sym": [big, "AAPL", "a\nb"], "Size": [1, 2, 3]}),
                     np.full(3, 3, np.uint8))
    r = _dump(p)
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert max(len(x) for x in lines) < 200
    rows = [x for x in lines if x.startswith("SINGLE_ROW")]
    assert len(rows) == 3 and "x" * 39 + "\u2026" in rows[0] and "AAPL" in rows[1] and "a\\nb" in rows[2]
    r = _dump("--json", p)
    assert r.returncode == 0 and json.loads(r.stdout.splitlines()[1])["Sym"] == big


def test_dump_prints_a_char_as_its_character(tmp_path):
    from disd.schema import TableSchema

    schema = TableSchema.from_dict({"namespace": "Test", "table": "Grades",
                                    "columns": [{"name": "Grade", "type": "char"}, {"name": "N", "type": "int"}]})
    p = tmp_path / "c.bin"
    with BinlogWriter(p, schema) as w:
        w.write_rows(normalize_columns(schema, {"Grade": ["B", "é", None, 0xD800], "N": [1, 2, 3, 4]}),
                     np.full(4, 3, np.uint8))
    r = _dump(p)
    assert r.returncode == 0
    rows = [x.split() for x in r.stdout.splitlines() if x.startswith("SINGLE_ROW")]
    assert [x[1] for x in rows] == ["B", "é", "null", "\\ud800"]
    r = _dump("--json", p)
    assert [json.loads(x)["Grade"] for x in r.stdout.splitlines()[1:]] == ["B", "é", None, "\ud800"]


def test_dump_of_a_corrupt_frame_prints_the_rows_before_it_then_the_error(tmp_path, trade_schema):
    from disd.binlog.format import FRAME_HEADER_SIZE

    p = tmp_path / "bad.bin"
    with BinlogWriter(p, trade_schema) as w:
        w.write_rows(normalize_columns(trade_schema, {"Sym": ["A", "B"], "Size": [1, 2]}), [3, 3])
        off = w.write_rows(normalize_columns(trade_schema, {"Sym": ["C"], "Size": [3]}), [3])
        w.write_rows(normalize_columns(trade_schema, {"Sym": ["D"], "Size": [4]}), [3])
    data = bytearray(p.read_bytes())
    data[off + FRAME_HEADER_SIZE + 3] ^= 0x40  # the third frame's payload
    p.write_bytes(bytes(data))
    r = _dump(p)
    assert r.returncode == 1
    out = r.stdout
    assert "Market.Trade" in out and f"corrupt frame at byte {off}" in out
    assert "rows:        3 in 2 intact frames" in out
    assert [x.split()[2] for x in out.splitlines() if x.startswith("SINGLE_ROW")] == ["A", "B", "C"]
    assert f"corrupt binary log at byte {off}" in r.stderr and "Traceback" not in r.stderr
    r = _dump("--json", p)
    assert r.returncode == 1
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert lines[0]["rows"] == 3 and lines[0]["corrupt"]["offset"] == off
    assert [x["Sym"] for x in lines[1:]] == ["A", "B", "C"]


def test_dump_shows_the_schema_version_and_renames(tmp_path, capsys):
    from disd.schema import TableSchema

    s = TableSchema.from_dict({"namespace": "Market", "table": "Quote", "version": 4, "columns": [
        {"name": "Symbol", "type": "string", "renamed_from": "Sym"}, {"name": "Size", "type": "long"}]})
    p = tmp_path / "Market.Quote.System.ip-4.2026-11-22.bin.2026-11-22.000000.000+0000"
    with BinlogWriter(p, s) as w:
        w.write_rows(normalize_columns(s, {"Symbol": ["AAPL"], "Size": [1]}), np.array([3], np.uint8))
    assert main(["binlog", "dump", str(p)]) == 0
    out = capsys.readouterr().out
    assert "Market.Quote   schema version 4   format v1" in out, out
    assert "Symbol:string (renamed from Sym), Size:long" in out, out
    assert main(["binlog", "dump", "--json", str(p)]) == 0
    meta = json.loads(capsys.readouterr().out.splitlines()[0])
    assert meta["schema_version"] == 4 and meta["version"] == 1 and meta["schema"]["version"] == 4
