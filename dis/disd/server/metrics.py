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
