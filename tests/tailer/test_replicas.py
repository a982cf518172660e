"""Hot replicas, the tailer's side: one tailer streams every location to each replica of its
routing entry, each stream on its own.  Real DISes on loopback (in this process, and a ``dis
serve`` process killed with SIGKILL), real log files, the tailer's real metrics endpoint."""

from __future__ import annotations

import os
import pathlib

import grpc
import yaml

from disd.binlog import LocationKey
from disd.client import connect
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from disd.tailer import Tailer, parse_tailer_config
from disd.tailer.core import replica_connected
from disd.tailer.retention import Checkpoint, oldest_checkpoint
from support import (ROOT, append_rows, free_port_pair, log_name, running_dis, sample, scrape, start_dis_process,
                     start_dis_server, wait_for, write_dis_config)

KEY = LocationKey("Market", "Trade", "ip1", "2026-11-22")
LOC = str(KEY)
F1, F2, F3 = (log_name("ip1", hhmmss=t) for t in ("090000", "100000", "110000"))


def routing_file(tmp_path: pathlib.Path, **replicas: str) -> str:
    path = tmp_path / "routing.yaml"
    path.write_text(yaml.safe_dump({"instances": [{
        "name": "market", "tables": ["Market.*"],
        "replicas": [{"name": n, "address": a} for n, a in replicas.items()]}]}))
    return str(path)


def tailer_config(routing: str, logs: pathlib.Path, **extra):
    data = {"routing": routing, "log_dirs": [str(logs)], "poll_interval_ms": 50, "max_backoff_ms": 200,
            "retry_refused_ms": 300, "torn_tail_grace_ms": 300}
    data.update(extra)
    return parse_tailer_config(data, "tailer.yaml")


def sizes(address: str) -> list[int]:
    """The Size of every row the DIS at ``address`` has published, sorted."""
    with connect(address, retry_s=0) as c:
        t = c.read_table("Market", "Trade")
    return sorted(t.column("Size").to_pylist()) if t.num_rows else []


def has_exactly(address: str, n: int) -> bool:
    return sizes(address) == list(range(n))


def checkpoint(address: str) -> Checkpoint | None:
    ch = grpc.insecure_channel(address)
    try:
        reply = dis_pb2_grpc.TableDataStub(ch).Status(dis_pb2.StatusRequest(
            namespace="Market", table="Trade", internal_partition="ip1", durable_checkpoint=True), timeout=10)
    finally:
        ch.close()
    for s in reply.locations:
        if s.key.column_partition == KEY.column_partition and s.checkpoint_file:
            return Checkpoint(s.checkpoint_file, s.checkpoint_offset, s.checkpoint_skip_rows)
    return None


def column_files(db_root: pathlib.Path) -> dict[str, bytes]:
    """Every file of the database's tables except ``table.size`` (whose time field differs), by
    relative path (``dis.lock``, outside the tables, holds the process id)."""
    out = {}
    for dirpath, _dirs, names in os.walk(db_root / "Intraday"):
        for n in names:
            if n != "table.size":
                p = pathlib.Path(dirpath) / n
                out[str(p.relative_to(db_root))] = p.read_bytes()
    return out


def assert_identical(db_a: pathlib.Path, db_b: pathlib.Path) -> None:
    a, b = column_files(db_a), column_files(db_b)
    assert any(k.endswith("Size.dat") for k in a), f"no column files under {db_a}: {sorted(a)}"
    assert sorted(a) == sorted(b)
    differ = [k for k in a if a[k] != b[k]]
    assert not differ, f"files that differ between the replicas: {differ}"


# -- pure parts --------------------------------------------------------------------------------


def test_oldest_checkpoint_is_the_least_advanced_and_none_when_a_replica_has_none():
    assert oldest_checkpoint([Checkpoint(F2, 10), Checkpoint(F1, 500), Checkpoint(F3, 0)]) == Checkpoint(F1, 500)
    assert oldest_checkpoint([Checkpoint(F1, 500), Checkpoint(F1, 400)]) == Checkpoint(F1, 400)
    assert oldest_checkpoint([Checkpoint(F1, 400, 2), Checkpoint(F1, 400)]) == Checkpoint(F1, 400)
    assert oldest_checkpoint([Checkpoint(F2, 10), None]) is None
    assert oldest_checkpoint([Checkpoint(F2, 10), Checkpoint("", 0)]) is None
    assert oldest_checkpoint([Checkpoint(F2, 10)]) == Checkpoint(F2, 10)


def test_replica_connected_when_one_stream_reaches_it():
    assert replica_connected([True, False])
    assert not replica_connected([False, None])
    assert replica_connected([None])  # not tried yet: nothing fails
    assert replica_connected([])


def test_the_replica_alerts_are_defined():
    groups = yaml.safe_load((ROOT / "config/prometheus/dis-tailer-alerts.yml").read_text())["groups"]
    rules = {r["alert"]: r for g in groups for r in g["rules"]}
    assert rules["DisReplicaDown"]["expr"].strip() == "dis_tailer_replica_connected == 0"
    assert rules["DisReplicaDown"]["for"] == "1m"
    assert rules["DisReplicaLagging"]["expr"].strip() == "dis_tailer_replica_bytes_behind > 64 * 1024 * 1024"
    assert rules["DisReplicaLagging"]["for"] == "5m"


# -- real DISes --------------------------------------------------------------------------------


def test_one_tailer_feeds_both_replicas_exactly_and_their_files_are_identical(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    append_rows(logs / F1, 0, 1500, frames=5)
    append_rows(logs / F2, 1500, 1500, frames=3)
    a = start_dis_server(tmp_path / "a")
    b = start_dis_server(tmp_path / "b")
    try:
        addr_a, addr_b = f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"
        with Tailer(tailer_config(routing_file(tmp_path, a=addr_a, b=addr_b), logs, metrics_port=0)) as t:
            assert t.wait_idle(30)
            append_rows(logs / F2, 3000, 1000, frames=2)  # the last file grows
            assert t.wait_idle(30)
            wait_for(lambda: has_exactly(addr_a, 4000) and has_exactly(addr_b, 4000), 20, what="4000 rows at both")
            st = t.status()[LOC]
            assert set(st["replicas"]) == {"a", "b"}
            end = (logs / F2).stat().st_size
            for name, addr in (("a", addr_a), ("b", addr_b)):
                r = st["replicas"][name]
                assert (r["dis"], r["acked_file"], r["acked_offset"]) == (addr, F2, end)
            assert (st["replica"], st["dis"]) == ("a", addr_a)  # the top level is the first replica's
            s = scrape(t.metrics_port)
            for name, addr in (("a", addr_a), ("b", addr_b)):
                assert sample(s, "dis_tailer_replica_connected", replica=name, address=addr) == 1
                assert sample(s, "dis_tailer_replica_bytes_behind", replica=name, address=addr) == 0
            assert len(s["dis_tailer_replica_connected"]) == 2
            assert sample(s, "dis_tailer_locations") == 1
            assert sample(s, "dis_tailer_bytes_behind", location=LOC) == 0
            # acked bytes summed over the two streams, each of which sent every frame once
            per = [w.counters()["acked_bytes"] for w in t.workers_of(KEY)]
            assert per[0] == per[1] > 0
            assert sample(s, "dis_tailer_acked_bytes_total", location=LOC) == 2 * per[0]
    finally:
        a.stop(0.5)
        b.stop(0.5)
    assert_identical(tmp_path / "a", tmp_path / "b")


def test_a_replica_that_refuses_does_not_stop_the_other(tmp_path):
    """Replica b has no schema of Market.Trade: it refuses the location (NOT_FOUND), and says so;
    replica a gets every row, and b counts as connected (it answers)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    append_rows(logs / F1, 0, 2000, frames=4)
    empty = tmp_path / "no-schemas"
    empty.mkdir()
    with running_dis(tmp_path / "a") as a, running_dis(tmp_path / "b", schemas=empty) as b:
        addr_a, addr_b = f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"
        with Tailer(tailer_config(routing_file(tmp_path, a=addr_a, b=addr_b), logs, metrics_port=0)) as t:
            wait_for(lambda: has_exactly(addr_a, 2000), 30, what="2000 rows at a")
            wait_for(lambda: t.status()[LOC]["replicas"]["b"]["state"] == "refused", 20, what="b refuses")
            st = t.status()[LOC]["replicas"]
            assert "NOT_FOUND" in st["b"]["error"] and st["a"]["state"] == "following"
            s = scrape(t.metrics_port)
            assert sample(s, "dis_tailer_refusals_total", location=LOC, code="NOT_FOUND") >= 1
            assert sample(s, "dis_tailer_replica_connected", replica="b") == 1
            assert sample(s, "dis_tailer_replica_bytes_behind", replica="a") == 0
            assert sample(s, "dis_tailer_replica_bytes_behind", replica="b") > 0
            assert not [k for k in column_files(tmp_path / "b") if "Trade" in k]


def test_a_killed_replica_stalls_nobody_keeps_its_logs_and_catches_up_identically(tmp_path):
    """Replica b is a ``dis serve`` process killed with SIGKILL while rows keep coming: a receives
    them without a stall, b shows as down and behind, retention keeps the file b still needs (a's
    checkpoint is past it), and once b is back it catches up from the logs to the same rows and
    the same column files as a."""
    logs = tmp_path / "logs"
    logs.mkdir()
    append_rows(logs / F1, 0, 1000, frames=4)
    port_b = free_port_pair()
    (tmp_path / "b").mkdir()
    cfg_b = write_dis_config(tmp_path / "b", port_b, db_root=tmp_path / "b" / "db")
    proc_b = start_dis_process(tmp_path / "b", cfg_b)
    a = start_dis_server(tmp_path / "a")
    addr_a, addr_b = f"127.0.0.1:{a.port}", f"127.0.0.1:{port_b}"
    t = Tailer(tailer_config(routing_file(tmp_path, a=addr_a, b=addr_b), logs, metrics_port=0,
                             retention={"mode": "delete", "interval_ms": 200}))
    try:
        t.start()
        wait_for(lambda: has_exactly(addr_a, 1000) and has_exactly(addr_b, 1000), 30, what="1000 rows at both")
        wait_for(lambda: checkpoint(addr_b), 20, what="b's first checkpoint")  # b resumes inside F1
        proc_b.kill9()

        # ingestion goes on: more rows in the first file, then two newer files
        append_rows(logs / F1, 1000, 500, frames=2)
        append_rows(logs / F2, 1500, 1500, frames=3)
        append_rows(logs / F3, 3000, 500, frames=1)
        wait_for(lambda: has_exactly(addr_a, 3500), 30, what="3500 rows at a while b is down")
        ca = wait_for(lambda: (lambda c: c if c and c.file_name >= F2 else None)(checkpoint(addr_a)), 20,
                      what="a's checkpoint past the first file")
        assert ca.file_name in (F2, F3)

        s = wait_for(lambda: (lambda s: s if sample(s, "dis_tailer_replica_connected", replica="b") == 0 else None)(
            scrape(t.metrics_port)), 20, what="b shown as not connected")
        assert sample(s, "dis_tailer_replica_connected", replica="b", address=addr_b) == 0
        assert sample(s, "dis_tailer_replica_connected", replica="a", address=addr_a) == 1
        behind_b = sample(s, "dis_tailer_replica_bytes_behind", replica="b", address=addr_b)
        assert behind_b >= (logs / F2).stat().st_size - 4096  # at least the newer files' frames
        assert sample(s, "dis_tailer_replica_bytes_behind", replica="a", address=addr_a) == 0
        assert sample(s, "dis_tailer_bytes_behind", location=LOC) == behind_b  # the location: the furthest behind
        st = t.status()[LOC]["replicas"]
        assert st["b"]["state"] in ("reconnecting", "connecting") and st["a"]["state"] == "following"

        # retention asks both: b cannot be asked, so nothing goes though a's checkpoint covers F1
        passes = t.retention_status()["passes"]
        wait_for(lambda: t.retention_status()["passes"] >= passes + 3, 20, what="three retention passes")
        assert (logs / F1).exists() and (logs / F2).exists()
        assert t.retention_status()["removed_files"] == 0
        assert addr_b in (t.retention_status()["last_error"] or "")

        # b comes back (truncated to its last checkpoint) and catches up from the files on disk
        proc_b = start_dis_process(tmp_path / "b", cfg_b)
        wait_for(lambda: has_exactly(addr_b, 3500), 30, what="b caught up")
        s = wait_for(lambda: (lambda s: s if sample(s, "dis_tailer_replica_bytes_behind", replica="b") == 0
                              else None)(scrape(t.metrics_port)), 20, what="b no longer behind")
        assert sample(s, "dis_tailer_replica_connected", replica="b") == 1
        # once both checkpoints are past F1 (and F2), retention removes them; never the newest file
        wait_for(lambda: not (logs / F1).exists(), 30, what="F1 removed once b's checkpoint is past it")
        assert (logs / F3).exists()
        assert has_exactly(addr_a, 3500) and has_exactly(addr_b, 3500)
        assert t.wait_idle(20)
    finally:
        t.stop()
        a.stop(0.5)
        if proc_b.alive():
            assert proc_b.terminate() == 0
    assert_identical(tmp_path / "a", tmp_path / "b" / "db")
