"""A tailer's ``report`` on its Ingest stream: the DIS keeps the location's last problem after the
stream ends, shows it in ``Status``, ``dis status`` (table and ``--json``) and the metric
``dis_location_tailer_problem``, and forgets it when the tailer reports it resolved, or once no
stream of its location has been open for ``server.idle_timeout_s``."""

from __future__ import annotations

import json
import time

import structlog

from disd.cli import main
from disd.rpc.channel import open_channel
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from support import TRADE, by_label, scrape, wait_for, write_log

from .conftest import FILE1, KEY, IngestStream, send_file

PROBLEM = f"corrupt binary log {FILE1} at byte 373: frame header checksum mismatch"


def _status(dis) -> dis_pb2.LocationStatus:
    ch = open_channel(f"127.0.0.1:{dis.port}")
    try:
        return dis_pb2_grpc.TableDataStub(ch).Status(dis_pb2.StatusRequest()).locations[0]
    finally:
        ch.close()


def _report(s: IngestStream, problem: str) -> None:
    s.send(dis_pb2.IngestRequest(report=dis_pb2.TailerReport(problem=problem)))


def _problem_gauge(dis) -> float:
    return by_label(scrape(dis.metrics_port), "dis_location_tailer_problem")[str(KEY)]


def test_a_reported_problem_is_shown_until_resolved(dis, tmp_path, capsys):
    write_log(tmp_path / FILE1, TRADE, {"Size": [1, 2, 3]}, [3, 3, 3])
    s = IngestStream(dis.port)
    resume = s.open(fingerprint=TRADE.fingerprint, tailer_id="host1:42")
    assert resume.resume.accepts_reports
    assert send_file(s, tmp_path / FILE1, TRADE).ack.committed_rows == 3
    wait_for(lambda: _status(dis).rows == 3)  # published a flush interval later
    with structlog.testing.capture_logs() as logs:
        _report(s, PROBLEM)
        st = wait_for(lambda: (lambda x: x if x.tailer_problem else None)(_status(dis)))
    assert (st.tailer_problem, st.tailer_problem_tailer) == (PROBLEM, "host1:42") and st.tailer_problem_age_s >= 0
    assert [(x["log_level"], x["location"], x["problem"]) for x in logs if x["event"] == "tailer reports a problem"] \
        == [("warning", str(KEY), PROBLEM)]
    assert _problem_gauge(dis) == 1.0
    # the stream ends: the problem stays (nothing was resolved), and a chunk after a report is fine
    s.close()
    wait_for(lambda: not _status(dis).tailer)
    capsys.readouterr()
    assert main(["status", "--address", f"127.0.0.1:{dis.port}", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    loc = rep["locations"][0]
    assert loc["error"] is None and loc["tailer_problem"]["problem"] == PROBLEM
    assert loc["tailer_problem"]["tailer"] == "host1:42"
    assert rep["tables"] == [{"table": "Market.Trade", "locations": 1, "rows": 3, "tailers": 0, "errors": 1,
                              "tailer_problems": 1}]
    assert main(["status", "--address", f"127.0.0.1:{dis.port}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.split() == ["Market.Trade", "1", "3", "0/1", "1"] for line in lines), lines
    assert "TAILER PROBLEM" in next(line for line in lines if line.startswith("LOCATION"))
    row = next(line for line in lines if line.startswith("Market.Trade/feed1/2026-11-22"))
    assert f"{PROBLEM} (host1:42, " in row
    # the next stream of the location says it is resolved
    s = IngestStream(dis.port)
    s.open(fingerprint=TRADE.fingerprint, tailer_id="host1:43")
    _report(s, "")
    wait_for(lambda: not _status(dis).tailer_problem)
    assert _problem_gauge(dis) == 0.0
    s.close()


def test_a_huge_report_is_kept_cut_short(dis):
    from disd.server.ingestsessions import MAX_PROBLEM_CHARS

    s = IngestStream(dis.port)
    s.open(fingerprint=TRADE.fingerprint, tailer_id="t")
    _report(s, "x" * (1 << 20))
    st = wait_for(lambda: (lambda x: x if x.tailer_problem else None)(_status(dis)))
    assert st.tailer_problem == "x" * MAX_PROBLEM_CHARS + f" ... ({(1 << 20) - MAX_PROBLEM_CHARS} more characters)"
    s.close()


def test_a_problem_nobody_stands_behind_is_dropped_after_the_idle_timeout(tmp_path):
    """A problem outlives its stream (a tailer stopped at it reopens one now and then, and says it
    again), but once no stream of its location has been open for ``server.idle_timeout_s`` its
    tailer is gone or no longer has the location's files: it is dropped, and the alert stops."""
    from support import running_dis

    with running_dis(tmp_path / "db", idle_timeout_s=1.5) as dis:
        s = IngestStream(dis.port)
        s.open(fingerprint=TRADE.fingerprint, tailer_id="host1:42")
        _report(s, PROBLEM)
        wait_for(lambda: _status(dis).tailer_problem == PROBLEM)
        # a stream that stays open keeps it (it says something within the idle timeout)
        for _ in range(3):
            time.sleep(0.6)
            _report(s, PROBLEM)
        assert _status(dis).tailer_problem == PROBLEM and _problem_gauge(dis) == 1.0
        s.close()
        wait_for(lambda: not _status(dis).tailer)
        ended = time.monotonic()
        assert _status(dis).tailer_problem == PROBLEM  # not at once: its tailer may come back
        with structlog.testing.capture_logs() as logs:
            wait_for(lambda: not _status(dis).tailer_problem, 10, 0.1, "the problem dropped")
        assert time.monotonic() - ended >= 1.0
        assert _problem_gauge(dis) == 0.0
        assert [(x["log_level"], x["location"], x["problem"]) for x in logs if x["event"].startswith(
            "tailer problem dropped")] == [("info", str(KEY), PROBLEM)]
        # a stream of the location that comes back in time keeps it
        s = IngestStream(dis.port)
        s.open(fingerprint=TRADE.fingerprint, tailer_id="host1:42")
        _report(s, PROBLEM)
        wait_for(lambda: _status(dis).tailer_problem == PROBLEM)
        s.close()
        wait_for(lambda: not _status(dis).tailer)
        s = IngestStream(dis.port)
        s.open(fingerprint=TRADE.fingerprint, tailer_id="host1:43")
        time.sleep(1.0)
        assert _status(dis).tailer_problem == PROBLEM
        s.close()
