"""The writer thread's files: which file a row goes to (rollover), what it is named, which are open.

Files are named by ``disd.binlog.LogFileName``; a new file's time is its creation time in the
configured zone, made strictly later than any existing file of the same location in the
directory so that files order as they were written.  ``Rollover.HOURLY`` starts a new file at
each hour of the zone, ``DAILY`` only when the column partition changes, ``FIXED`` keeps one file
per column partition for the logger's life, its time stamp fixed.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import os
import pathlib
import threading
from typing import Any, Callable, Iterator

from disd.logger.errors import LoggerTypeError
from disd.binlog import BinlogWriter, LogFileName
from disd.logger.config import LoggerConfig, Rollover


class MonotonicClock:
    """"Now" from a user clock (a datetime; naive means UTC), never allowed to run backwards:
    files and partitions follow in order."""

    def __init__(self, clock: Callable[[], dt.datetime]) -> None:
        self._clock = clock
        self._last: dt.datetime | None = None

    def __call__(self) -> dt.datetime:
        t = self._clock()
        if not isinstance(t, dt.datetime):
            raise LoggerTypeError(f"clock returned {type(t).__name__}, not a datetime")
        if t.tzinfo is None:
            t = t.replace(tzinfo=dt.timezone.utc)
        if self._last is not None and t < self._last:
            t = self._last
        self._last = t
        return t


class LogFiles:
    """The files of one logger, used by its writer thread only (``paths`` by any thread)."""

    def __init__(self, config: LoggerConfig, fixed_stamp: dt.datetime | None) -> None:
        self.config = config
        self.schema = config.schema
        self.log_dir = config.log_dir
        self.rollover = config.rollover
        self._tz = config.tz
        self._fixed_stamp = fixed_stamp
        self._max_open = config.max_open_files
        self._paths_lock = threading.Lock()
        self._all: list[pathlib.Path] = []
        self._open: "collections.OrderedDict[tuple, BinlogWriter]" = collections.OrderedDict()
        self._paths: dict[tuple, pathlib.Path] = {}
        self._last_stamp: dict[str, dt.datetime] = {}
        self._period: Any = None
        self._time_partition: str | None = None

    @property
    def paths(self) -> list[pathlib.Path]:
        """Every file written to, in the order first opened."""
        with self._paths_lock:
            return list(self._all)

    def time_partition(self, now: dt.datetime) -> str:
        """The column partition of rows partitioned by write time: the date in the zone."""
        return now.astimezone(self._tz).date().isoformat()

    def writer_for(self, part: str, now: dt.datetime) -> BinlogWriter:
        """The open file for rows of column partition ``part`` written at ``now``; files that
        rollover ends are fsynced and closed."""
        local = now.astimezone(self._tz)
        if self.rollover is Rollover.HOURLY:
            period = (local.date(), local.hour)
            if period != self._period:
                for key in [k for k in self._open if k[1] != period]:
                    self._close(self._open.pop(key), fsync=True)
                self._paths = {k: v for k, v in self._paths.items() if k[1] == period}
                self._period = period
        else:
            period = None
            if self.config.by_write_time:
                tp = self.time_partition(now)
                if tp != self._time_partition:
                    for key in [k for k in self._open if k[0] != tp]:
                        self._close(self._open.pop(key), fsync=True)
                    self._time_partition = tp
        key = (part, period)
        w = self._open.get(key)
        if w is not None:
            self._open.move_to_end(key)
            return w
        path = self._paths.get(key)
        if path is None:
            path = self._new_path(part, local)
            self._paths[key] = path
        w = BinlogWriter(path, self.schema)
        self._open[key] = w
        with self._paths_lock:
            if path not in self._all:
                self._all.append(path)
        while len(self._open) > self._max_open:
            _, old = self._open.popitem(last=False)
            self._close(old, fsync=True)
        return w

    def fsync(self) -> None:
        for w in self._open.values():
            w.fsync()

    def close_all(self, fsync: bool) -> BaseException | None:
        """Close every open file (fsynced, and the directory too, with ``fsync``); the first
        error met, after trying them all."""
        first: BaseException | None = None
        for w in list(self._open.values()):
            try:
                self._close(w, fsync=fsync)
            except BaseException as e:  # noqa: BLE001
                first = first or e
        self._open.clear()
        if first is None and fsync:
            with contextlib.suppress(OSError):
                fd = os.open(self.log_dir, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        return first

    def _close(self, w: BinlogWriter, fsync: bool) -> None:
        try:
            if fsync:
                w.fsync()
        finally:
            w.close()

    def _file_name(self, part: str, stamp: dt.datetime) -> LogFileName:
        c = self.config
        return LogFileName(self.schema.namespace, self.schema.table, c.namespace_set, c.internal_partition,
                           part, stamp)

    def _new_path(self, part: str, local: dt.datetime) -> pathlib.Path:
        if self.rollover is Rollover.FIXED:
            assert self._fixed_stamp is not None  # given for a fixed rollover (``IntradayLogger``)
            stamp = self._fixed_stamp.astimezone(self._tz)
            stamp = stamp.replace(microsecond=stamp.microsecond // 1000 * 1000)
            return self.log_dir / self._file_name(part, stamp).format()
        stamp = local.replace(microsecond=local.microsecond // 1000 * 1000)
        latest = self._last_stamp.get(part)
        for existing in self._existing_stamps(part):
            if latest is None or existing > latest:
                latest = existing
        if latest is not None and stamp <= latest:
            stamp = (latest + dt.timedelta(milliseconds=1)).astimezone(self._tz)
        while True:
            path = self.log_dir / self._file_name(part, stamp).format()
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            except FileExistsError:
                stamp = stamp + dt.timedelta(milliseconds=1)
                continue
            self._last_stamp[part] = stamp
            return path

    def _existing_stamps(self, part: str) -> Iterator[dt.datetime]:
        """Time stamps of the files of this location already in the directory."""
        prefix = f"{self.schema.namespace}.{self.schema.table}."
        try:
            entries = os.listdir(self.log_dir)
        except OSError:
            return
        for name in entries:
            if not name.startswith(prefix):
                continue
            parsed = LogFileName.try_parse(name)
            if (parsed is not None and parsed.internal_partition == self.config.internal_partition
                    and parsed.column_partition == part):
                yield parsed.timestamp
