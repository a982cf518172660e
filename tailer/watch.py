"""Finding log files: directory scans, file-name parsing, and change notification.

``scan_dirs`` lists the log directories and groups the files whose names parse as binary logs
(``LogFileName``) by location, each location's files ordered by time stamp; CSV files of the
tables configured as CSV-fed are listed apart.  Anything else is skipped: logged once, at warning
level, with the exact reason (which part of the name is wrong), and listed in ``Scan.skipped``.

``DirectoryWatcher`` tells the tailer when something changed: inotify (through ctypes, no extra
dependency) when the kernel offers it, its descriptor read on the tailer's event loop
(``read_events``); without it the scanner thread rescans every poll interval.  Events name the
file, so an append to a log wakes only its location's streams.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os
import struct
import threading
from dataclasses import dataclass, field
from typing import Iterable

import structlog

from disd.binlog import InvalidLogFileName, LogFileName
from disd.names import InvalidNameError, LocationKey

log = structlog.get_logger(__name__)

CSV_MARK = ".csv."
BIN_MARK = ".bin."


@dataclass(slots=True)
class LogFile:
    sort_key: int
    name: str
    path: str
    #: bytes when listed (-1: not known); not part of equality.  A rescan that finds a
    #: location's sizes changed wakes its workers: appends whose events were lost still show
    size: int = field(default=-1, compare=False)

    @property
    def order(self) -> tuple[int, str]:
        return (self.sort_key, self.name)


@dataclass
class LocationFiles:
    """One location's log files, oldest first."""

    key: LocationKey
    files: list[LogFile] = field(default_factory=list)

    def find(self, name: str) -> LogFile | None:
        return next((f for f in self.files if f.name == name), None)

    def after(self, name: str | None) -> list[LogFile]:
        """The files newer than ``name`` (all of them when ``name`` is None)."""
        if name is None:
            return list(self.files)
        k = order_of(name)
        return [f for f in self.files if f.order > k]


@functools.lru_cache(maxsize=1 << 17)
def log_name(name: str) -> tuple[LocationKey, int] | None:
    """The location and the sort key (its time stamp) a binary log's file name gives; None for
    a name that is not a binary log's.  Remembered per name: the tailer looks names up at every
    scan and at every inotify event, thousands of times a second at thousands of locations, and
    a ``LocationKey`` checks its four names each time it is made."""
    parsed = LogFileName.try_parse(name)
    return (parsed.location, parsed.sort_key) if parsed is not None else None


def order_of(name: str) -> tuple[int, str]:
    parsed = log_name(name)
    return (parsed[1] if parsed else 0, name)


def csv_to_bin_name(name: str) -> str | None:
    """The binary log name a CSV file's rows are transcoded under (``.csv.`` -> ``.bin.``)."""
    head, mark, tail = name.rpartition(CSV_MARK)
    if not mark:
        return None
    bin_name = head + BIN_MARK + tail
    return bin_name if LogFileName.try_parse(bin_name) else None


#: ``Skipped.reason`` of a CSV file whose table is not in ``csv_tables`` (others: ``InvalidLogFileName.part``)
CSV_NOT_CONFIGURED = "csv_not_configured"


@dataclass(frozen=True)
class Skipped:
    """A file of a log directory that is not streamed, and why."""

    path: str
    reason: str  # a short word for metrics: the wrong part of the name, or CSV_NOT_CONFIGURED
    problem: str  # for people: "month 13 is not 01..12"
    location: LocationKey | None  # the location the name seems meant for, when its fields say

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


@dataclass
class Scan:
    locations: dict[LocationKey, LocationFiles]
    csv_files: dict[str, tuple[LogFileName, str]]  # path -> (name of its binary log, csv name)
    skipped: dict[str, Skipped] = field(default_factory=dict)  # path -> why it is not streamed

    @property
    def file_count(self) -> int:
        return sum(len(lf.files) for lf in self.locations.values())

    @functools.cached_property
    def skipped_by_location(self) -> dict[LocationKey | None, list[Skipped]]:
        """The skipped files grouped by the location their names seem meant for, by path."""
        out: dict[LocationKey | None, list[Skipped]] = {}
        for path in sorted(self.skipped):
            sk = self.skipped[path]
            out.setdefault(sk.location, []).append(sk)
        return out


def meant_location(name: str) -> LocationKey | None:
    """The location a file name that does not parse seems meant for: its namespace, table,
    internal and column partition fields, when those are valid names (a typo in the namespace kind
    or the time stamp leaves them intact)."""
    fields = name.split(".")
    if len(fields) < 5:
        return None
    try:
        return LocationKey(fields[0], fields[1], fields[3], fields[4])
    except InvalidNameError:
        return None


def _skip(path: str, name: str, csv_tables: set[str]) -> Skipped | tuple[LogFileName, str]:
    """Why ``name`` (which is not a binary log name) is skipped; for the CSV file of a CSV-fed
    table, its binary log name and CSV name instead."""
    head, mark, tail = name.rpartition(CSV_MARK)
    if mark:
        try:
            parsed = LogFileName.parse(head + BIN_MARK + tail)
        except InvalidLogFileName as e:
            return Skipped(path, e.part, e.problem, meant_location(name))
        if parsed.location.table_key in csv_tables:
            return parsed, name
        return Skipped(path, CSV_NOT_CONFIGURED, f"table {parsed.location.table_key} is not in csv_tables",
                       parsed.location)
    try:
        LogFileName.parse(name)
    except InvalidLogFileName as e:
        return Skipped(path, e.part, e.problem, meant_location(name))
    raise AssertionError(f"{name} parses")  # pragma: no cover - only called for names that do not


def scan_dirs(dirs: Iterable[str], reported: set[str], csv_tables: Iterable[str] = ()) -> Scan:
    """List ``dirs``: binary logs grouped by location and ordered, plus the CSV files of
    ``csv_tables``.  A file that is skipped is logged once while it stays (``reported``)."""
    csv_tables = set(csv_tables)
    locations: dict[LocationKey, LocationFiles] = {}
    csv_files: dict[str, tuple[LogFileName, str]] = {}
    skipped: dict[str, Skipped] = {}
    for d in dirs:
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            if e.name.startswith("."):  # temporary files of atomic writes, editors' swap files
                continue
            try:
                if not e.is_file():
                    continue
            except OSError:
                continue
            name = log_name(e.name)
            if name is not None:
                try:
                    size = e.stat().st_size
                except OSError:  # gone since the listing
                    continue
                lf = locations.get(name[0])
                if lf is None:
                    lf = locations[name[0]] = LocationFiles(name[0])
                lf.files.append(LogFile(name[1], e.name, e.path, size))
                continue
            why = _skip(e.path, e.name, csv_tables)
            if not isinstance(why, Skipped):
                csv_files[e.path] = why
                continue
            skipped[e.path] = why
            if e.path not in reported:
                reported.add(e.path)
                log.warning("skipping file: not streamed to the DIS", file=e.path, reason=why.reason,
                            problem=why.problem, location=str(why.location) if why.location else None)
    for lf in locations.values():
        lf.files.sort(key=lambda f: f.order)
    reported.intersection_update(skipped)  # a file skipped again after it went is logged again
    return Scan(locations, csv_files, skipped)


# ---------------------------------------------------------------------------------------------
# inotify


@dataclass
class Events:
    names: set[str] = field(default_factory=set)  # files appended to
    rescan: bool = False  # files created, moved, deleted, or events lost


class DirectoryWatcher:
    """inotify on the log directories when available; ``wait`` returns what changed."""

    IN_MODIFY = 0x002
    IN_CLOSE_WRITE = 0x008
    IN_MOVED_FROM = 0x040
    IN_MOVED_TO = 0x080
    IN_CREATE = 0x100
    IN_DELETE = 0x200
    IN_DELETE_SELF = 0x400
    IN_MOVE_SELF = 0x800
    IN_Q_OVERFLOW = 0x4000
    IN_IGNORED = 0x8000
    _EVENT = struct.Struct("iIII")
    _STRUCTURAL = IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF | IN_Q_OVERFLOW | IN_IGNORED

    def __init__(self, use_inotify: bool = True) -> None:
        self.fd = -1
        self._libc: ctypes.CDLL | None = None
        self._watched: dict[str, int] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._poked = threading.Event()
        if not use_inotify:
            return
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        except (OSError, AttributeError):
            return
        if fd >= 0:
            self.fd, self._libc = fd, libc
        else:
            log.info("inotify unavailable, polling", errno=errno.errorcode.get(ctypes.get_errno(), "?"))

    @property
    def inotify(self) -> bool:
        return self.fd >= 0

    def watch(self, dirs: Iterable[str]) -> None:
        """Watch the directories that exist and are not watched yet (call again after a rescan:
        a directory created later gets its watch then)."""
        libc = self._libc
        if self.fd < 0 or libc is None:  # no inotify (the two are set together)
            return
        mask = self.IN_MODIFY | self.IN_CLOSE_WRITE | self._STRUCTURAL
        with self._lock:
            for d in dirs:
                if d in self._watched or not os.path.isdir(d):
                    continue
                wd = libc.inotify_add_watch(self.fd, os.fsencode(d), mask)
                if wd >= 0:
                    self._watched[d] = wd
                else:
                    log.warning("cannot watch directory; it is polled", dir=d,
                                errno=errno.errorcode.get(ctypes.get_errno(), "?"))

    def watches_all(self, dirs: Iterable[str]) -> bool:
        with self._lock:
            return self.fd >= 0 and all(d in self._watched for d in dirs)

    def wait_poke(self, timeout: float) -> bool:
        """Block until ``poke`` (True: a rescan is asked for) or ``timeout`` passes (False)."""
        poked = self._poked.wait(timeout)
        self._poked.clear()
        return poked

    def read_events(self) -> Events:
        """The events queued on the inotify descriptor (non-blocking; the tailer's event loop
        calls this when the descriptor is readable).  A structural change (a file created, moved
        or deleted) or lost events (a queue overflow) ask for a rescan."""
        ev = Events()
        if self.fd < 0:
            return ev
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            except OSError:
                ev.rescan = True
                break
            if not buf:
                break
            pos = 0
            size = self._EVENT.size
            unpack = self._EVENT.unpack_from
            names = ev.names
            while pos + size <= len(buf):
                wd, mask, _cookie, length = unpack(buf, pos)
                raw = buf[pos + size : pos + size + length]
                pos += size + length
                if mask & self._STRUCTURAL:
                    ev.rescan = True
                    if mask & (self.IN_DELETE_SELF | self.IN_MOVE_SELF | self.IN_IGNORED):
                        with self._lock:
                            for d, w in list(self._watched.items()):
                                if w == wd:
                                    del self._watched[d]
                if raw:
                    names.add(raw.split(b"\0", 1)[0].decode(errors="replace"))
            if len(buf) < 65536 - 4096:
                break  # drained (a full buffer may have more behind it)
        return ev

    def poke(self) -> None:
        """Ask for a rescan now: a blocked ``wait_poke`` returns True."""
        self._poked.set()

    def close(self) -> None:
        """Wake a blocked ``wait_poke``; release the descriptor once nothing reads it (``release``)."""
        self._closed.set()
        self.poke()

    def release(self) -> None:
        with self._lock:
            if self.fd >= 0:
                try:
                    os.close(self.fd)
                except OSError:
                    pass
            self.fd = -1
