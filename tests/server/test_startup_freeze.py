"""``dis serve`` takes what its start made out of the garbage collector's full passes."""

from __future__ import annotations

import gc

from disd.allocator import HeapTrimmer
from disd.server.daemon import start_serving
from support.dis import dis_config


def test_serving_starts_with_its_startup_objects_frozen_out_of_the_collectors_passes(tmp_path):
    gc.unfreeze()
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
