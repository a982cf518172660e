"""The proxy's cache is never stale and stays within its bound: a partial block is cached under
the size it was read at, so a location that grew reads its new bytes, and a snapshot read again
reads the same bytes (repeatable reads)."""

from __future__ import annotations

import pytest

from disd.binlog import LocationKey
from disd.client import connect
from disd.proxy.config import parse_proxy_config
from disd.proxy.daemon import ProxyServer
from support import Feeder, free_port, free_port_pair, running_dis, sample, scrape, trade_rows, wait_for

KEY = LocationKey("Market", "Trade", "feed0", "2026-11-22")
BOUND = 200_000


@pytest.fixture
def proxied(tmp_path):
    with running_dis(tmp_path / "db") as dis:
        cfg = parse_proxy_config({
            "proxy": {"host": "127.0.0.1", "port": free_port_pair(), "metrics_port": free_port(), "cache_bytes": BOUND},
            "upstream": {"address": f"127.0.0.1:{dis.port}", "retry_s": 10}}, "<test>")
        proxy = ProxyServer(cfg)
        proxy.start()
        try:
            yield dis, proxy
        finally:
            proxy.stop(0.5)


def test_a_grown_location_reads_its_new_bytes_and_old_snapshots_read_the_same(proxied):
    dis, proxy = proxied
    feeder = Feeder(dis)
    feeder.append(KEY, trade_rows(0, 1000))  # every file ends in a partial block
    with connect(f"127.0.0.1:{proxy.port}", retry_s=10) as c:
        old = c.locations("Market", "Trade")[0]
        first = c.read_location(old)
        assert first["Size"].to_pylist() == list(range(1000))
        feeder.append(KEY, trade_rows(1000, 1500))
        wait_for(lambda: c.locations("Market", "Trade")[0].rows == 2500, 30, 0.05, "the proxy publishes 2500 rows")
        new = c.locations("Market", "Trade")[0]
        with connect(f"127.0.0.1:{dis.port}", retry_s=0) as direct:
            assert c.read_location(new).equals(direct.read_location(direct.locations("Market", "Trade")[0]))
        assert c.read_location(new)["Size"].to_pylist() == list(range(2500))
        assert c.read_location(old).equals(first)  # the snapshot planned before: the same rows


def test_the_cache_stays_within_its_bound(proxied):
    dis, proxy = proxied
    Feeder(dis).append(KEY, trade_rows(0, 30_000))  # about 1 MB of column files
    with connect(f"127.0.0.1:{proxy.port}", retry_s=10) as c:
        for _ in range(2):
            assert c.read_table("Market", "Trade")["Size"].to_pylist() == list(range(30_000))
    m = scrape(proxy.metrics_port)
    assert 0 < sample(m, "dis_proxy_cache_bytes") <= BOUND
    assert proxy.cache.size_bytes <= BOUND
