"""Pull mode: the DIS consumes Kafka topics into its tables exactly once, resuming from the offsets
in its checkpoints (docs/kafka.md).  ``config`` (``import.kafka``), ``decode`` (messages to Arrow
columns in batches), ``fetcher`` and ``child`` (a source's fetch process: consume and decode),
``link`` (the DIS's end of it), ``consumer`` (one source's loop: route, append, offsets),
``service`` (the sources of a DIS, metrics).

The names below are imported when first used: the fetch process (``python -m disd.kafka.child``)
imports this package too, and needs none of the DIS's side (storage, metrics), which would add to
its start."""

from typing import Any

__all__ = ["KafkaCollector", "KafkaConfig", "KafkaImport", "SourceConfig", "parse_kafka_config"]

_WHERE = {"KafkaCollector": "service", "KafkaImport": "service", "KafkaConfig": "config", "SourceConfig": "config",
          "parse_kafka_config": "config"}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'disd.kafka' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"disd.kafka.{_WHERE[name]}"), name)
