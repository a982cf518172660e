"""Prometheus metrics of the gRPC services (the storage engine's counters are in
``disd.storage.metrics``).

Counters of events (chunks, rejections, block reads) are process-wide, on prometheus_client's
default registry.  Everything that describes *one server's state* (its locations and those in
error, its open column-file descriptors, its block cache and subscribers, its connected tailers,
the disk of its database root) is computed at scrape time by a ``ServerCollector`` that belongs to
that server and lives in that server's own registry (``server_registry``): two ``DisServer``s in
one process (tests, ``dis demo``, embedding) then never collide on the default registry, and each
endpoint reports its own state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Iterable, Iterator

from prometheus_client import REGISTRY, CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from disd.names import LocationKey
from disd.storage.lastby import metric_columns as lastby_metric_columns

from disd.server.exposition import GaugeColumn, label_text, render_gauges
from disd.server.status import disk_usage

if TYPE_CHECKING:
    from disd.server.ingestsessions import SessionRegistry
    from disd.server.tabledata import TableDataService
    from disd.storage import Location, StorageEngine

INGEST_CHUNKS = Counter("dis_ingest_chunks_total", "Log chunks received from tailers", ["table"])
INGEST_REJECTIONS = Counter(
    "dis_ingest_rejections_total", "Ingest streams or chunks refused, by gRPC status", ["code"]
)
BLOCK_READS = Counter("dis_block_reads_total", "ReadBlock calls served")
BLOCK_CACHE_HITS = Counter("dis_block_cache_hits_total", "ReadBlock calls served from the block cache")
HEAP_TRIMS = Counter(
    "dis_heap_trims_total", "Times free malloc heap memory was handed back to the system (disd.allocator.HeapTrimmer)"
)

#: Every series a ServerCollector produces, for the documentation and the drift tests.
SERVER_SERIES = (
    "dis_locations",
    "dis_partitions_in_error",
    "dis_open_file_handles",
    "dis_block_cache_bytes",
    "dis_subscribers",
    "dis_connected_tailers",
    "dis_location_tailer_connected",
    "dis_location_tailer_problem",
    "dis_location_rows",
    "dis_location_checkpointed_rows",
    "dis_location_in_error",
    "dis_location_schema_version",
    "dis_flush_age_seconds",
    "dis_checkpoint_age_seconds",
    "dis_checkpoint_interval_seconds",
    "dis_db_disk_free_bytes",
    "dis_db_disk_total_bytes",
)


@dataclass(frozen=True)
class LocationSeries:
    """What a location's series need of its key: their label text (``{location=...,table=...}``),
    its table key and its name (``str(key)``), made once for the location's life."""

    labels: str
    table: str
    location: str

    @classmethod
    def of(cls, key: LocationKey) -> "LocationSeries":
        return cls(label_text({"table": key.table_key, "location": str(key)}), key.table_key, str(key))


class ServerCollector:
    """Gauges computed at scrape time from one server's engine and ingest sessions.

    Per location (labels ``table``, ``location``): published and checkpointed rows, error state,
    the schema version it is written in (0 while in error before its version is known),
    whether a tailer is connected and whether it reports a problem, flush and checkpoint age and the checkpoint interval (the
    stale-checkpoint alert divides one by the other).  Per server: open ingest streams and the
    free and total bytes of the database root's filesystem; its locations, those in error, open
    column-file descriptors, block-cache bytes and open Subscribe streams.  A per-location gauge
    at 0 (rather than an absent series) is what lets "tailer disconnected" fire for one location.

    The per-server gauges come from ``collect`` (prometheus_client's metric objects); the
    per-location ones, a dozen series per location, from ``exposition`` as text rendered in one
    pass (``disd.server.exposition``): the locations open now (no walk of the disk), each one's
    figures read from attributes its writers replace whole, without its lock."""

    def __init__(self, engine: "StorageEngine", sessions: "SessionRegistry", db_root: str,
                 tabledata: "TableDataService | None" = None) -> None:
        self.engine = engine
        self.sessions = sessions
        self.db_root = db_root
        self.tabledata = tabledata
        #: what each open location's series need of its key, made once (by Location object: its
        #: key's own hash is computed in Python at each use)
        self._series: dict[Location, LocationSeries] = {}

    def _server_gauges(self, locations: list[Location]) -> Iterator[Metric]:
        values = [
            ("dis_locations", "Locations open", len(locations)),
            ("dis_partitions_in_error", "Locations in error state (not accepting rows)",
             sum(map(attrgetter("in_error"), locations))),
            ("dis_open_file_handles", "Column-file descriptors currently open", self.engine.file_handles.open_count),
        ]
        if self.tabledata is not None:
            values += [
                ("dis_block_cache_bytes", "Bytes held by the block cache", self.tabledata.cache.size_bytes),
                ("dis_subscribers", "Open Subscribe streams", self.tabledata.subscribers),
            ]
        for name, doc, value in values:
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], value)
            yield g

    def collect(self) -> Iterator[Metric]:
        yield from self._server_gauges(self.engine.open_locations())
        total = GaugeMetricFamily("dis_connected_tailers", "Ingest streams currently open")
        total.add_metric([], len(self.sessions.sessions()))
        yield total
        avail, total_bytes = disk_usage(self.db_root)
        if not total_bytes:
            return
        free = GaugeMetricFamily("dis_db_disk_free_bytes", "Bytes available to the DIS on the database root's filesystem")
        free.add_metric([], avail)
        size = GaugeMetricFamily("dis_db_disk_total_bytes", "Size of the database root's filesystem")
        size.add_metric([], total_bytes)
        yield free
        yield size

    def series(self, locations: list[Location]) -> list[LocationSeries]:
        """Each location's ``LocationSeries``, from the cache (which keeps to the locations given)."""
        old = self._series
        made = {loc: old.get(loc) or LocationSeries.of(loc.key) for loc in locations}
        self._series = made
        return list(made.values())

    def columns(self, locations: list[Location], series: list[LocationSeries], now: float) -> list[GaugeColumn]:
        """The per-location families over ``locations`` (whose ``series`` they are), a value per
        location each."""
        names = list(map(attrgetter("location"), series))
        tables = list(map(attrgetter("table"), series))
        with_tailer = {str(s.key) for s in self.sessions.sessions()}
        problems = {str(k) for k in self.sessions.problems()}
        intervals: dict[str, float] = {}
        for tk in set(tables):
            intervals[tk] = self.engine.import_config(tk).checkpoint_interval_ms / 1000.0
        checkpointed_at = map(attrgetter("last_checkpoint_time"), locations)
        cols = [
            GaugeColumn("dis_location_tailer_connected", "1 while a tailer holds the location's ingest stream, else 0",
                        list(map(int, map(with_tailer.__contains__, names)))),
            GaugeColumn("dis_location_tailer_problem", "1 while the location's tailer reports a problem on its side "
                        "(dis status shows it), else 0", list(map(int, map(problems.__contains__, names)))),
            GaugeColumn("dis_location_rows", "Published rows of the location",
                        list(map(attrgetter("published_rows"), locations))),
            GaugeColumn("dis_location_checkpointed_rows", "Rows of the location's last checkpoint",
                        list(map(attrgetter("checkpointed_rows"), locations))),
            GaugeColumn("dis_location_in_error", "1 while the location is in error state, else 0",
                        list(map(int, map(attrgetter("in_error"), locations)))),
            GaugeColumn("dis_location_schema_version",
                        "Schema version of the table the location is written in (0: unknown, in error)",
                        list(map(attrgetter("schema_version"), locations))),
            GaugeColumn("dis_flush_age_seconds", "Seconds the location's published rows have been behind its rows "
                        "(since it took rows no flush has published; with none, since the flusher's last cycle)",
                        self.engine.flush_ages(locations, now)),
            GaugeColumn("dis_checkpoint_age_seconds", "Seconds since the location's last checkpoint",
                        [(now - t if t < now else 0.0) if t else None for t in checkpointed_at]),
            GaugeColumn("dis_checkpoint_interval_seconds", "Configured checkpoint interval",
                        list(map(intervals.__getitem__, tables))),
        ]
        cols += [GaugeColumn(name, doc, values) for name, doc, values in lastby_metric_columns(locations)]
        return cols

    def exposition(self, openmetrics: bool, names: frozenset[str] | None) -> str:
        """The per-location families as exposition text (``disd.server.exposition.RenderedFamilies``)."""
        locations = self.engine.open_locations()
        series = self.series(locations)
        labels = list(map(attrgetter("labels"), series))
        return render_gauges(labels, self.columns(locations, series, time.time()), openmetrics, names)


class _ProcessMetrics:
    """Forwards the default registry (process-wide counters, process and GC metrics) into a
    server's registry.  No ``describe``: registration then checks no names, as the forwarded
    collectors were checked on the default registry already."""

    def collect(self) -> Iterable[Metric]:
        return REGISTRY.collect()


def server_registry(collector: Collector) -> CollectorRegistry:
    """The registry one server's ``/metrics`` endpoint serves: the process-wide metrics and the
    server's own collector."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_ProcessMetrics())
    reg.register(collector)
    return reg
