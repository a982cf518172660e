"""``bench/location_path.py``, small: the DIS's ingest path run in process over 10 new
locations (opened together) and 3 live rounds a chunk at a time, 3 in batches.  The bench itself asserts every row
published; here, that its last
line carries its figures and that they are consistent with one another."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_location_path_bench_reports_its_figures(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "location_path.py"), "--locations", "10", "--rounds", "3",
                        "--max-open-files", "16"],
                       capture_output=True, text=True, timeout=120, env={"TMPDIR": str(tmp_path), **_env()})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["bench"] == "location_path" and result["locations"] == 10 and result["rounds"] == 3
    assert result["value"] == pytest.approx(result["live_write_us"], rel=1e-3)
    assert result["baseline"] == pytest.approx(result["live_write_bare_us"], rel=1e-3)
    assert result["live_write_us"] > 0 and result["live_write_bare_us"] > 0
    assert result["new_location_ms"] >= result["new_location_user_ms"] >= 0
    assert result["new_location_bare_ms"] > 0
    # the baseline made right before and right after the DIS's phases (the kernel's cost of
    # creating files drifts within a run), reported apart and as their mean
    assert result["new_location_bare_before_ms"] > 0 and result["new_location_bare_after_ms"] > 0
    assert result["new_location_bare_ms"] == pytest.approx(
        (result["new_location_bare_before_ms"] + result["new_location_bare_after_ms"]) / 2, rel=1e-3)
    assert result["writes_per_core_s"] == pytest.approx(1e6 / result["live_write_us"], rel=1e-2)
    assert result["live_batch_write_us"] > 0  # a live write in a batch of every location's
    assert result["batch_writes_per_core_s"] == pytest.approx(1e6 / result["live_batch_write_us"], rel=1e-2)
    assert list(tmp_path.iterdir()) == []  # its work directory removed


def test_location_path_bench_refuses_a_count_not_of_whole_partitions():
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "location_path.py"), "--locations", "7"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "--locations must be a multiple of 5" in r.stderr and "Traceback" not in r.stderr


def _env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k != "TMPDIR"}
