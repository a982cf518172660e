"""A DIS serves published bytes one way: ReadBlock, ReadBlocks, ReadRanges and the block
endpoint's ``/v1/read`` each read through ``Location.read_range`` (bounds and handles are its
concern alone), and the block endpoint answers a location closed under a read as it answers any
location that cannot be read, with 503."""

from __future__ import annotations

import urllib.request

import grpc
import pytest

from disd.binlog import LocationKey
from disd.rpc.keys import key_to_proto
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from disd.server.blockhttp import EngineBackend, HttpRefused
from disd.storage.location import Location
from support import Feeder, running_dis, trade_rows

KEY = LocationKey("Market", "Trade", "feed1", "2026-11-22")
ROWS = 100_000  # Size.dat: 400,000 bytes, seven blocks


@pytest.fixture
def served(tmp_path, monkeypatch):
    """A DIS with ``ROWS`` published rows of ``KEY`` and every ``Location.read_range`` call
    recorded as ``(file, start, stop)``."""
    calls: list[tuple[str, int, int]] = []
    original = Location.read_range

    def recorded(self, file_name, start, stop):
        calls.append((file_name, start, stop))
        return original(self, file_name, start, stop)

    monkeypatch.setattr(Location, "read_range", recorded)
    with running_dis(tmp_path / "db") as srv:
        Feeder(srv).append(KEY, trade_rows(0, ROWS))
        yield srv, calls


def test_every_read_of_published_bytes_goes_through_the_location(served):
    srv, calls = served
    bs = srv.config.storage.block_size_bytes
    on_disk = (srv.engine.location(KEY).path / "Size.dat").read_bytes()
    assert len(on_disk) == ROWS * 4
    with grpc.insecure_channel(f"127.0.0.1:{srv.port}") as ch:
        stub = dis_pb2_grpc.TableDataStub(ch)
        loc = key_to_proto(KEY)
        got = stub.ReadBlock(dis_pb2.ReadBlockRequest(location=loc, file="Size.dat", block_index=0)).data
        assert got == on_disk[:bs] and calls == [("Size.dat", 0, bs)]
        calls.clear()
        got = b"".join(b for m in stub.ReadBlocks(dis_pb2.ReadBlocksRequest(
            location=loc, file="Size.dat", first_block=1, block_count=2)) for b in m.blocks)
        assert got == on_disk[bs:3 * bs] and calls == [("Size.dat", bs, 2 * bs), ("Size.dat", 2 * bs, 3 * bs)]
        calls.clear()
        parts = [p for m in stub.ReadRanges(dis_pb2.ReadRangesRequest(location=loc, ranges=[
            dis_pb2.BlockRange(file="Size.dat", first_block=6, block_count=5)])) for p in m.parts]
        assert b"".join(b for p in parts for b in p.blocks) == on_disk[6 * bs:]
        assert calls == [("Size.dat", 6 * bs, ROWS * 4)]  # the last block, cut at the published size
    calls.clear()
    url = (f"http://127.0.0.1:{srv.http_port}/v1/read?namespace=Market&table=Trade&internal_partition=feed1"
           f"&column_partition=2026-11-22&file=Size.dat&start=100&stop={ROWS * 4}")
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.read() == on_disk[100:]
    assert calls == [("Size.dat", 100, ROWS * 4)]


def test_the_block_endpoint_answers_503_for_a_location_closed_under_a_read(served):
    srv, _ = served
    backend = EngineBackend(srv.engine, srv.config.storage.block_size_bytes, lambda namespace, table: True)
    chunk = backend.open_range(KEY, "Size.dat", 0, ROWS * 4)
    assert len(chunk(0, ROWS * 4)) == ROWS * 4
    srv.engine.location(KEY).close()
    with pytest.raises(HttpRefused) as refused:
        chunk(0, 4)
    assert refused.value.status == 503 and refused.value.message == f"location {KEY} is closed"
