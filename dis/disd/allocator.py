"""glibc malloc's settings, made once by each long-running process: which blocks go back to the
system when freed, how much freed memory a heap keeps for the next buffer, and how many heaps.

Every byte a tailer sends passes through several buffers on each side (the log read, the
request, gRPC's message, the decoded columns), most of them between 64 KiB and a few MiB.

**The trim threshold** (``M_TRIM_THRESHOLD``): glibc hands the top of a heap back to the system
whenever more than this is free there, and a page handed back is a page fault and a page of
zeros the next time it is used.  Its default (128 KiB, kept fixed once the mmap threshold is
set) hands back nearly every such buffer, so the DIS and the tailer fault in fresh pages for
most of the bytes they move, several times the faults of the settings below and a slower ingest
(docs/benchmarks-history.md, note "page faults").  The memory kept is bounded by the threshold
per heap times the heaps:

**The arenas** (``M_ARENA_MAX``): glibc gives threads that allocate at once heaps of their own,
up to eight per core.  With 16 MiB kept at each heap's top, waves of concurrent streams served
by different threads leave more resident wave after wave.  Both processes allow two heaps:
their Python threads allocate under one interpreter lock anyway, so more heaps buy little.

**The mmap threshold** (``M_MMAP_THRESHOLD``): blocks of at least this size are mapped on their
own and unmapped when freed.  glibc raises it on its own (up to 32 MiB) after the first such
block is freed, so later large blocks come from the heaps, which keep freed memory for reuse.
The DIS pins it at 4 MiB: ingest messages are up to 48 MiB and decoded on many threads at once,
and a burst of large chunks would otherwise leave hundreds of MiB resident for good
(tests/hostile/test_ingest_fuzz.py).  A tailer's largest blocks are its own requests (up to
8 MiB): it pins the threshold at 32 MiB so they are reused, not mapped afresh each time.

**Free memory inside the heaps** (``HeapTrimmer``): the trim threshold only hands back free memory
at a heap's *top*.  A burst of large messages is received as many gRPC slices below 4 MiB, and
once it is over their free pages sit between blocks still in use, resident until the heap happens
to reuse them (after a burst, often more than the process held before it). ``malloc_trim(0)``,
which returns every free page of every heap, brings it back to about where it started
(docs/benchmarks-history.md, note "free heap pages handed back").  The DIS calls it once a second
while its resident size is ``growth`` above the lowest of the last ``window_s``: after such a
burst the memory goes back within a second, and a process whose memory is steady (however busy) is
not trimmed, so its buffers are not faulted in afresh.  A trim costs a walk of the heaps (0.3 ms
with a million small blocks live) plus 20 ms per 300 MiB it returns.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import functools
import os
import time
from dataclasses import dataclass, field
from typing import Callable

M_TRIM_THRESHOLD = -1  # glibc <malloc.h>
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MiB = 1 << 20


@dataclass(frozen=True)
class MallocTuning:
    mmap_threshold: int  # bytes: blocks this large and larger are mapped on their own
    trim_threshold: int  # bytes: free memory a heap keeps at its top
    arena_max: int  # heaps (arenas) threads allocate from


#: ``dis serve``: large ingest messages leave the process, the buffers under them are reused.
DIS = MallocTuning(mmap_threshold=4 * MiB, trim_threshold=16 * MiB, arena_max=2)
#: ``dis-tailer``: its requests (up to 8 MiB) and the buffers under them are reused.
TAILER = MallocTuning(mmap_threshold=32 * MiB, trim_threshold=16 * MiB, arena_max=2)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        return ctypes.CDLL(name)  # a CDLL call gives up the interpreter's lock
    except OSError:
        return None


def _glibc(function: str):  # noqa: ANN202 - a ctypes function, or None
    libc = _libc()
    return getattr(libc, function, None) if libc is not None else None


def tune_malloc(tuning: MallocTuning) -> bool:
    """Set glibc's mmap threshold (which also stops its dynamic raising), trim threshold and
    number of arenas; call it before the process starts threads (arenas made before stay).
    Returns False where there is no glibc ``mallopt`` (musl, macOS): nothing to tune there."""
    mallopt = _glibc("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return (mallopt(M_MMAP_THRESHOLD, tuning.mmap_threshold) == 1
            and mallopt(M_TRIM_THRESHOLD, tuning.trim_threshold) == 1
            and mallopt(M_ARENA_MAX, tuning.arena_max) == 1)


def resident_bytes() -> int:
    """This process's resident size (``/proc/self/statm``), 0 where there is no procfs."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def release_free_memory() -> bool:
    """Hand every free page of every malloc heap back to the system (glibc ``malloc_trim(0)``).
    Returns whether anything was released; False where there is no glibc."""
    trim = _glibc("malloc_trim")
    if trim is None:
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim(0) == 1


@dataclass
class HeapTrimmer:
    """Calls ``release_free_memory`` from a periodic ``tick`` (once a second) while the resident
    size is at least ``growth`` bytes above the lowest it was over the last ``window_s`` seconds.

    Measured against the recent low, not against the size after the last trim: a trim in the
    middle of a burst returns little and would otherwise set the bar too high for the one after
    it.  A lasting rise (the block cache filling, more locations) stops being growth once the
    window has passed over it."""

    growth: int = 64 * MiB
    window_s: float = 60.0
    read_resident: Callable[[], int] = resident_bytes
    release: Callable[[], bool] = release_free_memory
    _readings: collections.deque = field(default_factory=collections.deque, repr=False)

    def tick(self, now: float | None = None) -> bool:
        """One reading; trims when it is ``growth`` above the window's low.  Returns whether it
        trimmed."""
        now = time.monotonic() if now is None else now
        rss = self.read_resident()
        readings = self._readings
        while readings and readings[0][0] < now - self.window_s:
            readings.popleft()
        low = min((r for _, r in readings), default=rss)
        trimmed = rss - low >= self.growth and self.release()
        if trimmed:
            rss = self.read_resident()
        readings.append((now, rss))
        return trimmed
