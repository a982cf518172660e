"""The tailer's Prometheus endpoint (``metrics_port`` in its configuration; none without it).

Everything is computed at scrape time from the running ``Tailer`` by a ``TailerCollector`` in the
tailer's own registry (with the process metrics): two tailers in one process (tests, ``dis demo``)
never collide, and nothing is registered on prometheus_client's default registry.

Series (labels ``table``, ``location`` per location, as the DIS's):

- ``dis_tailer_files_watched{kind}``: log files found by the last scan (``binlog``: binary logs,
  spool logs included; ``csv``: CSV files of ``csv_tables``)
- ``dis_tailer_files_skipped{reason}``: files of the log directories that are not streamed, by
  reason: the part of the name that is wrong (``namespace_kind``, ``month``, ``suffix``, ...,
  ``fields`` when parts are missing) or ``csv_not_configured``
- ``dis_tailer_locations``: locations with a worker
- ``dis_tailer_bytes_behind``: log bytes of the location not yet acknowledged by the DIS
- ``dis_tailer_acked_bytes_total``: bytes the DIS acknowledged
- ``dis_tailer_corrupt_frames_total``: corrupt frames found (each one counted once)
- ``dis_tailer_reconnects_total``: failed streams, reconnected with backoff
- ``dis_tailer_refusals_total{code}``: streams the DIS refused (schema mismatch, unknown table, ...)
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Iterator

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from disd.tailer.core import Tailer

#: Every series of the collector, for the documentation and the tests (counters with ``_total``).
SERIES = (
    "dis_tailer_files_watched",
    "dis_tailer_files_skipped",
    "dis_tailer_locations",
    "dis_tailer_bytes_behind",
    "dis_tailer_acked_bytes_total",
    "dis_tailer_corrupt_frames_total",
    "dis_tailer_reconnects_total",
    "dis_tailer_refusals_total",
)


class TailerCollector:
    def __init__(self, tailer: "Tailer") -> None:
        self.tailer = tailer

    def collect(self) -> Iterator[Metric]:
        scan = self.tailer.last_scan()
        watched = GaugeMetricFamily("dis_tailer_files_watched", "Log files found by the last directory scan",
                                    labels=["kind"])
        watched.add_metric(["binlog"], scan.file_count)
        watched.add_metric(["csv"], len(scan.csv_files))
        yield watched
        skipped = GaugeMetricFamily("dis_tailer_files_skipped",
                                    "Files of the log directories not streamed, by reason (the wrong part of "
                                    "the name, or csv_not_configured)", labels=["reason"])
        for reason, n in sorted(collections.Counter(sk.reason for sk in scan.skipped.values()).items()):
            skipped.add_metric([reason], n)
        yield skipped

        lbl = ["table", "location"]
        behind = GaugeMetricFamily("dis_tailer_bytes_behind",
                                   "Log bytes of the location not yet acknowledged by the DIS", labels=lbl)
        acked = CounterMetricFamily("dis_tailer_acked_bytes_total", "Log bytes the DIS acknowledged", labels=lbl)
        corrupt = CounterMetricFamily("dis_tailer_corrupt_frames_total",
                                      "Corrupt frames found in the location's logs (each counted once)", labels=lbl)
        reconnects = CounterMetricFamily("dis_tailer_reconnects_total",
                                         "Ingest streams of the location that failed and were reopened", labels=lbl)
        refusals = CounterMetricFamily("dis_tailer_refusals_total",
                                       "Ingest streams of the location the DIS refused, by gRPC status",
                                       labels=[*lbl, "code"])
        workers = self.tailer.workers()
        for w in workers:
            labels = [w.key.table_key, str(w.key)]
            behind.add_metric(labels, w.bytes_behind(self.tailer.files_of(w.key)))
            c = w.counters()
            acked.add_metric(labels, c["acked_bytes"])
            corrupt.add_metric(labels, c["corrupt_frames"])
            reconnects.add_metric(labels, c["reconnects"])
            for code, n in sorted(c["refusals"].items()):
                refusals.add_metric([*labels, code], n)
        locations = GaugeMetricFamily("dis_tailer_locations", "Locations the tailer streams (one worker each)")
        locations.add_metric([], len(workers))
        yield from (locations, behind, acked, corrupt, reconnects, refusals)


def tailer_registry(tailer: "Tailer") -> CollectorRegistry:
    """The registry of one tailer's endpoint: its collector and the process metrics."""
    reg = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=reg)
    PlatformCollector(registry=reg)
    GCCollector(registry=reg)
    reg.register(TailerCollector(tailer))
    return reg
