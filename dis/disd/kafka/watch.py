"""Telling a hung fetch process from a quiet one.

A fetch process that dies is seen at once: its socket ends (``FetchProcessGone``).  One that
hangs (stopped, stuck in a library call, deadlocked) keeps its socket open and would hold its
partitions for ever, with nothing in the log.  A working process is never silent for long while
it has partitions: the consumer asks it for their high watermarks every second and it answers,
and while one of them lags behind its high watermark it sends batches.  So a process with
partitions is taken as hung when it has sent nothing for ``stall_timeout_ms``, or no batch for
that long while one of its partitions lags; the consumer then kills it and starts it again, which
re-seeks its partitions from the DIS's own offsets (nothing is lost or read twice).
"""

from __future__ import annotations


class FetchWatch:
    """When each of a source's fetch processes last sent anything, and last sent a batch."""

    def __init__(self, processes: int, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._heard = [0.0] * processes
        self._batch = [0.0] * processes

    def started(self, index: int, now: float) -> None:
        """Process ``index`` was (re)started: its silence counts from now."""
        self._heard[index] = self._batch[index] = now

    def heard(self, index: int, now: float, batch: bool) -> None:
        self._heard[index] = now
        if batch:
            self._batch[index] = now

    def hung(self, index: int, now: float, lagging: bool) -> str | None:
        """Why process ``index`` (which has partitions) is taken as hung, or None.  ``lagging``:
        one of its consuming partitions is behind its known high watermark."""
        silent = now - self._heard[index]
        if silent > self.timeout_s:
            return f"sent nothing for {silent:.1f} s"
        idle = now - self._batch[index]
        if lagging and idle > self.timeout_s:
            return f"sent no batch for {idle:.1f} s while its partitions lag"
        return None
