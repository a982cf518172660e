"""What is wrong on the tailer's side of one location's stream, as the DIS is told it
(``TailerReport``, docs/tailer.md "Problems reported to the DIS").

A location stream (``disd.tailer.location``) keeps one ``Problems``: the corrupt frame it stopped
at, a schema change between two of its files that the rules refuse, the DIS's FAILED_PRECONDITION
refusal of a file's stream, a followed file truncated below what was sent, bytes stranded in
files its stream passed (``disd.tailer.passed``), an address that is no DIS;
with the misnamed files the last scan found for the location, their text is the location's
problem.  Each is resolved when its cause goes: the stream gets past the corrupt offset (or the
file reads fine there), the refused file is replaced, taken or removed, a corrupt or truncated
file leaves the log directories, the stranded bytes' file leaves them, the address answers as a
DIS.

Fields are written on the tailer's event loop and read by other threads (``status``, the
metrics) under the location's lock.
"""

from __future__ import annotations

import os
import threading

import structlog

from disd.binlog import CorruptLogError
from disd.tailer.passed import PassedFiles, Stranded
from disd.tailer.watch import LocationFiles, Skipped, order_of

#: at most this many files of one kind are named in a problem; the rest are counted
NAMED = 3


class Problems:
    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        # the corrupt frame the location stopped at (file name, offset), and what the DIS is told
        # about it, until the stream gets past it
        self.corrupt_at: tuple[str, int] | None = None
        self.corrupt_problem: str | None = None
        self.corrupt_seen: set[tuple[str, int]] = set()  # (path, offset) of each corrupt frame found
        # a refused schema change: (the file the location stopped before, the problem)
        self.schema_stop: tuple[str, str] | None = None
        # the DIS refused a stream with FAILED_PRECONDITION: (the file, the problem, refused at
        # ``open``); and the file whose refusal at open the next stream, opened with the schema of
        # the file before it, is to report
        self.refused: tuple[str, str, bool] | None = None
        self.report_refusal_of: str | None = None
        # a file found shorter than the offset already sent of it: (name, size, offset, problem);
        # nothing more of it is read, until it leaves the log directories
        self.truncated: tuple[str, int, int, str] | None = None
        self.not_a_dis: str | None = None  # the replica's address serves no Ingest: why
        self.stranded: list[Stranded] = []
        self._stranded_seen: tuple[LocationFiles, str] | None = None  # (scan, file) last checked
        self._stranded_logged: set[tuple[str, int]] = set()

    # -- corrupt frames ----------------------------------------------------------------------

    def note_corrupt(self, e: CorruptLogError) -> bool:
        """The location stops at a corrupt frame; True when this frame was not seen before."""
        name = os.path.basename(e.path or "")
        with self._lock:
            new = (e.path or "", e.offset) not in self.corrupt_seen
            self.corrupt_seen.add((e.path or "", e.offset))
            self.corrupt_at = (name, e.offset)
            self.corrupt_problem = (f"corrupt binary log {name} at byte {e.offset}: {e.problem}; "
                                    "the location stops there until the file is repaired")
        return new

    def past_corruption(self, name: str, offset: int, read_there: bool = False) -> None:
        """The stream is at ``offset`` of ``name``: past the corrupt frame it stopped at (or there,
        and the file now reads fine: ``read_there``), that problem is resolved."""
        at = self.corrupt_at
        if at is None:
            return
        here, there = (order_of(name), offset), (order_of(at[0]), at[1])
        if here > there or (read_there and here == there):
            with self._lock:
                self.corrupt_at = self.corrupt_problem = None

    # -- refused files -----------------------------------------------------------------------

    def refused_taken(self, ack_file: str) -> None:
        """The DIS acknowledged rows of ``ack_file``: a chunk refusal of that file (or an older
        one) is over."""
        r = self.refused
        if r is not None and not r[2] and ack_file and order_of(ack_file) >= order_of(r[0]):
            self.refused = None  # (under the lock: called from the ack callback)

    def forget_missing_files(self, lf: LocationFiles) -> bool:
        """A problem about a file that is gone from the log directories is over: True if one was
        (a refused schema change, the DIS's refusal of a file, a corrupt frame, a truncation)."""
        if self.schema_stop is None and self.refused is None and self.corrupt_at is None and self.truncated is None:
            return False
        gone = False
        with self._lock:
            if self.schema_stop is not None and lf.find(self.schema_stop[0]) is None:
                self.schema_stop, gone = None, True
            if self.refused is not None and lf.find(self.refused[0]) is None:
                self.refused, gone = None, True
                self.report_refusal_of = None
            if self.corrupt_at is not None and lf.find(self.corrupt_at[0]) is None:
                self.corrupt_at = self.corrupt_problem = None
                gone = True
            if self.truncated is not None and lf.find(self.truncated[0]) is None:
                self.truncated, gone = None, True
        return gone

    # -- truncated files ---------------------------------------------------------------------

    def note_truncated(self, name: str, size: int, offset: int) -> bool:
        """The file being sent is shorter than what was sent of it: a log is only ever appended
        to, so its bytes from ``size`` on changed under the DIS.  Nothing more of it is sent (not
        again from the start, and not bytes at the old offset, which now belong to other rows);
        the location's problem until the file leaves the log directories.  True when new (the
        caller warns once)."""
        problem = (f"log {name} was truncated to {size} bytes, below the {offset} bytes of it already sent to "
                   "the DIS: nothing more of it is sent (a log must only be appended to); move it out of the log "
                   "directory once its rows are dealt with")
        with self._lock:
            if self.truncated is not None and self.truncated[0] == name:
                return False
            self.truncated = (name, size, offset, problem)
        return True

    def is_truncated(self, name: str) -> bool:
        t = self.truncated
        return t is not None and t[0] == name

    # -- stranded bytes ----------------------------------------------------------------------

    def check_stranded(self, passed: PassedFiles, lf: LocationFiles, current: str, log: structlog.BoundLogger) -> None:
        """Look for bytes in the files before ``current`` that the stream passed without them
        (``disd.tailer.passed``), once per directory scan and file: each new one is logged at
        warning and becomes part of the location's problem."""
        seen = self._stranded_seen
        if seen is not None and seen[0] is lf and seen[1] == current:
            return
        self._stranded_seen = (lf, current)
        found = passed.stranded(lf, current)
        for x in found:
            if (x.name, x.size) not in self._stranded_logged:
                self._stranded_logged.add((x.name, x.size))
                log.warning("bytes in a log file the stream has passed: they cannot be ingested",
                            file=x.name, passed_at=x.passed_at, size=x.size, stranded_bytes=x.nbytes,
                            problem=x.describe())
        if found or self.stranded:
            with self._lock:
                self.stranded = found

    def resumed(self) -> None:
        """A new stream: stranded bytes are looked for again at its first scan."""
        self._stranded_seen = None

    # -- the text ----------------------------------------------------------------------------

    def text(self, skipped: list[Skipped]) -> str:
        """What is wrong on this side of the location, for the DIS ("" when nothing)."""
        if (self.corrupt_problem is None and self.schema_stop is None and self.refused is None
                and self.truncated is None and not self.stranded and self.not_a_dis is None and not skipped):
            return ""
        with self._lock:
            parts = [self.corrupt_problem] if self.corrupt_problem else []
            parts += [x[1] for x in (self.schema_stop, self.refused) if x is not None]
            if self.truncated is not None:
                parts.append(self.truncated[3])
            parts += [x.describe() for x in self.stranded[:NAMED]]
            if len(self.stranded) > NAMED:
                parts.append(f"and {len(self.stranded) - NAMED} more files with bytes the stream passed")
            if self.not_a_dis is not None:
                parts.append(self.not_a_dis)
        parts += [f"file {sk.name} is not streamed: {sk.problem}" for sk in skipped[:NAMED]]
        if len(skipped) > NAMED:
            parts.append(f"and {len(skipped) - NAMED} more files whose names do not parse")
        return "; ".join(parts)

    def stranded_bytes(self) -> int:
        with self._lock:
            return sum(x.nbytes for x in self.stranded)
