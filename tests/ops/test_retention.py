"""Tailer log retention against a real DIS in this process, with checkpoints taken by hand so
every step is deterministic: no log goes before the checkpoint covers it."""

from __future__ import annotations

import os

import numpy as np
import pytest

from disd.binlog import LocationKey
from disd.client import connect
from disd.config import ConfigError
from disd.server.daemon import DisServer
from disd.tailer import Tailer, parse_tailer_config
from disd.tailer.retention import Checkpoint, covered_files
from disd.tailer.watch import LogFile, order_of
from support import append_rows, dis_config, free_port_pair, log_name, wait_for

KEY = LocationKey("Market", "Trade", "ip1", "2026-11-22")
A, B, C = (log_name("ip1", hhmmss=t) for t in ("090000", "100000", "110000"))


def _files(*names_sizes: tuple[str, int]):
    files = [LogFile(order_of(n)[0], n, f"/logs/{n}") for n, _ in names_sizes]
    sizes = {f"/logs/{n}": s for n, s in names_sizes}
    return files, sizes.__getitem__


def _passed_whole(*names_sizes: tuple[str, int], replicas: int = 1):
    """Every stream passed each file at its full size."""
    ends = dict(names_sizes)
    return lambda name: [ends[name]] * replicas


@pytest.mark.parametrize("ckpt, expected", [
    (None, []),
    (Checkpoint("", 0), []),
    (Checkpoint(A, 50), []),                    # inside the first file
    (Checkpoint(A, 100, skip_rows=2), []),      # at its end, but a frame only partly committed
    (Checkpoint(A, 100), [A]),                  # the first file's end, a newer file exists
    (Checkpoint(B, 10), [A]),                   # older files are covered
    (Checkpoint(B, 200), [A, B]),
    (Checkpoint(C, 300), [A, B]),               # never the newest, even when fully covered
    (Checkpoint(log_name("ip1", hhmmss="120000"), 0), [A, B]),
])
def test_covered_files(ckpt, expected):
    listed = ((A, 100), (B, 200), (C, 300))
    files, size_of = _files(*listed)
    assert [f.name for f in covered_files(files, ckpt, size_of, _passed_whole(*listed))] == expected


def test_a_single_file_is_never_covered():
    files, size_of = _files((A, 100))
    assert covered_files(files, Checkpoint(A, 100), size_of, _passed_whole((A, 100))) == []


@pytest.mark.parametrize("ends, expected", [
    ({A: [100], B: [200]}, [A, B]),
    ({A: [90], B: [200]}, [B]),           # 10 bytes appended to A after its stream passed it
    ({A: [None], B: [200]}, [B]),         # a file the stream never passed (appeared behind it)
    ({A: [100, 90], B: [200, 200]}, [B]),  # one replica's stream passed A before its last bytes
    ({A: [], B: [200]}, [B]),             # no stream of the location
])
def test_a_file_longer_than_its_streams_passed_it_is_not_covered(ends, expected):
    """Bytes a stream never sent are in no checkpoint, whatever file the checkpoint is at."""
    files, size_of = _files((A, 100), (B, 200), (C, 300))
    assert [f.name for f in covered_files(files, Checkpoint(C, 300), size_of, ends.__getitem__)] == expected


@pytest.mark.parametrize("retention, problem", [
    ({"mode": "archive"}, "retention.mode: must be 'delete' or 'move'"),
    ({"move_to": "/x"}, "retention.mode: missing"),
    ({"mode": "move"}, "retention.move_to: required with mode: move"),
    ({"mode": "delete", "move_to": "/x"}, "retention.move_to: only with mode: move"),
    ({"mode": "move", "move_to": "LOGS"}, "retention.move_to: must not be one of log_dirs"),
    ({"mode": "delete", "interval_ms": 0}, "retention.interval_ms: must be > 0"),
    ({"mode": "delete", "every": 1}, "retention.every: unknown key"),
])
def test_config_errors_name_the_key(tmp_path, retention, problem):
    logs = str(tmp_path / "logs")
    if retention.get("move_to") == "LOGS":
        retention = dict(retention, move_to=logs + "/")
    with pytest.raises(ConfigError, match=problem.replace("(", r"\(")):
        parse_tailer_config({"dis": "127.0.0.1:1", "log_dirs": [logs], "retention": retention})


def _passes_after(tailer: Tailer, n: int = 3) -> None:
    """Wait for ``n`` complete retention passes from now."""
    start = tailer.retention_status()["passes"]
    wait_for(lambda: tailer.retention_status()["passes"] >= start + n, 10, what="retention passes")


def _sizes_of(srv: DisServer) -> np.ndarray:
    with connect(f"127.0.0.1:{srv.port}") as c:
        return c.read_table("Market", "Trade").column("Size").to_numpy()


@pytest.mark.parametrize("mode", ["delete", "move"])
def test_logs_go_only_once_the_checkpoint_covers_them(tmp_path, mode):
    port = free_port_pair()
    cfg = dis_config(tmp_path / "db", checkpoint_ms=3_600_000, port=port)  # checkpoints only by hand here
    srv = DisServer(cfg)
    srv.start()
    logs, archive = tmp_path / "logs", tmp_path / "archive"
    retention = {"mode": mode, "interval_ms": 30} | ({"move_to": str(archive)} if mode == "move" else {})
    tcfg = parse_tailer_config({"dis": f"127.0.0.1:{port}", "log_dirs": [str(logs)], "poll_interval_ms": 30,
                                "retention": retention})
    tailer = Tailer(tcfg).start()
    try:
        append_rows(logs / A, 0, 30, frames=3)
        append_rows(logs / B, 30, 20, frames=2)
        original_a = (logs / A).read_bytes()
        assert tailer.wait_idle(30)
        wait_for(lambda: srv.engine.location(KEY).published_rows == 50, 10, what="published")
        # every row is ingested and acknowledged, but no checkpoint covers any: nothing goes
        _passes_after(tailer)
        assert sorted(os.listdir(logs)) == [A, B]

        srv.engine.location(KEY).checkpoint()  # covers A entirely and B up to its current end
        wait_for(lambda: not (logs / A).exists(), 10, what=f"{A} removed")
        _passes_after(tailer)
        assert sorted(os.listdir(logs)) == [B]  # B is the newest: a logger may still write it
        if mode == "move":
            assert sorted(os.listdir(archive)) == [A] and (archive / A).read_bytes() == original_a

        append_rows(logs / B, 50, 10, frames=1)  # B grows past the checkpoint, then C follows
        append_rows(logs / C, 60, 15, frames=2)
        assert tailer.wait_idle(30)
        _passes_after(tailer)
        assert sorted(os.listdir(logs)) == [B, C]  # the checkpoint is inside B: B stays

        # restart the DIS (a clean stop checkpoints): B is then covered, C is the newest
        srv.stop(0.5)
        _passes_after(tailer)  # passes go on (the DIS is down: nothing is removed)
        assert sorted(os.listdir(logs)) == [B, C]
        assert "UNAVAILABLE" in tailer.retention_status()["last_error"]
        srv = DisServer(cfg)
        srv.start()
        wait_for(lambda: not (logs / B).exists(), 15, what=f"{B} removed")
        assert sorted(os.listdir(logs)) == [C]
        append_rows(logs / C, 75, 5)
        assert tailer.wait_idle(30)
        wait_for(lambda: srv.engine.location(KEY).published_rows == 80, 10, what="published")
        assert np.array_equal(_sizes_of(srv), np.arange(80))
        st = tailer.retention_status()
        assert st["removed_files"] == 2 and st["removed_bytes"] > 0
        assert st["errors"] > 0 and st["last_error"] is None  # failed while the DIS was down, fine since
        if mode == "move":
            assert sorted(os.listdir(archive)) == [A, B]
    finally:
        tailer.stop()
        srv.stop(0.5)
