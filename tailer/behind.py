"""How far behind a location's stream is, and whether it is idle: computed from its status (a
snapshot taken under its lock) and the log files, in the thread that asks (``Tailer.status``,
``wait_idle``, the metrics endpoint), never on the event loop: these read and stat files.
"""

from __future__ import annotations

import os

from disd.binlog import CorruptLogError
from disd.tailer.frames import FrameReader
from disd.tailer.watch import LocationFiles, order_of

#: states in which the stream knows no position from the DIS
NO_POSITION = ("refused", "corrupt", "reconnecting", "connecting", "starting")


class HeaderSizes:
    """The header size of each log (cached per path and inode): bytes of a file that are never
    sent as frames."""

    def __init__(self) -> None:
        self._sizes: dict[str, tuple[int, int]] = {}  # path -> (inode, header bytes)

    def of(self, path: str) -> int:
        """The size of a log's header; 0 while it is incomplete or unreadable."""
        try:
            ino = os.stat(path).st_ino
        except OSError:
            return 0
        cached = self._sizes.get(path)
        if cached is not None and cached[0] == ino:
            return cached[1]
        try:
            with FrameReader(path) as r:
                header = r.header()
        except (CorruptLogError, OSError):
            return 0
        if header is None:
            return 0
        self._sizes[path] = (ino, header.size)
        return header.size

    def forget_others(self, lf: LocationFiles) -> None:
        if len(self._sizes) > 2 * len(lf.files) + 16:
            paths = {f.path for f in lf.files}
            self._sizes = {p: v for p, v in self._sizes.items() if p in paths}


def bytes_behind(lf: LocationFiles, acked_file: str | None, acked_offset: int, passed: dict[str, int],
                 headers: HeaderSizes) -> int:
    """Bytes of the location's log files the DIS has not acknowledged: from the last ack (or
    the resume point) on, frames only (a file's header, and what follows the last complete
    frame of a file the stream moved past (``passed``: its end of complete frames), are never
    sent)."""
    after = order_of(acked_file) if acked_file else None
    total = 0
    for f in lf.files:
        if after is not None and f.order < after:
            continue
        base = acked_offset if f.name == acked_file else 0
        end = passed.get(f.name)
        if end is None:
            try:
                end = os.stat(f.path).st_size
            except OSError:
                continue
        if base == 0:
            base = headers.of(f.path)
        total += max(0, end - base)
    headers.forget_others(lf)
    return total


def is_idle(lf: LocationFiles, st: dict) -> bool:
    """Every complete frame of the location's files is sent and acknowledged, by the status
    ``st`` of its stream."""
    if not lf.files:
        return True
    if st["file"] is None or st["state"] in NO_POSITION:
        # no position known from the DIS: idle only if there is nothing to send at all
        return all(not has_frames(f.path, 0) for f in lf.files)
    if (st["acked_file"], st["acked_offset"]) != (st["file"], st["sent_offset"]):
        return False
    k = order_of(st["file"])
    cur = lf.find(st["file"])
    if cur is not None and has_frames(cur.path, st["sent_offset"]):
        return False
    return all(not has_frames(f.path, 0) for f in lf.files if f.order > k)


def has_frames(path: str, offset: int) -> bool:
    try:
        with FrameReader(path) as r:
            return bool(r.read(offset, 1).data)
    except CorruptLogError:
        return True  # frames the DIS will never have
    except OSError:
        return False


def file_stat(path: str) -> tuple:
    """(inode, size, mtime) of a file; () when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return ()
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def repaired(before: tuple, now: tuple) -> bool:
    """Whether a file (``file_stat`` then and now) changed in a way that can end a problem found in
    its bytes: removed, replaced (another inode), cut shorter, or rewritten in place (same size,
    newer time).  Appending cannot repair a frame already complete, and a logger appending to it
    must not make the location read it again at every row."""
    if not before or not now:
        return before != now
    return now[0] != before[0] or now[1] < before[1] or (now[1] == before[1] and now[2] != before[2])
