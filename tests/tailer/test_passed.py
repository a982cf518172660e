"""``disd.tailer.passed``: which bytes of a location's older files its stream never sent."""

from __future__ import annotations

from disd.names import LocationKey
from disd.tailer.passed import PassedFiles
from disd.tailer.watch import LocationFiles, LogFile, order_of
from support import log_name

KEY = LocationKey("Market", "Trade", "ip1", "2026-11-22")
A, B, C, D = (log_name("ip1", hhmmss=t) for t in ("090000", "100000", "110000", "120000"))


def scan(**sizes: int) -> LocationFiles:
    names = {"A": A, "B": B, "C": C, "D": D}
    files = [LogFile(order_of(names[k])[0], names[k], f"/logs/{names[k]}", size) for k, size in sizes.items()]
    return LocationFiles(KEY, sorted(files, key=lambda f: f.order))


def test_files_passed_at_their_size_strand_nothing_and_growth_after_is_stranded():
    p = PassedFiles()
    p.resumed(scan(A=100), None)  # a new location: from the first file
    p.passed(A, 100)
    assert p.stranded(scan(A=100, B=50), B) == []
    found = p.stranded(scan(A=130, B=50), B)
    assert [(x.name, x.passed_at, x.size, x.nbytes) for x in found] == [(A, 100, 130, 30)]
    assert "30 bytes were appended to" in found[0].describe() and "at byte 100" in found[0].describe()
    assert p.stranded(scan(A=130, B=50), A) == []  # only files before the stream's position count


def test_files_before_the_first_resume_point_are_taken_as_they_are_then_and_new_ones_behind_are_stranded():
    p = PassedFiles()
    p.resumed(scan(A=100, B=200, C=10), C)
    assert (p.end_of(A), p.end_of(B), p.end_of(C)) == (100, 200, None)
    assert p.stranded(scan(A=100, B=200, C=10), C) == []
    # a file that appears behind the stream's position: every byte of it is stranded
    found = p.stranded(_with_between(), C)
    assert [(x.name, x.passed_at, x.nbytes) for x in found] == [(BETWEEN, None, 40)]
    assert "appeared after the stream" in found[0].describe()


BETWEEN = log_name("ip1", hhmmss="103000")


def _with_between() -> LocationFiles:
    lf = scan(A=100, B=200, C=10)
    lf.files.insert(2, LogFile(order_of(BETWEEN)[0], BETWEEN, f"/logs/{BETWEEN}", 40))
    return lf


def test_a_stream_resumed_further_back_sends_those_files_again_and_a_later_resume_learns_nothing_new():
    p = PassedFiles()
    p.resumed(scan(A=100), None)
    p.passed(A, 100)
    p.passed(B, 200)
    p.resumed(scan(A=100, B=200, C=5), B)  # the DIS restarted at its checkpoint, in B
    assert (p.end_of(A), p.end_of(B)) == (100, None)
    # a file that turned up behind B while the stream was away is not taken as complete
    lf = scan(A=100, B=200, C=5)
    early = log_name("ip1", hhmmss="080000")
    lf.files.insert(0, LogFile(order_of(early)[0], early, f"/logs/{early}", 60))
    p.resumed(lf, B)
    assert [x.name for x in p.stranded(lf, B)] == [early]
