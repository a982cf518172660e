"""Stub of the C module rdbatch.c (setup.py builds it): a batch of Kafka messages out of librdkafka
into flat buffers, grouped by partition (ascending; the order consumed within one)."""

from typing import Any

# path: the loaded librdkafka file; consumer_type: confluent_kafka.cimpl.Consumer
def bind(path: str, consumer_type: type, /) -> None: ...

# ValueError (or TypeError, RuntimeError when closed) unless the consumer's layout is the one read
def check(consumer: Any, /) -> None: ...

# (events consumed, error events included;
#  data: each message's value then sep; starts, ends: int64 each, value k is data[starts[k]:ends[k]];
#  flags: uint8 each, 1 a null value, 2 a value holding a line break (only with a sep);
#  partitions: int32 each; offsets: int64 each; timestamps: int64 each (-1 none) or None;
#  key data, key offsets (int32, one more than messages), key validity bitmap: an Arrow binary
#  array's buffers, or None;
#  error events: (topic or None, partition, offset, error code, error string) each)
def consume(consumer: Any, max_messages: int, timeout_ms: int, linger_ms: int, wait_first: bool, sep: bytes,
            keys: bool, timestamps: bool, /) -> tuple[int, bytes, bytes, bytes, bytes, bytes, bytes, bytes | None,
                                                      bytes | None, bytes | None, bytes | None,
                                                      list[tuple[str | None, int, int, int, str]]]: ...
