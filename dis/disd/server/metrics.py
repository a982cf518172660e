"""Prometheus metrics of the gRPC services (the storage engine's are in disd.metrics)."""

from prometheus_client import Counter, Gauge

CONNECTED_TAILERS = Gauge("dis_connected_tailers", "Ingest streams currently open")
INGEST_CHUNKS = Counter("dis_ingest_chunks_total", "Log chunks received from tailers", ["table"])
INGEST_REJECTIONS = Counter(
    "dis_ingest_rejections_total", "Ingest streams or chunks refused, by gRPC status", ["code"]
)
BLOCK_READS = Counter("dis_block_reads_total", "ReadBlock calls served")
BLOCK_CACHE_HITS = Counter("dis_block_cache_hits_total", "ReadBlock calls served from the block cache")
BLOCK_CACHE_BYTES = Gauge("dis_block_cache_bytes", "Bytes held by the block cache")
SUBSCRIBERS = Gauge("dis_subscribers", "Open Subscribe streams")


class EngineCollector:
    """Gauges computed at scrape time from the engine's state: checkpoint age and interval per
    location (the stale-checkpoint alert divides one by the other) and free space on the disk of
    the database root."""

    def __init__(self, engine, db_root: str) -> None:  # noqa: ANN001
        self.engine = engine
        self.db_root = db_root

    def collect(self):  # noqa: ANN201
        import os
        import time

        from prometheus_client.core import GaugeMetricFamily

        age = GaugeMetricFamily("dis_checkpoint_age_seconds", "Seconds since the location's last checkpoint",
                                labels=["table", "location"])
        interval = GaugeMetricFamily("dis_checkpoint_interval_seconds", "Configured checkpoint interval",
                                     labels=["table", "location"])
        now = time.time()
        for loc in list(self.engine.locations()):
            labels = [loc.key.table_key, str(loc.key)]
            last = getattr(loc, "last_checkpoint_time", None)
            if last:
                age.add_metric(labels, now - last)
            ivl = self.engine.import_config(loc.key.table_key).checkpoint_interval_ms / 1000.0
            interval.add_metric(labels, ivl)
        yield age
        yield interval
        try:
            st = os.statvfs(self.db_root)
        except OSError:
            return
        free = GaugeMetricFamily("dis_db_disk_free_bytes", "Free bytes on the database root's filesystem")
        free.add_metric([], st.f_bavail * st.f_frsize)
        total = GaugeMetricFamily("dis_db_disk_total_bytes", "Size of the database root's filesystem")
        total.add_metric([], st.f_blocks * st.f_frsize)
        yield free
        yield total
