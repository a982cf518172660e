"""The fetch process of a source (``disd.kafka.child``), with real ``dis serve`` processes on
librdkafka's mock cluster: killed with SIGKILL while messages arrive, the DIS starts a new one
and the table ends exactly the messages; the DIS killed with SIGKILL leaves no fetch process
behind; a DIS stopped in order stops it."""

from __future__ import annotations

import os
import pathlib
import random
import signal
import time

import numpy as np

from support import free_port_pair, start_dis_process, wait_for

from .test_kafka_exactly_once import produce, read_sizes, write_config


def children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (Linux /proc)."""
    out = []
    for task in pathlib.Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return [c for c in out if alive(c)]


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting to be reaped)."""
    try:
        status = pathlib.Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def fetch_process(dis_pid: int) -> int:
    pids: list[int] = []
    wait_for(lambda: len(pids := children(dis_pid)) == 1 or pids.clear(), 20, 0.1, "the fetch process")
    (pid,) = children(dis_pid)
    assert "disd.kafka.child" in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().decode()
    return pid


def test_fetch_process_killed_while_consuming(tmp_path, mock_kafka):
    n = 3000
    port = free_port_pair()
    cfg = write_config(tmp_path, port, mock_kafka.bootstrap)
    producer = produce(mock_kafka.bootstrap, "trades", n, 3, 150, 0.1)
    dis = start_dis_process(tmp_path, cfg)
    rng = random.Random(181)
    try:
        killed = []
        for _ in range(3):
            time.sleep(rng.uniform(0.5, 1.2))
            pid = fetch_process(dis.p.pid)
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            wait_for(lambda: not alive(pid), 10, 0.05, "the fetch process killed")
        assert producer.wait(60) == 0
        wait_for(lambda: len(read_sizes(port)) >= n, 60, 0.2, "every message in the table")
        time.sleep(1.0)  # a duplicate would show by now
        sizes = read_sizes(port)
        assert len(sizes) == n and (sizes == np.arange(n)).all(), "lost or duplicated messages"
        assert fetch_process(dis.p.pid) not in killed
        assert dis.alive()
    finally:
        if producer.poll() is None:
            producer.kill()
        dis.terminate()
    log = dis.log_text()
    assert log.count('"kafka fetch process lost; starting a new one"') == 3
    assert "Traceback" not in log


def test_no_fetch_process_outlives_the_dis(tmp_path, mock_kafka):
    port = free_port_pair()
    cfg = write_config(tmp_path, port, mock_kafka.bootstrap)
    assert produce(mock_kafka.bootstrap, "trades", 300, 3, 300, 0).wait(30) == 0
    dis = start_dis_process(tmp_path, cfg)
    try:
        pid = fetch_process(dis.p.pid)
        wait_for(lambda: len(read_sizes(port)) == 300, 30, 0.2, "the messages in the table")
        dis.kill9()
        wait_for(lambda: not alive(pid), 10, 0.05, "the fetch process gone with its DIS")
        # a DIS stopped in order stops its fetch process; every message once across the restart
        dis = start_dis_process(tmp_path, cfg)
        pid = fetch_process(dis.p.pid)
        wait_for(lambda: len(read_sizes(port)) >= 300, 30, 0.2, "the messages in the table after the restart")
        time.sleep(1.0)
        assert (read_sizes(port) == np.arange(300)).all()
    finally:
        if dis.alive():
            assert dis.terminate() == 0
    assert not alive(pid)
