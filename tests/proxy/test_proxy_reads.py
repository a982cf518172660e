"""Reads through a proxy: the same rows and bytes as the DIS serves, each block read from the DIS
about once however many readers scan the table, and nothing past what the DIS published."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import grpc
import pytest

from disd.client import connect
from disd.rpc.channel import open_channel
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from support import ROOT, sample, scrape, trade_rows

from .proxy_support import Dis, logger, metrics_port, start_proxy, wait_rows, write_proxy_config

NAMES = ("dis_proxy_subscribers", "dis_proxy_upstream_subscriptions", "dis_proxy_cache_hits_total",
         "dis_proxy_cache_misses_total", "dis_proxy_upstream_reads_total", "dis_proxy_upstream_bytes_total",
         "dis_proxy_bytes_saved_total", "dis_proxy_cache_bytes")
ROWS = 40_000
READERS = 8


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reads")
    logs = tmp / "logs"
    logs.mkdir()
    dis = Dis(tmp, logs).start()
    proxy = None
    try:
        for i, day in enumerate(("2026-11-22", "2026-11-23")):
            lg = logger(logs, "feed0", day)
            lg.log_batch(trade_rows(i * ROWS, ROWS), atomic=True)
            lg.close()
        wait_rows(dis.address, 2 * ROWS)
        config, port = write_proxy_config(tmp, {"address": dis.address})
        proxy = start_proxy(tmp, config)
        yield dis, config, port
    finally:
        if proxy is not None and proxy.alive():
            proxy.terminate()
        dis.stop()


def _blocks(snaps) -> int:
    return sum(-(-size // s.block_size) for s in snaps for size in s.files.values())


def test_many_readers_cost_the_dis_each_block_about_once(stack):
    dis, config, port = stack
    with connect(dis.address, retry_s=0) as direct:
        expected = direct.read_table("Market", "Trade")
        blocks = _blocks(direct.locations("Market", "Trade"))
    before = sample(dis.metrics(), "dis_block_reads_total")
    results, errors = [], []

    def read() -> None:
        try:
            with connect(f"127.0.0.1:{port}", retry_s=10) as c:
                results.append(c.read_table("Market", "Trade"))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=read) for _ in range(READERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len(results) == READERS
    for t in results:
        assert t.equals(expected)
    dis_reads = sample(dis.metrics(), "dis_block_reads_total") - before
    m = scrape(metrics_port(config))
    assert blocks <= dis_reads <= 1.2 * blocks, f"the DIS read {dis_reads} blocks for a table of {blocks}"
    assert sample(m, "dis_proxy_cache_hits_total") >= (READERS - 1) * blocks * 0.8
    assert sample(m, "dis_proxy_upstream_bytes_total") <= 1.2 * sum(
        sum(s.files.values()) for s in connect(dis.address, retry_s=0).locations("Market", "Trade"))
    assert sample(m, "dis_proxy_bytes_saved_total") > 0
    assert 0 < sample(m, "dis_proxy_cache_bytes") <= 64 << 20
    doc = (ROOT / "docs" / "proxy.md").read_text()
    for name in NAMES:  # every series the docs name is served, and documented
        assert name in m and f"`{name}" in doc, name

    # A second round is served from the cache alone.
    before = sample(dis.metrics(), "dis_block_reads_total")
    with connect(f"127.0.0.1:{port}", retry_s=0) as c:
        assert c.read_table("Market", "Trade").equals(expected)
    assert sample(dis.metrics(), "dis_block_reads_total") == before


def test_reads_never_go_past_the_published_size(stack):
    dis, config, port = stack
    with connect(dis.address, retry_s=0) as direct:
        snap = direct.locations("Market", "Trade")[0]
    name, size = sorted(snap.files.items())[0]
    bs = snap.block_size
    last = -(-size // bs)
    key = dis_pb2.LocationKey(namespace="Market", table="Trade", internal_partition=snap.key.internal_partition,
                              column_partition=snap.key.column_partition)
    ch = open_channel(f"127.0.0.1:{port}")
    try:
        stub = dis_pb2_grpc.TableDataStub(ch)
        got = b"".join(b for m in stub.ReadBlocks(dis_pb2.ReadBlocksRequest(
            location=key, file=name, first_block=0, block_count=last + 10), timeout=30) for b in m.blocks)
        assert len(got) == size
        with connect(dis.address, retry_s=0) as direct:
            assert got == direct.read_range(snap, name, 0, size)
        # ReadRanges: every file's bytes, ranges in order, cut at the published sizes as ReadBlocks cuts them
        names = sorted(snap.files)
        msgs = list(stub.ReadRanges(dis_pb2.ReadRangesRequest(location=key, ranges=[
            dis_pb2.BlockRange(file=n, first_block=0, block_count=-(-snap.files[n] // bs) + 3) for n in names]
            + [dis_pb2.BlockRange(file=name, first_block=last + 2, block_count=1)]), timeout=30))
        parts = [p for m in msgs for p in m.parts]
        assert [p.range for p in parts] == sorted(p.range for p in parts)
        by_range = {i: b"".join(b for p in parts if p.range == i for b in p.blocks) for i in range(len(names) + 1)}
        with connect(dis.address, retry_s=0) as direct:
            for i, n in enumerate(names):
                assert by_range[i] == direct.read_range(snap, n, 0, snap.files[n]), n
        assert by_range[len(names)] == b"" and parts[-1].file_size == size
        with pytest.raises(grpc.RpcError) as ei:
            list(stub.ReadRanges(dis_pb2.ReadRangesRequest(location=key, ranges=[
                dis_pb2.BlockRange(file="Nope.dat", first_block=0, block_count=1)]), timeout=30))
        assert ei.value.code() == grpc.StatusCode.NOT_FOUND and "Nope.dat" in ei.value.details()
        past = stub.ReadBlock(dis_pb2.ReadBlockRequest(location=key, file=name, block_index=last), timeout=30)
        assert past.data == b"" and past.file_size == size
        for bad, what in ((dis_pb2.ReadBlockRequest(location=key, file="Nope.dat", block_index=0), "Nope.dat"),
                          (dis_pb2.ReadBlockRequest(location=dis_pb2.LocationKey(
                              namespace="Market", table="Nope", internal_partition="a", column_partition="b"),
                              file=name, block_index=0), "Market.Nope")):
            with pytest.raises(grpc.RpcError) as ei:
                stub.ReadBlock(bad, timeout=30)
            assert ei.value.code() == grpc.StatusCode.NOT_FOUND and what in ei.value.details()
    finally:
        ch.close()

    # The block endpoint: the same listing and bytes as the DIS's, 416 past the published size.
    def get(p: int, path: str) -> bytes:
        return urllib.request.urlopen(f"http://127.0.0.1:{p}{path}", timeout=30).read()

    q = (f"namespace=Market&table=Trade&internal_partition={snap.key.internal_partition}"
         f"&column_partition={snap.key.column_partition}&file={name}")
    assert get(port + 1, f"/v1/read?{q}&start=3&stop={size}") == get(dis.port + 1, f"/v1/read?{q}&start=3&stop={size}")
    mine = json.loads(get(port + 1, "/v1/locations?namespace=Market&table=Trade"))
    theirs = json.loads(get(dis.port + 1, "/v1/locations?namespace=Market&table=Trade"))
    assert sorted(mine["locations"], key=str) == sorted(theirs["locations"], key=str)
    assert mine["block_size"] == theirs["block_size"]
    assert json.loads(get(port + 1, "/v1/tables")) == json.loads(get(dis.port + 1, "/v1/tables"))
    with pytest.raises(urllib.error.HTTPError) as ei:
        get(port + 1, f"/v1/read?{q}&start=0&stop={size + 1}")
    assert ei.value.code == 416 and f"{size} published" in json.loads(ei.value.read())["error"]


def test_subscriptions_through_the_proxy_list_what_the_dis_lists(stack):
    """SubscribeBatches at the proxy: its first message is the whole listing, marked listed, the
    same locations and sizes as the DIS's own and as the proxy's Subscribe gives one by one."""
    dis, config, port = stack

    def infos(msgs) -> dict:
        return {(m.key.internal_partition, m.key.column_partition): (m.rows, tuple((f.name, f.size) for f in m.files))
                for m in msgs}

    request = dis_pb2.SubscribeRequest(namespace="Market", table="Trade")
    at_dis, at_proxy = open_channel(dis.address), open_channel(f"127.0.0.1:{port}")
    try:
        theirs = next(dis_pb2_grpc.TableDataStub(at_dis).SubscribeBatches(request, timeout=30))
        proxy = dis_pb2_grpc.TableDataStub(at_proxy)
        mine = next(proxy.SubscribeBatches(request, timeout=30))
        single = proxy.Subscribe(request, timeout=30)
        one_by_one = [next(single) for _ in range(len(mine.locations))]
        assert mine.listed and theirs.listed and len(mine.locations) == 2
        assert infos(mine.locations) == infos(theirs.locations) == infos(one_by_one)
        assert {r for r, _ in infos(mine.locations).values()} == {ROWS}
        empty = next(proxy.SubscribeBatches(dis_pb2.SubscribeRequest(namespace="Market", table="Quote"), timeout=30))
        assert empty.listed and len(empty.locations) == 0
    finally:
        at_dis.close()
        at_proxy.close()
