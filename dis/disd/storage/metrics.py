"""Prometheus counters and histograms of the storage engine (the gRPC services' are in
``disd.server.metrics``).

Only events live here, on prometheus_client's default registry: they add up across every engine
of a process, as counters should.  Gauges of one engine's *state* (its locations, those in error,
its open descriptors) are computed at scrape time by the owning server's collector
(``disd.server.metrics.ServerCollector``), so two servers in one process never overwrite each
other's.  Names follow Prometheus conventions: the ``dis_`` prefix, base units (seconds, bytes),
``_total`` for counters.
"""

from prometheus_client import Counter, Histogram

ROWS_INGESTED = Counter("dis_rows_ingested_total", "Rows written to column files", ["table"])
ROWS_COMMITTED = Counter("dis_rows_committed_total", "Rows committed (single rows and ended transactions)", ["table"])
BYTES_INGESTED = Counter("dis_bytes_ingested_total", "Log bytes of ingested frames", ["table"])
ROWS_ROLLED_BACK = Counter("dis_rows_rolled_back_total", "Uncommitted transaction rows truncated away", ["table"])
MALFORMED_FLAGS = Counter(
    "dis_malformed_flag_sequences_total", "End without Start, Start or SingleRow inside a transaction", ["table", "kind"]
)
WRITE_SIZE = Histogram(
    "dis_write_size_bytes", "Size of each write to a column file",
    buckets=(1, 16, 256, 1024, 4096, 16384, 32768, 65536),
)
FLUSH_DURATION = Histogram(
    "dis_flush_duration_seconds", "Time to write a location's dirty buffers and publish",
    buckets=(0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0),
)
CHECKPOINT_DURATION = Histogram(
    "dis_checkpoint_duration_seconds", "Time to checkpoint a location (fsyncs and table.size rename)",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0),
)
HANDLE_RECLAIMS = Counter("dis_file_handle_reclaims_total", "Open column-file handles closed to stay under the limit")
HANDLE_FAST_CYCLING = Counter(
    "dis_file_handle_fast_cycling_total", "Times 20% of max_open_files were reclaimed within 60 s"
)
IO_ERRORS = Counter(
    "dis_io_errors_total", "Failed file-system operations of the storage engine, by operation and errno",
    ["op", "errno"],
)
LOCATION_RECOVERIES = Counter(
    "dis_location_recoveries_total", "Locations reopened from their checkpoint after an I/O error, by result",
    ["result"],
)
