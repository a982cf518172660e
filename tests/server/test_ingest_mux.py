"""The ``Ingest.Multiplex`` call on a real DIS, driven frame by frame: many locations' streams on
one call, each with ``Stream``'s protocol and statuses."""

from __future__ import annotations

import contextlib
import os
import pathlib
import queue
import threading
import time

import grpc
import pytest

from disd.binlog import LocationKey
from disd.client import connect
from disd.rpc.ingestwire import ChunkOut, encode_mux_request, parse_mux_request
from disd.rpc.keys import key_to_proto
from disd.rpc.v1 import dis_pb2
from disd.server import ingestmux
from disd.storage import writeout
from disd.storage.fsio import OsFileSystem
from faults.disk import engines_on
from support import TRADE, append_rows, running_dis, trade_rows, wait_for, write_log

from .conftest import FILE1, KEY, IngestStream, frames_of

KEY2 = LocationKey("Market", "Trade", "feed2", "2026-11-22")
FILE2 = FILE1.replace("feed1", "feed2")


class MuxCall:
    """A hand-driven Multiplex call: write requests of frames, read replies one at a time."""

    def __init__(self, port: int) -> None:
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        call = self.channel.stream_stream("/disd.rpc.v1.Ingest/Multiplex", request_serializer=None,
                                          response_deserializer=dis_pb2.MuxResponse.FromString)
        self._q: queue.Queue = queue.Queue()
        self.responses = call(iter(self._q.get, None))
        self._replies: list[dis_pb2.MuxReply] = []

    def send(self, *frames) -> None:
        self._q.put(encode_mux_request(list(frames)))

    def reply(self) -> dis_pb2.MuxReply:
        while not self._replies:
            self._replies.extend(next(self.responses).replies)
        return self._replies.pop(0)

    def replies(self, n: int) -> list[dis_pb2.MuxReply]:
        return [self.reply() for _ in range(n)]

    def close(self) -> None:
        self._q.put(None)
        self.channel.close()


def open_frame(key: LocationKey, fingerprint: str = TRADE.fingerprint) -> bytes:
    return dis_pb2.IngestRequest(open=dis_pb2.IngestOpen(
        location=key_to_proto(key), schema_fingerprint=fingerprint, tailer_id="mux-test")).SerializeToString()


def chunks(path: pathlib.Path, start: int = 0) -> list[ChunkOut]:
    return [ChunkOut(path.name, off, data, False) for off, data in frames_of(path, TRADE, start)]


def sizes(port: int, n: int) -> list[int]:
    """The table's ``Size`` values, sorted, once it has ``n`` rows published."""
    with connect(f"127.0.0.1:{port}") as c:
        wait_for(lambda: sum(loc.rows for loc in c.locations("Market", "Trade")) == n)
        return sorted(c.read_table("Market", "Trade").column("Size").to_pylist())


def test_two_locations_on_one_call(dis, tmp_path):
    p1, p2 = tmp_path / FILE1, tmp_path / FILE2
    write_log(p1, TRADE, trade_rows(0, 100), [3] * 100)
    write_log(p2, TRADE, trade_rows(1000, 40), [1] + [0] * 38 + [2])
    m = MuxCall(dis.port)
    m.send((1, open_frame(KEY)), (2, open_frame(KEY2)))
    r = {x.stream: x for x in m.replies(2)}
    assert r[1].response.resume.file_name == "" and r[2].response.resume.accepts_reports
    c1, c2 = chunks(p1), chunks(p2)
    # one request interleaving both locations' chunks: each stream's acks, in its own order
    m.send(*[(1, c) for c in c1], *[(2, c) for c in c2])
    acks = m.replies(len(c1) + len(c2))
    last = {x.stream: x.response.ack for x in acks}
    assert [x.stream for x in acks if x.stream == 1] == [1] * len(c1)
    assert (last[1].file_name, last[1].offset, last[1].committed_rows) == (FILE1, p1.stat().st_size, 100)
    assert (last[2].file_name, last[2].committed_rows) == (FILE2, 40)
    m.send((1, None), (2, None))
    ends = {x.stream: x.end for x in m.replies(2)}
    assert ends[1].code == ends[2].code == grpc.StatusCode.OK.value[0]
    m.close()
    assert sizes(dis.port, 140) == list(range(100)) + list(range(1000, 1040))


def test_a_refused_stream_ends_alone(dis, tmp_path):
    p1 = tmp_path / FILE1
    write_log(p1, TRADE, trade_rows(0, 10), [3] * 10)
    m = MuxCall(dis.port)
    m.send((1, open_frame(KEY)), (2, open_frame(LocationKey("Market", "Nope", "x", "2026-11-22"))),
           (3, open_frame(KEY2, fingerprint="deadbeef")))
    r = {x.stream: x for x in m.replies(3)}
    assert r[1].WhichOneof("body") == "response"
    assert r[2].end.code == grpc.StatusCode.NOT_FOUND.value[0] and "unknown table Market.Nope" in r[2].end.details
    assert r[3].end.code == grpc.StatusCode.FAILED_PRECONDITION.value[0] and "schema mismatch" in r[3].end.details
    # frames for an ended stream are dropped; a bad chunk ends only its own stream
    first, *rest = chunks(p1)
    m.send((2, first), (1, ChunkOut(FILE1, 5, first.data[5:], False)))
    bad = m.reply()
    assert bad.stream == 1 and bad.end.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "offset 0" in bad.end.details
    m.send((4, open_frame(KEY)))
    assert m.reply().response.resume.file_name == ""
    m.send((4, first), *[(4, c) for c in rest])
    assert m.replies(1 + len(rest))[-1].response.ack.committed_rows == 10
    m.close()


def test_the_opens_of_one_request_open_together_and_refusals_create_nothing(dis, tmp_path):
    """A request with many opens has its new locations opened side by side, on the call's
    opener (``MuxCall._open_group``); an open refused for its schema is refused
    as alone, and its location is not created."""
    keys = [LocationKey("Market", "Trade", f"feed{i}", "2026-11-22") for i in range(10, 16)]
    bad = LocationKey("Market", "Trade", "bad", "2026-11-22")
    m = MuxCall(dis.port)
    m.send(*[(i + 1, open_frame(k)) for i, k in enumerate(keys)], (20, open_frame(bad, fingerprint="deadbeef")),
           (21, open_frame(LocationKey("Market", "Nope", "x", "2026-11-22"))))
    r = {x.stream: x for x in m.replies(len(keys) + 2)}
    assert all(r[i + 1].response.resume.accepts_reports for i in range(len(keys)))
    assert r[20].end.code == grpc.StatusCode.FAILED_PRECONDITION.value[0] and "schema mismatch" in r[20].end.details
    assert r[21].end.code == grpc.StatusCode.NOT_FOUND.value[0]
    trade = tmp_path / "db" / "Intraday" / "Market" / "Trade"
    assert all((trade / k.internal_partition / k.column_partition / "Trade" / "table.size").exists() for k in keys)
    assert not (trade / "bad").exists()
    p = tmp_path / FILE1.replace("feed1", "feed12")
    write_log(p, TRADE, trade_rows(0, 7), [3] * 7)
    m.send(*[(3, c) for c in chunks(p)])
    assert m.replies(len(chunks(p)))[-1].response.ack.committed_rows == 7
    m.close()


def test_a_stream_taken_over_by_another_call_ends_with_cancelled(dis, tmp_path):
    p1 = tmp_path / FILE1
    write_log(p1, TRADE, trade_rows(0, 10), [3] * 10)
    m = MuxCall(dis.port)
    m.send((1, open_frame(KEY)), (2, open_frame(KEY2)))
    m.replies(2)
    s = IngestStream(dis.port)
    assert s.open(fingerprint=TRADE.fingerprint).WhichOneof("body") == "resume"
    end = m.reply()
    assert end.stream == 1 and end.end.code == grpc.StatusCode.CANCELLED.value[0]
    assert "taken over" in end.end.details
    # the call and its other stream go on
    p2 = tmp_path / FILE2
    write_log(p2, TRADE, trade_rows(0, 7), [3] * 7)
    m.send(*[(2, c) for c in chunks(p2)])
    assert m.replies(len(chunks(p2)))[-1].response.ack.committed_rows == 7
    m.close()
    s.close()


@pytest.mark.parametrize("how", ["end", "cut"])
def test_a_stream_ended_mid_transaction_rolls_back(dis, tmp_path, how):
    p1 = tmp_path / FILE1
    write_log(p1, TRADE, trade_rows(0, 5), [3] * 5)
    off = p1.stat().st_size
    write_log(p1, TRADE, trade_rows(5, 5), [1, 0, 0, 0, 0])  # a transaction without its End
    m = MuxCall(dis.port)
    m.send((1, open_frame(KEY)))
    m.reply()
    c = chunks(p1)
    m.send(*[(1, x) for x in c])
    assert m.replies(len(c))[-1].response.ack.committed_rows == 5
    if how == "end":
        m.send((1, None))
        assert m.reply().end.code == 0
    else:
        m.close()  # the whole call goes
    m2 = MuxCall(dis.port)
    m2.send((1, open_frame(KEY)))
    resume = m2.reply().response.resume
    assert (resume.file_name, resume.offset) == (FILE1, off)
    write_log(p1, TRADE, trade_rows(10, 1), [2])
    c = chunks(p1, start=off)
    m2.send(*[(1, x) for x in c])
    assert m2.replies(len(c))[-1].response.ack.committed_rows == 11
    m2.close()
    assert sizes(dis.port, 11) == list(range(11))
    if how == "end":
        m.close()


def test_malformed_bytes_end_the_call_and_the_dis_goes_on(tmp_path):
    from support import running_dis

    with running_dis(tmp_path / "db") as srv:
        m = MuxCall(srv.port)
        m._q.put(bytes([0x0A, 50]) + b"short")  # a frame's length past the message's end  # noqa: SLF001 - the test feeds the parser bytes no client sends
        with pytest.raises(grpc.RpcError) as ei:
            m.reply()
        assert ei.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNKNOWN)
        m.close()
        p1 = tmp_path / FILE1
        write_log(p1, TRADE, trade_rows(0, 3), [3] * 3)
        m = MuxCall(srv.port)
        m.send((1, open_frame(KEY)))
        assert m.reply().response.resume.file_name == ""
        c = chunks(p1)
        m.send(*[(1, x) for x in c])
        assert m.replies(len(c))[-1].response.ack.committed_rows == 3
        m.close()


def test_a_call_that_sends_nothing_is_cancelled_and_an_idle_stream_ended(tmp_path):
    from support import running_dis

    with running_dis(tmp_path / "db", idle_timeout_s=1.0) as srv:
        silent = MuxCall(srv.port)
        with pytest.raises(grpc.RpcError) as ei:
            silent.reply()
        assert ei.value.code() == grpc.StatusCode.CANCELLED and "without an 'open'" in ei.value.details()
        silent.close()
        m = MuxCall(srv.port)
        m.send((1, open_frame(KEY)))
        assert m.reply().WhichOneof("body") == "response"
        end = m.reply()  # nothing more sent: the stream is ended, the call stays
        assert end.stream == 1 and end.end.code == grpc.StatusCode.CANCELLED.value[0]
        assert "idle for" in end.end.details
        m.send((2, open_frame(KEY)))
        assert m.reply().response.resume.file_name == ""
        m.close()


class HeldDisk(OsFileSystem):
    """The real disk, whose writes made by a ``Multiplex`` call's reader (a chunk's blocks,
    written as the chunk is taken) wait, once ``held``, until the test lets them go."""

    def __init__(self) -> None:
        self.held = False
        self.writing = threading.Event()  # a held write has started
        self.go = threading.Event()

    def pwrite(self, fd: int, data, offset: int) -> int:
        if self.held and threading.current_thread().name == "ingest-mux-reader":
            self.writing.set()
            self.go.wait(30)
        return super().pwrite(fd, data, offset)


@pytest.fixture
def held_dis(tmp_path, monkeypatch):
    """A DIS whose engine writes on a ``HeldDisk`` in 4 KiB blocks (a chunk of a thousand rows
    fills blocks, so taking it writes), and the requests of its ``Multiplex`` calls as parsed,
    in the order gRPC handed them over (``parsed``)."""
    disk = HeldDisk()
    engines_on(monkeypatch, disk)
    parsed: list[list] = []

    def parse(raw: bytes):
        frames = parse_mux_request(raw)
        parsed.append(frames)
        return frames

    monkeypatch.setattr(ingestmux, "parse_mux_request", parse)
    with running_dis(tmp_path / "db", storage={"block_size_bytes": 4096}) as srv:
        try:
            yield srv, disk, parsed
        finally:
            disk.go.set()  # a failed test leaves no write waiting


def test_the_next_request_is_received_while_a_chunk_is_written_and_acked_only_after(held_dis, tmp_path):
    srv, disk, parsed = held_dis
    path = tmp_path / FILE1
    append_rows(path, 0, 3000, frames=3)
    a, b, c = chunks(path)
    m = MuxCall(srv.port)
    m.send((1, open_frame(KEY)))
    assert m.reply().response.resume.file_name == ""
    replies: queue.Queue = queue.Queue()

    def collect() -> None:
        with contextlib.suppress(grpc.RpcError):  # the call closed at the end
            for r in m.responses:
                replies.put(r)

    threading.Thread(target=collect, daemon=True).start()
    disk.held = True
    m.send((1, a))
    assert disk.writing.wait(10), "taking the chunk wrote nothing"
    m.send((1, b))
    m.send((1, c))
    # while the first chunk is being written, the next request has been received and parsed ...
    wait_for(lambda: len(parsed) == 3, timeout=5, what="the request after the one being written, received")
    # ... but no more (the read-ahead is one request), and nothing is acknowledged before its write
    time.sleep(0.3)
    assert len(parsed) == 3
    assert replies.empty(), replies.get()
    disk.go.set()
    acks = []
    while len(acks) < 3:
        acks.extend(r.response.ack for r in replies.get(timeout=10).replies)
    assert [x.offset for x in acks] == [x.offset + len(x.data) for x in (a, b, c)]
    assert acks[-1].committed_rows == 3000
    assert sizes(srv.port, 3000) == list(range(3000))
    m.close()


def replies_within(m: MuxCall, n: int, timeout_s: float) -> list[dis_pb2.MuxReply]:
    """The call's next ``n`` replies; fails when they take longer than ``timeout_s``."""
    got: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: got.put(m.replies(n)), daemon=True).start()
    try:
        return got.get(timeout=timeout_s)
    except queue.Empty:
        pytest.fail(f"no {n} replies within {timeout_s} s")


class SlowNewLocationDisk(OsFileSystem):
    """The real disk, on which making a location whose internal partition starts with ``slow``
    waits, once ``held``, at its first directory until the test lets it go (a disk slow for one
    location's creation).  A subclass of the real file system: new locations are made by the
    composition of its operations (``fsio.create_location``), so ``mkdir`` sees each one."""

    def __init__(self) -> None:
        self.held = False
        self.making = threading.Event()  # a held creation has started
        self.go = threading.Event()

    def mkdir(self, path: str) -> None:
        if self.held and "/slow" in path:
            self.making.set()
            self.go.wait(30)
        super().mkdir(path)


@pytest.fixture
def slow_dis(tmp_path, monkeypatch):
    disk = SlowNewLocationDisk()
    engines_on(monkeypatch, disk)
    with running_dis(tmp_path / "db") as srv:
        try:
            yield srv, disk
        finally:
            disk.go.set()  # a failed test leaves no creation waiting


@pytest.mark.parametrize("opens", [1, 3])
def test_a_slow_new_location_holds_up_neither_the_calls_open_streams_nor_the_order_of_its_own(slow_dis, tmp_path,
                                                                                              opens):
    """While a new location is being made (its disk slow), the call's open stream is answered:
    its chunks acked, its rows published; the new streams are answered once their locations
    exist, and a frame of a stream sent before its open's answer (here its end) is handled after
    that answer.  (One open, made alone, or several, made together.)"""
    srv, disk = slow_dis
    p1 = tmp_path / FILE1
    write_log(p1, TRADE, trade_rows(0, 100), [3] * 100)
    m = MuxCall(srv.port)
    m.send((1, open_frame(KEY)))
    assert m.reply().response.resume.file_name == ""
    disk.held = True
    slow = [LocationKey("Market", "Trade", f"slow{i}", "2026-11-22") for i in range(opens)]
    m.send(*[(10 + i, open_frame(k)) for i, k in enumerate(slow)])
    assert disk.making.wait(10), "the new location was not being made"
    m.send(*[(1, c) for c in chunks(p1)])
    acks = replies_within(m, len(chunks(p1)), 10)  # answered while the new location waits on its disk
    assert {x.stream for x in acks} == {1} and acks[-1].response.ack.committed_rows == 100
    assert not disk.go.is_set()
    # sent before their opens' answers: the first new stream's chunks (what a misbehaving client
    # might do), then every new stream's end
    p10 = tmp_path / FILE1.replace("feed1", "slow0")
    write_log(p10, TRADE, trade_rows(1000, 10), [3] * 10)
    early = chunks(p10)
    m.send(*[(10, c) for c in early], *[(10 + i, None) for i in range(opens)])
    time.sleep(0.2)
    assert sizes(srv.port, 100) == list(range(100))
    disk.go.set()
    rest = m.replies(2 * opens + len(early))
    for i, k in enumerate(slow):
        mine = [x for x in rest if x.stream == 10 + i]
        acks = len(early) if i == 0 else 0
        assert [x.WhichOneof("body") for x in mine] == ["response"] * (1 + acks) + ["end"]
        assert mine[0].response.resume.file_name == "" and mine[-1].end.code == grpc.StatusCode.OK.value[0]
        assert (tmp_path / "db" / "Intraday" / "Market" / "Trade" / k.internal_partition / k.column_partition
                / "Trade" / "table.size").exists()
    acked = [x.response.ack for x in rest if x.stream == 10 and x.WhichOneof("body") == "response"][1:]
    assert [a.offset for a in acked] == [c.offset + len(c.data) for c in early] and acked[-1].committed_rows == 10
    assert sizes(srv.port, 110) == list(range(100)) + list(range(1000, 1010))
    m.close()


class HeldLocationDisk(OsFileSystem):
    """The real disk, on which the ``Multiplex`` reader's writes to the column files of a location
    whose internal partition is ``held`` wait, once ``held`` is set, until the test lets them go
    (a disk slow for one location of a request).  A subclass of the real file system: a flush's
    writes are the composition of its ``pwrite``."""

    def __init__(self) -> None:
        self.held = False
        self.writing = threading.Event()  # a held write has started
        self.go = threading.Event()

    def pwrite(self, fd: int, data, offset: int) -> int:
        if (self.held and threading.current_thread().name == "ingest-mux-reader"
                and "/held/" in os.readlink(f"/proc/self/fd/{fd}")):
            self.writing.set()
            self.go.wait(30)
        return super().pwrite(fd, data, offset)


def test_a_requests_locations_are_flushed_in_bounded_groups_each_visible_at_its_own(tmp_path, monkeypatch):
    """A request carrying more caught-up chunks than ``writeout.FLUSH_GROUP`` is ingested and
    flushed a group at a time, each group's locks released once it is published: while the
    last location's flush waits on its disk, the first group's rows are visible, and every row
    is once the disk goes on.  (A tailer following thousands of locations puts every location's
    write of a moment in one request: flushed as one, its rows waited for the slowest write of
    all of them, and the flush, timed as one, took most of a second at 10,000 locations.)"""
    monkeypatch.setattr(writeout, "FLUSH_GROUP", 4)
    disk = HeldLocationDisk()
    engines_on(monkeypatch, disk)
    keys = [LocationKey("Market", "Trade", f"p{i}", "2026-11-22") for i in range(7)]
    keys.append(LocationKey("Market", "Trade", "held", "2026-11-22"))
    with running_dis(tmp_path / "db") as srv:
        try:
            m = MuxCall(srv.port)
            m.send(*[(i, open_frame(k)) for i, k in enumerate(keys)])
            assert all(r.WhichOneof("body") == "response" for r in m.replies(len(keys)))
            sent = []
            for i, k in enumerate(keys):
                path = tmp_path / FILE1.replace("feed1", k.internal_partition)
                write_log(path, TRADE, trade_rows(100 * i, 10), [3] * 10)
                (off, data), = frames_of(path, TRADE)
                sent.append((i, ChunkOut(path.name, off, data, True)))
            disk.held = True
            m.send(*sent)  # one request: every location's caught-up chunk, the held one last
            assert disk.writing.wait(10), "the held location's flush wrote nothing"
            # what a reader of each of the first group's locations sees (its published rows, read
            # under its lock as every read is), while the held location's flush still waits
            seen: queue.Queue = queue.Queue()
            threading.Thread(target=lambda: seen.put([srv.engine.location(k).snapshot()[0] for k in keys[:4]]),
                             daemon=True).start()
            try:
                first = seen.get(timeout=5)
            except queue.Empty:
                pytest.fail("the first group's locations could not be read while a later location's flush waits")
            assert first == [10] * 4
            assert not disk.go.is_set()
            disk.go.set()
            acks = m.replies(len(keys))
            assert sorted(r.stream for r in acks) == list(range(len(keys)))
            assert all(r.response.ack.committed_rows == 10 for r in acks)
            assert sizes(srv.port, 80) == [100 * i + j for i in range(8) for j in range(10)]
            m.close()
        finally:
            disk.go.set()
