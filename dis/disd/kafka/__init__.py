"""Pull mode: the DIS consumes Kafka topics into its tables exactly once, resuming from the offsets
in its checkpoints (docs/kafka.md).  ``config`` (``import.kafka``), ``decode`` (messages to Arrow
columns in batches), ``consumer`` (one source's loop), ``service`` (the sources of a DIS, metrics)."""

from disd.kafka.config import KafkaConfig, SourceConfig, parse_kafka_config
from disd.kafka.service import KafkaCollector, KafkaImport

__all__ = ["KafkaCollector", "KafkaConfig", "KafkaImport", "SourceConfig", "parse_kafka_config"]
