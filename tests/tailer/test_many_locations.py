"""Many locations in one tailer: what each costs.  A location is state on the tailer's event loop,
not a thread; the streams to one DIS share one connection (one ``Multiplex`` call, or against an
older DIS HTTP/2 streams of one channel); and with inotify an idle location waits for its events
instead of polling every ``poll_interval_ms``."""

from __future__ import annotations

import threading
import time

import pytest

from disd.tailer import Tailer
from support import wait_for

from .fakedis import FakeDis
from .helpers import config, name, write

LOCATIONS = 8


@pytest.fixture
def dis():
    d = FakeDis().start()
    yield d
    d.stop()


def test_a_location_costs_no_thread(tmp_path, dis):
    """Every location is state on the tailer's one event loop: against a DIS that does not know
    ``Multiplex`` (this fake one) each location's stream is a ``Stream`` call of its own on that
    loop, the calls share one connection, and the tailer's threads are the same for 8 locations
    as for one: the loop and the scanner (and whatever threads gRPC keeps for the process).  A
    thread per location was 10,000 threads at 10,000 locations."""
    for i in range(LOCATIONS):
        write(tmp_path / name(ip=f"ip{i}"), 5)
    earlier = set(threading.enumerate())  # the objects: an ended thread's ident is reused
    with Tailer(config(dis.address, tmp_path)) as t:
        assert t.wait_idle(30)
        assert len(dis.peers) == LOCATIONS
        assert len(set(dis.peers)) == 1, sorted(set(dis.peers))
        # more rows while the streams are open: acks still flow through the loop
        ends = [write(tmp_path / name(ip=f"ip{i}"), 3, 5) for i in range(LOCATIONS)]
        wait_for(lambda: [dis.log_of(f"ip{i}").offset for i in range(LOCATIONS)] == ends, 10, 0.01,
                 "the appends acknowledged")
        # the fake DIS's threads (its pool's, and a receiver per stream) run in this process
        # and are not counted
        names = [th.name for th in threading.enumerate() if th not in earlier
                 and not th.name.startswith("ThreadPoolExecutor") and not th.name.endswith("(receive)")]
        assert "tailer loop" in names and "tailer scan" in names, names
        assert not any(n.startswith("tailer Market") for n in names), names
        assert len(names) <= 4, names
        assert all(w.is_alive() for w in t.workers()) and len(t.workers()) == LOCATIONS


def test_idle_workers_wait_for_events_not_the_poll(tmp_path, dis):
    for i in range(LOCATIONS):
        write(tmp_path / name(ip=f"ip{i}"), 5)
    t = Tailer(config(dis.address, tmp_path, poll_interval_ms=50))
    looks = {"n": 0}
    files_of = t.files_of

    def counted(key):  # counts how often the workers look at their files
        looks["n"] += 1
        return files_of(key)

    t.files_of = counted
    with t:
        assert t.wait_idle(30)
        if not t.watcher.watches_all(t.dirs):
            pytest.skip("no inotify here: workers poll")
        time.sleep(0.3)
        before = looks["n"]
        time.sleep(1.0)
        idle_looks = looks["n"] - before
        # polling every 50 ms, 8 workers would look about 160 times a second; waiting for events,
        # at most the 2 s rescan wakes them (8 looks) plus the status calls of wait_idle (none here)
        assert idle_looks <= 2 * LOCATIONS, idle_looks
        # an append still reaches the DIS at once: inotify wakes the location's worker
        path = tmp_path / name(ip="ip3")
        t0 = time.monotonic()
        end = write(path, 3, 5)
        wait_for(lambda: dis.log_of("ip3").offset == end, 5, 0.005, "the append acknowledged")
        assert time.monotonic() - t0 < 1.0


def test_streams_are_opened_a_few_at_a_time(tmp_path):
    """Many locations starting at once open their streams at most ``MAX_OPENING`` at a time per
    DIS: a gRPC server rejects calls that arrive while about a thousand wait to be picked up
    (its pending-request backlog, ``grpc.server.max_pending_requests``), and at 2,000 locations
    the tailers' streams failed with INTERNAL or CANCELLED before the DIS saw them.  Here each
    open takes the DIS 30 ms; without the cap all 40 would be waiting at once."""
    n = 40
    d = FakeDis(open_delay=0.03, workers=n + 8).start()
    try:
        for i in range(n):
            write(tmp_path / name(ip=f"ip{i}"), 5)
        with Tailer(config(d.address, tmp_path)) as t:
            assert t.wait_idle(30)
            assert len(d.peers) == n  # every location opened once: none failed and retried
            assert 1 < d.max_opening <= 16, d.max_opening  # MAX_OPENING
    finally:
        d.stop()


def test_the_locations_of_a_tailer_share_one_multiplexed_call_and_one_dis_thread(tmp_path):
    """The default runtime against a real DIS (in this process): every location's stream is a
    stream of one ``Multiplex`` call, which the DIS reads with one thread, and each location's
    rows arrive exactly."""
    from disd.client import connect
    from support import running_dis

    logs = tmp_path / "logs"
    logs.mkdir()
    for i in range(LOCATIONS):
        write(logs / name(ip=f"ip{i}"), 5 + i)
    with running_dis(tmp_path / "db") as srv, Tailer(config(f"127.0.0.1:{srv.port}", logs)) as t:
        assert t.wait_idle(30)
        readers = [th for th in threading.enumerate() if th.name == "ingest-mux-reader"]
        assert len(readers) == 1, [th.name for th in threading.enumerate()]
        sessions = srv.sessions.sessions()
        assert len(sessions) == LOCATIONS and len({s.peer for s in sessions}) == 1
        with connect(f"127.0.0.1:{srv.port}") as c:
            wait_for(lambda: sorted(loc.rows for loc in c.locations("Market", "Trade"))
                     == [5 + i for i in range(LOCATIONS)], 20)
