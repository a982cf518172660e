"""How a fetch process takes its messages out of the client: the one place that chooses.

``Packed`` batches (``BatchReader``, the C module ``disd.kafka.rdbatch``): a batch of messages
leaves librdkafka as a few flat buffers (the values side by side, ready for Arrow's JSON reader
or the binary-log decoder; partitions, offsets, timestamps, keys as arrays), with no Python
object a message.  confluent-kafka's ``Consumer.consume`` makes a ``Message`` object of each,
holding the GIL: half of a fetch process's CPU (docs/kafka.md, "Fetch processes").

The C module reads the confluent-kafka ``Consumer``'s private layout (its ``rd_kafka_t`` and the
thread-state key of its callbacks), so it is used only with the confluent-kafka versions it was
checked against (``CHECKED_VERSIONS``), and only once ``rdbatch.check`` has proved the layout
on the consumer itself.  Otherwise (no C compiler at build time, another confluent-kafka, a
mapping that needs the messages' headers) ``reader`` returns None with the reason, and the
fetcher uses ``Consumer.consume`` as before: the same rows and offsets, more CPU.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from disd.kafka.decode import Packed

try:  # built by setup.py when a C compiler is there; without it, Consumer.consume
    from disd.kafka import rdbatch
except ImportError:  # pragma: no cover - exercised only by a build without a C compiler
    rdbatch = None  # type: ignore[assignment]  # (mypy cannot type "a module or None")

#: confluent-kafka versions whose ``Consumer`` layout (``rd_kafka_t *rk`` first after the object
#: header, then three callbacks, ``initiated`` and the callbacks' thread-state key; the callbacks'
#: ``CallState``) rdbatch.c was checked against
CHECKED_VERSIONS = ("2.16.1",)


@dataclass(frozen=True)
class Consumed:
    """One ``BatchReader.consume``: ``count`` events (error events included), the messages'
    values (``packed``), partitions, offsets, timestamps (-1: none) and keys (an Arrow binary
    array, or None when not asked) grouped by partition, ascending, each in offset order, and the
    error events as (topic, partition, offset, code, error string)."""

    count: int
    packed: Packed
    partitions: np.ndarray  # int32
    offsets: np.ndarray  # int64
    timestamps: np.ndarray | None
    keys: pa.Array | None
    errors: list[tuple[str | None, int, int, int, str]]

    def groups(self) -> list[tuple[int, int, int]]:
        """(partition, first, end) of each partition's messages."""
        parts = self.partitions
        if not len(parts):
            return []
        cuts = [0, *(np.flatnonzero(parts[1:] != parts[:-1]) + 1).tolist(), len(parts)]
        return [(int(parts[a]), a, b) for a, b in zip(cuts[:-1], cuts[1:])]


class BatchReader:
    """A consumer's batches out of librdkafka as ``Consumed`` (rdbatch.c)."""

    def __init__(self, consumer: Any, sep: bytes, keys: bool, timestamps: bool) -> None:
        self.consumer, self.sep, self.keys, self.timestamps = consumer, sep, keys, timestamps

    def consume(self, max_messages: int, timeout: float, linger: float, wait_first: bool) -> Consumed:
        """``wait_first``: wait up to ``timeout`` for a first message, then up to ``linger`` for
        the rest of ``max_messages``; else take what the client holds, without waiting."""
        assert rdbatch is not None  # a BatchReader is made only when it is there
        (count, data, starts, ends, flags, parts, offsets, ts, kdata, koffs, kvalid, errors) = rdbatch.consume(
            self.consumer, max_messages, int(timeout * 1000), int(linger * 1000), wait_first, self.sep, self.keys,
            self.timestamps)
        n = len(flags)
        keys = (pa.Array.from_buffers(pa.binary(), n, [pa.py_buffer(kvalid), pa.py_buffer(koffs), pa.py_buffer(kdata)])
                if kdata is not None and kvalid is not None and koffs is not None else None)
        return Consumed(count, Packed(memoryview(data), np.frombuffer(starts, np.int64), np.frombuffer(ends, np.int64),
                                      np.frombuffer(flags, np.uint8)),
                        np.frombuffer(parts, np.int32), np.frombuffer(offsets, np.int64),
                        None if ts is None else np.frombuffer(ts, np.int64), keys, errors)


def reader(consumer: Any, value_format: str, keys: bool, headers: bool, timestamps: bool) -> tuple[BatchReader | None, str]:
    """The compiled reader of ``consumer``, or None and why not."""
    why = _bind()
    if why is not None:
        return None, why
    if headers:
        return None, "the mapping reads message headers, which the compiled reader does not carry"
    assert rdbatch is not None
    try:
        rdbatch.check(consumer)
    except (TypeError, ValueError, RuntimeError) as e:
        return None, f"the consumer's layout is not the one checked: {e}"
    return BatchReader(consumer, b"" if value_format == "binlog" else b"\n", keys, timestamps), ""


def _bind() -> str | None:
    """None once rdbatch is bound to the librdkafka confluent-kafka loaded (again: once a
    fetcher, a few look-ups); else why not."""
    if rdbatch is None:
        return "the C module disd.kafka.rdbatch was not built"
    import confluent_kafka
    from confluent_kafka import cimpl

    got = confluent_kafka.version()  # the package's version (a tuple with a number in older ones)
    version = got[0] if isinstance(got, tuple) else got
    if version not in CHECKED_VERSIONS:
        return f"confluent-kafka {version} is not one the compiled reader was checked against {CHECKED_VERSIONS}"
    path = _loaded_librdkafka(cimpl.__file__)
    if path is None:
        return "the librdkafka that confluent-kafka loaded was not found"
    try:
        rdbatch.bind(path, cimpl.Consumer)
    except OSError as e:
        return str(e)
    return None


def _loaded_librdkafka(cimpl_file: str) -> str | None:
    """The librdkafka file mapped into this process (the one ``cimpl`` linked), else the one
    confluent-kafka's wheel bundles."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split(None, 5)[-1].strip()
                if os.path.basename(path).startswith("librdkafka") and ".so" in path:
                    return path
    except OSError:
        pass
    found = sorted(glob.glob(os.path.join(os.path.dirname(os.path.dirname(cimpl_file)), "confluent_kafka.libs",
                                          "librdkafka*.so*")))
    return found[0] if found else None
