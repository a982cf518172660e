"""The load benchmark, small: 20 locations from two real tailers into a real ``dis serve`` while
the client follows the table, with fewer column-file descriptors allowed (32) than there are column files
(100).  Every row is published exactly (per location), the lag levels off and drains, the
column-file descriptors stay under ``max_open_files``, and the DIS's memory stays under the
bound derived from its configuration (bench/load.py prints the formula)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_twenty_locations_two_tailers_bounded_lag_descriptors_and_memory(tmp_path):
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "load.py"), "--no-spark", "--locations", "20", "--tailers", "2",
         "--rows", "200000", "--live-seconds", "6", "--live-rate", "20000", "--max-open-files", "32",
         "--sample", "0.25", "--warm-mib", "0"],
        capture_output=True, text=True, timeout=300, env={"BENCH_DIR": str(tmp_path), **_env()},
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    human = r.stdout[-3000:]
    assert result["bench"] == "load" and result["locations"] == 20
    assert result["complete"], human  # every location holds exactly the rows logged for it
    assert result["lag_bounded"], human
    assert result["column_handles_peak"] <= 32, human
    assert result["dis_fds_peak"] <= 32 + 64, human  # column files + sockets, pipes, epoll
    assert result["dis_rss_peak_mib"] <= result["dis_rss_bound_mib"], human
    # the client following the table read every row exactly once while it was being written
    assert result["client_caught_up"] and result["client_rows_read"] == result["rows"] + result["live_rows"], human
    assert result["reader_errors"] == 0, human
    assert result["value"] > 0 and result["baseline"] > 0
    # the contract's keys: each process's CPU per live location write in µs, and what a new
    # location costs the DIS (the burst's DIS CPU beyond the baseline's, per location)
    assert result["dis_cpu_us_per_write"] == pytest.approx(1000 * result["dis_cpu_ms_per_write"], rel=0.01), human
    assert result["tailer_cpu_us_per_write"] == pytest.approx(1000 * result["tailer_cpu_ms_per_write"], rel=0.01)
    assert result["dis_cpu_us_per_write"] > 0 and result["tailer_cpu_us_per_write"] > 0, human
    new_location = 1000 * (result["dis_cpu_s_burst"] - result["dis_cpu_s_baseline"]) / 20
    assert result["new_location_ms"] == pytest.approx(new_location, rel=0.05, abs=0.05), human
    # the CPU limits: every process's CPU counts (the DIS's is part of it), and no run can make
    # location writes faster than its CPU per write allows on the machine's cores
    assert result["cpu_s_burst"] > result["dis_cpu_s_burst"] > 0, human
    assert result["ratio_cpu_ceiling"] > 0 and result["live_writes_per_s_asked"] == 20 / 1.0, human
    assert result["live_writes_per_s_ceiling"] >= 0.95 * result["live_writes_published_per_s"], human
    assert result["dis_live_writes_per_s_ceiling"] > result["live_writes_per_s_ceiling"], human
    # the DIS's CPU a location may add at 0.8, the DIS on one core: the baseline's seconds at
    # that ratio, less its DIS CPU, over the locations
    allowed = 1000 * (result["rows"] / result["baseline"] / 0.8 - result["dis_cpu_s_baseline"]) / 20
    assert result["dis_cpu_ms_per_location_at_0_8"] == pytest.approx(allowed, rel=0.02, abs=0.01), human
    # the floor: the same 20 locations with 10 rows each, on fresh processes; its seconds bound
    # the burst's ratio, and its CPU per location counts every process (the DIS's is part of it)
    assert result["floor_rows"] == 20 * 10, human
    baseline_s = result["rows"] / result["baseline"]
    assert result["ratio_floor_ceiling"] == pytest.approx(baseline_s / result["floor_s"], rel=0.01), human
    # CPU is counted in the kernel's 10 ms ticks: the tailers' share of a 200-row floor can be 0
    assert result["floor_cpu_ms_per_location"] >= result["floor_dis_cpu_ms_per_location"] > 0, human
    assert 0 < result["floor_first_rows_p50_s"] <= result["floor_s"], human
    # each phase's CPU per process from its threads' run time (schedstat, nanoseconds): the four
    # processes of the burst, three of the baseline; the burst's beyond the baseline per location
    burst, base = result["burst_cpu_s_by_process"], result["baseline_cpu_s_by_process"]
    assert set(burst) == {"dis", "tailers", "bench", "sampler"} and set(base) == {"dis", "tailers", "bench"}, human
    assert burst["dis"] > 0 and burst["tailers"] > 0 and base["dis"] > 0, human
    extra = result["extra_cpu_ms_per_location_by_process"]
    assert extra["dis"] == pytest.approx(1000 * (burst["dis"] - base["dis"]) / 20, abs=0.01), human
    assert extra["sampler"] == pytest.approx(1000 * burst["sampler"] / 20, abs=0.01), human
    name, seconds = result["burst_busiest_thread_by_process"]["tailers"]
    assert name.startswith("tailer") and 0 < seconds <= burst["tailers"], human


def _env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k != "BENCH_DIR"}
