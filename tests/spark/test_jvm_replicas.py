"""The JVM reader across DIS failures: batch planning and task reads ride out a restart of the
DIS (``kill -9``, then the same DIS on the same ports), and a scan of a replica set continues on
the other replica when one is killed after planning.  Real ``dis serve`` processes on loopback;
the database is checkpointed before the kills, so a restarted DIS republishes every row."""

from __future__ import annotations

import shutil
import socket
import threading
import time

import pytest
import yaml
from pyspark.sql import functions as F

from disd.binlog import LocationKey

from support import free_port_pair, loaded_dis, start_dis_process, write_dis_config

# Four locations of 2,500 rows (Size = row number): enough for a location on each replica.
LOCS = {LocationKey("Market", "Trade", f"feed{f}", d): (i * 2500, 2500)
        for i, (f, d) in enumerate((f, d) for f in (1, 2) for d in ("2026-11-22", "2026-11-23"))}
TOTAL = 10_000

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def checkpointed_db(tmp_path_factory):
    """A database root with LOCS published and checkpointed (no DIS running on it)."""
    db = tmp_path_factory.mktemp("replica-db") / "db"
    srv = loaded_dis(db, LOCS, checkpoint=True)
    srv.stop(0.5)
    return db


class Dis:
    """A real ``dis serve`` on fixed ports, so that a restart comes back where readers look."""

    def __init__(self, tmp, db) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.tmp = tmp
        self.port = free_port_pair()
        self.config = write_dis_config(tmp, self.port, db_root=db)
        self.proc = None

    def start(self) -> "Dis":
        self.proc = start_dis_process(self.tmp, self.config)
        return self

    def kill9(self) -> None:
        self.proc.kill9()

    def restart_later(self, delay_s: float) -> threading.Thread:
        t = threading.Thread(target=lambda: (time.sleep(delay_s), self.start()), daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        if self.proc is not None and self.proc.alive():
            self.proc.kill9()


def read(spark, **opts):
    r = spark.read.format("dis").option("reader", "jvm").option("table", "Market.Trade").option("retrySeconds", "60")
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


def sizes_after(df, between) -> list[int]:
    """Plan ``df``'s scan (its tasks' slices are fixed), run ``between()``, then run the tasks."""
    rdd = df.select("Size").rdd
    assert rdd.getNumPartitions() >= 2  # planned: the locations are listed now
    between()
    return sorted(r.Size for r in rdd.collect())


def test_batch_planning_and_task_reads_ride_out_a_dis_restart(spark_session, checkpointed_db, tmp_path):
    spark = spark_session
    dis = Dis(tmp_path / "dis", checkpointed_db).start()
    try:
        address = f"127.0.0.1:{dis.port}"
        # killed before load(): the schema and the listing are asked again until it is back
        dis.kill9()
        t = dis.restart_later(2.0)
        started = time.monotonic()
        df = read(spark, address=address)
        got = df.agg(F.count("*"), F.sum("Size")).collect()[0]
        assert tuple(got) == (TOTAL, TOTAL * (TOTAL - 1) // 2)
        assert time.monotonic() - started >= 1.5  # it did wait for the restart
        t.join()
        # killed between planning and the tasks: each read is retried until the DIS is back
        t = None

        def kill_and_restart() -> None:
            nonlocal t
            dis.kill9()
            t = dis.restart_later(2.0)

        assert sizes_after(read(spark, address=address, minPartitions="4", rowsPerPartition="2500"), kill_and_restart) == list(range(TOTAL))
        t.join()
        # and when it does not come back, the read says how long it tried
        df = read(spark, address=address, retrySeconds="1")
        rdd = df.select("Size").rdd
        rdd.getNumPartitions()
        dis.kill9()
        with pytest.raises(Exception) as e:
            rdd.collect()
        assert "DisSourceError: dis source:" in str(e.value) and "(tried for 1 s)" in str(e.value), str(e.value)[:3000]
    finally:
        dis.stop()


def test_a_replica_killed_after_planning_the_scan_continues_on_the_other(spark_session, checkpointed_db, tmp_path):
    """Two replicas with identical files.  Killing either one after planning leaves the scan
    exact: its locations are read from the other (locations spread over both, so one of the two
    kills always hits a replica that tasks were going to read from)."""
    spark = spark_session
    shutil.copytree(checkpointed_db, tmp_path / "db-b")
    a = Dis(tmp_path / "a", checkpointed_db).start()
    b = Dis(tmp_path / "b", tmp_path / "db-b").start()
    try:
        routing = tmp_path / "routing.yaml"
        routing.write_text(yaml.safe_dump({"instances": [{"name": "market", "tables": ["Market.*"], "replicas": [
            {"name": "a", "address": f"127.0.0.1:{a.port}"}, {"name": "b", "address": f"127.0.0.1:{b.port}"}]}]}))
        df = read(spark, routing=str(routing), minPartitions="4", rowsPerPartition="2500")
        assert tuple(df.agg(F.count("*"), F.sum("Size")).collect()[0]) == (TOTAL, TOTAL * (TOTAL - 1) // 2)
        for victim in (a, b):
            assert sizes_after(df, victim.kill9) == list(range(TOTAL))
            victim.start()
        # with one replica down from the start, planning lists from the other
        a.kill9()
        assert tuple(read(spark, routing=str(routing)).agg(F.count("*"), F.sum("Size")).collect()[0]) == (
            TOTAL, TOTAL * (TOTAL - 1) // 2)
    finally:
        a.stop()
        b.stop()


class DyingEndpoint:
    """A TCP relay in front of a DIS's block endpoint that dies mid-response: once it has passed
    ``budget`` bytes of ``/v1/read`` responses it cuts the one it is sending, drops every
    connection and stops listening, as the endpoint of a DIS killed mid-read would."""

    def __init__(self, backend_port: int, budget: int) -> None:
        self.backend_port = backend_port
        self.budget = budget
        self.died = False
        self.lock = threading.Lock()
        self.socks: list[socket.socket] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.backend_port))
            with self.lock:
                self.socks += [client, server]
            state = {"read": False}
            threading.Thread(target=self._up, args=(client, server, state), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, state), daemon=True).start()

    def _up(self, src, dst, state) -> None:
        try:
            while data := src.recv(65536):
                if data.startswith(b"GET "):
                    state["read"] = data.startswith(b"GET /v1/read")
                dst.sendall(data)
        except OSError:
            pass

    def _down(self, src, dst, state) -> None:
        try:
            while data := src.recv(65536):
                if state["read"]:
                    with self.lock:
                        self.budget -= len(data)
                        left = self.budget
                    if left <= 0:
                        dst.sendall(data[: len(data) + left])
                        self.die()
                        return
                dst.sendall(data)
        except OSError:
            pass

    def die(self) -> None:
        with self.lock:
            self.died = True
            socks, self.socks = self.socks, []
        self.listener.close()
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def test_a_replica_dying_mid_response_the_range_continues_on_the_other(spark_session, checkpointed_db, tmp_path):
    """A task whose replica goes away in the middle of a column's bytes reads the rest of that
    byte range from the other replica: every column of every row equals a read of the healthy
    replica alone."""
    spark = spark_session
    shutil.copytree(checkpointed_db, tmp_path / "db-b")
    a = Dis(tmp_path / "a", checkpointed_db).start()
    b = Dis(tmp_path / "b", tmp_path / "db-b").start()
    relay = DyingEndpoint(b.port + 1, 45_000)
    try:
        routing = tmp_path / "routing.yaml"
        routing.write_text(yaml.safe_dump({"instances": [{"name": "market", "tables": ["Market.*"], "replicas": [
            {"name": "a", "address": f"127.0.0.1:{a.port}"},
            {"name": "b", "address": f"127.0.0.1:{b.port}", "http_address": f"127.0.0.1:{relay.port}"}]}]}))
        expected = sorted(tuple(r) for r in read(spark, address=f"127.0.0.1:{a.port}").collect())
        got = sorted(tuple(r) for r in read(spark, routing=str(routing), minPartitions="2").collect())
        assert relay.died  # the replica that was read from went away mid-response
        assert len(got) == TOTAL and got == expected
    finally:
        relay.die()
        a.stop()
        b.stop()
