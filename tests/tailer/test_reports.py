"""What the tailer tells the DIS about its side of a location (``TailerReport``): the corrupt frame
it stopped at and files meant for the location whose names do not parse, resolved once repaired;
and nothing at all to an older DIS, which would refuse the message."""

from __future__ import annotations

import time

import pytest

from disd.tailer import Tailer
from support import wait_for

from .fakedis import FakeDis
from .helpers import config, name, write

LOC = "Market/Trade/ip1/2026-11-22"
GARBAGE = b"\xde\xad\xbe\xef" * 25


@pytest.fixture
def dis():
    d = FakeDis(accepts_reports=True).start()
    yield d
    d.stop()


def _last_report(dis, ip: str = "ip1"):
    reports = dis.log_of(ip).reports
    return reports[-1] if reports else None


def test_a_corrupt_frame_is_reported_and_resolved_once_repaired(tmp_path, dis):
    p = tmp_path / name()
    end = write(p, 5)
    with open(p, "ab") as f:
        f.write(GARBAGE)
    with Tailer(config(dis.address, tmp_path)) as t:
        report = wait_for(lambda: (lambda r: r if r and "corrupt" in r else None)(_last_report(dis)), 20,
                            what="the corruption reported")
        assert report == (f"corrupt binary log {name()} at byte {end}: frame header checksum mismatch; "
                          "the location stops there until the file is repaired")
        assert t.status()[LOC]["problem"] == report
        assert dis.log_of("ip1").offset == end  # the good frames went first
        # the location is looked at again: the DIS hears of it again (it may have restarted)
        n = len(dis.log_of("ip1").reports)
        wait_for(lambda: len(dis.log_of("ip1").reports) > n, 20, what="reported again")
        with open(p, "r+b") as f:  # the operator cuts the garbage off; the writer goes on
            f.truncate(end)
        write(p, 3, 5)
        assert t.wait_idle(20)
        wait_for(lambda: _last_report(dis) == "", 20, what="the problem resolved")
        assert t.status()[LOC]["problem"] is None
    assert t.status()[LOC]["state"] == "stopped"
    assert not dis.errors


def test_files_meant_for_a_location_whose_names_do_not_parse_are_reported(tmp_path, dis):
    write(tmp_path / name(), 5)
    bad_kind = tmp_path / name(hour=10).replace("System", "Sytem")
    write(bad_kind, 3, 5)
    write(tmp_path / (name(hour=11) + ".bak"), 1)
    with Tailer(config(dis.address, tmp_path)) as t:
        assert t.wait_idle(20)
        report = wait_for(lambda: (lambda r: r if r and "Sytem" in r else None)(_last_report(dis)), 20,
                            what="the skipped files reported")
        assert report == (f"file {name(hour=11)}.bak is not streamed: unexpected suffix '.bak'; "
                          f"file {bad_kind.name} is not streamed: namespace kind 'Sytem' is not 'System' or 'User'")
        bad_kind.rename(tmp_path / name(hour=10))  # the typo fixed: its rows go, one problem left
        wait_for(lambda: _last_report(dis) == f"file {name(hour=11)}.bak is not streamed: unexpected suffix '.bak'",
                   20, what="one skipped file left")
        (tmp_path / (name(hour=11) + ".bak")).unlink()
        wait_for(lambda: _last_report(dis) == "", 20, what="no problem left")
        assert t.wait_idle(20)
    assert dis.log_of("ip1").file_name == name(hour=10) and not dis.errors


def test_an_older_dis_is_sent_no_report(tmp_path):
    old = FakeDis().start()  # its resume points do not say accepts_reports
    try:
        p = tmp_path / name()
        end = write(p, 5)
        with open(p, "ab") as f:
            f.write(GARBAGE)
        write(tmp_path / (name(hour=11) + ".bak"), 1)
        with Tailer(config(old.address, tmp_path)) as t:
            wait_for(lambda: t.status()[LOC]["state"] == "corrupt", 20, what="corruption seen")
            assert "corrupt binary log" in t.status()[LOC]["problem"]
            time.sleep(1)  # looked at again every 0.3 s, on the stream it holds open
            assert t.status()[LOC]["state"] == "corrupt" and len(old.log_of("ip1").opens) == 1
        assert old.log_of("ip1").offset == end
        assert old.log_of("ip1").reports == [] and old.errors == []  # an older DIS would refuse a report
    finally:
        old.stop()
