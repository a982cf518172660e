"""Prometheus counters and histograms of the storage engine (the gRPC services' are in
``disd.server.metrics``).

Only events live here, on prometheus_client's default registry: they add up across every engine
of a process, as counters should.  Gauges of one engine's *state* (its locations, those in error,
its open descriptors) are computed at scrape time by the owning server's collector
(``disd.server.metrics.ServerCollector``), so two servers in one process never overwrite each
other's.  Names follow Prometheus conventions: the ``dis_`` prefix, base units (seconds, bytes),
``_total`` for counters.
"""

import threading
from typing import Iterator, Sequence

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString


class BatchHistogram:
    """A histogram fed a batch's observations at once: ``observe_counts`` adds how many fell in
    each bucket and their sum, as the compiled write path counts them (``ingestcore.write_out``)
    instead of an ``observe`` call per write.  Exported at scrape time as prometheus_client's
    ``Histogram`` would be."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float]) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = tuple(float(b) for b in buckets)
        self._counts = [0] * (len(self.bounds) + 1)  # the last: above every bound
        self._sum = 0.0
        self._lock = threading.Lock()
        REGISTRY.register(self)

    def observe(self, value: float) -> None:
        i = 0
        while i < len(self.bounds) and value > self.bounds[i]:
            i += 1
        with self._lock:
            self._counts[i] += 1
            self._sum += value

    def observe_counts(self, counts: Sequence[int], total: float) -> None:
        """``counts[i]``: observations in bucket ``i`` (at most ``bounds[i]``, above the one
        before; the last, above every bound); ``total``: their sum."""
        with self._lock:
            for i, n in enumerate(counts):
                self._counts[i] += n
            self._sum += total

    def collect(self) -> Iterator[HistogramMetricFamily]:  # noqa: ANN201 - prometheus_client's collector protocol
        with self._lock:
            counts, total = list(self._counts), self._sum
        buckets, acc = [], 0
        for bound, n in zip(list(self.bounds) + [float("inf")], counts):
            acc += n
            buckets.append((floatToGoString(bound), acc))
        yield HistogramMetricFamily(self.name, self.documentation, buckets=buckets, sum_value=total)

    def describe(self) -> list[HistogramMetricFamily]:  # noqa: ANN201
        return [HistogramMetricFamily(self.name, self.documentation)]


ROWS_INGESTED = Counter("dis_rows_ingested_total", "Rows written to column files", ["table"])
ROWS_COMMITTED = Counter("dis_rows_committed_total", "Rows committed (single rows and ended transactions)", ["table"])
BYTES_INGESTED = Counter("dis_bytes_ingested_total", "Log bytes of ingested frames", ["table"])
ROWS_ROLLED_BACK = Counter("dis_rows_rolled_back_total", "Uncommitted transaction rows truncated away", ["table"])
MALFORMED_FLAGS = Counter(
    "dis_malformed_flag_sequences_total", "End without Start, Start or SingleRow inside a transaction", ["table", "kind"]
)
#: the buckets are ingestcore.c's BOUNDS: the compiled writes count into them
WRITE_SIZE = BatchHistogram(
    "dis_write_size_bytes", "Size of each write to a column file",
    buckets=(1, 16, 256, 1024, 4096, 16384, 32768, 65536),
)
FLUSH_DURATION = Histogram(
    "dis_flush_duration_seconds",
    "Time to write the dirty buffers of the locations flushed together (a batch of chunks', a flush tick's, or one) and publish them",
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
