"""Readers ride out a DIS restart: the client retries an unreachable DIS (and a read of rows the
restarted DIS has not yet republished) for ``retry_s`` seconds, then fails saying how long it
waited; with ``retry_s=0`` it fails at once.  Real ``dis serve`` processes, killed with -9."""

from __future__ import annotations

import threading
import time

import pytest

from disd.client import DisClientError, connect
from support import ROOT, free_port_pair, wait_for, write_dis_config
from support import start_dis_process as start_dis


def _feed(port: int, logs, n: int) -> None:
    from disd.logger import IntradayLoggerBuilder
    from disd.tailer import Tailer, parse_tailer_config

    log = (IntradayLoggerBuilder(str(ROOT / "config/schemas/Market.Trade.yaml")).set_log_dir(logs)
           .set_internal_partition("ip1").set_column_partition_value("2026-11-22").build())
    log.log_batch({"Sym": ["S"] * n, "Size": list(range(n))})
    log.close()
    with Tailer(parse_tailer_config({"dis": f"127.0.0.1:{port}", "log_dirs": [str(logs)]})) as t:
        assert t.wait_idle(30)


def test_a_client_rides_out_kill_9_and_restart(tmp_path):
    port = free_port_pair()
    cfg = write_dis_config(tmp_path, port)
    dis = start_dis(tmp_path, cfg)
    restarted = []
    try:
        _feed(port, tmp_path / "logs", 5000)
        client = connect(f"127.0.0.1:{port}", retry_s=60)
        wait_for(lambda: client.status().locations and client.status().locations[0].checkpointed_rows == 5000,
                 20, what="rows checkpointed")
        dis.kill9()

        with pytest.raises(DisClientError, match="unreachable") as e:
            connect(f"127.0.0.1:{port}", retry_s=0).read_table("Market", "Trade")
        assert "tried for" not in str(e.value)  # at once
        t0 = time.monotonic()
        with pytest.raises(DisClientError, match=r"unreachable.*\(tried for 1 s\)"):
            connect(f"127.0.0.1:{port}", retry_s=1).read_table("Market", "Trade")
        assert 0.9 < time.monotonic() - t0 < 10

        def restart() -> None:
            time.sleep(3)
            restarted.append(start_dis(tmp_path, cfg))

        threading.Thread(target=restart, daemon=True).start()
        t0 = time.monotonic()
        table = client.read_table("Market", "Trade")  # issued while the DIS is down
        assert time.monotonic() - t0 >= 2.5 and restarted
        assert table.num_rows == 5000 and table.column("Size").to_pylist() == list(range(5000))
        client.close()
    finally:
        for p in (dis, *restarted):
            if p.alive():
                p.kill9()


def test_a_subscription_continues_across_a_restart(tmp_path):
    port = free_port_pair()
    cfg = write_dis_config(tmp_path, port)
    dis = start_dis(tmp_path, cfg)
    procs = [dis]
    try:
        _feed(port, tmp_path / "logs", 100)
        client = connect(f"127.0.0.1:{port}", retry_s=60)
        seen: list[int] = []

        def follow() -> None:
            for snap in client.subscribe("Market", "Trade"):
                seen.append(snap.rows)
                if snap.rows >= 300:
                    return

        t = threading.Thread(target=follow, daemon=True)
        t.start()
        wait_for(lambda: 100 in seen, 20, what="the first size")
        wait_for(lambda: client.status().locations[0].checkpointed_rows == 100, 20, what="checkpointed")
        dis.terminate()
        procs.append(start_dis(tmp_path, cfg))
        _feed(port, tmp_path / "logs2", 200)  # a second log file of the same location
        t.join(60)
        assert not t.is_alive() and seen[-1] == 300, seen
        client.close()
    finally:
        for p in procs:
            if p.alive():
                p.kill9()


def test_calls_racing_a_graceful_stop_are_retried(tmp_path):
    """A call that reaches a DIS as it stops, before a handler takes it, ends CANCELLED with the
    text "CANCELLED" (grpc/grpc#41785), not UNAVAILABLE.  Its caller did not cancel it: readers
    that hammer a DIS through five SIGTERM restarts see every call answered, none an error."""
    port = free_port_pair()
    cfg = write_dis_config(tmp_path, port)
    procs = [start_dis(tmp_path, cfg)]
    _feed(port, tmp_path / "logs", 10)
    stop = threading.Event()
    answered: list[int] = []
    errors: list[str] = []

    def hammer() -> None:
        client = connect(f"127.0.0.1:{port}", retry_s=60)
        try:
            while not stop.is_set():
                answered.append(len(client.locations("Market", "Trade")))
        except Exception as e:  # noqa: BLE001 - the test's point: any error is a failure
            errors.append(repr(e))
        finally:
            client.close()

    threads = [threading.Thread(target=hammer, daemon=True) for _ in range(4)]
    try:
        for t in threads:
            t.start()
        for _ in range(5):
            time.sleep(0.5)
            assert procs[-1].terminate() == 0
            procs.append(start_dis(tmp_path, cfg))
        time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join(30)
        assert not errors, errors
        assert answered and set(answered) == {1}, set(answered)
    finally:
        stop.set()
        for p in procs:
            if p.alive():
                p.kill9()
