"""``dis-tailer`` takes what its start made out of the garbage collector's full passes, as ``dis
serve`` does (``server/test_startup_freeze.py``), and raises the collector's thresholds: a tailer finding 50 new locations at once set
off a full collection of its start-up's objects in the middle of the burst."""

from __future__ import annotations

import gc

from disd.collector import THRESHOLDS
from disd.tailer.cli import start_tailing
from disd.tailer.config import load_tailer_config

from .fakedis import FakeDis
from .helpers import name, write


def test_tailing_starts_with_its_startup_objects_frozen_out_of_the_collectors_passes(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    write(logs / name(), 5)
    dis = FakeDis().start()
    cfg = tmp_path / "tailer.yaml"
    cfg.write_text(f"dis: {dis.address}\nlog_dirs: [{logs}]\nstate_dir: {tmp_path / 'state'}\n")
    gc.unfreeze()
    thresholds = gc.get_threshold()
    made_before = len(gc.get_objects())
    tailer = start_tailing(load_tailer_config(cfg))
    try:
        # the modules, the configuration and the tailer made so far: a full pass walks none of them
        assert gc.get_freeze_count() >= made_before
        assert not any(o is tailer for o in gc.get_objects())  # the permanent generation's are not listed
        assert gc.get_threshold() == THRESHOLDS  # a young generation its per-write objects die in (disd.collector)
    finally:
        tailer.stop()
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        dis.stop()
