"""The fetch processes of a source (``disd.kafka.child``), with real ``dis serve`` processes on
librdkafka's mock cluster: one killed with SIGKILL while messages arrive, the DIS starts a new
one in its place, re-seeks only its partitions, and the table ends exactly the messages; the
DIS killed with SIGKILL leaves no fetch process behind; a DIS stopped in order stops them."""

from __future__ import annotations

import json
import os
import pathlib
import random
import signal
import time

import numpy as np
import yaml

from disd.kafka.config import MAX_FETCH_PROCESSES
from disd.kafka.link import default_fetch_processes, usable_cores
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


def command_line(pid: int) -> str:
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().decode()
    except OSError:
        return ""


def fetch_processes(dis_pid: int, n: int = 2) -> list[int]:
    """The DIS's ``n`` fetch processes, once each runs its own program: a child just forked has
    the DIS's command line until its exec, which on a busy machine can be seen."""
    def started() -> bool:
        pids = children(dis_pid)
        return len(pids) == n and all("disd.kafka.child" in command_line(pid) for pid in pids)

    wait_for(started, 20, 0.1, f"{n} fetch processes")
    pids = children(dis_pid)
    assert len(pids) == n
    return pids


def fetch_process(dis_pid: int) -> int:
    (pid,) = fetch_processes(dis_pid, 1)
    return pid


def log_events(dis, event: str) -> list[dict]:
    return [d for d in map(json.loads, filter(lambda line: line.startswith("{"), dis.log_text().splitlines()))
            if d.get("event") == event]


def test_fetch_process_killed_while_consuming(tmp_path, mock_kafka):
    n = 3000
    port = free_port_pair()
    cfg = write_config(tmp_path, port, mock_kafka.bootstrap, fetch_processes=1)
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
    assert "not the compiled reader" not in log  # every fetch process took its messages packed


def test_one_of_two_fetch_processes_killed_while_consuming(tmp_path, mock_kafka):
    """``fetch_processes: 2`` over 3 partitions: process 0 consumes partitions 0 and 2, process
    1 partition 1.  Process 1 is killed twice and process 0 once while messages arrive: each
    time only the killed one is replaced and only its partitions are assigned again; the other
    goes on (same pid); the table is exactly the messages."""
    n = 3000
    port = free_port_pair()
    cfg = write_config(tmp_path, port, mock_kafka.bootstrap, fetch_processes=2)
    producer = produce(mock_kafka.bootstrap, "trades", n, 3, 150, 0.1)
    dis = start_dis_process(tmp_path, cfg)
    rng = random.Random(182)
    try:
        wait_for(lambda: len(log_events(dis, "kafka partition assigned")) == 3, 20, 0.1, "the first assignments")
        pids = log_events(dis, "kafka source started")[0]["fetch_pids"]
        assert sorted(pids) == sorted(fetch_processes(dis.p.pid))
        for victim in (1, 0, 1):
            time.sleep(rng.uniform(0.5, 1.0))
            other = pids[1 - victim]
            os.kill(pids[victim], signal.SIGKILL)
            wait_for(lambda: not alive(pids[victim]), 10, 0.05, "the fetch process killed")
            wait_for(lambda: pids[victim] not in (fetch_processes(dis.p.pid)), 20, 0.1, "a new fetch process")
            now = fetch_processes(dis.p.pid)
            assert other in now, "the other fetch process was restarted too"
            pids[victim] = next(p for p in now if p != other)
        assert producer.wait(60) == 0
        wait_for(lambda: len(read_sizes(port)) >= n, 60, 0.2, "every message in the table")
        time.sleep(1.0)  # a duplicate would show by now
        sizes = read_sizes(port)
        assert len(sizes) == n and (sizes == np.arange(n)).all(), "lost or duplicated messages"
        assert sorted(fetch_processes(dis.p.pid)) == sorted(pids)
    finally:
        if producer.poll() is None:
            producer.kill()
        dis.terminate()
    lost = log_events(dis, "kafka fetch process lost; starting a new one")
    assert [e["fetch_process"] for e in lost] == [1, 0, 1]
    assigned = [(e["partition"], e["fetch_process"]) for e in log_events(dis, "kafka partition assigned")]
    # the first three, then each kill's own: partition 1 after the kills of process 1, 0 and 2 after process 0's
    assert sorted(assigned) == sorted([(0, 0), (1, 1), (2, 0), (1, 1), (0, 0), (2, 0), (1, 1)]), assigned
    assert "Traceback" not in dis.log_text()


def test_a_hung_fetch_process_is_killed_and_replaced(tmp_path, mock_kafka):
    """A fetch process stopped with SIGSTOP keeps its socket open and sends nothing: after
    ``stall_timeout_ms`` the DIS kills it, starts another and re-seeks its partitions; the other
    process goes on, and the table is exactly the messages."""
    n = 3000
    port = free_port_pair()
    cfg = write_config(tmp_path, port, mock_kafka.bootstrap, fetch_processes=2)
    data = yaml.safe_load(cfg.read_text())
    data["import"]["kafka"]["stall_timeout_ms"] = 2000
    cfg.write_text(yaml.safe_dump(data))
    producer = produce(mock_kafka.bootstrap, "trades", n, 3, 150, 0.1)
    dis = start_dis_process(tmp_path, cfg)
    try:
        wait_for(lambda: len(log_events(dis, "kafka partition assigned")) == 3, 20, 0.1, "the first assignments")
        pids = log_events(dis, "kafka source started")[0]["fetch_pids"]
        time.sleep(0.5)
        os.kill(pids[0], signal.SIGSTOP)  # partitions 0 and 2
        t0 = time.monotonic()
        wait_for(lambda: log_events(dis, "kafka fetch process hung; killing it"), 20, 0.1, "the hang seen")
        assert time.monotonic() - t0 >= 1.5, "taken as hung before stall_timeout_ms"
        wait_for(lambda: not alive(pids[0]), 10, 0.05, "the hung process killed")
        wait_for(lambda: len(fetch_processes(dis.p.pid)) == 2, 20, 0.1, "a new fetch process")
        assert pids[1] in fetch_processes(dis.p.pid), "the other fetch process was restarted too"
        assert producer.wait(60) == 0
        wait_for(lambda: len(read_sizes(port)) >= n, 60, 0.2, "every message in the table")
        time.sleep(1.0)  # a duplicate would show by now
        sizes = read_sizes(port)
        assert len(sizes) == n and (sizes == np.arange(n)).all(), "lost or duplicated messages"
    finally:
        if producer.poll() is None:
            producer.kill()
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGCONT)
        dis.terminate()
    hung = log_events(dis, "kafka fetch process hung; killing it")
    assert [e["fetch_process"] for e in hung] == [0], hung
    assert "sent nothing" in hung[0]["reason"] or "no batch" in hung[0]["reason"]
    assert "Traceback" not in dis.log_text()


def test_no_fetch_process_outlives_the_dis(tmp_path, mock_kafka):
    port = free_port_pair()
    cfg = write_config(tmp_path, port, mock_kafka.bootstrap, fetch_processes=2)
    assert produce(mock_kafka.bootstrap, "trades", 300, 3, 300, 0).wait(30) == 0
    dis = start_dis_process(tmp_path, cfg)
    try:
        pids = fetch_processes(dis.p.pid, 2)
        wait_for(lambda: len(read_sizes(port)) == 300, 30, 0.2, "the messages in the table")
        dis.kill9()
        wait_for(lambda: not any(map(alive, pids)), 10, 0.05, "the fetch processes gone with their DIS")
        # a DIS stopped in order stops its fetch processes; every message once across the restart
        dis = start_dis_process(tmp_path, cfg)
        pids = fetch_processes(dis.p.pid, 2)
        wait_for(lambda: len(read_sizes(port)) >= 300, 30, 0.2, "the messages in the table after the restart")
        time.sleep(1.0)
        assert (read_sizes(port) == np.arange(300)).all()
    finally:
        if dis.alive():
            assert dis.terminate() == 0
    assert not any(map(alive, pids))


def test_default_fetch_processes_one_per_partition(tmp_path, mock_kafka):
    """Without ``fetch_processes`` the DIS reads the topic's partitions before starting its
    fetch processes and starts one a partition (up to twice the cores): over 3 partitions every
    process has an equal share (with ``p % 2`` one process had two of the three and bounded the
    source), over 1 partition a second process would only idle."""
    cases = (("trades", default_fetch_processes(3, usable_cores())), ("one", 1))
    for topic, want in cases:
        tmp = tmp_path / topic
        tmp.mkdir()
        port = free_port_pair()
        dis = start_dis_process(tmp, write_config(tmp, port, mock_kafka.bootstrap, topic=topic))
        try:
            assert len(fetch_processes(dis.p.pid, want)) == want
            # logged once every fetch process is started, so a moment after they all show
            wait_for(lambda: log_events(dis, "kafka source started"), 10, 0.05, "the source's start logged")
            started = log_events(dis, "kafka source started")[0]
            assert (started["fetch_processes"], started["partitions"]) == (want, 3 if topic == "trades" else 1)
            wait_for(lambda: len(log_events(dis, "kafka partition assigned")) == (3 if topic == "trades" else 1),
                     20, 0.1, "the first assignments")
            owners = {e["partition"]: e["fetch_process"] for e in log_events(dis, "kafka partition assigned")}
            assert owners == {p: p % want for p in owners}
        finally:
            dis.terminate()
        assert "Traceback" not in dis.log_text()


def test_default_fetch_processes_rule():
    """One a partition, at most twice the usable cores and ``MAX_FETCH_PROCESSES``; 2 when the
    partitions could not be read at start."""
    assert default_fetch_processes(3, 2) == 3
    assert default_fetch_processes(1, 2) == 1
    assert default_fetch_processes(12, 2) == 4
    assert default_fetch_processes(1000, 64) == MAX_FETCH_PROCESSES
    assert default_fetch_processes(None, 8) == 2
    assert default_fetch_processes(0, 8) == 2
