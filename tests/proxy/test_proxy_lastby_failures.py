"""Last-by through a real ``dis proxy`` while the DIS behind it fails: a ``dis serve`` killed with
``kill -9`` and restarted (it recovers to fewer rows and republishes them as its tailer resends),
and the followed replica of a set killed.  Readers through the proxy never see a state go back;
every state they are given is exactly the last-by of the rows it says it covers; subscriptions
stay open and end at the DIS's final state."""

from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa

from disd.blocks import replica_order
from disd.client import connect
from disd.names import LocationKey
from disd.rpc.keys import key_from_proto
from disd.storage.lastby import from_ipc, last_by
from lastby.support_lastby import random_updates
from support import sample, scrape, start_dis_process, start_tailer, wait_for

from .lastby_support import LastBySubscriber
from .proxy_support import Dis, logger, metrics_port, replica_set, start_proxy, write_proxy_config

KEY = LocationKey("Market", "Trade", "feed0", "2026-11-22")
KEYS = 1000


def _log(lg, start: int, n: int) -> None:
    lg.log_batch(random_updates(start, n, KEYS, seed=31), atomic=True)
    lg.flush()


def _opened(proxy) -> int:
    """How many times the proxy's last-by feed opened an upstream stream (its log says)."""
    return sum("upstream last-by subscription open" in line for line in proxy.log_text().splitlines())


def _all_rows(address: str) -> pa.Table:
    with connect(address, retry_s=30) as c:
        return c.read_table("Market", "Trade").drop_columns(["Date"])


class Poller:
    """A reader calling ``LastBy`` through the proxy every 50 ms (its own thread): every
    ``(rows, state)`` it was answered for KEY."""

    def __init__(self, address: str) -> None:
        self.answers: list[tuple[int, pa.Table]] = []
        self.errors: list[str] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(address,), daemon=True)
        self.thread.start()

    def _run(self, address: str) -> None:
        with connect(address, retry_s=30) as c:
            while not self.done.is_set():
                try:
                    for m in c.last_by_states("Market", "Trade"):
                        if key_from_proto(m.key) == KEY:
                            self.answers.append((m.rows, from_ipc(m.arrow_ipc)))
                except Exception as e:  # noqa: BLE001 - recorded, asserted on below
                    self.errors.append(str(e))
                time.sleep(0.05)

    def stop(self) -> None:
        self.done.set()
        self.thread.join(60)


def _check_readers(subs: list[LastBySubscriber], poller: Poller, rows: pa.Table, first: int) -> None:
    """Every state given is the last-by of the rows it covers, rows never go back, and each
    subscriber ends at the last-by of every row."""
    final = last_by(rows, ["Sym"])
    for s in subs:
        assert s.error is None, s.error
        sizes = s.sizes(KEY)
        assert sizes[0] == first and sizes[-1] == rows.num_rows, sizes
        assert all(a < b for a, b in zip(sizes, sizes[1:])), f"rows went back or came twice: {sizes}"
        assert s.state(KEY).equals(final)
    assert not poller.errors, poller.errors[:3]
    got = [r for r, _ in poller.answers]
    assert got and got == sorted(got), got[:50]
    for r in sorted(set(got)):  # each distinct answer: exactly the last-by of rows [0, r)
        state = next(t for n, t in poller.answers if n == r)
        assert state.equals(last_by(rows.slice(0, r), ["Sym"])), f"the state at {r} rows differs"


def _stop(lg, poller: Poller | None, subs: list[LastBySubscriber], proxy) -> None:
    """What a test started besides its DIS, stopped: the log, the poller, the subscribers, the proxy."""
    lg.close()
    if poller is not None:
        poller.stop()
    for s in subs:
        s.close()
    if proxy is not None and proxy.alive():
        proxy.terminate()


def test_upstream_dis_killed_and_restarted(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    # Checkpoints far apart: the restarted DIS recovers to fewer rows than it had published and
    # rebuilds its state as its tailer resends them (states the proxy must hold back).
    dis = Dis(tmp_path, logs, last_by=("Sym",), checkpoint_ms=600_000).start()
    proxy, subs, poller = None, [], None
    lg = logger(logs)
    try:
        _log(lg, 0, 3000)
        wait_for(lambda: _all_rows(dis.address).num_rows == 3000, 60, 0.1, "3000 rows at the DIS")
        config, port = write_proxy_config(tmp_path, {"address": dis.address})
        proxy = start_proxy(tmp_path, config)
        address = f"127.0.0.1:{port}"
        subs = [LastBySubscriber(address) for _ in range(5)]
        wait_for(lambda: all(s.rows(KEY) == 3000 for s in subs), 30, 0.05, "the current state")
        _log(lg, 3000, 2000)
        wait_for(lambda: all(s.rows(KEY) == 5000 for s in subs), 30, 0.05, "5000 rows")
        with connect(dis.address, retry_s=0) as c:
            assert c.status().locations[0].checkpointed_rows < 5000
        poller = Poller(address)
        wait_for(lambda: poller.answers, 30, 0.05, "a LastBy answer through the proxy")
        dis.proc.kill9()
        dis.tailer.kill9()
        _log(lg, 5000, 1000)  # logged while the DIS is down
        # The DIS alone first: it serves the state of the rows it recovered (none checkpointed),
        # fewer than the proxy published, until its tailer resends them.
        dis.proc = start_dis_process(dis.dir, dis.config)
        wait_for(lambda: _opened(proxy) == 2, 30, 0.05, "the proxy's feed on the restarted DIS")
        with connect(dis.address, retry_s=0) as c:
            behind = {key_from_proto(m.key): m.rows for m in c.last_by_states("Market", "Trade")}
        assert behind.get(KEY, 0) < 5000, behind
        n = len(poller.answers)
        wait_for(lambda: len(poller.answers) > n + 5, 30, 0.05, "LastBy answers through the proxy meanwhile")
        assert poller.answers[-1][0] == 5000 and all(s.rows(KEY) == 5000 for s in subs)
        dis.tailer = start_tailer(dis.dir, dis.dir / "tailer.yaml")
        wait_for(lambda: all(s.rows(KEY) == 6000 for s in subs), 60, 0.05, "6000 rows after the restart")
        _log(lg, 6000, 500)
        wait_for(lambda: all(s.rows(KEY) == 6500 for s in subs), 30, 0.05, "6500 rows")
        wait_for(lambda: poller.answers[-1][0] == 6500, 30, 0.05, "LastBy at 6500 rows")
        poller.stop()
        rows = _all_rows(dis.address)
        assert np.array_equal(rows.column("Size").to_numpy(), np.arange(6500))
        _check_readers(subs, poller, rows, 3000)
        assert min(r for r, _ in poller.answers) >= 5000  # never behind what readers were given
        with connect(dis.address, retry_s=0) as d, connect(address, retry_s=0) as p:
            assert p.last_by("Market", "Trade").equals(d.last_by("Market", "Trade"))
        m = scrape(metrics_port(config))
        assert {s.labels["table"]: s.value for s in m["dis_proxy_upstream_lastby_subscriptions"]} == {
            "Market.Trade": 1.0}
        assert sample(m, "dis_proxy_lastby_subscribers") == 5
    finally:
        _stop(lg, poller, subs, proxy)
        dis.stop()


def test_followed_replica_killed_the_feed_moves_to_the_other(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    replicas, routing = replica_set(tmp_path, logs, last_by=("Sym",))
    proxy, subs, poller = None, [], None
    lg = logger(logs)
    try:
        for r in replicas:
            r.start()
        _log(lg, 0, 3000)
        for r in replicas:
            wait_for(lambda: _all_rows(r.address).num_rows == 3000, 60, 0.1, f"3000 rows at {r.address}")
        config, port = write_proxy_config(tmp_path, {"routing": str(routing)})
        proxy = start_proxy(tmp_path, config)
        address = f"127.0.0.1:{port}"
        subs = [LastBySubscriber(address) for _ in range(5)]
        poller = Poller(address)
        wait_for(lambda: all(s.rows(KEY) == 3000 for s in subs), 30, 0.05, "the current state")
        # the feed follows the table's first replica in rendezvous order, as the size feed does
        followed = replica_order("Market.Trade", [r.address for r in replicas])[0]
        assert f'"dis": "{followed}"' in next(line for line in proxy.log_text().splitlines()
                                              if "upstream last-by subscription open" in line)
        victim = next(r for r in replicas if r.address == followed)
        other = next(r for r in replicas if r is not victim)
        victim.stop()  # kill -9 the followed replica and its tailer
        _log(lg, 3000, 1500)
        wait_for(lambda: all(s.rows(KEY) == 4500 for s in subs), 60, 0.05, "4500 rows from the other replica")
        wait_for(lambda: poller.answers and poller.answers[-1][0] == 4500, 30, 0.05, "LastBy at 4500 rows")
        poller.stop()
        assert any(f'"dis": "{other.address}"' in line for line in proxy.log_text().splitlines()
                   if "upstream last-by subscription open" in line)
        _check_readers(subs, poller, _all_rows(other.address), 3000)
    finally:
        _stop(lg, poller, subs, proxy)
        for r in replicas:
            r.stop()
