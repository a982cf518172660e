"""One writer per location, with real processes (``dis serve``, ``dis-tailer``, loggers): a second
logger on a location is refused while the first lives (or takes a partition of its own when told
to), every row logged arrives exactly once, and bytes that appear in a file the tailer has already
passed are reported everywhere an operator looks and never archived by retention."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from disd.client import connect
from support import (BIN, ROOT, TESTS, append_rows, by_label, free_port, log_name, scrape, start_dis_process,
                     start_tailer, subprocess_env, wait_for, write_dis_config, write_tailer_config)

pytestmark = pytest.mark.slow

APP = TESTS / "ops" / "logger_app.py"


def _app(log_dir, start: int, count: int, process_name: str = "app", mode: str = "refuse") -> subprocess.Popen:
    env = subprocess_env()
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    return subprocess.Popen([sys.executable, str(APP), str(log_dir), str(start), str(count), process_name, mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def _built(p: subprocess.Popen) -> str:
    """The internal partition the app's logger holds, once it holds it."""
    line = p.stdout.readline()
    assert line.startswith("built "), (line, p.stderr.read() if p.poll() is not None else "")
    return line.split()[1]


def _rows_by_partition(port: int) -> dict[str, np.ndarray]:
    out: dict[str, list] = {}
    with connect(f"127.0.0.1:{port}") as c:
        for snap in c.locations("Market", "Trade"):
            t = c.read_location(snap, ["Size"])
            out.setdefault(snap.key.internal_partition, []).append(t.column("Size").to_numpy())
    return {ip: np.sort(np.concatenate(v)) for ip, v in out.items()}


def test_a_second_logger_is_refused_or_takes_its_own_partition_and_every_row_arrives(tmp_path):
    port = free_port()
    dis = start_dis_process(tmp_path, write_dis_config(tmp_path, port))
    logs = tmp_path / "logs"
    tailer = start_tailer(tmp_path, write_tailer_config(tmp_path, port, logs, poll_interval_ms=50))
    try:
        first = _app(logs, 0, 3000)
        ip = _built(first)
        # the same script again, same process name, while the first one logs: refused, naming it
        second = _app(logs, 10_000, 3000)
        _, err = second.communicate(timeout=60)
        assert second.returncode == 3, err
        assert f"internal partition {ip!r}" in err and f"pid {first.pid} on host" in err, err
        assert "set_process_name" in err and "set_on_location_in_use('new_partition')" in err, err
        # told to, a third takes the next free internal partition and logs beside the first
        third = _app(logs, 20_000, 3000, mode="new_partition")
        assert _built(third) == f"{ip}_2"
        assert first.wait(60) == 0 and third.wait(60) == 0
        expected = {ip: np.arange(0, 3000), f"{ip}_2": np.arange(20_000, 23_000)}

        def arrived():
            got = _rows_by_partition(port)
            return got if {k: len(v) for k, v in got.items()} == {k: len(v) for k, v in expected.items()} else None

        got = wait_for(arrived, 60, 0.2, "every row logged")
        for k, v in expected.items():
            assert np.array_equal(got[k], v), k  # exactly once each

        # kill -9 of a holder frees its location: the next logger takes the same one
        holder = _app(logs, 30_000, 100_000)
        assert _built(holder) == ip
        holder.kill()
        holder.wait(30)
        after = _app(logs, 40_000, 100)
        assert _built(after) == ip and after.wait(60) == 0
    finally:
        for p in [q for q in locals().values() if isinstance(q, subprocess.Popen)]:
            if p.poll() is None:
                p.kill()
                p.wait(30)
        assert tailer.terminate() == 0
        assert dis.terminate() == 0


def test_bytes_appended_to_a_passed_file_are_reported_and_never_archived(tmp_path):
    """Two writers on one location the logger's lock cannot see (here: plain appends to an older
    file): the tailer warns, ``dis status`` shows the TAILER PROBLEM, the tailer's metric counts
    the bytes, and retention keeps the file while it archives the ones the checkpoint covers."""
    port, tailer_metrics = free_port(), free_port()
    # checkpoints 3 s apart: A must still be in the log directory (not covered, so not archived)
    # when the test appends to it, right after its rows arrived
    dis = start_dis_process(tmp_path, write_dis_config(tmp_path, port, checkpoint_ms=3000))
    logs, archive = tmp_path / "logs", tmp_path / "archive"
    logs.mkdir()
    a, b, c = (logs / log_name("ip1", hhmmss=t) for t in ("090000", "100000", "110000"))
    append_rows(a, 0, 10)
    append_rows(b, 10, 10)
    tailer = start_tailer(tmp_path, write_tailer_config(
        tmp_path, port, logs, poll_interval_ms=50, metrics_port=tailer_metrics,
        retention={"mode": "move", "move_to": str(archive), "interval_ms": 200}))
    loc = "Market/Trade/ip1/2026-11-22"
    try:
        wait_for(lambda: _rows_by_partition(port).get("ip1", np.empty(0)).size == 20, 30, 0.1, "20 rows")
        # the stream is past A (in B); another writer appends 10 rows to A
        size_a = a.stat().st_size
        grown = append_rows(a, 100, 10) - size_a
        append_rows(c, 20, 5)  # the location goes on: B is covered and archived, A must not be

        def status():
            r = subprocess.run([str(BIN / "dis"), "status", "--address", f"127.0.0.1:{port}", "--json"],
                               capture_output=True, text=True, timeout=60, cwd=ROOT)
            assert r.returncode in (0, 1), r.stderr
            rep = json.loads(r.stdout)
            p = rep["locations"][0]["tailer_problem"] if rep["locations"] else None
            return p["problem"] if p and a.name in p["problem"] else None

        problem = wait_for(status, 30, 0.2, "the stranded bytes in dis status")
        assert f"{grown} bytes were appended to {a.name}" in problem and f"at byte {size_a}" in problem, problem
        assert by_label(scrape(tailer_metrics), "dis_tailer_stranded_bytes") == {loc: grown}
        wait_for(lambda: (archive / b.name).exists(), 30, 0.1, f"{b.name} archived")
        time.sleep(3.5)  # more retention passes and a checkpoint
        assert sorted(os.listdir(archive)) == [b.name]  # A, with its unsent rows, stays where it is
        assert a.stat().st_size == size_a + grown
        assert np.array_equal(_rows_by_partition(port)["ip1"], np.arange(25))  # nothing of A's new rows
        events = [json.loads(line) for line in tailer.log_text().splitlines() if line.startswith("{")]
        warned = [e for e in events if e["event"].startswith("bytes in a log file the stream has passed")]
        assert warned and warned[0]["level"] == "warning" and warned[0]["stranded_bytes"] == grown, warned

        # the operator moves A out of the log directory: the problem is over
        a.rename(tmp_path / a.name)
        wait_for(lambda: status() is None, 30, 0.2, "the problem cleared")
        wait_for(lambda: by_label(scrape(tailer_metrics), "dis_tailer_stranded_bytes") == {loc: 0}, 30, 0.2,
                 "no stranded bytes")
    finally:
        assert tailer.terminate() == 0
        assert dis.terminate() == 0
