"""Hot replicas end to end, every part a real process or a real reader (docs/replicas.md).

Two replicas (``dis serve``) of one routing entry; two ``dis-tailer`` processes, each with its own
log directory written by its own logger, each streaming every location to both replicas; while
rows are logged, one replica at a time is killed with SIGKILL and restarted, several times.
Readers follow the table the whole time through the routing file: a client (``subscribe`` and
``read_location``), and two Spark streaming queries of the ``dis`` source, the JVM reader and the
Python reader.  At the end:

* each replica has published every logged row;
* every reader saw every row exactly once (no gap, no duplicate), across the failovers;
* stopped, the two replicas hold byte-identical column files (and ``table.size`` records equal
  but for the replica's own time and import counters), the determinism guarantee.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import threading
import time

import numpy as np
import pytest
import yaml

from disd.client import connect
from disd.logger import IntradayLoggerBuilder
from spark.conftest import spark_session  # noqa: F401 - the shared local session
from support import (BIN, SCHEMAS, Proc, free_port, free_port_pair, start_dis_process, trade_rows, wait_for,
                     write_dis_config)
from support.sinks import SizeSink

from replicas.test_determinism import assert_identical

DAY = "2026-11-22"
FEEDS = {"host1": 0, "host2": 10_000_000}  # the logger of each log directory, its first Size


class Replica:
    """One ``dis serve`` of the replica set, in its own directory, restartable."""

    def __init__(self, tmp: pathlib.Path, name: str) -> None:
        self.name = name
        self.dir = tmp / name
        self.dir.mkdir()
        self.port = free_port_pair()
        self.config = write_dis_config(self.dir, self.port, checkpoint_ms=300)
        self.proc: Proc | None = None
        self.kills = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = start_dis_process(self.dir, self.config)

    def kill9(self) -> None:
        self.proc.kill9()
        self.kills += 1

    def rows(self) -> dict[str, int]:
        with connect(self.address, retry_s=0) as c:
            return {f"{s.key.internal_partition}/{s.key.column_partition}": s.rows
                    for s in c.locations("Market", "Trade")}


class Follower(threading.Thread):
    """A client following the table: each snapshot of a location that shows more rows than it
    has read, it reads the new rows ``[seen, rows)`` (from whichever replica the client picks)."""

    def __init__(self, routing: pathlib.Path) -> None:
        super().__init__(daemon=True)
        self.client = connect(routing=str(routing), retry_s=60)
        self.seen: dict[str, int] = {}
        self.sizes: list[np.ndarray] = []
        self.error: BaseException | None = None
        self.lock = threading.Lock()

    def run(self) -> None:
        try:
            for snap in self.client.subscribe("Market", "Trade"):
                k = f"{snap.key.internal_partition}/{snap.key.column_partition}"
                start = self.seen.get(k, 0)
                if snap.rows <= start:
                    continue  # a replica that has not caught up yet (or an unchanged size)
                t = self.client.read_location(snap, ["Size"], start, snap.rows)
                assert t.num_rows == snap.rows - start, (k, start, snap.rows, t.num_rows)
                with self.lock:
                    self.sizes.append(np.asarray(t.column("Size")))
                    self.seen[k] = snap.rows
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e

    def all_sizes(self) -> np.ndarray:
        with self.lock:
            return np.concatenate(self.sizes) if self.sizes else np.zeros(0, np.int32)


@pytest.fixture
def spark(request):
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("the replicas end-to-end test needs Java 17 for its Spark streaming queries")
    from disd.spark import jvm

    jar, why = jvm.jar_status()
    assert jar is not None, why
    return request.getfixturevalue("spark_session")  # the run's one local session (tests/spark/conftest.py)


def exactly_once(sizes: np.ndarray, expected: np.ndarray, who: str) -> None:
    got = np.sort(sizes)
    dup = got[1:][got[1:] == got[:-1]]
    assert len(dup) == 0, f"{who} read {len(dup)} rows twice (e.g. Size {dup[:5].tolist()})"
    missing = np.setdiff1d(expected, got)
    extra = np.setdiff1d(got, expected)
    assert len(missing) == 0 and len(extra) == 0, (
        f"{who}: {len(missing)} rows missing (e.g. {missing[:5].tolist()}), {len(extra)} never logged")


@pytest.mark.spark
@pytest.mark.slow
def test_two_replicas_survive_kills_and_stay_identical(spark, tmp_path):
    replicas = [Replica(tmp_path, "r1"), Replica(tmp_path, "r2")]
    routing = tmp_path / "routing.yaml"
    routing.write_text(yaml.safe_dump({"instances": [{
        "name": "market", "tables": ["Market.*"],
        "replicas": [{"name": r.name, "address": r.address, "http_address": f"127.0.0.1:{r.port + 1}"}
                     for r in replicas]}]}))
    tailers, loggers = [], {}
    for ip in FEEDS:
        d = tmp_path / f"tailer-{ip}"
        (d / "logs").mkdir(parents=True)
        cfg = d / "tailer.yaml"
        cfg.write_text(yaml.safe_dump({"routing": str(routing), "log_dirs": [str(d / "logs")],
                                       "state_dir": str(d / "state"), "max_backoff_ms": 300,
                                       "metrics_port": free_port()}))
        tailers.append(Proc([str(BIN / "dis-tailer"), "--config", str(cfg)], d / "tailer.log"))
        loggers[ip] = (IntradayLoggerBuilder(str(SCHEMAS / "Market.Trade.yaml")).set_process_name(ip)
                       .set_log_dir(str(d / "logs")).set_column_partition_value(DAY).set_internal_partition(ip)
                       .build())
    logged: dict[str, int] = {ip: 0 for ip in FEEDS}
    writer_errors: list[BaseException] = []
    stop_writing = threading.Event()

    def write(ip: str) -> None:
        i = 0
        try:
            while not stop_writing.is_set():
                n = 50 + 31 * (i % 7)
                loggers[ip].log_batch(trade_rows(FEEDS[ip] + logged[ip], n), atomic=i % 3 != 0)
                logged[ip] += n
                i += 1
                time.sleep(0.03)
            loggers[ip].close()
        except BaseException as e:  # noqa: BLE001
            writer_errors.append(e)

    sinks = {"jvm": SizeSink(), "python": SizeSink()}
    queries = []
    follower = None
    writers = [threading.Thread(target=write, args=(ip,), daemon=True) for ip in FEEDS]
    try:
        for r in replicas:
            r.start()
        for t in tailers:
            t.start()
        for w in writers:
            w.start()
        for reader, sink in sinks.items():
            df = (spark.readStream.format("dis").option("reader", reader).option("routing", str(routing))
                  .option("table", "Market.Trade").option("maxRowsPerTrigger", "4000").load())
            queries.append(df.writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / f"ckpt-{reader}"))
                           .trigger(processingTime="200 milliseconds").start())
        follower = Follower(routing)
        follower.start()

        # Kill one replica at a time while rows flow, and bring it back.
        for victim in (replicas[0], replicas[1], replicas[0], replicas[1]):
            time.sleep(1.0)
            victim.kill9()
            time.sleep(0.5)  # the readers and the tailers meet a dead replica
            assert all(q.isActive for q in queries), [q.exception() for q in queries]
            victim.start()
        time.sleep(0.5)
        stop_writing.set()
        for w in writers:
            w.join(30)
        assert not writer_errors, writer_errors
        expected = np.concatenate([np.arange(FEEDS[ip], FEEDS[ip] + logged[ip]) for ip in FEEDS])
        final = {f"{ip}/{DAY}": n for ip, n in logged.items()}

        for r in replicas:
            wait_for(lambda: r.rows() == final, 60, 0.2, f"{r.name} publishing every logged row {final}")
        wait_for(lambda: len(follower.all_sizes()) >= len(expected) or follower.error, 60, 0.2,
                 "the follower reading every row")
        assert follower.error is None, follower.error
        for reader, sink in sinks.items():
            wait_for(lambda: len(sink.sizes()) >= len(expected), 60, 0.2, f"the {reader} streaming query")
        time.sleep(1.0)  # a duplicate would arrive now
        for q in queries:
            assert q.exception() is None, q.exception()
        exactly_once(follower.all_sizes(), expected, "the subscribing client")
        for reader, sink in sinks.items():
            exactly_once(sink.sizes(), expected, f"the {reader} streaming query")
        assert [r.kills for r in replicas] == [2, 2]
    finally:
        stop_writing.set()
        for q in queries:
            q.stop()
        if follower is not None:
            follower.client.close()
        for t in tailers:
            if t.alive():
                t.terminate()
        for r in replicas:
            if r.proc is not None and r.proc.alive():
                assert r.proc.terminate() == 0, r.proc.log_text()[-2000:]

    assert_identical({r.name: r.dir / "db" for r in replicas}, expect_locations=len(FEEDS))


def test_the_example_routing_file_names_a_replica_set():
    """``config/routing-replicas.yaml``, the starting point docs/replicas.md gives, is a valid
    routing whose Market tables have two replicas, each with its block endpoint."""
    from disd.routing import load_routing
    from support import ROOT

    r = load_routing(ROOT / "config" / "routing-replicas.yaml")
    reps = r.replicas("Market", "Trade")
    assert [x.name for x in reps] == ["dis-a1", "dis-a2"]
    assert all(x.http_address for x in reps)
    assert r.addresses == [x.address for x in reps]
