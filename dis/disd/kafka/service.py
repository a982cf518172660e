"""Pull mode in a running DIS: every configured source's consumer, their per-partition metrics and
what ``dis status`` shows of a Kafka location.

``dis serve`` builds a ``KafkaImport`` after the storage engine has recovered every location
(so each partition resumes from its locations' checkpoints) and stops it before the engine's
final checkpoint (so that checkpoint holds every row consumed).
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from disd.kafka.config import KafkaConfig
from disd.kafka.consumer import PartitionState, SourceConsumer
from disd.names import LocationKey
from disd.storage import StorageEngine

#: Every series ``KafkaCollector`` produces, for the documentation and the drift tests.
KAFKA_SERIES = (
    "dis_kafka_lag_messages",
    "dis_kafka_next_offset",
    "dis_kafka_messages_total",
    "dis_kafka_bytes_total",
    "dis_kafka_errors_total",
    "dis_kafka_partition_stopped",
    "dis_kafka_client_errors_total",
)


class KafkaImport:
    def __init__(self, config: KafkaConfig, engine: StorageEngine) -> None:
        self.config = config
        self.consumers = [SourceConsumer(config, s, engine) for s in config.sources]

    def start(self) -> None:
        for c in self.consumers:
            c.start()

    def stop(self) -> None:
        for c in self.consumers:
            c.stop()

    def partitions(self) -> list[PartitionState]:
        return [st for c in self.consumers for st in c.snapshot()]

    def status(self, key: LocationKey) -> PartitionState | None:
        """The Kafka partition feeding location ``key``, if one does."""
        for c in self.consumers:
            s = c.src.schema
            if (key.namespace, key.table) != (s.namespace, s.table):
                continue
            for st in c.snapshot():
                if st.internal_partition == key.internal_partition:
                    return st
        return None


class KafkaCollector:
    """Per source partition (labels ``source``, ``topic``, ``partition``, ``table``): lag (high
    watermark minus next offset), next offset, messages, bytes, poison and fetch errors, and
    whether it is stopped; per source, errors of the client (broker, metadata)."""

    def __init__(self, kafka: KafkaImport) -> None:
        self.kafka = kafka

    def collect(self) -> Iterator[Metric]:
        lbl = ["source", "topic", "partition", "table"]
        lag = GaugeMetricFamily("dis_kafka_lag_messages", "Messages in the partition not yet consumed (high "
                                "watermark minus next offset)", labels=lbl)
        nxt = GaugeMetricFamily("dis_kafka_next_offset", "Next offset of the partition to consume", labels=lbl)
        msgs = CounterMetricFamily("dis_kafka_messages", "Messages consumed", labels=lbl)
        nbytes = CounterMetricFamily("dis_kafka_bytes", "Bytes of message values consumed", labels=lbl)
        errors = CounterMetricFamily("dis_kafka_errors", "Poison messages and fetch errors of the partition",
                                     labels=lbl)
        stopped = GaugeMetricFamily("dis_kafka_partition_stopped", "1 while the partition is stopped (a poison "
                                    "message, its location in error), else 0", labels=lbl)
        client = CounterMetricFamily("dis_kafka_client_errors", "Errors of the Kafka client (broker, metadata)",
                                     labels=["source"])
        for c in self.kafka.consumers:
            client.add_metric([c.src.name], c.client_errors)
            for st in c.snapshot():
                labels = [st.source, st.topic, str(st.partition), st.table]
                if st.lag is not None:
                    lag.add_metric(labels, st.lag)
                if st.next_offset >= 0:
                    nxt.add_metric(labels, st.next_offset)
                msgs.add_metric(labels, st.messages)
                nbytes.add_metric(labels, st.bytes)
                errors.add_metric(labels, st.errors)
                stopped.add_metric(labels, 1.0 if st.stopped else 0.0)
        yield from (lag, nxt, msgs, nbytes, errors, stopped, client)
