"""``examples/spark_batch.py`` as a user runs it (``python examples/spark_batch.py --address ...``,
a Spark of its own) gives the day's statistics with the JVM reader, and what its notes say of the
reader holds: without ``vwap`` the query's aggregates are pushed into the scan."""

from __future__ import annotations

import re
import subprocess
import sys

import pyarrow as pa
import pytest

from .conftest import LOCS
from support import ROOT, subprocess_env, trade_rows

pytestmark = pytest.mark.spark

EXAMPLE = ROOT / "examples" / "spark_batch.py"
DAY = "2026-11-22"


def run_example(script, address: str) -> str:
    r = subprocess.run([sys.executable, str(script), "--address", address, "--date", DAY, "--explain"],
                       capture_output=True, text=True, timeout=300, env=subprocess_env())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def shown_rows(out: str) -> dict[str, tuple[int, int]]:
    """Sym -> (trades, volume) of the rows ``stats.show`` printed (a null Sym as ``NULL``)."""
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and re.fullmatch(r"\d{4}-\d\d-\d\d", cells[0]):
            assert cells[0] == DAY, line
            rows[cells[1]] = (int(cells[2]), int(cells[3]))
    return rows


def expected_rows() -> dict[str, tuple[int, int]]:
    day = pa.concat_tables([trade_rows(start, n, nulls=True) for key, (start, n) in LOCS.items()
                            if key.column_partition == DAY])
    grouped = day.group_by("Sym").aggregate([("Size", "count"), ("Size", "sum")])
    return {("NULL" if s is None else s): (c, v) for s, c, v in
            zip(grouped["Sym"].to_pylist(), grouped["Size_count"].to_pylist(), grouped["Size_sum"].to_pylist())}


def test_the_batch_example_gives_the_days_statistics_with_the_jvm_reader(trade_dis):
    assert sum(t for t, _ in expected_rows().values()) == 50_000  # both feeds of the day
    out = run_example(EXAMPLE, f"127.0.0.1:{trade_dis.port}")
    assert "BatchScan dis Market.Trade" in out  # the JVM reader (the Python source's scan is a PythonScan)
    assert shown_rows(out) == expected_rows()


def test_without_vwap_the_examples_aggregates_are_pushed_as_its_notes_say(trade_dis, tmp_path):
    source = EXAMPLE.read_text()
    vwap = '                  (F.sum(F.col("Price") * F.col("Size")) / F.sum("Size")).alias("vwap"),\n'
    assert vwap in source
    script = tmp_path / "spark_batch_no_vwap.py"
    script.write_text(source.replace(vwap, ""))
    out = run_example(script, f"127.0.0.1:{trade_dis.port}")
    note = re.search(r"``(pushed aggregation \[.*?\]\s+group by \[.*?\])``", source, re.S)
    assert note, "the example's notes no longer say what is pushed"
    assert " ".join(note.group(1).split()) in out
    assert shown_rows(out) == expected_rows()
