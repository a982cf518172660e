"""Readers of a replica set (docs/replicas.md): the client lists from the replicas that answer,
spreads locations over them, and when a replica dies a read continues on another one that has
published what it reads, never past what a replica said it published; subscriptions and
streaming offsets never go back; ``dis status --routing`` shows every replica and its lag.

Failover claims run against real ``dis serve`` processes killed with -9; the checks of a
replica behind the others use DISes in this process (stopped, and fed with the Feeder)."""

from __future__ import annotations

import json
import pickle
import subprocess
import threading
import time

import numpy as np
import pytest

from disd.binlog import LocationKey
from disd.blocks import replica_order
from disd.client import Client, DisClientError, connect
from disd.routing import Instance, Replica, Routing
from support import BIN, Feeder, start_dis_server, trade_rows, wait_for

from .readers_support import published, replica_set, write_logs

K1 = LocationKey("Market", "Trade", "feed1", "2026-11-22")
K2 = LocationKey("Market", "Trade", "feed2", "2026-11-22")


def set_of(*servers) -> Routing:
    return Routing((Instance("market", f"127.0.0.1:{servers[0].port}", ("*",), None, tuple(
        Replica(f"r{i}", f"127.0.0.1:{s.port}") for i, s in enumerate(servers))),))


def sizes(table) -> np.ndarray:
    return np.sort(np.asarray(table.column("Size")))


def dis_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "dis"), *args], capture_output=True, text=True, timeout=60)


# -- the order of replicas -----------------------------------------------------------------------
def test_replica_order_is_stable_and_spreads_locations():
    a, b, c = "10.0.0.1:22021", "10.0.0.2:22021", "10.0.0.3:22021"
    keys = [str(LocationKey("Market", "Trade", f"feed{i}", "2026-11-22")) for i in range(200)]
    first = [replica_order(k, [a, b, c])[0] for k in keys]
    assert first == [replica_order(k, [c, a, b])[0] for k in keys]  # the file's order does not matter
    assert all(40 < first.count(x) < 95 for x in (a, b, c))  # spread, roughly evenly
    # Losing a replica moves only its own locations.
    without_c = [replica_order(k, [a, b])[0] for k in keys]
    assert all(w == f for w, f in zip(without_c, first) if f != c)


# -- real processes, kill -9 ---------------------------------------------------------------------
def test_a_read_survives_kill_9_of_its_replica_mid_scan_and_status_shows_it(tmp_path):
    rs = replica_set(tmp_path)
    try:
        total = write_logs(rs.logs, 10, 1500)
        for r in rs.replicas:
            wait_for(lambda r=r: published(r.address) == total, 60, 0.1, f"{total} rows at {r.name}")

        # dis status --routing: both replicas, every location at lag 0.
        st = dis_cli("status", "--routing", str(rs.routing), "--json")
        assert st.returncode == 0, st.stderr
        rep = json.loads(st.stdout)["replicas"]
        assert [r["replica"] for r in rep["entries"][0]["replicas"]] == ["dis-a", "dis-b"]
        assert all(r["reachable"] for r in rep["entries"][0]["replicas"])
        assert len(rep["locations"]) == 20  # 10 locations x 2 replicas
        assert {r["lag"] for r in rep["locations"]} == {0} and {r["rows"] for r in rep["locations"]} == {1500}

        killed: list[str] = []

        class KillDuringScan(Client):
            """Kills the replica a read is being served by, at the third location read (-9)."""

            reads = 0

            def read_ranges(self, snap, ranges):
                self.reads += 1
                if self.reads == 3:
                    rs.by_address(snap.address).proc.kill9()
                    killed.append(snap.address)
                return super().read_ranges(snap, ranges)

        c = KillDuringScan(_load(rs.routing), retry_s=30)
        listed = {s.address for s in c.locations("Market", "Trade")}
        t0 = time.monotonic()
        table = c.read_table("Market", "Trade")
        took = time.monotonic() - t0
        c.close()
        assert killed and not rs.by_address(killed[0]).proc.alive()
        assert table.num_rows == total
        assert (sizes(table) == np.arange(total)).all()  # every row exactly once
        assert took < 15  # failed over, not waited out
        assert len(listed) == 2 or listed == set(killed)  # listed from both (spread), or only the victim

        # A new client lists and reads from the replica left.
        with connect(routing=str(rs.routing), retry_s=5) as c2:
            t = c2.read_table("Market", "Trade")
            assert {s.address for s in c2.locations("Market", "Trade")} == {a.address for a in rs.replicas} - set(killed)
        assert (sizes(t) == np.arange(total)).all()

        st = dis_cli("status", "--routing", str(rs.routing))
        assert st.returncode == 1
        assert "Traceback" not in st.stderr + st.stdout
        assert "UNREACHABLE" in st.stdout and killed[0] in st.stdout
        st = dis_cli("status", "--routing", str(rs.routing), "--json")
        rep = json.loads(st.stdout)
        dead = [r for r in rep["replicas"]["entries"][0]["replicas"] if not r["reachable"]]
        assert [r["dis"] for r in dead] == killed and "unreachable" in dead[0]["error"]
        assert all(r["rows"] is None for r in rep["replicas"]["locations"] if r["dis"] == killed[0])
        assert all(r["rows"] == 1500 and r["lag"] == 0 for r in rep["replicas"]["locations"] if r["dis"] != killed[0])
    finally:
        rs.stop()


def _load(path):
    from disd.routing import load_routing

    return load_routing(path)


def test_a_subscription_moves_to_another_replica_when_its_own_is_killed(tmp_path):
    rs = replica_set(tmp_path)
    try:
        total = write_logs(rs.logs, 1, 300)
        for r in rs.replicas:
            wait_for(lambda r=r: published(r.address) == total, 60, 0.1, f"{total} rows at {r.name}")
        client = connect(routing=str(rs.routing), retry_s=30)
        seen: list = []
        errors: list = []

        def follow() -> None:
            try:
                for snap in client.subscribe("Market", "Trade"):
                    seen.append(snap)
                    if snap.rows >= 900:
                        return
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        th = threading.Thread(target=follow, daemon=True)
        th.start()
        wait_for(lambda: seen, 20, what="the first snapshot")
        first = seen[0].address
        rs.by_address(first).proc.kill9()
        from .readers_support import logger

        lg = logger(rs.logs, "feed0", "2026-11-22")
        lg.log_batch(trade_rows(300, 600), atomic=True)
        lg.close()
        th.join(60)
        assert not errors, errors
        assert seen[-1].rows == 900 and seen[-1].address != first
        rows = [s.rows for s in seen]
        assert rows == sorted(rows)
        client.close()
    finally:
        rs.stop()


# -- a replica behind the others (DISes in this process) ----------------------------------------
@pytest.fixture
def two_replicas(tmp_path):
    a = start_dis_server(tmp_path / "a")
    # B publishes only when told to (Feeder.append, flush): no flush clock of its own.
    b = start_dis_server(tmp_path / "b", flush_ms=3_600_000, checkpoint_ms=3_600_000)
    yield a, b
    for s in (a, b):
        s.stop(0.5)


def test_a_read_never_goes_past_what_the_other_replica_published(two_replicas):
    a, b = two_replicas
    fa, fb = Feeder(a), Feeder(b)
    fa.append(K1, trade_rows(0, 3000))
    fb.append(K1, trade_rows(0, 1000))
    fb.append(K1, trade_rows(1000, 2000), publish=False)  # in B's files, not published by B

    c = Client(set_of(a, b), retry_s=1.0)
    snaps = c.locations("Market", "Trade")
    assert [(s.address, s.rows) for s in snaps] == [(f"127.0.0.1:{a.port}", 3000)]  # the most advanced
    snap = snaps[0]
    assert (sizes(c.read_location(snap)) == np.arange(3000)).all()  # the schema is known from here on
    a.stop(0.5)
    # Rows B has published are read from B ...
    assert (sizes(c.read_location(snap, stop=1000)) == np.arange(1000)).all()
    # ... rows it has not are not, even though its files hold them: an error after retry_s.
    with pytest.raises(DisClientError, match=r"published .* fewer than .*tried for 1 s"):
        c.read_location(snap, start=500, stop=3000)
    # Once B publishes them, the same snapshot reads from B, waiting within retry_s.
    c.retry_s = 30
    threading.Timer(1.0, lambda: b.engine.location(K1).flush()).start()
    t = c.read_location(snap)
    assert (sizes(t) == np.arange(3000)).all()
    c.close()


def test_a_stream_offset_never_moves_back_when_listing_from_a_replica_behind(two_replicas):
    from disd.spark.options import parse_options
    from disd.spark.read import read_partition
    from disd.spark.source import DisDataSource, DisStreamReader

    a, b = two_replicas
    fa, fb = Feeder(a), Feeder(b)
    fa.append(K1, trade_rows(0, 2000))
    fa.append(K2, trade_rows(2000, 500))
    fb.append(K1, trade_rows(0, 800))
    fb.append(K2, trade_rows(2000, 500))
    routing = set_of(a, b)
    path = _write_routing(a, b)
    o = {"routing": path, "namespace": "Market", "table": "Trade", "retrySeconds": "30"}
    r = DisStreamReader(parse_options(o), DisDataSource(o).schema())
    assert routing.replicas("Market", "Trade")
    end = r.latestOffset({}, r.getDefaultReadLimit())
    assert end == {"feed1/2026-11-22": 2000, "feed2/2026-11-22": 500}
    a.stop(0.5)
    # B is behind on feed1: the offset stays where A took it.
    assert r.latestOffset(end, r.getDefaultReadLimit()) == end
    assert r.reportLatestOffset() == end
    # Planning the batch waits for a replica that has published the end (B catching up).
    threading.Timer(1.0, lambda: fb.append(K1, trade_rows(800, 1200))).start()
    t0 = time.monotonic()
    parts = r.partitions({}, end)
    assert time.monotonic() - t0 >= 0.8
    got = []
    for p in parts:
        for batch in read_partition(pickle.loads(pickle.dumps(p))):
            got += batch.column("Size").to_pylist()
    assert sorted(got) == list(range(2500))
    r.stop()


def _write_routing(*servers) -> str:
    import tempfile

    import yaml

    f = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    yaml.safe_dump({"instances": [{"name": "market", "tables": ["*"], "replicas": [
        {"name": f"r{i}", "address": f"127.0.0.1:{s.port}"} for i, s in enumerate(servers)]}]}, f)
    f.close()
    return f.name
