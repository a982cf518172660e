"""The fetching half of a source's consumer, run in the source's fetch process
(``disd.kafka.child``): ``consume`` batches from librdkafka, cut them per partition, decode each
partition's messages into the table's Arrow columns, and hand each decoded batch to the DIS as
Arrow IPC with its partition, generation, offsets and poison messages.

Why in another process: reading the messages out of the client (a Python ``Message`` each) and
decoding them is work under a GIL that grows with the messages; in the DIS it shared one GIL
with routing and appending (``disd.kafka.consumer``), so the two halves took turns instead of
running side by side.  Here they have a GIL each.

Exactly once is untouched: the fetcher decides nothing.  It consumes what the DIS assigned it,
tags every batch with the partition's ``generation`` of that assignment (the DIS moves the
generation on at every (un)assignment and drops batches of an older one), and holds nothing the
DIS cannot give it again: after a restart the DIS assigns every partition anew from its own
state.  Commands and ``consume`` run in one thread, one after the other: a batch's generation
is exactly the assignment its messages were consumed under (librdkafka delivers only messages
from the new position after a (re)assignment), and no client call waits for a concurrent
``consume`` (an asynchronous ``commit`` was seen to wait indefinitely for one).

How the messages leave the client is chosen once, at the first ``fetch_once``
(``disd.kafka.batchread``): packed by the compiled reader, no Python object a message; or, when
it cannot be used (said once in the log), ``Consumer.consume``'s ``Message`` objects.  Both are
cut alike: error events first, then each assigned partition's messages in offset order.
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from disd.errors import DisError
from disd.kafka import batchread
from disd.kafka.config import SourceConfig
from disd.kafka.decode import Batch, Decoder

#: the column of a decoded batch's record batch holding each row's Kafka offset
OFFSET_COLUMN = "__kafka_offset"
#: once a ``consume`` that waited has its first message, how long it lingers for more: a
#: partition's last messages (fewer than ``batch_size``) are taken within this, not after the
#: whole wait, while a trickle still comes in at most one ``consume`` this often (each batch
#: costs the DIS an append and a publish whatever its size)
LINGER_S = 0.01

#: a command's answer, a log line, or a batch to decode (``Fetcher.encode``), to the DIS:
#: (header, b"" or the ``Batch``)
Send = Callable[[tuple, Any], None]


class FetchCommandError(DisError, ValueError):
    """A command the fetch process does not know (the DIS and its fetch process disagree)."""


class Fetcher:
    """One source's client, its assigned partitions and their generations; ``handle`` runs a
    command of the DIS, ``fetch_once`` one ``consume``.  Everything it tells the DIS goes
    through ``send``."""

    def __init__(self, src: SourceConfig, consumer: Any, send: Send,
                 ask_broker: Callable[[list[int]], bool] | None = None) -> None:
        self.src = src
        self.consumer = consumer
        self.send = send
        #: asks the broker for partitions' high watermarks off this thread (the answer is sent
        #: on; False: it cannot); None or False: here, between two ``consume``s (a query can take 0.5 s)
        self.ask_broker = ask_broker
        self.decoder = Decoder(src)
        d = self.decoder
        self.parts = (d.need_keys, d.need_headers, d.need_timestamps)
        self.gens: dict[int, int] = {}  # assigned partition -> its generation
        #: the next offset the DIS expects of a partition (its assignment's, then past each batch
        #: sent); messages below are already in the DIS and dropped (a broker may deliver them again)
        self.expect: dict[int, int] = {}
        self._told_drained = True  # the DIS knows the client's queue was empty (or nothing came yet)
        #: the compiled reader of ``consumer`` (``batchread``), chosen at the first ``fetch_once``;
        #: None: ``Consumer.consume``
        self.reader: batchread.BatchReader | None = None
        self._chosen = False

    # -- commands of the DIS ---------------------------------------------------------------------
    def handle(self, cmd: tuple) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        op, topic = cmd[0], self.src.topic
        if op == "assign":  # ("assign", partition, offset or librdkafka's logical offset, generation)
            _, p, start, gen = cmd
            self.consumer.incremental_assign([TopicPartition(topic, p, start)])
            self.gens[p] = gen
            if start >= 0:
                self.expect[p] = start
            else:
                self.expect.pop(p, None)
        elif op == "unassign":  # ("unassign", partition)
            p = cmd[1]
            if p in self.gens:
                self.consumer.incremental_unassign([TopicPartition(topic, p)])
                self.gens.pop(p)
                self.expect.pop(p, None)
        elif op == "metadata":
            try:
                t = self.consumer.list_topics(topic, timeout=5).topics.get(topic)
            except KafkaException as e:
                self.send(("metadata", None, f"metadata of topic {topic}: {e}"), b"")
                return
            if t is None or t.error is not None:
                self.send(("metadata", None, f"topic {topic}: {t.error if t is not None else 'unknown'}"), b"")
            else:
                self.send(("metadata", sorted(t.partitions), None), b"")
        elif op == "watermarks":  # ("watermarks", [(partition, librdkafka's cached value will do)])
            fresh = [p for p, cached in cmd[1] if not cached]
            highs = watermarks(self.consumer, topic, [p for p, cached in cmd[1] if cached], cached=True)
            if fresh and self.ask_broker is not None and self.ask_broker(fresh):
                pass
            else:
                highs.update(watermarks(self.consumer, topic, fresh, cached=False))
            self.send(("watermarks", highs), b"")
        elif op == "commit":  # ("commit", [(partition, next offset)]): for monitoring only
            try:
                self.consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in cmd[1]], asynchronous=True)
            except KafkaException as e:
                self.send(("log", "debug", "kafka monitoring commit failed", {"error": str(e)}), b"")
        else:
            raise FetchCommandError(f"unknown command {op!r}")

    # -- consuming -------------------------------------------------------------------------------
    def fetch_once(self, timeout: float = 0.1) -> bool:
        """One ``consume`` into decoded batches sent to the DIS; False: nothing is assigned."""
        if not self.gens:
            return False
        if not self._chosen:
            self._choose_reader()
        if self.reader is not None:
            return self._fetch_packed(self.reader, timeout)
        # after a full batch, a look without waiting: the DIS hears at once that the client's
        # queue is empty (and publishes), not after a ``consume`` that waited ``timeout`` for more.
        # Else a wait for the first message, then what else comes within ``LINGER_S``: a
        # ``consume`` of ``batch_size`` waits out its whole timeout unless the batch fills, so a
        # partition's last messages would wait ``timeout`` for messages that never come.
        if not self._told_drained:
            msgs = self.consumer.consume(self.src.batch_size, 0)
        else:
            msgs = self.consumer.consume(1, timeout)
            if msgs and self.src.batch_size > 1:
                msgs += self.consumer.consume(self.src.batch_size - 1, LINGER_S)
        return self._send_cut(len(msgs), lambda drained: self.cut(msgs, drained))

    def _send_cut(self, count: int, cut: Callable[[bool], list[tuple[tuple, Any]]]) -> bool:
        """After a consume of ``count`` messages, by either reader: "drained" once when nothing
        came (the last batch was full, and nothing followed), else the batches ``cut`` makes, or
        "lost" when they cannot be cut (the messages are out of the client: have them read
        again)."""
        if not count:
            if not self._told_drained:
                self.send(("drained",), b"")
                self._told_drained = True
            return True
        drained = count < self.src.batch_size
        try:
            out = cut(drained)
        except Exception as e:  # noqa: BLE001 - said to the DIS, which has them read again
            self.send(*self.lost(e))
            self.send(("lost",), b"")
            return True
        for header, body in out:
            self.send(header, body)
        self._told_drained = drained
        return True

    def _choose_reader(self) -> None:
        self._chosen = True
        d = self.decoder
        self.reader, why = batchread.reader(self.consumer, self.src.format, d.need_keys, d.need_headers,
                                            d.need_timestamps)
        if self.reader is None:
            self.send(("log", "warning", "kafka fetch: messages read through confluent-kafka's consume, not the "
                                      "compiled reader", {"reason": why}), b"")

    def _fetch_packed(self, reader: batchread.BatchReader, timeout: float) -> bool:
        """``fetch_once`` by the compiled reader: the same waits, the same cut."""
        got = reader.consume(self.src.batch_size, timeout, LINGER_S, wait_first=self._told_drained)
        return self._send_cut(got.count, lambda drained: self.cut_packed(got, drained))

    def cut_packed(self, got: batchread.Consumed, drained: bool) -> list[tuple[tuple, Any]]:
        """``cut`` of a packed ``consume``: error events (as ``KafkaError``s of the same code and
        string as the client's ``Message.error()``), then each partition's batch, slices of the
        packed buffers."""
        from confluent_kafka import KafkaError

        out: list[tuple[tuple, Any]] = []
        for topic, p, _offset, code, text in got.errors:
            err = KafkaError(code, text)
            out.append((("error", topic, p, err.code(), err.str(), str(err)), b""))
        n = len(got.offsets)
        ts = got.timestamps if got.timestamps is not None else np.full(n, -1, np.int64)
        for p, a, b in got.groups():
            if p not in self.gens:
                continue  # not assigned (any more): the DIS would drop it
            keys = None if got.keys is None else got.keys.slice(a, b - a)
            self._tag(out, p, Batch(got.packed.slice(a, b), got.offsets[a:b], ts[a:b], p, keys))
        return self._drained(out, drained)

    def cut(self, msgs: list, drained: bool) -> list[tuple[tuple, Any]]:
        """Error events, then each partition's messages as a ``Batch`` to decode (header
        ``("decode", partition, generation, drained)``: ``encode`` makes it a batch for the DIS),
        in offset order; the last one carries ``drained`` (``consume`` returned fewer than
        ``batch_size``)."""
        out: list[tuple[tuple, Any]] = []
        groups, errors = split(msgs)
        for m in errors:
            err = m.error()
            out.append((("error", m.topic(), m.partition(), err.code(), err.str(), str(err)), b""))
        for p, group in groups.items():
            if p not in self.gens:
                continue  # not assigned (any more): the DIS would drop it
            self._tag(out, p, Batch.of(group, *self.parts))
        return self._drained(out, drained)

    def _tag(self, out: list[tuple[tuple, Any]], p: int, batch: Batch) -> None:
        """Partition ``p``'s batch to ``out``, less the messages the DIS already has, with its
        generation."""
        low = self.expect.get(p)
        if low is not None and batch.offsets[0] < low:  # already in the DIS
            batch = batch.take(np.flatnonzero(batch.offsets >= low))
            if not len(batch):
                return
        self.expect[p] = int(batch.offsets[-1]) + 1
        out.append((("decode", p, self.gens[p], False), batch))

    @staticmethod
    def _drained(out: list[tuple[tuple, Any]], drained: bool) -> list[tuple[tuple, Any]]:
        """The last batch says ``drained``, or a ``("drained",)`` follows."""
        if drained:
            if out and out[-1][0][0] == "decode":
                out[-1] = ((*out[-1][0][:-1], True), out[-1][1])
            else:
                out.append((("drained",), b""))
        return out

    def encode(self, header: tuple, batch: Batch) -> tuple[tuple, bytes]:
        """A ``("decode", partition, generation, drained)`` of ``cut`` decoded, for the DIS:
        ``("batch", partition, generation, first offset, next offset, messages, value bytes,
        [(poison offset, reason)], drained)`` and the rows with their offsets as Arrow IPC.  Runs
        on another thread than ``consume`` (``disd.kafka.child``): Arrow's JSON reader works
        without the GIL while the next ``consume`` runs."""
        _, p, gen, drained = header
        dec = self.decoder.decode(batch)
        nbytes = batch.value_bytes()
        end = int(batch.offsets[-1]) + 1
        poison = [(int(batch.offsets[i]), why) for i, why in dec.poison]
        names = [*self.src.schema.column_names, OFFSET_COLUMN]
        rb = pa.RecordBatch.from_arrays([*dec.columns, pa.array(dec.row_offsets, pa.int64())], names=names)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, rb.schema) as w:
            w.write_batch(rb)
        header = ("batch", p, gen, int(batch.offsets[0]), end, len(batch), nbytes, poison, drained)
        return header, sink.getvalue().to_pybytes()

    @staticmethod
    def lost(e: Exception) -> tuple[tuple, bytes]:
        """The log line for messages taken out of the client that cannot reach the DIS; a
        ``("lost",)`` follows, and the DIS assigns every partition again at its offsets."""
        return ("log", "error", "kafka fetch: cannot cut or decode a batch; the partitions are re-seeked",
                {"error": repr(e)}), b""


def watermarks(consumer: Any, topic: str, partitions: list[int], cached: bool) -> dict[int, int]:
    """The high watermarks of ``partitions`` that could be had (librdkafka's last seen when
    ``cached``, else asked of the broker, up to 1 s each)."""
    from confluent_kafka import KafkaException, TopicPartition

    highs = {}
    for p in partitions:
        try:
            _low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=1, cached=cached)
        except KafkaException:
            continue
        if high is not None and high >= 0:
            highs[p] = high
    return highs


def split(msgs: list) -> tuple[dict[int, list], list]:
    """The messages by partition, each in offset order, and the error events apart.  C-level
    passes (``map`` of the unbound methods, numpy), no Python frame a message."""
    from confluent_kafka import Message

    errors: list = []
    if any(map(Message.error, msgs)):  # error() is None or a KafkaError, which is true
        errs = list(map(Message.error, msgs))
        errors = [m for m, e in zip(msgs, errs) if e is not None]
        msgs = [m for m, e in zip(msgs, errs) if e is None]
        if not msgs:
            return {}, errors
    parts = np.fromiter(map(Message.partition, msgs), np.int64, len(msgs))
    if (parts == parts[0]).all():
        return {int(parts[0]): msgs}, errors
    order = np.argsort(parts, kind="stable")
    uniq, starts = np.unique(parts[order], return_index=True)
    bounds = [*starts.tolist(), len(msgs)]
    return {int(p): _pick(msgs, order[bounds[j]:bounds[j + 1]]) for j, p in enumerate(uniq.tolist())}, errors


def _pick(msgs: list, idx: np.ndarray) -> list:
    """``msgs`` at ``idx``, by ``itemgetter`` (C), not a Python frame a message."""
    if len(idx) == 1:
        return [msgs[int(idx[0])]]
    return list(operator.itemgetter(*idx.tolist())(msgs))
