"""The fetch process's outbox (``disd.kafka.child._Outbox``), in process over a real pipe: the
consuming thread waits once 2 consumed batches wait for the decoding (docs/kafka.md, "Fetch
processes"); with more room it read most of its partitions before the first batch was decoded."""

from __future__ import annotations

import multiprocessing
import threading
import time

from disd.kafka.child import _Outbox
from support import wait_for


def test_at_most_two_batches_wait_for_the_decoding():
    ours, theirs = multiprocessing.Pipe()
    out = _Outbox(ours)
    gate = threading.Event()

    def encode(header: tuple, body: object) -> tuple[tuple, bytes]:
        gate.wait(10)  # the decoding of the first batch takes a while
        return ("batch", *header[1:]), b"rows"

    out.encode = encode
    sent: list[int] = []

    def consume() -> None:
        for i in range(6):
            out.send(("decode", i), None)
            sent.append(i)

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    try:
        wait_for(lambda: len(sent) >= 3, 5, 0.01, "three batches handed over")
        time.sleep(0.3)  # a fourth would be handed over by now if there were room
        assert sent == [0, 1, 2], "one batch being decoded and two waiting; the consuming thread waits"
    finally:
        gate.set()
        t.join(5)
    assert sent == list(range(6))
    got = []
    while len(got) < 12 and theirs.poll(5):
        got.append(theirs.recv_bytes())
    assert len(got) == 12  # a header and rows a batch, in order
    out.close()
