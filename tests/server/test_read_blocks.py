"""ReadBlocks: a range of blocks in one stream, byte for byte what ReadBlock returns; ReadRanges:
ranges of several files of a location in one stream, byte for byte what ReadBlocks returns, and
a location read in one call; and the client's fallbacks against a DIS without them."""

from __future__ import annotations

import grpc
import pytest

from disd.client import connect
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from disd.server.blockcache import BlockCache
from disd.server.tabledata import TableDataService

from support import trade_rows, wait_for, write_log

from .conftest import FILE1, KEY, IngestStream, key_msg, send_file

N = 150_000  # Timestamp alone is 1.2 MB: more than one ReadBlocks message, the last block partial


@pytest.fixture
def loaded(dis, tmp_path, trade_schema):
    p1 = tmp_path / FILE1
    write_log(p1, trade_schema, trade_rows(0, N), [3] * N)
    s = IngestStream(dis.port)
    s.open(fingerprint=trade_schema.fingerprint)
    send_file(s, p1, trade_schema)
    s.close()
    with connect(f"127.0.0.1:{dis.port}") as c:
        snap = wait_for(lambda: [loc for loc in c.locations("Market", "Trade") if loc.rows == N])[0]
    return dis, snap


def test_stream_equals_block_by_block_reads(loaded):
    dis, snap = loaded
    with connect(f"127.0.0.1:{dis.port}") as c:
        stub = c.stub(snap.address)
        for name, size in snap.files.items():
            n_blocks = -(-size // snap.block_size)
            one_by_one = [stub.ReadBlock(dis_pb2.ReadBlockRequest(location=key_msg(KEY), file=name,
                                                                  block_index=i)).data
                          for i in range(n_blocks)]
            streamed = list(stub.ReadBlocks(dis_pb2.ReadBlocksRequest(
                location=key_msg(KEY), file=name, first_block=0, block_count=n_blocks + 5)))
            # the stream ends at the last published block however many were asked for
            assert [b for m in streamed for b in m.blocks] == one_by_one
            assert max(len(m.blocks) for m in streamed) <= (1 << 20) // snap.block_size
            if size > 1 << 20:
                assert len(streamed) > 1
            assert all(m.file_size == size for m in streamed)
            assert all(len(d) <= snap.block_size for d in one_by_one)
            assert b"".join(one_by_one) == c.read_range(snap, name, 0, size)
        ts = "Timestamp.dat"
        mid = list(stub.ReadBlocks(dis_pb2.ReadBlocksRequest(location=key_msg(KEY), file=ts,
                                                             first_block=2, block_count=2)))
        assert [len(b) for m in mid for b in m.blocks] == [snap.block_size] * 2


def test_stream_refusals_are_clear(loaded):
    dis, snap = loaded
    with connect(f"127.0.0.1:{dis.port}") as c:
        stub = c.stub(snap.address)
        with pytest.raises(grpc.RpcError) as ei:
            list(stub.ReadBlocks(dis_pb2.ReadBlocksRequest(location=key_msg(KEY), file="../../etc/passwd",
                                                           block_count=1)))
        assert ei.value.code() == grpc.StatusCode.NOT_FOUND and "no column file" in ei.value.details()
        bad = dis_pb2.LocationKey(namespace="..", table="Trade", internal_partition="x", column_partition="y")
        with pytest.raises(grpc.RpcError) as ei:
            list(stub.ReadBlocks(dis_pb2.ReadBlocksRequest(location=bad, file="x", block_count=1)))
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def _ranges(stub, ranges):
    req = dis_pb2.ReadRangesRequest(location=key_msg(KEY), ranges=[
        dis_pb2.BlockRange(file=f, first_block=a, block_count=n) for f, a, n in ranges])
    return list(stub.ReadRanges(req))


def test_ranges_are_what_read_blocks_returns_for_each(loaded):
    dis, snap = loaded
    bs = snap.block_size
    with connect(f"127.0.0.1:{dis.port}") as c:
        stub = c.stub(snap.address)
        ranges = [(name, 0, -(-size // bs) + 3) for name, size in sorted(snap.files.items())]
        ranges += [("Timestamp.dat", 2, 2), ("Sym.off", 10_000, 4), ("Size.dat", 1, 0), ("Timestamp.dat", 0, 1)]
        msgs = _ranges(stub, ranges)
        got: dict[int, list[bytes]] = {}
        order = []
        for m in msgs:
            assert sum(len(p.blocks) for p in m.parts) <= (1 << 20) // bs  # about 1 MiB per message
            for p in m.parts:
                assert p.file_size == snap.files[ranges[p.range][0]]
                got.setdefault(p.range, []).extend(p.blocks)
                order.append(p.range)
        assert len(msgs) > 1
        assert order == sorted(order) and set(order) == set(range(len(ranges)))  # every range, in order
        for i, (name, first, count) in enumerate(ranges):
            expected = [b for m in stub.ReadBlocks(dis_pb2.ReadBlocksRequest(
                location=key_msg(KEY), file=name, first_block=first, block_count=count)) for b in m.blocks]
            assert got[i] == expected, (name, first, count)
        assert got[len(ranges) - 3] == [] and got[len(ranges) - 2] == []  # past the end; no blocks asked

        with pytest.raises(grpc.RpcError) as ei:
            _ranges(stub, [("Size.dat", 0, 1), ("../table.size", 0, 1)])
        assert ei.value.code() == grpc.StatusCode.NOT_FOUND and "'../table.size'" in ei.value.details()
        bad = dis_pb2.LocationKey(namespace="..", table="Trade", internal_partition="x", column_partition="y")
        with pytest.raises(grpc.RpcError) as ei:
            list(stub.ReadRanges(dis_pb2.ReadRangesRequest(location=bad, ranges=[dis_pb2.BlockRange(file="x")])))
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT


class _Counting(TableDataService):
    """A DIS's TableData service that counts the read calls it serves."""

    calls: dict[str, int]

    def ReadRanges(self, request, context):  # noqa: N802
        self.calls["ReadRanges"] = self.calls.get("ReadRanges", 0) + 1
        yield from super().ReadRanges(request, context)

    def ReadBlocks(self, request, context):  # noqa: N802
        self.calls["ReadBlocks"] = self.calls.get("ReadBlocks", 0) + 1
        yield from super().ReadBlocks(request, context)


def _serve(service):
    from concurrent import futures

    server = grpc.server(futures.ThreadPoolExecutor(4))
    dis_pb2_grpc.add_TableDataServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def test_a_location_is_read_in_one_call(loaded):
    """A read to a snapshot's end is one ReadRanges call whatever the table's files; a read
    after row 0 of a table with strings is two (the data's first byte is in the offsets)."""
    dis, snap = loaded
    counting = _Counting(dis.engine, dis.sessions, BlockCache(1 << 20), snap.block_size, lambda ns, t: True, 0.0)
    counting.calls = {}
    server, port = _serve(counting)
    try:
        with connect(f"127.0.0.1:{dis.port}") as direct, connect(f"127.0.0.1:{port}") as c:
            s = c.locations("Market", "Trade")[0]
            assert len(s.files) == 5
            assert c.read_location(s).equals(direct.read_location(snap))
            assert counting.calls == {"ReadRanges": 1}
            counting.calls.clear()
            assert c.read_location(s, start=1000).equals(direct.read_location(snap).slice(1000))
            assert counting.calls == {"ReadRanges": 2}
            counting.calls.clear()
            assert c.read_location(s, columns=["Size", "Price"], start=5, stop=99).equals(
                direct.read_location(snap, columns=["Size", "Price"], start=5, stop=99))
            assert counting.calls == {"ReadRanges": 1}
            # a follower: the read from where the last one stopped knows where its strings start
            counting.calls.clear()
            assert c.read_location(s, start=3000, stop=7000).equals(direct.read_location(snap).slice(3000, 4000))
            assert counting.calls == {"ReadRanges": 2}
            counting.calls.clear()
            assert c.read_location(s, start=7000).equals(direct.read_location(snap).slice(7000))
            assert counting.calls == {"ReadRanges": 1}
    finally:
        server.stop(0)


class _WithoutRanges(TableDataService):
    """The TableData service of a DIS that predates ReadRanges."""

    ReadRanges = dis_pb2_grpc.TableDataServicer.ReadRanges


def test_client_falls_back_to_read_blocks(loaded):
    dis, snap = loaded
    server, port = _serve(_WithoutRanges(dis.engine, dis.sessions, BlockCache(1 << 20), snap.block_size,
                                         lambda ns, t: True, 0.0))
    try:
        with connect(f"127.0.0.1:{dis.port}") as new, connect(f"127.0.0.1:{port}") as c:
            expected = new.read_table("Market", "Trade")
            got = c.read_table("Market", "Trade")
            assert got.equals(expected) and got.num_rows == N
            assert c.block_calls.no_ranges == {f"127.0.0.1:{port}"} and c.block_calls.unary_only == set()
            assert new.block_calls.no_ranges == set()
    finally:
        server.stop(0)


class _OldTableData(TableDataService):
    """The TableData service of a DIS that predates ReadBlocks (and ReadRanges)."""

    ReadBlocks = dis_pb2_grpc.TableDataServicer.ReadBlocks
    ReadRanges = dis_pb2_grpc.TableDataServicer.ReadRanges


def test_client_falls_back_to_read_block(loaded):
    from concurrent import futures

    dis, snap = loaded
    old = _OldTableData(dis.engine, dis.sessions, BlockCache(1 << 20), snap.block_size, lambda ns, t: True, 0.0)
    server = grpc.server(futures.ThreadPoolExecutor(4))
    dis_pb2_grpc.add_TableDataServicer_to_server(old, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with connect(f"127.0.0.1:{dis.port}") as new, connect(f"127.0.0.1:{port}") as c:
            expected = new.read_table("Market", "Trade")
            got = c.read_table("Market", "Trade")
            assert got.equals(expected) and got.num_rows == N
            assert c.block_calls.unary_only == {f"127.0.0.1:{port}"}
            assert new.block_calls.unary_only == set()
    finally:
        server.stop(0)
