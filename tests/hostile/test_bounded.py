"""Bounded resources of a running ``dis serve`` that the load benchmark relies on."""

from __future__ import annotations

import time

import grpc

from disd.client import connect
from support import TRADE, log_name, sample, scrape, trade_rows, write_log

from .helpers import DisProcess, channel, chunk_msg, open_msg, run_stream


def _metric(port: int, name: str) -> float:
    samples = scrape(port)
    assert name in samples, name
    return sample(samples, name)


def test_block_cache_never_holds_more_than_block_cache_bytes(tmp_path):
    """Readers go through 60 full 64 KiB blocks, repeatedly, with a cache of 4 blocks: the cache
    serves hits but never holds more than its configured bytes."""
    d = DisProcess(tmp_path, storage={"block_cache_bytes": 4 * 65536})
    metrics_port = d.metrics_port
    try:
        p = tmp_path / log_name("cache")
        write_log(p, TRADE, trade_rows(0, 120_000), [3] * 120_000)
        ch = channel(d.port)
        r = run_stream(ch, [open_msg("cache", TRADE.fingerprint), chunk_msg(p.name, 0, p.read_bytes())])
        ch.close()
        assert r.code == grpc.StatusCode.OK, r
        with connect(f"127.0.0.1:{d.port}") as c:
            end = time.monotonic() + 15
            while sum(loc.rows for loc in c.locations("Market", "Trade")) < 120_000:
                assert time.monotonic() < end
                time.sleep(0.05)
            sizes = []
            for _ in range(3):
                assert c.read_table("Market", "Trade", columns=["Timestamp", "Price"]).num_rows == 120_000
                sizes.append(_metric(metrics_port, "dis_block_cache_bytes"))
            # the last reads, of the same few blocks, come from the cache
            snap = c.locations("Market", "Trade")[0]
            for _ in range(5):
                c.read_location(snap, ["Price"], 0, 30_000)
        assert max(sizes) <= 4 * 65536 and max(sizes) > 0, sizes
        assert _metric(metrics_port, "dis_block_cache_bytes") <= 4 * 65536
        assert _metric(metrics_port, "dis_block_cache_hits_total") > 0
    finally:
        d.stop()
