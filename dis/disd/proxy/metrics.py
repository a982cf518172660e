"""The proxy's Prometheus metrics (names fixed by docs/proxy.md).

Counters of events are process-wide (prometheus_client's default registry, forwarded into the
proxy's own registry as the DIS does, ``disd.server.metrics.server_registry``); the gauges of
the proxy's state (reader streams, upstream subscriptions per table, cache bytes) are computed
at scrape time from the running proxy by ``ProxyCollector``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from disd.proxy.daemon import ProxyServer

CACHE_HITS = Counter("dis_proxy_cache_hits", "Blocks served from the proxy's cache")
CACHE_MISSES = Counter("dis_proxy_cache_misses", "Blocks not in the proxy's cache when a reader asked")
UPSTREAM_READS = Counter("dis_proxy_upstream_reads", "Byte ranges read from upstream DISes")
UPSTREAM_BYTES = Counter("dis_proxy_upstream_bytes", "Bytes read from upstream DISes")
BYTES_SAVED = Counter("dis_proxy_bytes_saved", "Bytes served to readers from the cache (not read upstream)")
UPSTREAM_LOST = Counter("dis_proxy_upstream_streams_lost",
                        "Upstream streams of a feed that failed or stopped answering once open (the feed then "
                        "follows the next member)", ["table", "dis"])

#: The series the collector produces, for the documentation's drift test.
PROXY_SERIES = ("dis_proxy_subscribers", "dis_proxy_upstream_subscriptions", "dis_proxy_cache_bytes",
                "dis_proxy_lastby_subscribers", "dis_proxy_upstream_lastby_subscriptions")


class ProxyCollector:
    """Gauges of one proxy, computed at scrape time."""

    def __init__(self, proxy: "ProxyServer") -> None:
        self.proxy = proxy

    def collect(self) -> Iterator[Metric]:
        subs = GaugeMetricFamily("dis_proxy_subscribers", "Open reader Subscribe streams")
        subs.add_metric([], self.proxy.service.subscribers if self.proxy.service else 0)
        up = GaugeMetricFamily("dis_proxy_upstream_subscriptions",
                               "Open upstream Subscribe streams, per table (goal: 1 each)", labels=["table"])
        if self.proxy.upstream is not None:
            for table, n in sorted(self.proxy.upstream.subscriptions().items()):
                up.add_metric([table], n)
        cache = GaugeMetricFamily("dis_proxy_cache_bytes", "Bytes held by the proxy's block cache")
        cache.add_metric([], self.proxy.cache.size_bytes if self.proxy.cache else 0)
        lb_subs = GaugeMetricFamily("dis_proxy_lastby_subscribers", "Open reader SubscribeLastBy streams")
        lb_subs.add_metric([], self.proxy.service.lastby_subscribers if self.proxy.service else 0)
        lb_up = GaugeMetricFamily("dis_proxy_upstream_lastby_subscriptions",
                                  "Open upstream SubscribeLastBy streams, per table (goal: 1 each)", labels=["table"])
        if self.proxy.upstream is not None:
            for table, n in sorted(self.proxy.upstream.lastby_subscriptions().items()):
                lb_up.add_metric([table], n)
        yield from (subs, up, cache, lb_subs, lb_up)
