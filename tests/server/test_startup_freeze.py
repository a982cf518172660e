"""``dis serve`` takes what its start made out of the garbage collector's full passes, and raises its thresholds."""

from __future__ import annotations

import gc

from disd.allocator import HeapTrimmer
from disd.collector import THRESHOLDS as COLLECTOR_THRESHOLDS
from disd.server.daemon import start_serving
from support.dis import dis_config


def test_serving_starts_with_its_startup_objects_frozen_out_of_the_collectors_passes(tmp_path):
    gc.unfreeze()
    thresholds = gc.get_threshold()
    made_before = len(gc.get_objects())
    server, text = start_serving(dis_config(tmp_path / "db", port=0), HeapTrimmer())
    try:
        assert text.startswith("serving on 127.0.0.1:")
        # the modules, schemas, engine and servers made so far: a full pass walks none of them
        assert gc.get_freeze_count() >= made_before
        assert not any(o is server for o in gc.get_objects())  # the permanent generation's are not listed
    finally:
        server.stop(0.5)
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def _full_passes_under(thresholds: tuple[int, int, int]) -> int:
    """Full passes over a churn of a serving DIS's shape: many long-lived tracked objects (the
    locations) and small ones each held for a few thousand allocations (a write's, until its
    flush or ack)."""
    from collections import deque

    passes = []

    def count(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2:
            passes.append(1)

    old = gc.get_threshold()
    gc.collect()
    gc.set_threshold(*thresholds)
    gc.callbacks.append(count)
    try:
        long_lived = [[i] for i in range(400_000)]
        held: deque = deque(maxlen=5_000)
        for i in range(1_500_000):
            held.append((i,))
        del long_lived
    finally:
        gc.callbacks.remove(count)
        gc.set_threshold(*old)
    return len(passes)


def test_the_serving_thresholds_spare_long_lived_locations_the_full_passes_a_writes_churn_sets_off_at_the_defaults(tmp_path):
    assert _full_passes_under((700, 10, 10)) > 0  # Python's defaults: the churn reaches the old generation
    assert _full_passes_under(COLLECTOR_THRESHOLDS) == 0
    old = gc.get_threshold()
    server, _ = start_serving(dis_config(tmp_path / "db", port=0), HeapTrimmer())
    try:
        assert gc.get_threshold() == COLLECTOR_THRESHOLDS
    finally:
        server.stop(0.5)
        gc.unfreeze()
        gc.set_threshold(*old)
