"""The fetcher's cut of a ``consume`` result (``disd.kafka.fetcher``), in process with
confluent_kafka ``Message`` objects: per partition in offset order, offsets exact also across a
gap (compaction, transaction markers), error events apart, each batch tagged with its
partition's generation (-1: not assigned, so the loop thread drops it)."""

from __future__ import annotations

import threading

from confluent_kafka import KafkaError, Message

from disd.kafka.fetcher import Fetcher


def fetcher() -> Fetcher:
    return Fetcher("t", None, 100, (True, False, False), lambda: {}, threading.Event())


def msg(p: int, off: int) -> Message:
    return Message(topic="t", partition=p, offset=off, value=f"v{p}.{off}".encode(), key=f"k{off}".encode())


def test_split_by_partition_with_gap_and_error():
    msgs = [msg(0, 10), msg(1, 3), msg(0, 11), msg(1, 4), msg(0, 12), msg(1, 9), msg(2, 0),
            Message(topic="t", partition=1, error=KafkaError(KafkaError._AUTO_OFFSET_RESET))]
    out = fetcher().split(msgs, {0: 7, 1: 2}, drained=True)
    errors = [f for f in out if f.error is not None]
    assert len(errors) == 1 and errors[0].error.error().code() == KafkaError._AUTO_OFFSET_RESET
    batches = {f.partition: f for f in out if f.error is None}
    assert sorted(batches) == [0, 1, 2]
    assert batches[0].generation == 7 and batches[1].generation == 2 and batches[2].generation == -1
    assert batches[0].batch.offsets.tolist() == [10, 11, 12]  # contiguous: read at the ends only
    assert batches[1].batch.offsets.tolist() == [3, 4, 9]  # a gap: every offset read
    assert batches[1].batch.values == [b"v1.3", b"v1.4", b"v1.9"]
    assert batches[1].batch.keys == [b"k3", b"k4", b"k9"]
    assert batches[2].batch.offsets.tolist() == [0] and all(f.drained for f in batches.values())


def test_split_one_partition():
    out = fetcher().split([msg(4, 100 + i) for i in range(5)], {4: 1}, drained=False)
    assert len(out) == 1 and out[0].batch.offsets.tolist() == list(range(100, 105)) and not out[0].drained
    assert out[0].batch.partition == 4


def test_messages_that_cannot_be_cut_are_reported_lost(mock_kafka):
    """A real consumer on the mock cluster; the cut fails: the loop thread is told to re-seek
    (``lost``) instead of the messages vanishing."""
    from confluent_kafka import Consumer, TopicPartition

    from .test_kafka_exactly_once import produce

    assert produce(mock_kafka.bootstrap, "one", 5, 1, 5, 0).wait(30) == 0
    c = Consumer({"bootstrap.servers": mock_kafka.bootstrap, "group.id": "t", "enable.auto.commit": False})
    c.assign([TopicPartition("one", 0, 0)])
    stop = threading.Event()
    f = Fetcher("t", c, 100, (False, False, False), lambda: {0: 1}, stop)

    def broken(*_a):
        raise RuntimeError("cut failed")

    f.split = broken
    f.start()
    try:
        out = f.queue.get(timeout=20)
    finally:
        stop.set()
        f.join(5)
        c.close()
    assert len(out) == 1 and out[0].lost and out[0].batch is None
