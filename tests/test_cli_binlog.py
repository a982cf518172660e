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
