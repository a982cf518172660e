"""Problems on the tailer's side reach the operator, with ``dis serve`` and ``dis-tailer`` as real
processes: garbage appended to a log and misnamed log files show in ``dis status`` (ERRORS, TAILER
PROBLEM, ``--json``), in the DIS's ``dis_location_tailer_problem``, on the tailer's own endpoint
(``metrics_port``) and in its log at warning and error level with the exact reason; a DIS restart
counts as a reconnect and the problem is told again; repaired, everything clears."""

from __future__ import annotations

import json
import subprocess

import pytest

from support import (BIN, ROOT, append_rows, by_label, free_port, log_name, scrape, start_dis_process, start_tailer,
                     wait_for, write_dis_config, write_tailer_config)

pytestmark = pytest.mark.slow

LOC = "Market/Trade/ip1/2026-11-22"
GARBAGE = b"\xde\xad\xbe\xef" * 25


def _status(port: int) -> dict:
    r = subprocess.run([str(BIN / "dis"), "status", "--address", f"127.0.0.1:{port}", "--json"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_tailer_problems_reach_dis_status_the_metrics_and_the_logs(tmp_path):
    port, dis_metrics, tailer_metrics = free_port(), free_port(), free_port()
    cfg = write_dis_config(tmp_path, port, dis_metrics)
    dis = start_dis_process(tmp_path, cfg)
    logs = tmp_path / "logs"
    logs.mkdir()
    good = logs / log_name("ip1")
    size = append_rows(good, 0, 9, frames=3)
    with open(good, "ab") as f:
        f.write(GARBAGE)
    typo = logs / log_name("ip1", hhmmss="100000").replace("System", "Sytem")
    append_rows(typo, 9, 3)
    month = logs / log_name("ip1", hhmmss="110000").replace("bin.2026-11", "bin.2026-13")
    append_rows(month, 12, 1)
    bak = logs / (log_name("ip1", hhmmss="120000") + ".bak")
    bak.write_bytes(b"x")
    tailer = start_tailer(tmp_path, write_tailer_config(tmp_path, port, logs, poll_interval_ms=50,
                                                        retry_refused_ms=200, max_backoff_ms=200,
                                                        metrics_port=tailer_metrics))
    expected = [f"corrupt binary log {good.name} at byte {size}: frame header checksum mismatch",
                f"file {typo.name} is not streamed: namespace kind 'Sytem' is not 'System' or 'User'",
                f"file {month.name} is not streamed: month 13 is not 01..12",
                f"file {bak.name} is not streamed: unexpected suffix '.bak'"]

    def problem_shown():
        rep = _status(port)
        p = rep["locations"][0]["tailer_problem"] if rep["locations"] else None
        # the good rows published (a flush interval after they were acknowledged) and the problem
        return rep if p and all(e in p["problem"] for e in expected) and rep["locations"][0]["rows"] == 9 else None

    try:
        # the good rows arrive; the problem is in dis status, table and JSON
        rep = wait_for(problem_shown, 30, 0.2, "the tailer's problem in dis status")
        loc = rep["locations"][0]
        assert loc["error"] is None and loc["tailer_problem"]["tailer"].endswith(f":{tailer.p.pid}")
        assert rep["tables"][0]["errors"] == 1 and rep["tables"][0]["tailer_problems"] == 1
        r = subprocess.run([str(BIN / "dis"), "status", "--address", f"127.0.0.1:{port}"],
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
        lines = r.stdout.splitlines()
        # TAILERS is 0/1 or 1/1: a tailer stopped at a corrupt frame reopens a stream now and
        # then to tell a DIS that may have restarted, so either can be seen
        assert any(f[:3] == ["Market.Trade", "1", "9"] and f[3] in ("0/1", "1/1") and f[4] == "1"
                   for f in (line.split() for line in lines)), r.stdout
        assert expected[0] in next(line for line in lines if line.startswith("Market.Trade/ip1/2026-11-22"))
        assert by_label(scrape(dis_metrics), "dis_location_tailer_problem") == {LOC: 1.0}
        # the tailer's own endpoint
        s = scrape(tailer_metrics)
        assert by_label(s, "dis_tailer_corrupt_frames_total") == {LOC: 1.0}
        assert by_label(s, "dis_tailer_acked_bytes_total") == {LOC: size}
        assert by_label(s, "dis_tailer_bytes_behind") == {LOC: len(GARBAGE)}
        assert {x.labels["reason"]: x.value for x in s["dis_tailer_files_skipped"]} == {
            "namespace_kind": 1, "month": 1, "suffix": 1}
        # its log: each skipped file at warning with the wrong part, the corruption at error with its offset
        events = [json.loads(line) for line in tailer.log_text().splitlines() if line.startswith("{")]
        skipped = {e["file"]: e for e in events if e["event"].startswith("skipping file")}
        assert {e["level"] for e in skipped.values()} == {"warning"}
        assert skipped[str(typo)]["problem"] == "namespace kind 'Sytem' is not 'System' or 'User'"
        assert skipped[str(month)]["problem"] == "month 13 is not 01..12"
        assert skipped[str(bak)]["problem"] == "unexpected suffix '.bak'"
        corrupt = [e for e in events if e["event"].startswith("corrupt binary log")]
        assert corrupt[0]["level"] == "error" and corrupt[0]["offset"] == size and corrupt[0]["file"] == str(good)

        # the DIS restarts: the tailer counts the failed streams, and tells the new DIS again
        assert dis.terminate() == 0
        wait_for(lambda: by_label(scrape(tailer_metrics), "dis_tailer_reconnects_total").get(LOC, 0) >= 1, 30,
                 0.2, "a reconnect counted")
        dis = start_dis_process(tmp_path, cfg)
        wait_for(problem_shown, 30, 0.2, "the problem told to the restarted DIS")

        # repaired: the garbage cut off, the typo renamed, the other two removed
        with open(good, "r+b") as f:
            f.truncate(size)
        typo.rename(logs / log_name("ip1", hhmmss="100000"))
        month.unlink()
        bak.unlink()
        rep = wait_for(lambda: (lambda r: r if r["locations"][0]["tailer_problem"] is None
                                and r["locations"][0]["rows"] == 12 else None)(_status(port)), 30, 0.2,
                       "the problem resolved and the renamed file's rows ingested")
        assert rep["tables"][0]["errors"] == 0 and rep["tables"][0]["tailer_problems"] == 0
        assert by_label(scrape(dis_metrics), "dis_location_tailer_problem") == {LOC: 0.0}
        s = wait_for(lambda: (lambda s: s if by_label(s, "dis_tailer_bytes_behind") == {LOC: 0} else None)(
            scrape(tailer_metrics)), 30, 0.2, "nothing behind")
        assert "dis_tailer_files_skipped" not in s
    finally:
        tailer_rc = tailer.terminate()
        dis_rc = dis.terminate()
    assert tailer_rc == 0 and dis_rc == 0
