"""Log retention with real ``dis serve`` and ``dis-tailer`` processes across DIS restarts and
``kill -9``: a log the DIS had ingested but not checkpointed must survive the kill (the restarted
DIS asks for it again), and the final table holds every row exactly once."""

from __future__ import annotations

import os
import json
import time

import numpy as np
import pytest

from disd.client import connect
from support import (append_rows, free_port, free_port_pair, log_name, start_dis_process, start_tailer, wait_for, write_dis_config,
                     write_tailer_config)

pytestmark = pytest.mark.slow

F = [log_name("ip1", hhmmss=f"{h:02d}0000") for h in range(9, 15)]


def _rows(port: int) -> int:
    with connect(f"127.0.0.1:{port}") as c:
        return sum(loc.rows for loc in c.locations("Market", "Trade"))


def _listing(logs) -> list[str]:
    return sorted(os.listdir(logs))


def test_retention_across_kill9_and_restart(tmp_path):
    port, metrics_port = free_port_pair(), free_port()
    # first life: ingests, never checkpoints
    cfg = write_dis_config(tmp_path, port, metrics_port, checkpoint_ms=3_600_000)
    logs = tmp_path / "logs"
    logs.mkdir()
    tcfg = write_tailer_config(tmp_path, port, logs, poll_interval_ms=50, max_backoff_ms=300,
                               retention={"mode": "delete", "interval_ms": 100})
    dis = start_dis_process(tmp_path, cfg)
    tailer = start_tailer(tmp_path, tcfg)
    try:
        append_rows(logs / F[0], 0, 100, frames=4)
        append_rows(logs / F[1], 100, 100, frames=4)
        append_rows(logs / F[2], 200, 50, frames=2)
        wait_for(lambda: _rows(port) == 250, 30, what="250 rows published")
        # the DIS holds every row in memory and its resume point is the end of F[2]; no
        # checkpoint covers anything yet, so every log stays however many passes run
        time.sleep(1.5)
        assert _listing(logs) == F[:3]

        dis.kill9()
        assert _listing(logs) == F[:3]
        write_dis_config(tmp_path, port, metrics_port, checkpoint_ms=200)
        dis = start_dis_process(tmp_path, cfg)  # recovers to the empty checkpoint: asks for F[0] again
        wait_for(lambda: _rows(port) == 250, 30, what="250 rows after the restart")
        wait_for(lambda: _listing(logs) == F[2:3], 30, what="F0 and F1 removed")

        append_rows(logs / F[2], 250, 30)  # the newest file grows ...
        append_rows(logs / F[3], 280, 40, frames=2)  # ... then a newer one follows
        wait_for(lambda: _listing(logs) == F[3:4], 30, what="F2 removed once covered")
        assert _rows(port) == 320

        # kill -9 in the middle of streaming: whatever was not checkpointed is asked for again
        append_rows(logs / F[4], 320, 200, frames=20)
        append_rows(logs / F[5], 520, 10)
        dis.kill9()
        assert set(_listing(logs)) >= {F[4], F[5]}  # uncheckpointed: still there
        dis = start_dis_process(tmp_path, cfg)
        wait_for(lambda: _rows(port) == 530, 30, what="530 rows after the second kill")
        wait_for(lambda: _listing(logs) == F[5:6], 30, what="all but the newest removed")
        with connect(f"127.0.0.1:{port}") as c:
            sizes = c.read_table("Market", "Trade").column("Size").to_numpy()
        assert np.array_equal(sizes, np.arange(530))  # every row once, in order
    finally:
        if tailer.alive():
            assert tailer.terminate() == 0, tailer.log_text()[-3000:]
        if dis.alive():
            assert dis.terminate() == 0, dis.log_text()[-3000:]
    events = [json.loads(line) for line in tailer.log_text().splitlines() if line.startswith("{")]
    deleted = [e["file"] for e in events if e.get("event", "").startswith("log file covered by the DIS checkpoint")]
    assert sorted(os.path.basename(p) for p in deleted) == F[:5]
