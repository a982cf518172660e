"""Last-by state with real ``dis serve`` and ``dis-tailer`` processes: random updates of 100,000
keys, the DIS killed with ``kill -9`` five times mid-ingest.  After each kill the state the DIS
would load (``lastby.<rows>.arrow``, named in ``table.size``) is exactly the last-by of the
checkpointed rows, and loaded, not rebuilt; after each restart the served state equals the
last-by of the rows it covers; at the end it equals the last-by of every row."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import yaml

from disd.binlog import BinlogWriter, normalize_columns
from disd.client import connect
from disd.config import ImportConfig
from disd.schema import SchemaRegistry
from disd.storage import StorageEngine
from disd.storage.lastby import last_by
from support import (SCHEMAS, TRADE, dis_settings, free_port, free_port_pair, log_name, start_dis_process,
                     start_tailer, wait_for, write_tailer_config)

from .support_lastby import random_updates, with_last_by

pytestmark = pytest.mark.slow

KEYS = 100_000
# At least 300,000 rows; the writer goes on (up to 1,500,000) until the kills are done, so on a
# loaded machine rows still arrive for every kill instead of all being in before the last one.
MIN_FRAMES, MAX_FRAMES, PER_FRAME = 300, 1500, 1000
KILLS = 5


def _writer(path, stop: threading.Event, written: list[int]) -> None:
    """Frames of ``PER_FRAME`` rows every 20 ms: at least ``MIN_FRAMES``, then until ``stop``."""
    with BinlogWriter(path, TRADE) as w:
        i = 0
        while i < MIN_FRAMES or (not stop.is_set() and i < MAX_FRAMES):
            w.write_rows(normalize_columns(TRADE, random_updates(i * PER_FRAME, PER_FRAME, KEYS, seed=7)),
                         np.full(PER_FRAME, 3, np.uint8))
            i += 1
            written[0] = i * PER_FRAME
            time.sleep(0.02)


def _served(client) -> tuple[int, object]:
    states = client.last_by_states("Market", "Trade")
    if not states:
        return 0, None
    from disd.client import state_table

    return states[0].rows, state_table(TRADE, states[0])


def _checkpointed(client) -> int:
    locs = client.status().locations
    return locs[0].checkpointed_rows if locs else 0


def _offline_check(db) -> int:
    """Open the database as the restarted DIS would and compare its loaded state with the
    last-by recomputed from the checkpointed rows; the checkpointed row count."""
    eng = StorageEngine(str(db), SchemaRegistry.load_dir(SCHEMAS),
                        import_tables={"Market.Trade": ImportConfig(last_by=("Sym",))})
    try:
        locs = eng.locations()
        if not locs:
            return 0
        (loc,) = locs
        assert not loc.in_error, loc.error
        state = loc.lastby.snapshot()
        assert state.rows == loc.checkpointed_rows == loc.published_rows
        if state.rows:
            assert loc.lastby.durable_ref is not None, "the state was rebuilt, not loaded from its file"
        assert state.table.equals(last_by(loc.read_table(), ["Sym"])), f"state at {state.rows} rows differs"
        return state.rows
    finally:
        eng.close()


def test_state_survives_kill9_and_equals_the_last_by_of_the_rows(tmp_path):
    port = free_port_pair()
    logs = tmp_path / "logs"
    logs.mkdir()
    db = tmp_path / "db"
    settings = with_last_by(dis_settings(db, port=port, metrics_port=free_port(), flush_ms=50, checkpoint_ms=150))
    cfg = tmp_path / "dis.yaml"
    cfg.write_text(yaml.safe_dump(settings))
    tcfg = write_tailer_config(tmp_path, port, logs, poll_interval_ms=50, max_backoff_ms=300)
    stop, written = threading.Event(), [0]
    writer = threading.Thread(target=_writer, args=(logs / log_name("q"), stop, written))
    dis = start_dis_process(tmp_path, cfg)
    tailer = start_tailer(tmp_path, tcfg)
    writer.start()
    checkpoints = []
    try:
        with connect(f"127.0.0.1:{port}", retry_s=30) as c:
            for _ in range(KILLS):
                # a checkpoint past the previous one, then rows past it: the kill loses published rows
                last = checkpoints[-1] if checkpoints else 0
                wait_for(lambda: _checkpointed(c) > last, 30, what="a new checkpoint")
                ckpt = _checkpointed(c)
                wait_for(lambda: _served(c)[0] > ckpt + 2 * PER_FRAME, 30, what="rows past the checkpoint")
                dis.kill9()
                checkpoints.append(_offline_check(db))
                dis = start_dis_process(tmp_path, cfg)
                rows, state = _served(c)
                assert state is not None and state.equals(last_by(c.read_table("Market", "Trade").slice(0, rows)
                                                                  .drop_columns(["Date"]), ["Sym"]))
            stop.set()
            writer.join(60)
            total = written[0]
            assert checkpoints[-1] < total, "the last kill came after every row was in"
            wait_for(lambda: _served(c)[0] == total, 60, what="every row after the kills")
            rows, state = _served(c)
            everything = c.read_table("Market", "Trade").drop_columns(["Date"])
            assert everything.num_rows == total
            assert np.array_equal(everything.column("Size").to_numpy(), np.arange(total))
            assert len(state) == KEYS
            assert state.equals(last_by(everything, ["Sym"]))
            assert c.last_by("Market", "Trade").num_rows == KEYS
    finally:
        stop.set()
        if tailer.alive():
            assert tailer.terminate() == 0, tailer.log_text()[-3000:]
        if dis.alive():
            assert dis.terminate() == 0, dis.log_text()[-3000:]
    print("checkpointed rows at each kill:", checkpoints)
    assert all(a < b for a, b in zip(checkpoints, checkpoints[1:])), checkpoints
