"""The tailer against a small Ingest servicer on loopback: resume, order, backpressure,
following growing files, moving on, reconnecting, refusals, corruption, schema changes."""

from __future__ import annotations

import time

import grpc
import pytest

from disd.tailer import Tailer
from support import TRADE, wait_for

from .fakedis import FakeDis, LocationLog
from .helpers import TRADE2, config, name, sizes_from_rows, write


@pytest.fixture
def dis():
    d = FakeDis().start()
    yield d
    d.stop()


def next_frame(path, n, start, tmp_path) -> bytes:
    """The bytes write() would append to ``path`` next, without touching it."""
    scratch = tmp_path / "scratch" / path.name
    scratch.parent.mkdir(exist_ok=True)
    scratch.write_bytes(path.read_bytes())
    before = scratch.stat().st_size
    write(scratch, n, start)
    return scratch.read_bytes()[before:]


def append(path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def rows_received(st: LocationLog) -> list[int]:
    out = []
    for f in sorted(st.data):
        out += sizes_from_rows(bytes(st.data[f]))
    return out


def test_streams_every_file_in_order_and_reports_idle(tmp_path, dis):
    write(tmp_path / name(hour=10), 5, 5)
    write(tmp_path / name(hour=9), 5, 0)
    with Tailer(config(dis.address, tmp_path)) as t:
        assert t.wait_idle(20)
        st = dis.log_of("ip1")
        assert [c[0] for c in st.chunks] == [name(hour=9), name(hour=10)]
        assert rows_received(st) == list(range(10))
        s = t.status()["Market/Trade/ip1/2026-11-22"]
        end = (tmp_path / name(hour=10)).stat().st_size
        assert (s["file"], s["sent_offset"], s["acked_file"], s["acked_offset"]) == (name(hour=10), end, name(hour=10), end)
        assert s["state"] == "following" and s["dis"] == dis.address
        assert st.opens == [TRADE.fingerprint]


def test_follows_a_growing_file_then_moves_to_the_next(tmp_path, dis):
    p1 = tmp_path / name(hour=9)
    write(p1, 3, 0)
    with Tailer(config(dis.address, tmp_path)) as t:
        assert t.wait_idle(20)
        write(p1, 3, 3)  # the file grows
        assert t.wait_idle(20)
        assert rows_received(dis.log_of("ip1")) == list(range(6))
        # a torn tail: the writer is mid-frame; only whole frames are sent, the tail waits
        frame = next_frame(p1, 4, 6, tmp_path)
        append(p1, frame[:-7])
        time.sleep(0.2)
        assert t.wait_idle(20)
        assert rows_received(dis.log_of("ip1")) == list(range(6))
        append(p1, frame[-7:])  # the frame completes
        assert t.wait_idle(20)
        assert rows_received(dis.log_of("ip1")) == list(range(10))
        write(tmp_path / name(hour=10), 2, 10)  # a newer file: the tailer moves on
        assert t.wait_idle(20)
        assert rows_received(dis.log_of("ip1")) == list(range(12))
        write(p1, 1, 99)  # late rows in the old file are not sent any more
        write(tmp_path / name(hour=10), 1, 12)
        assert t.wait_idle(20)
        assert rows_received(dis.log_of("ip1")) == list(range(13))


def test_a_torn_tail_with_a_newer_file_is_left_after_the_grace_period(tmp_path, dis):
    p1 = tmp_path / name(hour=9)
    end = write(p1, 3, 0)
    write(p1, 3, 3)
    p1.write_bytes(p1.read_bytes()[: -5])  # the writer died mid-frame...
    write(tmp_path / name(hour=10), 2, 6)  # ...and a new one started a new file
    with Tailer(config(dis.address, tmp_path, torn_tail_grace_ms=300)) as t:
        t0 = time.monotonic()
        wait_for(lambda: dis.log_of("ip1").file_name == name(hour=10), 20, what="moved to the newer file")
        assert time.monotonic() - t0 >= 0.25
        assert t.wait_idle(20)
    st = dis.log_of("ip1")
    assert rows_received(st) == [0, 1, 2, 6, 7]
    assert st.chunks[0] == (name(hour=9), 0, end)


def test_resumes_where_the_dis_says(tmp_path, dis):
    write(tmp_path / name(hour=8), 5, 0)
    end1 = write(tmp_path / name(hour=9), 5, 5)
    write(tmp_path / name(hour=9), 5, 10)
    write(tmp_path / name(hour=10), 5, 15)
    st = dis.log_of("ip1")
    st.file_name, st.offset = name(hour=9), end1  # the DIS has everything up to here
    st.data[name(hour=9)] = bytearray((tmp_path / name(hour=9)).read_bytes()[:end1])
    with Tailer(config(dis.address, tmp_path)) as t:
        assert t.wait_idle(20)
    assert st.chunks[0] == (name(hour=9), end1, (tmp_path / name(hour=9)).stat().st_size - end1)
    assert name(hour=8) not in st.data  # older than the resume file: skipped
    assert rows_received(st) == list(range(5, 20))


def test_a_resume_file_that_is_gone_continues_with_newer_files(tmp_path, dis):
    write(tmp_path / name(hour=10), 5, 0)
    st = dis.log_of("ip1")
    st.file_name, st.offset = name(hour=9), 1234
    with Tailer(config(dis.address, tmp_path)) as t:
        assert t.wait_idle(20)
    assert st.chunks[0][:2] == (name(hour=10), 0)


def test_backpressure_bounds_unacknowledged_bytes(tmp_path):
    p = tmp_path / name()
    for i in range(60):
        write(p, 200, i * 200)  # frames of about 6 KB
    dis = FakeDis(ack_delay=0.005).start()
    try:
        limit, chunk = 40_000, 12_000
        with Tailer(config(dis.address, tmp_path, chunk_bytes=chunk, max_in_flight_bytes=limit)) as t:
            assert t.wait_idle(30)
        st = dis.log_of("ip1")
        assert st.offset == p.stat().st_size and not dis.errors
        assert max(n for _, _, n in st.chunks) <= chunk
        assert len(st.chunks) >= 30  # several frames per chunk, and many chunks
        assert 0 < dis.max_unacked <= limit, dis.max_unacked
        assert rows_received(st) == list(range(12000))
    finally:
        dis.stop()


def test_refused_location_is_retried_and_does_not_stop_the_others(tmp_path, dis):
    write(tmp_path / name(), 5)
    write(tmp_path / name(ip="bad"), 5)
    dis.refuse["bad"] = (grpc.StatusCode.NOT_FOUND, "unknown table Market.Trade")
    with Tailer(config(dis.address, tmp_path, retry_refused_ms=200)) as t:
        wait_for(lambda: dis.log_of("ip1").offset == (tmp_path / name()).stat().st_size, 20, what="ip1 ingested")
        s = wait_for(lambda: (lambda s: s if s["state"] == "refused" else None)(
            t.status()["Market/Trade/bad/2026-11-22"]), 20, what="refusal seen")
        assert "NOT_FOUND" in s["error"] and "unknown table" in s["error"]
        assert not t.wait_idle(0.3)  # the refused location's rows are not acknowledged
        wait_for(lambda: len(dis.log_of("bad").opens) >= 2, 20, what="retried")
        del dis.refuse["bad"]  # the DIS learns the table: the next retry succeeds
        assert t.wait_idle(20)
    assert rows_received(dis.log_of("bad")) == list(range(5))


def test_reconnects_with_backoff_after_the_dis_restarts(tmp_path):
    store: dict = {}
    dis = FakeDis(store=store).start()
    port = dis.port
    p = tmp_path / name()
    write(p, 5, 0)
    t = Tailer(config(dis.address, tmp_path, max_backoff_ms=200)).start()
    try:
        assert t.wait_idle(20)
        dis.stop()
        write(p, 5, 5)
        wait_for(lambda: t.status()["Market/Trade/ip1/2026-11-22"]["state"] == "reconnecting", 20, what="stream failed")
        time.sleep(0.5)
        dis2 = FakeDis(store=store).start(port)  # same state: it resumes where the old one was
        try:
            assert t.wait_idle(20)
            assert rows_received(store["ip1"]) == list(range(10))
            assert not dis2.errors
        finally:
            dis2.stop()
    finally:
        t.stop()


def test_a_dis_that_lost_everything_gets_everything_again(tmp_path):
    dis = FakeDis().start()
    write(tmp_path / name(), 5, 0)
    t = Tailer(config(dis.address, tmp_path)).start()
    try:
        assert t.wait_idle(20)
        port = dis.port
        dis.stop()
        dis2 = FakeDis().start(port)  # empty: resume from the start
        try:
            wait_for(lambda: dis2.log_of("ip1").chunks, 20, what="resent")
            assert t.wait_idle(20)
            assert dis2.log_of("ip1").chunks[0][:2] == (name(), 0)
            assert rows_received(dis2.log_of("ip1")) == list(range(5))
        finally:
            dis2.stop()
    finally:
        t.stop()


def test_a_corrupt_file_stops_only_its_location(tmp_path, dis):
    bad = tmp_path / name(ip="bad")
    end1 = write(bad, 5, 0)
    write(bad, 5, 5)
    data = bytearray(bad.read_bytes())
    data[end1 + 20] ^= 0xFF
    bad.write_bytes(bytes(data))
    write(tmp_path / name(), 5)
    with Tailer(config(dis.address, tmp_path)) as t:
        s = wait_for(lambda: (lambda s: s if s["state"] == "corrupt" else None)(
            t.status()["Market/Trade/bad/2026-11-22"]), 20, what="corruption seen")
        assert f"byte {end1}" in s["error"]
        wait_for(lambda: dis.log_of("ip1").offset == (tmp_path / name()).stat().st_size, 20, what="ip1 ingested")
        assert dis.log_of("bad").offset == end1  # the frames before the corruption went through
        assert not t.wait_idle(0.3)
        bad.write_bytes(bytes(data[:end1]))  # the operator cuts the bad frame off
        assert t.wait_idle(20)


def test_a_new_schema_fingerprint_reopens_the_stream(tmp_path, dis):
    write(tmp_path / name(hour=9), 3, 0)
    write(tmp_path / name(hour=10), 3, 3, schema=TRADE2)
    with Tailer(config(dis.address, tmp_path)) as t:
        assert t.wait_idle(20)
    st = dis.log_of("ip1")
    fps = list(dict.fromkeys(st.opens))
    assert len(fps) == 2 and fps[1] == TRADE2.fingerprint
    assert rows_received(st) == list(range(6))


def test_polling_without_inotify_finds_new_files_and_growth(tmp_path, dis):
    with Tailer(config(dis.address, tmp_path), use_inotify=False) as t:
        assert not t.watcher.inotify
        write(tmp_path / name(), 3, 0)
        wait_for(lambda: t.status(), 10, what="location found")
        assert t.wait_idle(20)
        write(tmp_path / name(), 3, 3)
        assert t.wait_idle(20)
    assert rows_received(dis.log_of("ip1")) == list(range(6))


def test_log_dir_created_after_start(tmp_path, dis):
    logs = tmp_path / "later"
    with Tailer(config(dis.address, logs)) as t:
        assert t.wait_idle(5)
        logs.mkdir()
        write(logs / name(), 3, 0)
        wait_for(lambda: dis.log_of("ip1").chunks, 20, what="streamed")
        assert t.wait_idle(20)


def test_stop_is_prompt_while_the_dis_is_down(tmp_path):
    write(tmp_path / name(), 3)
    t = Tailer(config("127.0.0.1:1", tmp_path)).start()  # nothing listens there
    wait_for(lambda: t.status().get("Market/Trade/ip1/2026-11-22", {}).get("state") == "reconnecting", 20, what="failing")
    t0 = time.monotonic()
    t.stop()
    assert time.monotonic() - t0 < 3
    assert t.status()["Market/Trade/ip1/2026-11-22"]["state"] == "stopped"


def test_an_abandoned_file_without_a_header_does_not_block_the_location(tmp_path, dis):
    (tmp_path / name(hour=8)).write_bytes(b"")  # a writer died before writing the header
    (tmp_path / name(hour=9)).write_bytes(b"DISBLOG\x00\x01")  # ... or in the middle of it
    write(tmp_path / name(hour=10), 3, 0)
    with Tailer(config(dis.address, tmp_path)) as t:
        assert t.wait_idle(20)
    st = dis.log_of("ip1")
    assert [c[0] for c in st.chunks] == [name(hour=10)]
    assert rows_received(st) == [0, 1, 2]


def test_rows_written_one_at_a_time_to_a_slow_dis_coalesce_into_chunks(tmp_path):
    # A location written a row at a time sends a chunk per row while the DIS keeps up; when
    # the DIS is slower than the rows (acks 0.3 s after each chunk), the caught-up rows wait
    # for the chunk in flight and go together, so the DIS's chunks grow instead of queueing.
    p = tmp_path / name()
    write(p, 1, 0)
    dis = FakeDis(ack_delay=0.3).start()
    try:
        with Tailer(config(dis.address, tmp_path)) as t:
            n = 60
            for i in range(1, n):
                write(p, 1, i)
                time.sleep(0.02)
            assert t.wait_idle(30)
        st = dis.log_of("ip1")
        assert rows_received(st) == list(range(n)) and not dis.errors
        # 1.2 s of rows over 0.3 s acks: a few chunks (one per ack), so five rows or more a
        # chunk on average, not one per row (59 chunks without the rule).  No comparison of
        # chunk sizes: the first carries the log's header, which outweighs a dozen rows.
        assert len(st.chunks) <= 12, len(st.chunks)
    finally:
        dis.stop()


def test_a_waiting_location_does_not_hold_the_others_back(tmp_path, dis):
    # Every location is a coroutine of one event loop: a location refused (and waiting a minute
    # to retry) and locations following their files (waiting for rows) leave the loop to the
    # location that has rows to send.
    write(tmp_path / name(ip="bad"), 5)
    dis.refuse["bad"] = (grpc.StatusCode.NOT_FOUND, "unknown table Market.Trade")
    ips = ["ip1", "ip2", "ip3"]
    with Tailer(config(dis.address, tmp_path, retry_refused_ms=60_000)):
        wait_for(lambda: dis.log_of("bad").opens, 20, what="the refusal")
        for round_ in range(3):
            for ip in ips:
                write(tmp_path / name(ip=ip), 5, 5 * round_)
            for ip in ips:
                p = tmp_path / name(ip=ip)
                wait_for(lambda: dis.log_of(ip).offset == p.stat().st_size, 20, what=f"{ip} round {round_}")
    for ip in ips:
        assert rows_received(dis.log_of(ip)) == list(range(15))
