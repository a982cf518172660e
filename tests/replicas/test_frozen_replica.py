"""A replica frozen without dying (docs/reliability.md, "A frozen replica"): a real ``dis serve``
stopped with SIGSTOP, which is what the cgroup freezer does to a process (its kernel still
accepts and acknowledges TCP, the process answers nothing: no gRPC reply, no HTTP/2 ping ack),
without needing cgroups, so this runs everywhere.

Two ``dis serve`` replicas of one routing entry, one ``dis-tailer`` streaming to both, one
``dis proxy`` in front of them, a logger writing a small transaction every 100 ms and a reader
subscribed through the proxy.  The replica the proxy follows is frozen for ``FREEZE_S``:

* the tailer declares its streams to it broken: ``dis_tailer_replica_connected{replica}`` goes
  to 0 within ``DOWN_WITHIN_S`` (DisReplicaDown's condition), while the other replica keeps
  receiving every row.  The bound is the tailer's keepalive (``keepalive_ms`` 2 s +
  ``keepalive_timeout_ms`` 3 s, the defaults) and slack, short of its answer deadline
  (``ack_timeout_ms``, 15 s): the pings are what notice a frozen process;
* the proxy leaves it for the other replica (its feeds' keepalive, ``upstream.keepalive_s`` 2 s +
  ``upstream.keepalive_timeout_s`` 3 s), says so in ``dis_proxy_upstream_streams_lost_total``,
  and the reader sees rows logged during the freeze within ``READERS_WITHIN_S`` of the freeze
  (seconds, not the freeze's length), never a size going down;
* after SIGCONT everything heals: the replica is connected again, both replicas and the proxy
  hold every row exactly once, and the replicas' column files are byte-identical.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import yaml

from disd.client import connect
from disd.rpc.channel import open_channel
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from support import BIN, Proc, free_port, sample, scrape, trade_rows, wait_for

from proxy.proxy_support import Dis, logger, metrics_port, start_proxy, write_proxy_config
from replicas.test_determinism import assert_identical

#: How long the replica stays frozen: well past the bounds below, well short of the 45 s freeze
#: of the cgroup test (tests/realfaults/test_partitions.py).
FREEZE_S = 20.0
#: Most seconds from the freeze until the tailer says the replica is not connected: its
#: keepalive's 5 s and slack for a loaded machine, below its 15 s answer deadline.
DOWN_WITHIN_S = 10.0
#: Most seconds from the freeze until a reader of the proxy sees rows logged during it: the
#: proxy's keepalive's 5 s, a listing at the other replica, and slack.
READERS_WITHIN_S = 10.0
LOC = "feed0/2026-11-22"
#: Rows of each transaction, one every 100 ms.  Few: the rows of the whole freeze fit in the
#: frozen replica's socket buffers, so no TCP timeout notices the freeze for the tailer (with more,
#: unsent bytes behind a closed TCP window can end the connection after ``TCP_USER_TIMEOUT``,
#: which is luck, not a guarantee: docs/reliability.md).
TXN = 10


class Writer:
    """The application: a ``TXN``-row transaction every 100 ms, on a thread; ``logged`` so far."""

    def __init__(self, logs) -> None:  # noqa: ANN001
        self.lg = logger(logs)
        self.logged = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.lg.log_batch(trade_rows(self.logged, TXN), atomic=True)
            self.lg.flush()
            self.logged += TXN
            self._stop.wait(0.1)

    def stop(self) -> int:
        self._stop.set()
        self.thread.join(10)
        self.lg.close()
        return self.logged


class TimedSubscriber:
    """A reader's Subscribe stream through the proxy: (monotonic time, rows) of each snapshot."""

    def __init__(self, address: str) -> None:
        self.channel = open_channel(address)
        self.seen: list[tuple[float, int]] = []
        self.error: Exception | None = None
        self.call = dis_pb2_grpc.TableDataStub(self.channel).Subscribe(
            dis_pb2.SubscribeRequest(namespace="Market", table="Trade"))
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for m in self.call:
                if f"{m.key.internal_partition}/{m.key.column_partition}" == LOC:
                    self.seen.append((time.monotonic(), m.rows))
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = e

    def last(self) -> int:
        return self.seen[-1][1] if self.seen else -1

    def first_above(self, rows: int) -> float | None:
        return next((t for t, n in self.seen if n > rows), None)

    def close(self) -> None:
        self.call.cancel()
        self.thread.join(5)
        self.channel.close()


def _rows(address: str) -> int:
    with connect(address, retry_s=0, timeout_s=2) as c:
        return sum(s.rows for s in c.locations("Market", "Trade"))


def _sizes(address: str) -> np.ndarray:
    with connect(address, retry_s=30) as c:
        return np.sort(np.asarray(c.read_table("Market", "Trade", columns=["Size"])["Size"], np.int64))


def _connected(metrics_port: int, replica: str) -> float | None:
    try:
        return sample(scrape(metrics_port), "dis_tailer_replica_connected", replica=replica)
    except OSError:
        return None


def _lost(proxy_config, address: str) -> float:
    """``dis_proxy_upstream_streams_lost_total`` of the proxy's Trade feed at ``address``."""
    return sample(scrape(metrics_port(proxy_config)), "dis_proxy_upstream_streams_lost_total",
                  table="Market.Trade", dis=address) or 0.0


def test_a_frozen_replica_is_left_by_the_tailer_and_the_proxy_and_heals(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    replicas = {name: Dis(tmp_path, logs, name) for name in ("r1", "r2")}
    routing = tmp_path / "routing.yaml"
    routing.write_text(yaml.safe_dump({"instances": [{"name": "market", "tables": ["Market.*"], "replicas": [
        {"name": n, "address": r.address} for n, r in replicas.items()]}]}))
    tailer_metrics = free_port()
    tcfg = tmp_path / "tailer.yaml"
    tcfg.write_text(yaml.safe_dump({"routing": str(routing), "log_dirs": [str(logs)],
                                    "state_dir": str(tmp_path / "tailer-state"), "poll_interval_ms": 20,
                                    "max_backoff_ms": 500, "metrics_port": tailer_metrics}))
    tailer = proxy = writer = sub = frozen = None
    try:
        for r in replicas.values():
            r.start(tailer=False)
        tailer = Proc([str(BIN / "dis-tailer"), "--config", str(tcfg)], tmp_path / "tailer.log").start()
        pcfg, pport = write_proxy_config(tmp_path, {"routing": str(routing)})
        proxy = start_proxy(tmp_path, pcfg)
        writer = Writer(logs)
        sub = TimedSubscriber(f"127.0.0.1:{pport}")
        wait_for(lambda: sub.last() >= 10 * TXN and all(_rows(r.address) >= 10 * TXN for r in replicas.values()),
                 60, 0.1, "rows at both replicas and through the proxy")
        assert all(_connected(tailer_metrics, n) == 1 for n in replicas)
        followed = [n for n, r in replicas.items() if sample(r.metrics(), "dis_subscribers") == 1]
        assert len(followed) == 1, f"the proxy follows one replica of the set: {followed}"
        name = followed[0]
        frozen = replicas[name]
        other = next(r for n, r in replicas.items() if n != name)
        lost_before = _lost(pcfg, frozen.address)

        os.kill(frozen.proc.p.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        at_freeze = writer.logged
        down_at = None
        while time.monotonic() - t0 < FREEZE_S:
            if down_at is None and _connected(tailer_metrics, name) == 0:
                down_at = time.monotonic()
            time.sleep(0.1)
        other_rows = _rows(other.address)
        during = writer.logged
        os.kill(frozen.proc.p.pid, signal.SIGCONT)
        thawed = time.monotonic()
        readers_at = sub.first_above(at_freeze)
        print(f"froze {name} for {FREEZE_S:.0f} s at {at_freeze} rows; tailer said it is down after "
              f"{None if down_at is None else round(down_at - t0, 2)} s; the reader saw new rows after "
              f"{None if readers_at is None else round(readers_at - t0, 2)} s; the other replica had {other_rows} "
              f"of {during} rows")

        assert down_at is not None and down_at - t0 <= DOWN_WITHIN_S, \
            f"dis_tailer_replica_connected{{replica={name!r}}} stayed 1 for {DOWN_WITHIN_S} s of the freeze"
        assert other_rows >= at_freeze + (FREEZE_S - 3) * 5 * TXN, \
            f"the other replica stopped receiving: {other_rows} rows of {during} logged"
        assert readers_at is not None and readers_at - t0 <= READERS_WITHIN_S, \
            f"the proxy's readers saw no row logged during the freeze within {READERS_WITHIN_S} s: " \
            f"{sub.seen[-3:]} (at the freeze: {at_freeze})"
        assert _lost(pcfg, frozen.address) > lost_before, "the proxy did not count the stream it left"

        # healing: connected again, every row exactly once everywhere, replicas byte-identical
        wait_for(lambda: _connected(tailer_metrics, name) == 1, 30, 0.1, f"{name} connected again")
        print(f"connected again {round(time.monotonic() - thawed, 2)} s after the thaw")
        logged = writer.stop()
        writer = None
        want = np.arange(logged)
        for r in replicas.values():
            wait_for(lambda: _rows(r.address) == logged, 60, 0.1, f"every row at {r.dir.name}")
        wait_for(lambda: sub.last() == logged, 30, 0.1, "every row through the proxy")
        for address in (*(r.address for r in replicas.values()), f"127.0.0.1:{pport}"):
            assert np.array_equal(_sizes(address), want), f"{address}: not every row exactly once"
        sizes = [n for _, n in sub.seen]
        assert all(a < b for a, b in zip(sizes, sizes[1:])), "a reader saw a size go down or come twice"
        assert sub.error is None, sub.error
        for r in replicas.values():
            assert r.proc.terminate() == 0
        assert_identical({n: r.dir / "db" for n, r in replicas.items()}, 1)
    finally:
        if frozen is not None and frozen.proc.alive():
            os.kill(frozen.proc.p.pid, signal.SIGCONT)
        if writer is not None:
            writer.stop()
        if sub is not None:
            sub.close()
        for p in (tailer, proxy):
            if p is not None and p.alive():
                p.kill9()
        for r in replicas.values():
            r.stop()
