"""The garbage collector's settings for the long-running processes (``dis serve``, ``dis-tailer``),
made once their start is done (``settle_after_start``).

**The freeze** (``gc.freeze``): a full pass walks every object the collector tracks, and after a
start those are mostly what lives as long as the process (modules, schemas, gRPC's, numpy's and
structlog's objects: 55,000-90,000).  Frozen, a full pass walks only what was made since.  Without
it a burst of new locations set off full passes that walked them all to free nothing
(docs/benchmarks-history.md, "The DIS's CPU per new location" and "Where the 200-location
burst's CPU goes").

**The thresholds** (``THRESHOLDS``): locations opened after the start live as long as their day
(10,000 of them are about 420,000 tracked objects in the DIS).  At Python's defaults (700, 10, 10)
the small objects of each write that wait a moment for their flush, ack or send outlive two young
collections, so enough of them reach the old generation to start a full pass every few seconds,
each walking every location's objects to free nothing while it holds the interpreter's lock, and
so every ingest, flush and gRPC thread (docs/benchmarks-history.md, "The collector's full passes
at 10,000 live locations").  A young generation of 50,000 lets those objects die of their
reference counts before a collection sees them; cyclic garbage still goes at the next young or
full pass.
"""

from __future__ import annotations

import gc

#: The collector's (young, middle, old) thresholds once a process has started.
THRESHOLDS = (50_000, 20, 20)


def settle_after_start() -> None:
    """Every object made so far out of the collector's passes, and the thresholds raised."""
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
