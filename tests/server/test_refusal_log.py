"""A refusal the DIS gives again and again (a tailer retrying a location in error, or a refused
one) is logged at warning once; its repeats are counted and said at info now and then with the
count, and ``dis_ingest_rejections_total`` still counts every one.  Through a real DIS on
loopback: a location whose checkpoint record is garbage, opened again and again."""

from __future__ import annotations

import time

import grpc
import pytest
import structlog

from support import TRADE, sample, scrape

from .conftest import KEY, IngestStream


def _refused_open(port: int) -> grpc.StatusCode:
    s = IngestStream(port)
    try:
        with pytest.raises(grpc.RpcError) as ei:
            s.open(fingerprint=TRADE.fingerprint, tailer_id="host1:42")
    finally:
        s.close()
    return ei.value.code()


def test_the_same_refusal_is_said_once_then_counted(tmp_path):
    from support import running_dis

    bad = tmp_path / "db/Intraday/Market/Trade/feed1/2026-11-22/Trade"
    bad.mkdir(parents=True)
    (bad / "table.size").write_bytes(b"not a checkpoint")
    with running_dis(tmp_path / "db") as dis:
        before = sample(scrape(dis.metrics_port), "dis_ingest_rejections_total", code="UNAVAILABLE")
        with structlog.testing.capture_logs() as logs:
            for _ in range(5):
                assert _refused_open(dis.port) == grpc.StatusCode.UNAVAILABLE
        said = [x for x in logs if x["event"].startswith("ingest refused")]
        assert [(x["log_level"], x["location"], x["code"]) for x in said] == [("warning", str(KEY), "UNAVAILABLE")]
        assert " is in error: " in said[0]["details"]
        assert sample(scrape(dis.metrics_port), "dis_ingest_rejections_total", code="UNAVAILABLE") == before + 5


def test_repeats_are_said_at_info_with_their_count_and_other_refusals_at_warning():
    from disd.server.refusallog import RefusalLog

    refusals = RefusalLog(repeats_every_s=0.2)
    with structlog.testing.capture_logs() as logs:
        for _ in range(4):
            refusals.refused("UNAVAILABLE", "location a is in error: x", "peer1", "a", "t1")
        refusals.refused("UNAVAILABLE", "location b is in error: x", "peer1", "b", "t1")  # another location
        refusals.refused("NOT_FOUND", "location a: unknown table", "peer1", "a", "t1")  # another status
        time.sleep(0.25)
        refusals.refused("UNAVAILABLE", "location a is in error: x", "peer2", "a", "t2")
        refusals.refused("UNAVAILABLE", "location a is in error: x", "peer2", "a", "t2")
    said = [(x["log_level"], x["location"], x["code"], x.get("repeats")) for x in logs]
    assert said == [("warning", "a", "UNAVAILABLE", None), ("warning", "b", "UNAVAILABLE", None),
                    ("warning", "a", "NOT_FOUND", None), ("info", "a", "UNAVAILABLE", 4)], said


def test_what_is_remembered_is_bounded():
    from disd.server.refusallog import RefusalLog

    refusals = RefusalLog(max_remembered=3)
    with structlog.testing.capture_logs() as logs:
        for loc in "abcda":
            refusals.refused("UNAVAILABLE", "in error", "p", loc, None)
    # "a" was forgotten to remember "d": said at warning again
    assert [x["location"] for x in logs if x["log_level"] == "warning"] == ["a", "b", "c", "d", "a"]
