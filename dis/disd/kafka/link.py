"""The DIS's end of a source's fetch processes (``disd.kafka.child``): starting them, commands to
them, batches and answers from them.

A source has ``fetch_processes`` of them (``FetchPool``); process ``i`` consumes the topic's
partitions ``p`` with ``p % fetch_processes == i``, a fixed, disjoint share, so that consuming
(building confluent-kafka's ``Message`` objects, under each process's own GIL) runs on as many
cores.  One Unix socket pair a process; each message is a pickled header tuple (pickle only between
the DIS and the process it started itself), a batch's header followed by its rows as an Arrow
IPC stream, read without a copy into a ``RecordBatch``.  The process holds nothing the DIS
cannot give it again, so when it is gone (``FetchProcessGone``) the consumer starts a new one
and assigns its partitions again from its own state.

Without a configured ``fetch_processes`` the count is derived when the source starts, from the
topic's partitions (``topic_partitions``, asked of the broker by a short-lived client before any
process starts) and the cores (``default_fetch_processes``): ``p % N`` gives every process an
equal share only when N divides the partitions, and the process with the largest share bounds
the source (over 3 partitions, ``N = 2`` gave one process two thirds of the messages).
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
from multiprocessing.connection import Connection, wait
from typing import Any

import pyarrow as pa

from disd.errors import DisError
from disd.kafka.config import MAX_FETCH_PROCESSES


#: without partitions read at start, the default count (two cores' worth of consuming)
FALLBACK_FETCH_PROCESSES = 2
#: how long the start of a source waits for its topic's partitions
PARTITIONS_TIMEOUT_S = 5.0


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a container or taskset narrows)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def default_fetch_processes(partitions: int | None, cores: int) -> int:
    """One fetch process a partition, so that each has an equal share, but at most twice the
    cores (beyond, a process's share is at most ``1/(2 cores) + 1/partitions`` of the messages
    and so never bounds the source more than the cores do) and ``MAX_FETCH_PROCESSES``;
    ``FALLBACK_FETCH_PROCESSES`` when the partitions are not known."""
    if not partitions or partitions < 1:
        return FALLBACK_FETCH_PROCESSES
    return max(1, min(partitions, 2 * cores, MAX_FETCH_PROCESSES))


def topic_partitions(kafka: Any, topic: str, timeout: float = PARTITIONS_TIMEOUT_S) -> int | None:
    """How many partitions ``topic`` has, by a client of the source's properties made for this
    one question; None when the broker did not say within ``timeout`` seconds."""
    from confluent_kafka import Consumer, KafkaException

    try:
        consumer = Consumer(kafka.client_properties(), logger=_Quiet())
    except KafkaException:
        return None
    try:
        t = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        return len(t.partitions) if t is not None and t.error is None and t.partitions else None
    except KafkaException:
        return None
    finally:
        consumer.close()


class _Quiet:
    """librdkafka's log lines of ``topic_partitions``'s client: the fetch processes' clients
    say the same about the same broker."""

    def log(self, level: int, fmt: str, *args: Any) -> None:
        pass


class FetchProcessGone(DisError):
    """The fetch process ``index`` exited, was killed, or its socket broke."""

    def __init__(self, message: str, index: int = 0) -> None:
        super().__init__(message)
        self.index = index


class FetchProcess:
    def __init__(self, kafka: Any, src: Any, index: int = 0) -> None:
        self.kafka = kafka
        self.src = src
        self.index = index
        self.proc: subprocess.Popen | None = None
        self.conn: Connection | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> None:
        """A new process, given the configuration; its commands may follow at once.  Started by
        the consumer's loop thread, whose end the kernel tells it (``PR_SET_PDEATHSIG``)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "disd.kafka.child", str(theirs.fileno()),
                                          str(os.getpid())], pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        except OSError as e:
            ours.close()
            raise FetchProcessGone(f"cannot start the fetch process ({sys.executable} -m disd.kafka.child): {e}",
                                   self.index) from None
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())
        self.send((self.kafka, self.src))

    def send(self, cmd: tuple) -> None:
        if self.conn is None:
            raise FetchProcessGone("no fetch process", self.index)
        try:
            self.conn.send_bytes(pickle.dumps(cmd))
        except OSError as e:
            raise FetchProcessGone(f"cannot write to the fetch process: {e}", self.index) from None

    def receive(self, timeout: float) -> tuple[tuple, pa.RecordBatch | None] | None:
        """The next message (header, and a batch's rows), or None after ``timeout`` seconds."""
        if self.conn is None:
            raise FetchProcessGone("no fetch process", self.index)
        try:
            if not self.conn.poll(timeout):
                return None
            header = pickle.loads(self.conn.recv_bytes())
            rows = None
            if header[0] == "batch":
                rows = pa.ipc.open_stream(pa.py_buffer(self.conn.recv_bytes())).read_next_batch()
        except (EOFError, OSError) as e:
            raise FetchProcessGone(f"the fetch process is gone ({self.status()}): {e!r}", self.index) from None
        return header, rows

    def status(self) -> str:
        rc = self.proc.poll() if self.proc is not None else None
        if rc is None:
            return "running"
        return f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}"

    def kill(self) -> None:
        """SIGKILL the process (hung: it would not read a ``stop``); ``close`` reaps it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the process (in order if it listens, else killed) and reap it."""
        if self.proc is None:
            return
        try:
            self.send(("stop",))
        except FetchProcessGone:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        if self.conn is not None:
            self.conn.close()
        self.proc = self.conn = None


class FetchPool:
    """A source's ``n`` fetch processes; partition ``p`` is process ``p % n``'s."""

    def __init__(self, kafka: Any, src: Any, n: int) -> None:
        self.procs = [FetchProcess(kafka, src, i) for i in range(n)]

    def owner(self, partition: int) -> FetchProcess:
        return self.procs[partition % len(self.procs)]

    def running(self) -> list[FetchProcess]:
        return [f for f in self.procs if f.conn is not None]

    @property
    def pids(self) -> list[int | None]:
        return [f.pid for f in self.procs]

    def ready(self, timeout: float) -> list[FetchProcess]:
        """The running processes with a message to read, waiting up to ``timeout`` seconds for
        one; each is read with ``receive(0)``."""
        conns = [f.conn for f in self.procs if f.conn is not None]  # the running processes'
        if not conns:
            return []
        by_conn: dict[object, FetchProcess] = {f.conn: f for f in self.running()}
        try:
            return [by_conn[c] for c in wait(conns, timeout)]
        except OSError:  # a socket closed under us: every process is looked at, the dead one raises
            return list(by_conn.values())

    def close(self, timeout: float = 10.0) -> None:
        for f in self.procs:
            f.close(timeout)
