"""The storage engine's two clocks: which location to flush or checkpoint, and when.

Why two shapes.  A DIS may hold thousands of locations of which few get rows in any one
``flush_interval_ms``; a clock that visits every location every interval spends its thread (and
the interpreter's lock, shared with ingestion) on locations with nothing to do: at 500
locations one visiting thread no longer kept up with ten visits a second each.

- ``FlushClock`` visits only locations with something to flush.  A location marks itself when
  it takes rows or cuts them back (``Location._mark_dirty``); the mark puts it in the set of its
  flush interval, and at that interval's next tick the set is taken and each location in it is
  flushed.  Ticks lie on a grid of the interval (multiples of it on the monotonic clock), so
  rows wait for a flush at most one interval, as with a clock that visits every location, and
  the locations of one interval are flushed together.
- ``CheckpointClock`` visits every location once per ``checkpoint_interval_ms`` (a checkpoint of
  a location with nothing new only notes the time: ``dis_checkpoint_age_seconds`` stays a
  liveness signal for every location), from a heap of due times, so a wake-up costs the
  locations due, not all of them.

Both run ``routine(location)`` on their own thread; a routine's failure is logged and the clock
goes on with the other locations.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
import zlib
from typing import TYPE_CHECKING, Callable

import structlog

if TYPE_CHECKING:
    from disd.storage.location import Location

log = structlog.get_logger(__name__)

#: the longest a clock sleeps when nothing is due: it notes that it is alive (``last_cycle``)
IDLE_WAKE_S = 0.5


def first_turn_fraction(loc: "Location") -> float:
    """Where in ``[0.5, 1)`` of its interval a location's first checkpoint falls, fixed by its key.

    Thousands of locations opened at once (a DIS's start, a burst of new ones) would otherwise
    all be due at the same instant, every interval: thousands of locations' fsyncs (five column
    files, the record, its directory each) in one run of the checkpointer, and the disk's journal
    busy with them while every flush of the moment waits on it.  Never later than one interval:
    the checkpoint interval still bounds the rows a crash can take back to the logs."""
    digest = zlib.crc32(str(getattr(loc, "key", id(loc))).encode())
    return 0.5 + 0.5 * (digest / 2**32)


def _run(routine: Callable[["Location"], object], loc: "Location") -> object:
    try:
        return routine(loc)
    except Exception as e:  # noqa: BLE001 - one location must not stop the others
        log.error("location routine failed", location=str(loc.key), error=repr(e))
        return None


class FlushClock:
    """Flushes the locations marked since their interval's last tick, at its next tick: all of a
    tick's together with ``batch`` (the engine's: their writes in one call for each group of at
    most ``writeout.FLUSH_GROUP``), else one at a time."""

    def __init__(self, routine: Callable[["Location"], object], stop: threading.Event,
                 batch: Callable[[list["Location"]], int] | None = None) -> None:
        self.routine = routine
        self.batch = batch
        self.stop = stop
        self._cond = threading.Condition()
        self._marked: dict[float, set["Location"]] = {}  # interval (s) -> locations to flush at its tick
        self._tick: dict[float, float] = {}  # interval (s) -> its next tick, while it has marked locations
        #: time.time() of the clock's last cycle: a location with nothing to flush is as fresh as this
        self.last_cycle = time.time()
        self.visits = 0  # locations flushed by this clock so far (not those already flushed)

    def mark(self, loc: "Location", interval_s: float) -> None:
        """Have ``loc`` flushed at the next tick of ``interval_s``; cheap when it already is."""
        with self._cond:
            locs = self._marked.get(interval_s)
            if locs is None:
                locs = self._marked[interval_s] = set()
            if not locs:
                tick = (math.floor(time.monotonic() / interval_s) + 1) * interval_s
                self._tick[interval_s] = tick
                if tick <= min(self._tick.values()):
                    self._cond.notify()
            locs.add(loc)

    def pending(self) -> int:
        """Locations waiting for their tick."""
        with self._cond:
            return sum(len(s) for s in self._marked.values())

    def _due(self) -> list["Location"]:
        """Wait for the next tick (or ``IDLE_WAKE_S``); the locations due then."""
        with self._cond:
            now = time.monotonic()
            if self._tick:
                wait = min(self._tick.values()) - now
            else:
                wait = IDLE_WAKE_S
            if wait > 0:
                self._cond.wait(min(wait, IDLE_WAKE_S))
                now = time.monotonic()
            due: list["Location"] = []
            for ivl, tick in list(self._tick.items()):
                if tick <= now:
                    due.extend(self._marked[ivl])
                    self._marked[ivl] = set()
                    del self._tick[ivl]
            return due

    def run(self) -> None:
        while not self.stop.is_set():
            due = self._due()
            if due and self.batch is not None:
                try:
                    self.visits += self.batch(due)
                except Exception as e:  # noqa: BLE001 - the next tick goes on
                    log.error("flushing a tick's locations failed", locations=len(due), error=repr(e))
            else:
                for loc in due:
                    if _run(self.routine, loc) is not False:
                        self.visits += 1
            self.last_cycle = time.time()


class CheckpointClock:
    """Runs ``routine`` on every location once per its interval, from a heap of due times."""

    def __init__(self, routine: Callable[["Location"], object], interval_s: Callable[["Location"], float],
                 stop: threading.Event) -> None:
        self.routine = routine
        self.interval_s = interval_s
        self.stop = stop
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, "Location"]] = []
        self._seq = itertools.count()  # ties never compare locations

    def add(self, loc: "Location") -> None:
        """A location opened: its first turn is between half an interval and one interval from
        now (``first_turn_fraction``), so locations opened together are checkpointed spread over
        half an interval, then each one interval after its last turn."""
        due = time.monotonic() + self.interval_s(loc) * first_turn_fraction(loc)
        with self._cond:
            heapq.heappush(self._heap, (due, next(self._seq), loc))
            if self._heap[0][2] is loc:
                self._cond.notify()

    def _due(self) -> list[tuple[float, "Location"]]:
        with self._cond:
            now = time.monotonic()
            wait = self._heap[0][0] - now if self._heap else IDLE_WAKE_S
            if wait > 0:
                self._cond.wait(min(wait, IDLE_WAKE_S))
                now = time.monotonic()
            due = []
            while self._heap and self._heap[0][0] <= now:
                t, _, loc = heapq.heappop(self._heap)
                due.append((t, loc))
            return due

    def run(self) -> None:
        while not self.stop.is_set():
            for t, loc in self._due():
                if loc.closed:
                    continue
                _run(self.routine, loc)
                nxt = max(t + self.interval_s(loc), time.monotonic())
                with self._cond:
                    heapq.heappush(self._heap, (nxt, next(self._seq), loc))
