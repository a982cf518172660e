"""The files a location's stream has moved past, and bytes that appear in them afterwards.

A location's files are streamed in order, and the DIS only ever goes forward in them: once a
stream has moved to a newer file, nothing appended to an older one can be ingested into the
location.  With one writer per location (docs/logger.md, "One writer per location") that never
happens: a logger appends only to its newest file of a location.  A second writer does it (two
logger processes on one location, in one directory the logger's lock refuses it, in two
directories the tailer watches it cannot), and so does a file of the location copied in late:
its rows would be lost without a word.

So each worker remembers how long every older file was when it moved past it — or, for the files
before its first resume point, when it first learned that point (nothing earlier is known of them:
the tailer keeps no state of its own) — and compares that with the sizes each directory scan
finds.  Bytes beyond are *stranded*: the worker reports them (a warning, the location's problem in
``dis status``, ``dis_tailer_stranded_bytes``), and retention never removes a file whose size is
not exactly what its stream passed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from disd.tailer.watch import LocationFiles, order_of


@dataclass(frozen=True)
class Stranded:
    """A file before the stream's position that holds bytes the stream never sent."""

    name: str
    passed_at: int | None  # its size when the stream moved past it; None: it appeared afterwards
    size: int

    @property
    def nbytes(self) -> int:
        return self.size - (self.passed_at or 0)

    def describe(self) -> str:
        if self.passed_at is None:
            what = (f"file {self.name} ({self.size} bytes) appeared after the stream of its location had moved past "
                    f"its place in the file order")
        else:
            what = (f"{self.nbytes} bytes were appended to {self.name} after the stream of its location moved past "
                    f"it at byte {self.passed_at}")
        return (f"{what}: they can never be ingested into this location (the DIS only goes forward in a location's "
                f"files). Two writers on one location? Give each logger process its own internal partition "
                f"(docs/logger.md); move the file out of the log directories once its rows are saved elsewhere")


class PassedFiles:
    """One location stream's record of the files before its position (``disd.tailer.location``)."""

    def __init__(self) -> None:
        self._ends: dict[str, int] = {}  # file name -> its size when the stream moved past it
        self._baselined = False

    def passed(self, name: str, size: int) -> None:
        """The stream moves past file ``name``, which holds ``size`` bytes as it was last read."""
        self._ends[name] = size

    def resumed(self, lf: LocationFiles, resume_file: str | None) -> None:
        """A stream opened at ``resume_file`` (None: the location's first file).  Files from it on
        are to be sent (again, after a DIS restart); the files before it are taken as complete at
        their sizes now when nothing was known of them yet (the worker's first stream)."""
        if resume_file is None:
            self._ends.clear()
            self._baselined = True
            return
        at = order_of(resume_file)
        self._ends = {n: e for n, e in self._ends.items() if order_of(n) < at}
        if not self._baselined:
            for f in lf.files:
                if f.order < at and f.name not in self._ends:
                    size = f.size if f.size >= 0 else _size(f.path)
                    if size >= 0:
                        self._ends[f.name] = size
            self._baselined = True

    def end_of(self, name: str) -> int | None:
        """The size file ``name`` had when the stream moved past it; None when it has not."""
        return self._ends.get(name)

    def stranded(self, lf: LocationFiles, current: str) -> list[Stranded]:
        """The files before ``current`` (the file the stream is at) that hold bytes the stream
        never sent, by the sizes of the scan ``lf``."""
        if not self._baselined:
            return []
        at = order_of(current)
        out = []
        for f in lf.files:
            if f.order >= at:
                break
            if f.size < 0:
                continue
            end = self._ends.get(f.name)
            if f.size > (end or 0):
                out.append(Stranded(f.name, end, f.size))
        if len(self._ends) > 2 * len(lf.files) + 16:  # forget files that are gone (retention)
            names = {f.name for f in lf.files}
            self._ends = {n: e for n, e in self._ends.items() if n in names}
        return out


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1
