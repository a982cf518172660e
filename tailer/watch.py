"""Finding log files: directory scans, file-name parsing, and change notification.

``scan_dirs`` lists the log directories and groups the files whose names parse as binary logs
(``LogFileName``) by location, each location's files ordered by time stamp; CSV files of the
tables configured as CSV-fed are listed apart.  Anything else is reported once and ignored.

``DirectoryWatcher`` tells the tailer when something changed: inotify (through ctypes, no extra
dependency) when the kernel offers it, else it just times out every poll interval and the tailer
rescans.  Events name the file, so an append to a log wakes only the worker of its location.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import select
import struct
import threading
from dataclasses import dataclass, field
from typing import Iterable

import structlog

from disd.binlog import LocationKey, LogFileName

log = structlog.get_logger(__name__)

CSV_MARK = ".csv."
BIN_MARK = ".bin."


@dataclass(frozen=True)
class LogFile:
    sort_key: int
    name: str
    path: str

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


def order_of(name: str) -> tuple[int, str]:
    parsed = LogFileName.try_parse(name)
    return (parsed.sort_key if parsed else 0, name)


def csv_to_bin_name(name: str) -> str | None:
    """The binary log name a CSV file's rows are transcoded under (``.csv.`` -> ``.bin.``)."""
    head, mark, tail = name.rpartition(CSV_MARK)
    if not mark:
        return None
    bin_name = head + BIN_MARK + tail
    return bin_name if LogFileName.try_parse(bin_name) else None


@dataclass
class Scan:
    locations: dict[LocationKey, LocationFiles]
    csv_files: dict[str, tuple[LogFileName, str]]  # path -> (name of its binary log, csv name)


def scan_dirs(dirs: Iterable[str], reported: set[str], csv_tables: Iterable[str] = ()) -> Scan:
    """List ``dirs``: binary logs grouped by location and ordered, plus the CSV files of
    ``csv_tables``.  A file whose name does not parse is logged once (``reported``)."""
    csv_tables = set(csv_tables)
    locations: dict[LocationKey, LocationFiles] = {}
    csv_files: dict[str, tuple[LogFileName, str]] = {}
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
            name = LogFileName.try_parse(e.name)
            if name is not None:
                lf = locations.setdefault(name.location, LocationFiles(name.location))
                lf.files.append(LogFile(name.sort_key, e.name, e.path))
                continue
            bin_name = csv_to_bin_name(e.name)
            if bin_name is not None:
                parsed = LogFileName.parse(bin_name)
                if parsed.location.table_key in csv_tables:
                    csv_files[e.path] = (parsed, e.name)
                    continue
                why = f"table {parsed.location.table_key} is not in csv_tables"
            else:
                why = "not a binary log file name"
            if e.path not in reported:
                reported.add(e.path)
                log.info("ignoring file", file=e.path, reason=why)
    for lf in locations.values():
        lf.files.sort(key=lambda f: f.order)
    return Scan(locations, csv_files)


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
        self._libc = None
        self._watched: dict[str, int] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._poked = threading.Event()
        self._pipe_r, self._pipe_w = os.pipe()  # wakes a select() blocked in wait() on close()
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
        if self.fd < 0:
            return
        mask = self.IN_MODIFY | self.IN_CLOSE_WRITE | self._STRUCTURAL
        with self._lock:
            for d in dirs:
                if d in self._watched or not os.path.isdir(d):
                    continue
                wd = self._libc.inotify_add_watch(self.fd, os.fsencode(d), mask)
                if wd >= 0:
                    self._watched[d] = wd
                else:
                    log.warning("cannot watch directory; it is polled", dir=d,
                                errno=errno.errorcode.get(ctypes.get_errno(), "?"))

    def watches_all(self, dirs: Iterable[str]) -> bool:
        with self._lock:
            return self.fd >= 0 and all(d in self._watched for d in dirs)

    def wait(self, timeout: float) -> Events:
        """Block until something changes or ``timeout`` passes (then ``rescan`` is True)."""
        if self.fd < 0 or self._closed.is_set():
            self._poked.wait(timeout)
            self._poked.clear()
            return Events(rescan=True)
        try:
            ready, _, _ = select.select([self.fd, self._pipe_r], [], [], timeout)
        except (OSError, ValueError):
            return Events(rescan=True)
        if not ready or self._closed.is_set():
            return Events(rescan=True)
        ev = Events()
        if self._pipe_r in ready:
            try:
                os.read(self._pipe_r, 4096)
            except OSError:
                pass
            ev.rescan = True
            if self.fd not in ready:
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
            while pos + self._EVENT.size <= len(buf):
                wd, mask, _cookie, length = self._EVENT.unpack_from(buf, pos)
                raw = buf[pos + self._EVENT.size : pos + self._EVENT.size + length]
                pos += self._EVENT.size + length
                name = raw.split(b"\0", 1)[0].decode(errors="replace")
                if mask & self._STRUCTURAL:
                    ev.rescan = True
                    if mask & (self.IN_DELETE_SELF | self.IN_MOVE_SELF | self.IN_IGNORED):
                        with self._lock:
                            for d, w in list(self._watched.items()):
                                if w == wd:
                                    del self._watched[d]
                if name:
                    ev.names.add(name)
        return ev

    def poke(self) -> None:
        """Make a blocked ``wait`` return now, asking for a rescan."""
        try:
            os.write(self._pipe_w, b"x")
        except OSError:
            pass
        self._poked.set()

    def close(self) -> None:
        """Wake a blocked ``wait``; release the descriptors once it has returned (``release``)."""
        self._closed.set()
        self.poke()

    def release(self) -> None:
        with self._lock:
            for fd in (self.fd, self._pipe_r, self._pipe_w):
                if fd >= 0:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            self.fd = self._pipe_r = self._pipe_w = -1
