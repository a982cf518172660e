"""A source's fetch process: ``python -m disd.kafka.child FD PARENT_PID``, started by the DIS
(``disd.kafka.link``), owning the source's confluent-kafka ``Consumer`` (``disd.kafka.fetcher``).

It talks to the DIS over the socket ``FD`` only: the first message is the configuration, then
commands come in (assign, unassign, metadata, watermarks, monitoring commits, stop) and batches,
answers and log lines go out.  Three threads: one reads commands into a queue, one writes the
outgoing messages (at most ``QUEUE_BATCHES`` batches wait, which bounds the memory and lets the
client run ahead of the DIS by that much), and the main one runs commands and ``consume`` in
turn.

It never outlives the DIS: it exits when the socket reaches end of file or breaks (the DIS
closed it, or died: the kernel closes a killed process's sockets), and the kernel kills it when
the DIS's thread that started it ends (``PR_SET_PDEATHSIG``).  It ignores SIGINT and SIGTERM: a
Ctrl-C or a service manager's SIGTERM to the process group reaches the DIS, which stops it in
order.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import queue
import signal
import sys
import threading
import traceback
from multiprocessing.connection import Connection
from typing import Any

#: batches consumed and waiting to be decoded and written; bounds the memory to this many times
#: ``batch_size``.  Small, so the DIS's appends overlap the fetching: with more room the consuming
#: thread read most of its partitions before the first batch was decoded, which the DIS then
#: waited for (measured with ``Consumer.consume``, which holds the GIL while it makes a batch's
#: ``Message`` objects and is still the fallback; the packed reader releases it: docs/kafka.md,
#: "Fetch processes")
QUEUE_BATCHES = 2
_PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> None:
    fd, parent = int(argv[0]), int(argv[1])
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    conn = Connection(fd)
    try:
        kafka, src = pickle.loads(conn.recv_bytes())
    except (EOFError, OSError):
        os._exit(0)
    out = _Outbox(conn)
    commands: queue.Queue = queue.Queue()
    threading.Thread(target=_read, args=(conn, commands), name="dis-kafka-commands", daemon=True).start()
    try:
        _fetch(kafka, src, commands, out)
    except Exception:  # noqa: BLE001 - said to the DIS, which restarts the process
        out.send(("log", "error", "kafka fetch process failed", {"error": traceback.format_exc()}), b"")
    out.close()
    os._exit(0)


def _fetch(kafka: Any, src: Any, commands: queue.Queue, out: "_Outbox") -> None:
    import time

    import pyarrow as pa
    from confluent_kafka import Consumer

    from disd.kafka.fetcher import Fetcher

    pa.array([0], pa.int64())  # pyarrow's pandas shim (0.2 s) now, not in the first batch
    consumer = Consumer(kafka.client_properties(), logger=_KafkaLog(out))
    side = _BrokerWatermarks(kafka, src.topic, out)
    f = Fetcher(src, consumer, out.send, side.ask)
    try:  # connected, the topic's leaders known, before the first assignment (else ~1 s after it)
        consumer.list_topics(src.topic, timeout=5)
    except Exception as e:  # noqa: BLE001 - it connects at the assignment then
        out.send(("log", "warning", "kafka client not connected", {"error": repr(e)}), b"")
    side.started.wait(5.0)  # its client's start is over before the DIS assigns anything
    out.encode = f.encode
    out.send(("ready", os.getpid()), b"")
    try:
        while True:
            try:
                cmd = commands.get(timeout=0.05) if not f.gens else commands.get_nowait()
                while True:
                    if cmd[0] == "stop":
                        return
                    f.handle(cmd)
                    cmd = commands.get_nowait()
            except queue.Empty:
                pass
            try:
                f.fetch_once()
            except Exception as e:  # noqa: BLE001 - the process goes on; the DIS is told
                out.send(("log", "error", "kafka fetch failed; retrying", {"error": repr(e)}), b"")
                time.sleep(1.0)
    finally:
        consumer.close()


def _read(conn: Connection, commands: queue.Queue) -> None:
    """Commands into ``commands``; at end of file (the DIS is gone) the process exits."""
    while True:
        try:
            commands.put(pickle.loads(conn.recv_bytes()))
        except (EOFError, OSError):
            os._exit(0)


class _Outbox:
    """Messages to the DIS, decoded (batches, ``Fetcher.encode``) and written by a thread of
    their own, in the order sent; ``send`` waits while ``QUEUE_BATCHES`` batches are
    unwritten."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.encode: Any = None
        self.queue: queue.Queue = queue.Queue()
        self.room = threading.Semaphore(QUEUE_BATCHES)
        self.thread = threading.Thread(target=self._write, name="dis-kafka-out", daemon=True)
        self.thread.start()

    def send(self, header: tuple, body: Any) -> None:
        if header[0] == "decode":
            self.room.acquire()
        self.queue.put((header, body))

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join(10)

    def _write(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            header, body = item
            if header[0] == "decode":
                self.room.release()
                try:
                    header, body = self.encode(header, body)
                except Exception as e:  # noqa: BLE001 - taken out of the client: have them read again
                    from disd.kafka.fetcher import Fetcher

                    self._write_one(*Fetcher.lost(e))
                    header, body = ("lost",), b""
            self._write_one(header, body)

    def _write_one(self, header: tuple, body: bytes) -> None:
        try:
            self.conn.send_bytes(pickle.dumps(header))
            if header[0] == "batch":
                self.conn.send_bytes(body)
        except OSError:  # the DIS is gone
            os._exit(0)


class _BrokerWatermarks:
    """High watermarks asked of the broker by a thread and a ``Consumer`` of their own (no
    assignment, no commits): a query can take 0.5 s, which the fetching thread would otherwise
    spend not consuming, and the fetching client is never called from two threads."""

    def __init__(self, kafka: Any, topic: str, out: _Outbox) -> None:
        self.kafka, self.topic, self.out = kafka, topic, out
        self.queue: queue.Queue = queue.Queue()
        self.started = threading.Event()
        self.working = True  # False: its client could not be made; the fetching thread asks
        # started with the process, not at the first question: a client's start (threads,
        # connections) costs CPU, which right after the first assignment the consuming needs
        threading.Thread(target=self._run, name="dis-kafka-watermarks", daemon=True).start()

    def ask(self, partitions: list[int]) -> bool:
        if self.working:
            self.queue.put(partitions)
        return self.working

    def _run(self) -> None:
        from confluent_kafka import Consumer

        from disd.kafka.fetcher import watermarks

        consumer = None
        try:
            consumer = Consumer(self.kafka.client_properties(), logger=_KafkaLog(self.out))
            consumer.list_topics(self.topic, timeout=5)  # connected before the first question
        except Exception as e:  # noqa: BLE001 - connects at its first question then (if it was made)
            self.out.send(("log", "warning", "kafka watermark client not connected", {"error": repr(e)}), b"")
        finally:
            self.started.set()
        if consumer is None:
            self.working = False
            return
        while True:
            parts = set(self.queue.get())
            while not self.queue.empty():  # asked again meanwhile: one answer
                parts.update(self.queue.get_nowait())
            try:
                highs = watermarks(consumer, self.topic, sorted(parts), cached=False)
            except Exception as e:  # noqa: BLE001 - no watermark this time; asked again later
                self.out.send(("log", "warning", "kafka watermark query failed", {"error": repr(e)}), b"")
                continue
            self.out.send(("watermarks", highs), b"")


class _KafkaLog:
    """librdkafka's log lines, to the DIS's log."""

    def __init__(self, out: _Outbox) -> None:
        self.out = out

    def log(self, level: int, fmt: str, *args: Any) -> None:
        text = fmt % args if args else fmt
        self.out.send(("log", "warning" if level >= 30 else "debug", "librdkafka", {"message": text}), b"")


def _die_with_parent(parent: int) -> None:
    """SIGKILL from the kernel when the DIS's thread that started us ends (Linux); and if the
    DIS is already gone, exit now."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: end of file on the socket still ends us
        pass
    if os.getppid() != parent:
        os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
