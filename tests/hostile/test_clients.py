"""Misbehaving and numerous clients against a real DIS on loopback: a client killed with an open
transaction, clients that send nothing, many streams at once, and streams competing for one
location."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest

from disd.client import connect
from support import TRADE, log_name, running_dis, trade_rows, wait_for, write_log

from .helpers import HeldStream, channel, chunk_msg, open_msg, split_frames

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def dis(tmp_path):
    with running_dis(tmp_path / "db", idle_timeout_s=1.0, max_workers=128) as srv:
        yield srv


def published(port: int, ip: str) -> int:
    with connect(f"127.0.0.1:{port}") as c:
        return sum(loc.rows for loc in c.locations("Market", "Trade") if loc.key.internal_partition == ip)


def sizes_of(port: int, ip: str) -> list[int]:
    """The Size column of one internal partition's location, as published."""
    with connect(f"127.0.0.1:{port}") as c:
        snap = next(loc for loc in c.locations("Market", "Trade") if loc.key.internal_partition == ip)
        return c.read_location(snap, ["Size"]).column("Size").to_pylist()


class Watcher:
    """Subscribes for the whole test and records the largest row count ever published per
    internal partition: proof that rolled-back rows were never visible, not merely gone."""

    def __init__(self, port: int) -> None:
        self.max_rows: dict[str, int] = {}
        self._client = connect(f"127.0.0.1:{port}")
        self._ready = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        assert self._ready.wait(10)

    def _run(self) -> None:
        self._ready.set()
        try:
            for snap in self._client.subscribe("Market", "Trade"):
                ip = snap.key.internal_partition
                self.max_rows[ip] = max(self.max_rows.get(ip, 0), snap.rows)
        except Exception:  # noqa: BLE001 - ends when the client is closed
            pass

    def close(self) -> None:
        self._client.close()


def test_client_killed_mid_transaction_is_rolled_back_never_published_and_resumed(dis, tmp_path):
    """A client process sends 5 single rows and the first 4 rows of a transaction, is
    acknowledged, then dies (SIGKILL).  The 4 rows are truncated away and were never published;
    the next client resumes after row 5 and its resent transaction commits once."""
    path = tmp_path / log_name("vanish")
    committed_end = write_log(path, TRADE, trade_rows(0, 5), [3] * 5)
    write_log(path, TRADE, trade_rows(5, 4), [1, 0, 0, 0])
    watcher = Watcher(dis.port)
    child = subprocess.Popen([sys.executable, os.path.join(HERE, "vanishing_client.py"), str(dis.port), str(path),
                              TRADE.fingerprint], stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        assert line.split()[:2] == ["acked", "5"], line
        loc = next(held for held in dis.engine.locations() if held.key.internal_partition == "vanish")
        assert loc.written_rows == 9 and loc.txn_open  # the transaction's rows are in the buffers
        time.sleep(0.2)  # several flush intervals: the open transaction must stay unpublished
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
    wait_for(lambda: dis.sessions.get(loc.key) is None, what="the DIS noticing the dead client")
    wait_for(lambda: loc.written_rows == 5 and not loc.txn_open, what="rollback")
    assert loc.import_state["rows_rolled_back"] == 4
    time.sleep(0.2)
    assert published(dis.port, "vanish") == 5
    # every count ever published was seen by the subscriber: the open transaction (9) never was
    assert watcher.max_rows["vanish"] == 5
    # the writer comes back and ends the transaction; a new client resumes where the DIS says
    write_log(path, TRADE, trade_rows(9, 1), [2])
    s = HeldStream(channel(dis.port))
    r = s.send(open_msg("vanish", TRADE.fingerprint))
    assert (r.resume.file_name, r.resume.offset) == (path.name, committed_end)
    data = path.read_bytes()
    ack = s.send(chunk_msg(path.name, committed_end, data[committed_end:]))
    assert ack.ack.committed_rows == 10
    s.close()
    wait_for(lambda: published(dis.port, "vanish") == 10, what="publication of the resumed rows")
    assert sizes_of(dis.port, "vanish") == list(range(10))
    watcher.close()


def test_client_that_opens_and_then_sends_nothing_is_closed_after_the_idle_timeout(dis):
    s = HeldStream(channel(dis.port))
    s.send(open_msg("idle", TRADE.fingerprint))
    t0 = time.monotonic()
    err = s.error(timeout=10)
    assert err.code() == grpc.StatusCode.CANCELLED
    assert "idle" in err.details(), err.details()
    assert 0.9 < time.monotonic() - t0 < 5
    assert dis.sessions.get(next(iter(loc.key for loc in dis.engine.locations()))) is None


def test_client_that_sends_nothing_at_all_is_closed_after_the_idle_timeout(dis):
    """Not even ``open``: such a stream must not hold a server thread forever."""
    s = HeldStream(channel(dis.port))
    t0 = time.monotonic()
    err = s.error(timeout=10)
    assert err.code() == grpc.StatusCode.CANCELLED
    assert "idle" in err.details(), err.details()
    assert time.monotonic() - t0 < 5


def _send_log(port: int, ip: str, data: bytes, name: str, results: dict, step: int = 3) -> None:
    try:
        header, frames = split_frames(data)
        s = HeldStream(channel(port))
        r = s.send(open_msg(ip, TRADE.fingerprint))
        assert r.resume.file_name == ""
        pieces = [(0, len(header) + len(frames[0].payload) + 16)]
        for f in frames[1:]:
            pieces.append((f.offset, f.offset + 16 + len(f.payload)))
        for i in range(0, len(pieces), step):
            a, b = pieces[i][0], pieces[min(i + step, len(pieces)) - 1][1]
            ack = s.send(chunk_msg(name, a, data[a:b]))
        s.close()
        results[ip] = ack.ack.committed_rows
    except BaseException as e:  # noqa: BLE001 - reported by the test
        results[ip] = e


def test_fifty_concurrent_streams_to_distinct_locations(dis, tmp_path):
    n_loc, rows_per_frame, frames = 50, 200, 10
    logs = {}
    for k in range(n_loc):
        ip = f"many{k:02d}"
        p = tmp_path / log_name(ip)
        for f in range(frames):
            write_log(p, TRADE, trade_rows(f * rows_per_frame, rows_per_frame), [3] * rows_per_frame)
        logs[ip] = p
    results: dict = {}
    threads = [threading.Thread(target=_send_log, args=(dis.port, ip, p.read_bytes(), p.name, results))
               for ip, p in logs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(v == rows_per_frame * frames for v in results.values()), results
    assert len(results) == n_loc
    with connect(f"127.0.0.1:{dis.port}") as c:
        wait_for(lambda: sum(loc.rows for loc in c.locations("Market", "Trade")) == n_loc * rows_per_frame * frames)
        t = c.read_table("Market", "Trade")
    assert t.num_rows == n_loc * rows_per_frame * frames
    counts = np.bincount(np.asarray(t.column("Size")), minlength=rows_per_frame * frames)
    assert (counts == n_loc).all()  # each location holds 0..1999 once


def test_a_second_stream_for_a_location_takes_it_over_and_the_first_is_told_why(dis, tmp_path):
    path = tmp_path / log_name("shared")
    write_log(path, TRADE, trade_rows(0, 10), [3] * 10)
    write_log(path, TRADE, trade_rows(10, 10), [3] * 10)
    data = path.read_bytes()
    header, frames = split_frames(data)
    first_end = frames[1].offset
    a = HeldStream(channel(dis.port))
    a.send(open_msg("shared", TRADE.fingerprint))
    assert a.send(chunk_msg(path.name, 0, data[:first_end])).ack.committed_rows == 10
    b = HeldStream(channel(dis.port))
    r = b.send(open_msg("shared", TRADE.fingerprint))
    assert (r.resume.file_name, r.resume.offset) == (path.name, first_end)
    err = a.error()
    assert err.code() == grpc.StatusCode.CANCELLED and "taken over" in err.details(), err.details()
    assert b.send(chunk_msg(path.name, first_end, data[first_end:])).ack.committed_rows == 20
    b.close()
    wait_for(lambda: published(dis.port, "shared") == 20)
    assert sizes_of(dis.port, "shared") == list(range(20))


def test_streams_racing_for_one_location_never_duplicate_or_lose_rows(dis, tmp_path):
    """Four clients send the same log to one location at the same time, each reconnecting when
    it is taken over and resuming where the DIS says, like duplicated tailers.  Transactions
    span frames.  The location ends with every committed row exactly once, in order."""
    path = tmp_path / log_name("race")
    n = 0
    for k in range(40):
        if k % 3 == 2:  # a transaction over two frames
            write_log(path, TRADE, trade_rows(n, 5), [1, 0, 0, 0, 0])
            write_log(path, TRADE, trade_rows(n + 5, 5), [0, 0, 0, 0, 2])
            n += 10
        else:
            write_log(path, TRADE, trade_rows(n, 7), [3] * 7)
            n += 7
    data = path.read_bytes()
    header, frames = split_frames(data)
    bounds = [0] + [f.offset + 16 + len(f.payload) for f in frames]
    ends = {b: i for i, b in enumerate(bounds)}
    errors: list = []
    done = threading.Event()

    def racer(seed: int) -> None:
        rng = np.random.default_rng(seed)
        ch = channel(dis.port)
        try:
            while not done.is_set():
                s = HeldStream(ch, timeout=30)
                try:
                    r = s.send(open_msg("race", TRADE.fingerprint))
                    off = r.resume.offset if r.resume.file_name else 0
                    i = ends[off] if off else 0
                    while i < len(frames):
                        j = min(len(frames), i + int(rng.integers(1, 4)))
                        a, b = (0 if i == 0 else bounds[i]), bounds[j]
                        s.send(chunk_msg(path.name, a, data[a:b]))
                        i = j
                        time.sleep(float(rng.random()) * 0.002)
                    done.set()
                except grpc.RpcError as e:
                    if e.code() != grpc.StatusCode.CANCELLED or "taken over" not in (e.details() or ""):
                        if e.code() != grpc.StatusCode.INVALID_ARGUMENT:
                            errors.append((e.code(), e.details()))
                except StopIteration:
                    pass
                finally:
                    s.close()
        except BaseException as e:  # noqa: BLE001
            errors.append(repr(e))
        finally:
            ch.close()

    threads = [threading.Thread(target=racer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:5]
    assert done.is_set()
    wait_for(lambda: published(dis.port, "race") == n, what=f"{n} rows published")
    assert sizes_of(dis.port, "race") == list(range(n))
