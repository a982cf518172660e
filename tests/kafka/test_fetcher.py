"""The fetching half (``disd.kafka.fetcher``) in process, with confluent_kafka ``Message``
objects: the cut of a ``consume`` result per partition in offset order, offsets exact also
across a gap (compaction, transaction markers), error events apart, each batch tagged with its
partition's generation (a partition not assigned is left out), messages the DIS already has
dropped, poison messages named by offset in the encoded batch; and messages that cannot be cut
reported lost."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from confluent_kafka import KafkaError, Message

from disd.kafka.fetcher import OFFSET_COLUMN, Fetcher, split

from .test_kafka_config import parse


def fetcher(sent: list | None = None, **source) -> Fetcher:
    src = parse(columns={"Sym": "key", "Size": "value.size"}, column_partition="2026-11-23", **source).sources[0]
    return Fetcher(src, None, lambda h, b: sent.append((h, b)) if sent is not None else None)


def msg(p: int, off: int, value: bytes | None = None) -> Message:
    return Message(topic="t", partition=p, offset=off, value=value or b'{"size": %d}' % off, key=f"k{off}".encode())


def test_split_by_partition_with_gap_and_error():
    msgs = [msg(0, 10), msg(1, 3), msg(0, 11), msg(1, 4), msg(0, 12), msg(1, 9), msg(2, 0),
            Message(topic="t", partition=1, error=KafkaError(KafkaError._AUTO_OFFSET_RESET))]  # noqa: SLF001 - confluent_kafka names librdkafka's own error codes with a leading underscore
    groups, errors = split(msgs)
    assert len(errors) == 1 and errors[0].error().code() == KafkaError._AUTO_OFFSET_RESET  # noqa: SLF001 - confluent_kafka names librdkafka's own error codes with a leading underscore
    assert sorted(groups) == [0, 1, 2]
    f = fetcher()
    f.gens = {0: 7, 1: 2}
    out = f.cut(msgs, drained=True)
    assert out[0][0][:4] == ("error", "t", 1, KafkaError._AUTO_OFFSET_RESET)  # noqa: SLF001 - confluent_kafka names librdkafka's own error codes with a leading underscore
    batches = {h[1]: (h, b) for h, b in out if h[0] == "decode"}
    assert sorted(batches) == [0, 1]  # partition 2 is not assigned: left out
    assert batches[0][0] == ("decode", 0, 7, False) and batches[1][0] == ("decode", 1, 2, True)  # drained: last
    assert batches[0][1].offsets.tolist() == [10, 11, 12]  # contiguous: read at the ends only
    assert batches[1][1].offsets.tolist() == [3, 4, 9]  # a gap: every offset read
    assert batches[1][1].values == [b'{"size": 3}', b'{"size": 4}', b'{"size": 9}']
    assert batches[1][1].keys == [b"k3", b"k4", b"k9"]
    assert f.expect == {0: 13, 1: 10}


def test_messages_the_dis_has_are_dropped():
    """After an assignment at offset 11, a message below it (delivered again) is not sent."""
    f = fetcher()
    f.gens, f.expect = {0: 1}, {0: 11}
    out = f.cut([msg(0, 10), msg(0, 11), msg(0, 12)], drained=False)
    assert len(out) == 1 and out[0][1].offsets.tolist() == [11, 12]
    assert f.cut([msg(0, 12)], drained=True) == [(("drained",), b"")]  # nothing new: only the news


def test_encode_rows_offsets_and_poison():
    f = fetcher(on_poison="skip")
    f.gens = {4: 3}
    [(h, batch)] = f.cut([msg(4, 100), msg(4, 101, b"{bad"), msg(4, 102)], drained=True)
    header, body = f.encode(h, batch)
    _, p, gen, first, end, messages, nbytes, poison, drained = header
    assert (p, gen, first, end, messages, drained) == (4, 3, 100, 103, 3, True)
    assert nbytes == sum(len(v) for v in batch.values)
    assert [o for o, _ in poison] == [101] and "bad JSON" in poison[0][1]
    rows = pa.ipc.open_stream(pa.py_buffer(body)).read_next_batch()
    assert rows.column(OFFSET_COLUMN).to_pylist() == [100, 102]
    assert rows.column("Size").to_pylist() == [100, 102] and rows.column("Sym").to_pylist() == ["k100", "k102"]


def test_messages_that_cannot_be_cut_are_reported_lost(mock_kafka):
    """A real consumer on the mock cluster; the cut fails: the DIS is told to re-seek
    (``lost``) instead of the messages vanishing."""
    from confluent_kafka import Consumer

    from .test_kafka_exactly_once import produce

    assert produce(mock_kafka.bootstrap, "one", 5, 1, 5, 0).wait(30) == 0
    c = Consumer({"bootstrap.servers": mock_kafka.bootstrap, "group.id": "t", "enable.auto.commit": False})
    sent: list = []
    f = fetcher(sent, topic="one")
    f.consumer = c

    def broken(*_a):
        raise RuntimeError("cut failed")

    f.cut = f.cut_packed = broken  # whichever way the messages left the client
    try:
        f.handle(("assign", 0, 0, 1))
        for _ in range(100):
            f.fetch_once()
            if sent:
                break
    finally:
        c.close()
    assert [h[0] for h, _ in sent] == ["log", "lost"] and "cut failed" in sent[0][0][3]["error"]
    assert np.all([b == b"" for _, b in sent])


def test_a_partial_batch_is_taken_without_waiting_out_the_timeout(mock_kafka):
    """A real consumer on the mock cluster holding fewer messages than ``batch_size`` (a burst's
    last ones, a trickle): ``fetch_once`` takes them as soon as they are in the client, not
    after waiting its whole ``timeout`` for a batch they never fill (every partition's last
    messages would otherwise wait it out)."""
    import time

    from confluent_kafka import Consumer

    from .test_kafka_exactly_once import produce

    assert produce(mock_kafka.bootstrap, "one", 30, 1, 30, 0).wait(30) == 0
    c = Consumer({"bootstrap.servers": mock_kafka.bootstrap, "group.id": "t", "enable.auto.commit": False})
    sent: list = []
    f = fetcher(sent, topic="one", batch_size=500)
    f.consumer = c
    try:
        c.list_topics("one", timeout=5)
        f.handle(("assign", 0, 0, 1))
        t0 = time.monotonic()
        while sum(len(b) for h, b in sent if h[0] == "decode") < 30 and time.monotonic() - t0 < 20:
            f.fetch_once(timeout=5.0)
        took = time.monotonic() - t0
    finally:
        c.close()
    batches = [(h, b) for h, b in sent if h[0] == "decode"]
    assert sum(len(b) for _, b in batches) == 30
    assert batches[-1][0][3] is True  # the last one says the client's queue was empty
    assert took < 2.5, f"30 messages took {took:.2f} s with a 5 s timeout"
