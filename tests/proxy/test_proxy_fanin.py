"""Fan-in: 500 readers subscribed through one proxy cost the DIS one Subscribe stream per table,
and each reader gets the current state and then every change, sizes strictly increasing."""

from __future__ import annotations

import pytest

from disd.rpc.channel import open_channel
from support import sample, scrape, trade_rows, wait_for

from .proxy_support import Dis, Subscriber, logger, metrics_port, start_proxy, wait_rows, write_proxy_config

READERS = 500
LOC = "feed0/2026-11-22"


@pytest.fixture
def stack(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    dis = Dis(tmp_path, logs).start()
    proxy = None
    try:
        config, port = write_proxy_config(tmp_path, {"address": dis.address})
        proxy = start_proxy(tmp_path, config)
        yield dis, config, port, logs
    finally:
        if proxy is not None and proxy.alive():
            proxy.terminate()
        dis.stop()


def test_500_subscribers_one_upstream_subscription_per_table(stack):
    dis, config, port, logs = stack
    lg = logger(logs)
    lg.log_batch(trade_rows(0, 1000), atomic=True)
    lg.flush()
    wait_rows(dis.address, 1000)
    channels = [open_channel(f"127.0.0.1:{port}") for _ in range(10)]
    subs: list[Subscriber] = []
    try:
        for i in range(READERS):
            # every 50th reader subscribes to the whole namespace (a feed for each of its tables)
            subs.append(Subscriber(channels[i % 10], "Market", "" if i % 50 == 0 else "Trade"))
        wait_for(lambda: all(s.last(LOC) >= 1000 for s in subs), 60, 0.2, "every reader has the current state")
        proxy_m = scrape(metrics_port(config))
        assert sample(proxy_m, "dis_proxy_subscribers") == READERS
        ups = {s.labels["table"]: s.value for s in proxy_m["dis_proxy_upstream_subscriptions"]}
        assert ups == {"Market.Trade": 1.0, "Market.Quote": 1.0}
        assert sample(dis.metrics(), "dis_subscribers") == 2  # one stream per table, not 500

        expected = [1000]
        for end in (1300, 1600, 2000):
            lg.log_batch(trade_rows(expected[-1], end - expected[-1]), atomic=True)
            lg.flush()
            wait_for(lambda: all(s.last(LOC) >= end for s in subs), 60, 0.2, f"every reader sees {end} rows")
            expected.append(end)
        for s in subs:
            sizes = s.sizes(LOC)
            assert s.error is None
            assert sizes[0] == 1000, "the current state first"
            assert all(a < b for a, b in zip(sizes, sizes[1:])), f"sizes not strictly increasing: {sizes}"
            assert set(expected) <= set(sizes), f"a change was missed: {sizes}"
        assert sample(dis.metrics(), "dis_subscribers") == 2
    finally:
        lg.close()
        for s in subs:
            s.cancel()
        for ch in channels:
            ch.close()
    wait_for(lambda: sample(scrape(metrics_port(config)), "dis_proxy_subscribers") == 0, 30, 0.2,
             "reader streams closed")
