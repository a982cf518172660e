"""ReadBlocks: a range of blocks in one stream, byte for byte what ReadBlock returns; and the
client's fallback to ReadBlock against a DIS without it."""

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
        snap = wait_for(lambda: [l for l in c.locations("Market", "Trade") if l.rows == N])[0]
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


class _OldTableData(TableDataService):
    """The TableData service of a DIS that predates ReadBlocks."""

    ReadBlocks = dis_pb2_grpc.TableDataServicer.ReadBlocks


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
            assert c._unary_only == {f"127.0.0.1:{port}"}
            assert new._unary_only == set()
    finally:
        server.stop(0)
