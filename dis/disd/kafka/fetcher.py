"""The fetching half of a source's consumer: a thread of its own that takes batches of messages
from librdkafka and cuts them into one ``Batch`` per partition, while the loop thread
(``disd.kafka.consumer``) decodes and writes the batch before.

Why a thread: reading a message's parts from the client (``consume``, then value, offset, key
of each ``Message``) is work under the GIL that grows with the messages; Arrow's JSON reader
and the column files' writes (the other half) mostly run without it.  Two threads keep both
cores busy; one thread did one half and then the other.

Exactly once is untouched: the fetcher neither decodes nor writes, and it hands over only what
``consume`` returned.  Each batch carries the ``generation`` of its partition at the moment
``consume`` returned, read under the fetch lock, which the loop thread holds (``exclusive``)
while it assigns or unassigns a partition and moves the generation on.  A batch taken before a partition
was stopped, re-seeked or reassigned thus carries an old generation, and the loop thread drops
it; after the (re)assignment librdkafka delivers only messages from the new position.
"""

from __future__ import annotations

import operator
import queue
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import structlog

from disd.kafka.decode import Batch

log = structlog.get_logger(__name__)

#: batches waiting for the loop thread; bounds the memory to this many times ``batch_size``
QUEUE_BATCHES = 4


@dataclass(frozen=True)
class Fetched:
    """One partition's messages of one ``consume``, or (``error``) one error event, or (neither)
    the news that the client's queue is empty."""

    partition: int
    generation: int
    batch: Batch | None = None
    error: Any = None  # a confluent_kafka Message whose error() is set
    #: ``consume`` returned fewer than ``batch_size`` messages: the client's queue was empty
    drained: bool = False
    #: messages were taken from the client but could not be handed over: re-seek every partition
    lost: bool = False


class Fetcher:
    """``consume`` in a loop into ``queue`` (bounded: the fetcher waits when the loop thread
    is behind)."""

    def __init__(self, name: str, consumer: Any, batch_size: int, parts: tuple[bool, bool, bool],
                 generations: Callable[[], dict[int, int]], stop: threading.Event) -> None:
        self.consumer = consumer
        self.batch_size = batch_size
        self.parts = parts  # need keys, headers, timestamps
        self.generations = generations  # each assigned partition's generation; empty while none is
        self.fetch_lock = threading.Lock()
        self._waiting = threading.Event()  # the loop thread waits for the fetch lock
        self.stop = stop
        self.queue: queue.Queue[list[Fetched]] = queue.Queue(QUEUE_BATCHES)
        self._told_drained = True  # the loop thread knows the queue was empty (or nothing came yet)
        self.thread = threading.Thread(target=self._run, name=f"dis-kafka-fetch-{name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """No ``consume`` meanwhile: for (un)assignments, and every other call of the loop thread
        into the client (an asynchronous ``commit`` was seen to wait for the end of a concurrent
        ``consume`` of an idle partition, indefinitely).  The fetcher lets go of the lock
        between its ``consume`` calls only while nobody waits (a plain lock is not fair: the
        fetcher would take it again at once), so this waits for one ``consume`` at most."""
        self._waiting.set()
        try:
            with self.fetch_lock:
                yield
        finally:
            self._waiting.clear()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self._fetch_once()
            except Exception:  # noqa: BLE001 - the fetcher never dies; the loop thread goes on
                log.exception("kafka fetch failed; retrying")
                self.stop.wait(1.0)

    def _fetch_once(self) -> None:
        while self._waiting.is_set() and not self.stop.is_set():
            self.stop.wait(0.002)
        with self.fetch_lock:
            gens = self.generations()
            if not gens:
                msgs = None
            else:
                msgs = self.consumer.consume(self.batch_size, 0.1)
        if msgs is None:
            self.stop.wait(0.05)
            return
        if not msgs:
            if self._told_drained:
                return
            out = [Fetched(-1, -1, drained=True)]  # the last batch was full, and nothing followed
        else:
            try:
                out = self.split(msgs, gens, len(msgs) < self.batch_size)
            except Exception:  # noqa: BLE001 - the messages are out of the client: have them read again
                log.exception("kafka fetch: cannot cut a batch; the partitions are re-seeked")
                out = [Fetched(-1, -1, lost=True)]
        self._told_drained = out[-1].drained
        while not self.stop.is_set():
            try:
                self.queue.put(out, timeout=0.1)
                return
            except queue.Full:
                continue

    def split(self, msgs: list, gens: dict[int, int], drained: bool) -> list[Fetched]:
        """The messages by partition, each in offset order, as ``Batch``es; error events apart.
        C-level passes (``map`` of the unbound methods, numpy), no Python frame a message."""
        from confluent_kafka import Message

        out: list[Fetched] = []
        if any(map(Message.error, msgs)):  # error() is None or a KafkaError, which is true
            errors = list(map(Message.error, msgs))
            out = [Fetched(-1, -1, error=m) for m, e in zip(msgs, errors) if e is not None]
            msgs = [m for m, e in zip(msgs, errors) if e is None]
            if not msgs:
                return out
        parts = np.fromiter(map(Message.partition, msgs), np.int64, len(msgs))
        if (parts == parts[0]).all():
            groups = {int(parts[0]): msgs}
        else:
            order = np.argsort(parts, kind="stable")
            uniq, starts = np.unique(parts[order], return_index=True)
            bounds = [*starts.tolist(), len(msgs)]
            groups = {int(p): _pick(msgs, order[bounds[j]:bounds[j + 1]]) for j, p in enumerate(uniq.tolist())}
        for p, group in groups.items():
            out.append(Fetched(p, gens.get(p, -1), Batch.of(group, *self.parts), drained=drained))
        return out


def _pick(msgs: list, idx: np.ndarray) -> list:
    """``msgs`` at ``idx``, by ``itemgetter`` (C), not a Python frame a message."""
    if len(idx) == 1:
        return [msgs[int(idx[0])]]
    return list(operator.itemgetter(*idx.tolist())(msgs))
