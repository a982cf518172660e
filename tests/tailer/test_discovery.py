"""Finding log files: names parsed, grouped by location, ordered by time stamp; others ignored."""

from __future__ import annotations

import pathlib

import structlog

from disd.tailer.watch import DirectoryWatcher, csv_to_bin_name, scan_dirs

from .helpers import name, write


def test_groups_by_location_and_orders_by_timestamp(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    write(a / name(hour=10), 1)
    write(b / name(hour=9), 1)
    # 10:30 at +0200 is 08:30 UTC: the oldest file, though its text sorts last
    write(a / name(hour=10, tz="+0200").replace("100000", "103000"), 1)
    write(a / name(ip="ip2", hour=8), 1)
    write(a / name(cp="2026-11-23", hour=8), 1)
    found = scan_dirs([str(a), str(b)], set()).locations
    assert len(found) == 3
    ip1 = next(v for k, v in found.items() if k.internal_partition == "ip1" and k.column_partition == "2026-11-22")
    assert [f.name for f in ip1.files] == [name(hour=10, tz="+0200").replace("100000", "103000"), name(hour=9),
                                          name(hour=10)]
    assert [f.path for f in ip1.files][1] == str(b / name(hour=9))
    assert [f.name for f in ip1.after(name(hour=9))] == [name(hour=10)]
    assert [f.name for f in ip1.after(None)] == [f.name for f in ip1.files]
    assert ip1.find(name(hour=9)).name == name(hour=9) and ip1.find("nope") is None


def test_non_matching_names_are_logged_once_at_warning_with_the_wrong_part(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / name().replace("System", "Sytem")).write_text("x")
    (tmp_path / name().replace("bin.2026-11", "bin.2026-13")).write_text("x")
    (tmp_path / (name() + ".bak")).write_text("x")
    (tmp_path / name(kind="csv")).write_text("Size\n1\n")  # CSV of a table not configured as CSV-fed
    (tmp_path / ".hidden.tmp").write_text("x")
    (tmp_path / "subdir").mkdir()
    reported: set[str] = set()
    with structlog.testing.capture_logs() as logs:
        s1 = scan_dirs([str(tmp_path), str(tmp_path / "missing")], reported)
        s2 = scan_dirs([str(tmp_path)], reported)
    assert not s1.locations and not s2.locations and not s1.csv_files
    skipped = [e for e in logs if e["event"].startswith("skipping file")]
    assert all(e["log_level"] == "warning" for e in skipped)
    by_file = {pathlib.Path(e["file"]).name: e for e in skipped}
    assert len(skipped) == len(by_file) == 5, skipped  # once each, though scanned twice
    assert by_file[name().replace("System", "Sytem")]["problem"] == "namespace kind 'Sytem' is not 'System' or 'User'"
    assert by_file[name().replace("bin.2026-11", "bin.2026-13")]["problem"] == "month 13 is not 01..12"
    assert by_file[name() + ".bak"]["problem"] == "unexpected suffix '.bak'"
    assert by_file[name(kind="csv")]["problem"] == "table Market.Trade is not in csv_tables"
    assert "where the namespace kind (System or User) should follow" in by_file["notes.txt"]["problem"]
    assert by_file[name() + ".bak"]["location"] == "Market/Trade/ip1/2026-11-22"
    assert {s.reason for s in s2.skipped.values()} == {"fields", "namespace_kind", "month", "suffix",
                                                      "csv_not_configured"}
    assert s2.skipped[str(tmp_path / "notes.txt")].location is None
    # a skipped file that goes and comes back is logged again
    (tmp_path / "notes.txt").unlink()
    scan_dirs([str(tmp_path)], reported)
    (tmp_path / "notes.txt").write_text("x")
    with structlog.testing.capture_logs() as logs:
        scan_dirs([str(tmp_path)], reported)
    assert [pathlib.Path(e["file"]).name for e in logs] == ["notes.txt"]


def test_csv_files_of_csv_tables(tmp_path):
    p = tmp_path / name(kind="csv")
    p.write_text("Size\n")
    assert csv_to_bin_name(p.name) == name()
    assert csv_to_bin_name("x.csv.y") is None
    found = scan_dirs([str(tmp_path)], set(), ["Market.Trade"])
    assert list(found.csv_files) == [str(p)]
    spool, csv_name = found.csv_files[str(p)]
    assert spool.format() == name() and csv_name == p.name


def _events(w: DirectoryWatcher, timeout: float = 2.0):  # Events
    """The events the watcher has within ``timeout`` (as the tailer's loop reads them when the
    descriptor is readable)."""
    import select

    select.select([w.fd], [], [], timeout)
    return w.read_events()


def test_inotify_reports_appends_and_new_files(tmp_path):
    w = DirectoryWatcher()
    if not w.inotify:  # pragma: no cover - kernels without inotify poll
        return
    try:
        w.watch([str(tmp_path), str(tmp_path / "later")])
        write(tmp_path / name(), 1)
        ev = _events(w)
        assert ev.rescan and name() in ev.names
        write(tmp_path / name(), 1)
        ev = _events(w)
        while not ev.names:
            ev = _events(w)
        assert name() in ev.names
        (tmp_path / "later").mkdir()
        assert _events(w).rescan
        w.watch([str(tmp_path / "later")])  # a directory created later is watched once it exists
        write(tmp_path / "later" / name(hour=10), 1)
        ev = _events(w)
        assert name(hour=10) in ev.names
        assert not _events(w, 0.01).names  # nothing more: read without blocking
        w.poke()
        assert w.wait_poke(2)
    finally:
        w.close()
        w.release()


def test_polling_watcher_times_out_or_is_poked():
    w = DirectoryWatcher(use_inotify=False)
    assert not w.inotify
    assert not w.wait_poke(0.01)  # the time out: the scanner rescans all the same
    assert not w.read_events().names and not w.read_events().rescan
    w.poke()
    assert w.wait_poke(0.01)
    w.close()
    w.release()
