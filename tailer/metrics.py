"""The tailer's Prometheus endpoint (``metrics_port`` in its configuration; none without it).

Everything is computed at scrape time from the running ``Tailer`` by a ``TailerCollector`` in the
tailer's own registry (with the process metrics): two tailers in one process (tests, ``dis demo``)
never collide, and nothing is registered on prometheus_client's default registry.

Series (labels ``table``, ``location`` per location, as the DIS's; a location routed to a replica
set is streamed to each replica, and its series cover all of them: ``bytes_behind`` is that of the
replica furthest behind, the counters are summed over the replicas' streams, corrupt frames counted
once however many streams found them):

- ``dis_tailer_files_watched{kind}``: log files found by the last scan (``binlog``: binary logs,
  spool logs included; ``csv``: CSV files of ``csv_tables``)
- ``dis_tailer_files_skipped{reason}``: files of the log directories that are not streamed, by
  reason: the part of the name that is wrong (``namespace_kind``, ``month``, ``suffix``, ...,
  ``fields`` when parts are missing) or ``csv_not_configured``
- ``dis_tailer_locations``: locations with workers (one per replica of the location's entry)
- ``dis_tailer_bytes_behind``: log bytes of the location not yet acknowledged by the DIS
- ``dis_tailer_stranded_bytes``: bytes in files of the location that its stream had already
  passed when they appeared (a second writer on the location: ``disd.tailer.passed``); they can
  never be ingested into it.  Alert ``DisTailerStrandedBytes``.
- ``dis_tailer_acked_bytes_total``: bytes the DIS acknowledged
- ``dis_tailer_corrupt_frames_total``: corrupt frames found (each one counted once)
- ``dis_tailer_reconnects_total``: failed streams, reconnected with backoff
- ``dis_tailer_refusals_total{code}``: streams the DIS refused (schema mismatch, unknown table, ...)

Per replica (labels ``replica``: its name in the routing, ``address``), for every DIS the tailer
streams at least one location to (a plain routing entry is a replica set of one):

- ``dis_tailer_replica_connected``: 1 when the tailer has an open stream to the replica or it
  answered the last attempt of one of its locations (a refusal is an answer); 0 when its streams'
  attempts fail (down, unreachable).  Alert ``DisReplicaDown``.
- ``dis_tailer_replica_bytes_behind``: log bytes on disk past the replica's acknowledged positions,
  summed over its locations: what it has to catch up.  Alert ``DisReplicaLagging``.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Iterator

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from disd.tailer.status import replica_connected

if TYPE_CHECKING:
    from disd.tailer.core import Tailer

#: Every series of the collector, for the documentation and the tests (counters with ``_total``).
SERIES = (
    "dis_tailer_files_watched",
    "dis_tailer_files_skipped",
    "dis_tailer_locations",
    "dis_tailer_bytes_behind",
    "dis_tailer_stranded_bytes",
    "dis_tailer_acked_bytes_total",
    "dis_tailer_corrupt_frames_total",
    "dis_tailer_reconnects_total",
    "dis_tailer_refusals_total",
    "dis_tailer_replica_connected",
    "dis_tailer_replica_bytes_behind",
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
        stranded = GaugeMetricFamily("dis_tailer_stranded_bytes",
                                     "Bytes in files of the location its stream had passed when they appeared: "
                                     "never ingested into it (two writers on one location?)", labels=lbl)
        acked = CounterMetricFamily("dis_tailer_acked_bytes_total", "Log bytes the DIS acknowledged", labels=lbl)
        corrupt = CounterMetricFamily("dis_tailer_corrupt_frames_total",
                                      "Corrupt frames found in the location's logs (each counted once)", labels=lbl)
        reconnects = CounterMetricFamily("dis_tailer_reconnects_total",
                                         "Ingest streams of the location that failed and were reopened", labels=lbl)
        refusals = CounterMetricFamily("dis_tailer_refusals_total",
                                       "Ingest streams of the location the DIS refused, by gRPC status",
                                       labels=[*lbl, "code"])
        rlbl = ["replica", "address"]
        r_connected = GaugeMetricFamily("dis_tailer_replica_connected",
                                        "1 when the tailer has an open stream to the replica or it answered the "
                                        "last attempt; 0 when its streams fail", labels=rlbl)
        r_behind = GaugeMetricFamily("dis_tailer_replica_bytes_behind",
                                     "Log bytes on disk past the replica's acknowledged positions, summed over "
                                     "its locations", labels=rlbl)
        per_replica: dict[tuple[str, str], list] = {}  # (name, address) -> [bytes behind, reachability]
        keys = self.tailer.locations_streamed()
        for key in keys:
            ws = self.tailer.workers_of(key)
            lf = self.tailer.files_of(key)
            labels = [key.table_key, str(key)]
            most = most_stranded = 0
            acked_n = reconnects_n = 0
            seen: set = set()
            codes: collections.Counter[str] = collections.Counter()
            for w in ws:
                b = w.bytes_behind(lf)
                most = max(most, b)
                c = w.counters()
                most_stranded = max(most_stranded, c["stranded_bytes"])
                acked_n += c["acked_bytes"]
                reconnects_n += c["reconnects"]
                seen |= c["corrupt_seen"]
                codes.update(c["refusals"])
                if w.replica is not None:
                    r = per_replica.setdefault((w.replica.name, w.replica.address), [0, []])
                    r[0] += b
                    r[1].append(w.reachable)
            behind.add_metric(labels, most)
            stranded.add_metric(labels, most_stranded)
            acked.add_metric(labels, acked_n)
            corrupt.add_metric(labels, len(seen))
            reconnects.add_metric(labels, reconnects_n)
            for code, n in sorted(codes.items()):
                refusals.add_metric([*labels, code], n)
        for (name, address), (b, reach) in sorted(per_replica.items()):
            r_connected.add_metric([name, address], 1 if replica_connected(reach) else 0)
            r_behind.add_metric([name, address], b)
        locations = GaugeMetricFamily("dis_tailer_locations", "Locations the tailer streams (one worker per replica "
                                      "each)")
        locations.add_metric([], len(keys))
        yield from (locations, behind, stranded, acked, corrupt, reconnects, refusals, r_connected, r_behind)


def tailer_registry(tailer: "Tailer") -> CollectorRegistry:
    """The registry of one tailer's endpoint: its collector and the process metrics."""
    reg = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=reg)
    PlatformCollector(registry=reg)
    GCCollector(registry=reg)
    reg.register(TailerCollector(tailer))
    return reg
