"""SubscribeBatches: Subscribe's snapshots several a message (the first listing marked ``listed``,
then each set of changes gathered while the last was sent), and the client's fallback to
Subscribe against a DIS without it."""

from __future__ import annotations

import threading

import grpc
import pytest

from disd.client import connect
from disd.names import LocationKey
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from disd.server import tabledata
from disd.server.blockcache import BlockCache
from disd.server.tabledata import TableDataService

from support import trade_rows
from support.dis import Feeder

TRADE = dis_pb2.SubscribeRequest(namespace="Market", table="Trade")


def _key(i: int) -> LocationKey:
    return LocationKey("Market", "Trade", f"ip{i}", "2026-11-22")


def _infos(msgs) -> dict:
    """(internal partition, rows, files) per location of LocationInfo messages."""
    return {m.key.internal_partition: (m.rows, tuple((f.name, f.size) for f in m.files)) for m in msgs}


class _Context:
    """What a streaming call's context tells its handler: active until ended."""

    def __init__(self) -> None:
        self.active = True

    def is_active(self) -> bool:
        return self.active

    def abort(self, code, details):
        raise AssertionError(f"aborted: {code} {details}")


def test_the_listing_then_changes_equal_subscribes(dis):
    feeder = Feeder(dis)
    for i in range(3):
        feeder.append(_key(i), trade_rows(0, 10 + i))
    with grpc.insecure_channel(f"127.0.0.1:{dis.port}") as ch:
        stub = dis_pb2_grpc.TableDataStub(ch)
        batches = stub.SubscribeBatches(TRADE, timeout=30)
        single = stub.Subscribe(TRADE, timeout=30)
        first = next(batches)
        assert first.listed and len(first.locations) == 3
        assert _infos(first.locations) == _infos([next(single) for _ in range(3)])
        assert _infos(first.locations) == _infos(stub.ListLocations(dis_pb2.ListLocationsRequest(
            namespace="Market", table="Trade")).locations)
        feeder.append(_key(1), trade_rows(11, 5))
        feeder.append(_key(3), trade_rows(0, 7))  # a new location
        want = {"ip1": 16, "ip3": 7}  # a new location is given first with no rows, then with them
        got: dict = {}
        while {k: v[0] for k, v in got.items()} != want:
            m = next(batches)
            assert not m.listed
            got.update(_infos(m.locations))
        one_by_one: dict = {}
        while {k: v[0] for k, v in one_by_one.items()} != want:
            one_by_one.update(_infos([next(single)]))
        assert got == one_by_one
        batches.cancel()
        single.cancel()


def test_an_empty_listing_is_one_listed_message_sent_at_once(dis):
    with grpc.insecure_channel(f"127.0.0.1:{dis.port}") as ch:
        call = dis_pb2_grpc.TableDataStub(ch).SubscribeBatches(TRADE, timeout=30)
        done = threading.Event()
        first: list = []
        threading.Thread(target=lambda: (first.append(next(call)), done.set()), daemon=True).start()
        assert done.wait(5), "the listing of no location never came"
        assert first[0].listed and len(first[0].locations) == 0
        call.cancel()


def test_changes_made_while_the_last_message_went_out_come_in_one(dis):
    """Fifty locations published while the subscriber held its listing arrive as one message."""
    feeder = Feeder(dis)
    feeder.append(_key(0), trade_rows(0, 3))
    ctx = _Context()
    stream = dis.tabledata.SubscribeBatches(TRADE, ctx)
    listing = next(stream)
    assert listing.listed and [m.key.internal_partition for m in listing.locations] == ["ip0"]
    for i in range(50):
        feeder.append(_key(i), trade_rows(100, 2))
    changes = next(stream)
    assert not changes.listed
    assert {m.key.internal_partition: m.rows for m in changes.locations} == {
        f"ip{i}": 5 if i == 0 else 2 for i in range(50)}
    ctx.active = False
    stream.close()


def test_a_long_listing_is_split_and_only_its_last_message_is_listed(dis, monkeypatch):
    monkeypatch.setattr(tabledata, "BATCH_LOCATIONS", 4)
    feeder = Feeder(dis)
    for i in range(10):
        feeder.append(_key(i), trade_rows(0, 1))
    ctx = _Context()
    stream = dis.tabledata.SubscribeBatches(TRADE, ctx)
    msgs = [next(stream) for _ in range(3)]
    assert [len(m.locations) for m in msgs] == [4, 4, 2]
    assert [m.listed for m in msgs] == [False, False, True]
    assert sorted(m.key.internal_partition for b in msgs for m in b.locations) == sorted(f"ip{i}" for i in range(10))
    ctx.active = False
    stream.close()


class _WithoutBatches(TableDataService):
    """The TableData service of a DIS that predates SubscribeBatches."""

    SubscribeBatches = dis_pb2_grpc.TableDataServicer.SubscribeBatches


@pytest.mark.parametrize("service", ["new", "old"])
def test_the_client_follows_either_dis(dis, service):
    from concurrent import futures

    feeder = Feeder(dis)
    feeder.append(_key(0), trade_rows(0, 4))
    server, port = None, dis.port
    if service == "old":
        server = grpc.server(futures.ThreadPoolExecutor(4))
        dis_pb2_grpc.add_TableDataServicer_to_server(
            _WithoutBatches(dis.engine, dis.sessions, BlockCache(1 << 20), 65536, lambda ns, t: True, 0.0), server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
    try:
        with connect(f"127.0.0.1:{port}") as c:
            snaps = c.subscribe("Market", "Trade")
            first = next(snaps)
            assert (first.key, first.rows) == (_key(0), 4)
            feeder.append(_key(0), trade_rows(4, 3))
            feeder.append(_key(1), trade_rows(0, 2))
            seen = {}
            while seen != {_key(0): 7, _key(1): 2}:
                s = next(snaps)
                seen[s.key] = s.rows
            snaps.close()
        if service == "old":
            with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                with pytest.raises(grpc.RpcError) as e:
                    next(dis_pb2_grpc.TableDataStub(ch).SubscribeBatches(TRADE, timeout=10))
                assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        if server is not None:
            server.stop(0)
