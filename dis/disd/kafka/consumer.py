"""One source's consumer loop: a topic's partitions into their locations, exactly once.

Exactly once without consumer-group offsets (docs/kafka.md): every location holds, in its
checkpoint's source record, the next Kafka offset of its partition, and a batch's rows and that
offset move in one step (``Location.append_committed``), so a checkpoint has both or neither.  At
start (and after a location was reopened from its checkpoint) a partition is assigned at the
smallest next offset of its locations; a message below a location's own next offset is already
in it and is dropped for it.  A crash at any moment then loses nothing (the checkpoint's offset
is at most the first uncheckpointed message) and duplicates nothing (recovery cuts every row past
the checkpoint).  Offsets committed to the consumer group are for monitoring only, never read.

A poison message (a value that cannot be rows of the table) stops its partition with the reason
(``on_poison: stop``, the default), or is counted and passed over (``skip``).  Nothing a message,
the broker or a location does ends the loop: errors stop at most a partition.

Consuming and decoding run in the source's fetch processes (``disd.kafka.fetcher``, in
``disd.kafka.child``; partition ``p`` in process ``p % fetch_processes``, ``disd.kafka.link``);
this loop routes, appends and commits the decoded batches they send, and is the only one to know
offsets.  A process is told which partitions to consume from where, with a ``generation`` that
moves on at every (un)assignment; a batch of an older generation is dropped.  When a process is
gone (killed, crashed) a new one is started in its place and each of its assigned partitions is
assigned again at its locations' offsets, as after a reopened location; the others go on.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import structlog

from disd.kafka.config import KafkaConfig, SourceConfig
from disd.kafka.fetcher import OFFSET_COLUMN
from disd.kafka.link import FetchPool, FetchProcess, FetchProcessGone, default_fetch_processes, topic_partitions, usable_cores
from disd.kafka.watch import FetchWatch
from disd.names import LocationKey
from disd.schema import SchemaValueError
from disd.storage import LocationError, StorageEngine
from disd.storage.checkpoint import SourcePosition

log = structlog.get_logger(__name__)

NS_PER_DAY = 86_400_000_000_000
#: how often partitions are looked for, watermarks read, stopped locations retried
HOUSEKEEPING_S = 1.0
METADATA_S = 10.0
#: the least time between two starts of one of a source's fetch processes
RESTART_S = 1.0
#: how long the first assignment waits for every fetch process to be ready
READY_WAIT_S = 10.0


@dataclass
class PartitionState:
    """What the loop knows of one Kafka partition; the metrics and ``dis status`` read it."""

    source: str
    topic: str
    partition: int
    table: str
    internal_partition: str
    next_offset: int = -1  # -1: not known yet (no checkpointed offset, before the first message)
    high_watermark: int = -1
    messages: int = 0
    bytes: int = 0
    errors: int = 0
    stopped: str | None = None  # why the partition is stopped (poison, a location in error)
    blocked_on: Any = None  # the Location in error it waits for
    assigned: bool = False
    #: moved on at every (un)assignment: batches fetched before carry an older one (fetcher.py)
    generation: int = 0
    locations: dict[str, Any] = field(default_factory=dict)  # column partition -> Location
    #: each location's ``epoch`` when the partition was (re)assigned: a location reopened from its
    #: checkpoint since (its offset moved back) refuses our rows, and the partition re-seeks
    epochs: dict[str, int] = field(default_factory=dict)

    @property
    def lag(self) -> int | None:
        if self.high_watermark < 0 or self.next_offset < 0:
            return None
        return max(0, self.high_watermark - self.next_offset)


class SourceConsumer:
    """The thread consuming one source's topic into its table's locations."""

    def __init__(self, kafka: KafkaConfig, src: SourceConfig, engine: StorageEngine) -> None:
        self.kafka = kafka
        self.src = src
        self.engine = engine
        self.partitions: dict[int, PartitionState] = {}
        self.lock = threading.Lock()
        self.client_errors = 0
        self.last_client_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: the topic's partitions when the source started (read only when ``fetch_processes`` is
        #: derived from them), and the pool; a derived count is known once ``_run`` has read them
        self.partitions_at_start: int | None = None
        self._pool(src.fetch_processes or 0)
        self._restart_at: dict[int, float] = {}
        self._ready: set[int] = set()  # fetch processes that said they are ready (clients started)
        self._first_metadata = 0.0  # the first metadata waits until then for every process to be ready
        self._unpublished: set = set()  # locations written since the last caught-up flush
        self._next_housekeeping = self._next_metadata = self._next_commit = 0.0

    def _pool(self, n: int) -> None:
        self._fetch = FetchPool(self.kafka, self.src, n)
        self._watch = FetchWatch(n, self.kafka.stall_timeout_ms / 1000.0)
        #: per fetch process: when it was last started; when it is to be started again (it is gone)
        self._last_start = [0.0] * n

    @property
    def fetch_pids(self) -> list[int | None]:
        """Each fetch process's pid (None while there is none)."""
        return self._fetch.pids

    # -- life cycle ----------------------------------------------------------------------------
    def start(self) -> None:
        _warm_up()
        self._thread = threading.Thread(target=self._run, name=f"dis-kafka-{self.src.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        if self.src.fetch_processes is None:  # one a partition, up to twice the cores (disd.kafka.link)
            self.partitions_at_start = topic_partitions(self.kafka, self.src.topic)
            self._pool(default_fetch_processes(self.partitions_at_start, usable_cores()))
        for f in self._fetch.procs:  # all at once: each takes about a second to start (imports, connecting)
            self._start_fetch(f)
        self._first_metadata = time.monotonic() + READY_WAIT_S
        log.info("kafka source started", source=self.src.name, topic=self.src.topic, table=self.src.schema.key,
                 fetch_processes=len(self._fetch.procs), partitions=self.partitions_at_start, fetch_pids=self._fetch.pids)
        try:
            while not self._stop.is_set():
                try:
                    self._step()
                except FetchProcessGone as e:
                    self._lost(e.index, str(e))
                except Exception as e:  # the loop never dies; the error is shown
                    self._client_error(f"unexpected: {e!r}")
                    log.exception("kafka source loop failed; retrying", source=self.src.name)
                    self._stop.wait(1.0)
        finally:
            self._stop.set()
            self._fetch.close()
            log.info("kafka source stopped", source=self.src.name)

    def _start_fetch(self, f: FetchProcess) -> bool:
        """Start fetch process ``f``; False (and it is started again later) if it cannot be."""
        self._last_start[f.index] = time.monotonic()
        self._restart_at.pop(f.index, None)
        self._ready.discard(f.index)
        try:
            f.start()
        except FetchProcessGone as e:
            self._lost(f.index, str(e))
            return False
        self._watch.started(f.index, time.monotonic())
        return True

    def _lost(self, index: int, why: str) -> None:
        """Fetch process ``index`` is gone: its assigned partitions move to a new generation (the
        batches it sent are never appended) and it is started again, at most once every
        ``RESTART_S``, by ``_restarts``; the other processes go on meanwhile."""
        f = self._fetch.procs[index]
        self._client_error(why)
        log.error("kafka fetch process lost; starting a new one", source=self.src.name, fetch_process=index,
                  error=why)
        f.close(timeout=1.0)
        for st in self._owned(index):
            if st.assigned:  # assigned again by the next start
                st.generation += 1
        self._restart_at[index] = self._last_start[index] + RESTART_S

    def _restarts(self, now: float) -> None:
        """Start the lost fetch processes whose time has come, each assigned its partitions again
        at their locations' offsets."""
        for index, at in sorted(self._restart_at.items()):
            if now < at:
                continue
            f = self._fetch.procs[index]
            if not self._start_fetch(f):
                continue
            log.info("kafka fetch process started", source=self.src.name, fetch_process=index, fetch_pid=f.pid)
            self._next_metadata = 0.0  # a metadata question it had may be lost
            for st in self._owned(index):
                if st.assigned:
                    st.assigned = False
                    self._assign(st)

    def _hung(self, now: float) -> None:
        """Kill and start again a fetch process that has partitions but has gone silent
        (``disd.kafka.watch``); its partitions are re-seeked from our offsets when it is back."""
        for f in self._fetch.running():
            if f.index in self._restart_at:
                continue
            mine = [st for st in self._owned(f.index) if st.assigned]
            if not mine:
                continue
            lagging = any(st.stopped is None and st.blocked_on is None and 0 <= st.next_offset < st.high_watermark
                          for st in mine)
            why = self._watch.hung(f.index, now, lagging)
            if why is not None:
                log.error("kafka fetch process hung; killing it", source=self.src.name, fetch_process=f.index,
                          fetch_pid=f.pid, reason=why)
                f.kill()
                self._lost(f.index, f"fetch process {f.index} hung ({why}); killed")

    def _owned(self, index: int) -> list[PartitionState]:
        return [st for p, st in list(self.partitions.items()) if self._fetch.owner(p).index == index]

    def _send(self, f: FetchProcess, cmd: tuple) -> None:
        """A command to fetch process ``f``; none while it is gone (its partitions are assigned
        again when it is started again)."""
        if f.index in self._restart_at:
            return
        try:
            f.send(cmd)
        except FetchProcessGone as e:
            self._lost(f.index, str(e))

    def _step(self) -> None:
        now = time.monotonic()
        if self._restart_at:
            self._restarts(now)
        running = self._fetch.running()
        asked = [f for f in running if f.index in self._ready]
        if now >= self._next_metadata and asked and (len(self._ready) == len(running) or now >= self._first_metadata):
            # the first time only when every process is ready: a partition is not assigned to a
            # process still starting (its start-up, on the same cores, would slow the others)
            self._next_metadata = now + METADATA_S
            self._first_metadata = 0.0
            self._send(asked[0], ("metadata",))
        if now >= self._next_housekeeping:
            self._next_housekeeping = now + HOUSEKEEPING_S
            self._retry_blocked()
            self._hung(now)
            self._watermarks()
        if now >= self._next_commit:
            self._next_commit = now + self.kafka.commit_interval_ms / 1000.0
            self._commit_for_monitoring()
        ready = self._fetch.ready(0.1)
        if not ready and not running:
            self._stop.wait(0.1)
        for f in ready:
            got = f.receive(0)
            if got is not None:
                self._handle(f.index, *got)

    def _handle(self, index: int, header: tuple, rows: pa.RecordBatch | None) -> None:
        """One message of fetch process ``index`` (fetcher.py says what each is)."""
        kind = header[0]
        self._watch.heard(index, time.monotonic(), kind == "batch")
        if kind == "batch":
            _, p, gen, first, end, messages, nbytes, poison, drained = header
            st = self.partitions.get(p)
            if st is not None and st.assigned and st.generation == gen:
                self._process(st, rows, first, end, messages, nbytes, poison)
            if drained:
                self._publish_caught_up(self._unpublished)
        elif kind == "ready":
            self._ready.add(index)
        elif kind == "drained":
            self._publish_caught_up(self._unpublished)
        elif kind == "error":
            self._message_error(*header[1:])
        elif kind == "metadata":
            self._discover(header[1], header[2])
        elif kind == "watermarks":
            for p, high in header[1].items():
                if p in self.partitions:
                    self.partitions[p].high_watermark = high
        elif kind == "lost":
            self._reseek(index)
        elif kind == "log":
            _, level, event, fields = header
            getattr(log, level)(event, source=self.src.name, fetch_process=index, **fields)

    def _publish_caught_up(self, written: set) -> None:
        """The client had no more messages: publish the rows just written now rather than at
        the flusher's next tick (up to ``flush_interval_ms`` later), so rows of a source that
        has caught up are visible as soon as they are in (``Location.publish_soon``: at most
        every ``Location.caught_up_flush_s`` a location; one held back by that is flushed at the
        flush clock's next such tick)."""
        for loc in written:
            loc.publish_soon()
        written.clear()

    def _reseek(self, index: int) -> None:
        """Messages were consumed by fetch process ``index`` and lost on the way: each of its
        assigned partitions is assigned again at its locations' offsets (as after a reopened
        location), so they are read again."""
        for st in self._owned(index):
            if st.assigned:
                self._unassign(st)
                self._assign(st)

    # -- partitions ----------------------------------------------------------------------------
    def _discover(self, partitions: list[int] | None, error: str | None) -> None:
        """Assign every partition of the topic not yet known, each at its locations' offset."""
        if partitions is None:
            self._client_error(error or "the topic's partitions are unknown")  # the fetcher says why
            return
        new = [p for p in partitions if p not in self.partitions]
        for p in new:
            st = PartitionState(self.src.name, self.src.topic, p, self.src.schema.key,
                                self.src.internal_partition(p))
            self._find_locations(st)
            with self.lock:
                self.partitions[p] = st
            self._assign(st)
        if new:
            self._watermarks()  # their lag at once, not at the next housekeeping

    def _find_locations(self, st: PartitionState) -> None:
        for loc in self.engine.locations():
            k = loc.key
            if (k.namespace, k.table, k.internal_partition) == (self.src.schema.namespace, self.src.schema.table,
                                                                 st.internal_partition):
                st.locations[k.column_partition] = loc

    def _resume_offset(self, st: PartitionState) -> int | None:
        """The smallest next offset among the partition's locations; None: none has one."""
        offsets = [loc.resume_point.offset for loc in st.locations.values() if _ours(loc.resume_point, st)]
        return min(offsets) if offsets else None

    def _assign(self, st: PartitionState) -> None:
        from confluent_kafka import OFFSET_BEGINNING, OFFSET_END

        for loc in st.locations.values():
            if loc.in_error:
                self._block(st, loc)
                return
        st.epochs = {cp: loc.epoch for cp, loc in st.locations.items()}
        offset = self._resume_offset(st)
        st.next_offset = -1 if offset is None else offset
        start = offset if offset is not None else (OFFSET_BEGINNING if self.src.start == "earliest" else OFFSET_END)
        st.generation += 1
        st.assigned, st.stopped, st.blocked_on = True, None, None
        self._send(self._fetch.owner(st.partition), ("assign", st.partition, start, st.generation))
        log.info("kafka partition assigned", source=st.source, topic=st.topic, partition=st.partition,
                 offset=offset if offset is not None else self.src.start, locations=sorted(st.locations),
                 fetch_process=self._fetch.owner(st.partition).index)

    def _unassign(self, st: PartitionState) -> None:
        if st.assigned:
            st.generation += 1
            st.assigned = False
            self._send(self._fetch.owner(st.partition), ("unassign", st.partition))

    def _block(self, st: PartitionState, loc: Any) -> None:
        """A location of the partition is in error: stop consuming until it is reopened."""
        self._unassign(st)
        st.blocked_on = loc
        st.stopped = (f"location {loc.key} is in error: {loc.error}" if loc.in_error else
                      f"location {loc.key} was reopened from its checkpoint: resuming from its offset")
        log.error("kafka partition waits for its location", source=st.source, topic=st.topic,
                  partition=st.partition, location=str(loc.key), error=loc.error)

    def _retry_blocked(self) -> None:
        """Re-seek partitions whose location failed or was reopened (even with no message since
        to notice it: the rows cut back to the checkpoint must be read again), and resume those
        whose location accepts rows again."""
        for st in list(self.partitions.values()):
            if st.assigned:
                bad = next((loc for cp, loc in st.locations.items() if loc.in_error or loc.epoch != st.epochs.get(cp)), None)
                if bad is not None:
                    self._block(st, bad)
        for st in list(self.partitions.values()):
            if st.blocked_on is not None and not st.blocked_on.in_error:
                log.info("kafka partition resumes: its location was reopened", source=st.source, topic=st.topic,
                         partition=st.partition)
                self._assign(st)

    def _watermarks(self) -> None:
        """Asks each running fetch process for its partitions' high watermarks (the answers come
        with the batches): the first of a partition from the broker (lag at once), later ones
        librdkafka's cached."""
        for f in self._fetch.running():
            parts = [(st.partition, st.assigned and st.high_watermark >= 0) for st in self._owned(f.index)]
            if parts:
                self._send(f, ("watermarks", parts))

    def _commit_for_monitoring(self) -> None:
        """The next offsets, committed to the group for lag tools (each partition's by its fetch
        process); never read back."""
        for f in self._fetch.running():
            offsets = [(s.partition, s.next_offset) for s in self._owned(f.index) if s.next_offset >= 0]
            if offsets:
                self._send(f, ("commit", offsets))

    # -- messages ------------------------------------------------------------------------------
    def _message_error(self, topic: str | None, partition: int, code: int, text: str, full: str) -> None:
        """An error event of ``consume`` (its topic, partition, ``KafkaError`` code, ``str()``
        and the whole error)."""
        from confluent_kafka import KafkaError

        st = self.partitions.get(partition) if topic == self.src.topic else None
        if st is not None:
            st.errors += 1
            if code == KafkaError._AUTO_OFFSET_RESET:  # noqa: SLF001 - librdkafka's own code (confluent_kafka's leading _): the resume offset is gone from the topic
                self._stop_partition(st, f"offset {st.next_offset} is no longer in the topic (deleted by retention?): "
                                         f"{text}; messages may be lost, see docs/kafka.md")
                return
        self._client_error(full)

    def _client_error(self, text: str) -> None:
        self.client_errors += 1
        if text != self.last_client_error:
            log.warning("kafka client error", source=self.src.name, error=text)
        self.last_client_error = text

    def _process(self, st: PartitionState, rows: pa.RecordBatch, first: int, end: int, messages: int,
                 nbytes: int, poison: list[tuple[int, str]]) -> None:
        """One partition's decoded messages ``first``..``end``-1 (rows with their offsets, and
        the poison messages' offsets and reasons): route to locations, commit."""
        cols = rows.columns[:-1]
        row_offsets = rows.column(OFFSET_COLUMN).to_numpy()
        if st.next_offset >= 0 and first < st.next_offset:  # already written (the process filters them too)
            if end <= st.next_offset:
                return
            keep = np.flatnonzero(row_offsets >= st.next_offset)
            cols, row_offsets = [c.take(pa.array(keep)) for c in cols], row_offsets[keep]
            poison = [(o, why) for o, why in poison if o >= st.next_offset]
        st.messages += messages
        st.bytes += nbytes
        keep_below = None
        if poison:
            st.errors += len(poison)
            if self.src.on_poison == "stop":
                end = keep_below = poison[0][0]
            for offset, reason in poison if self.src.on_poison == "skip" else poison[:1]:
                log.error("kafka poison message", source=st.source, topic=st.topic, partition=st.partition,
                          offset=offset, error=reason, policy=self.src.on_poison)
        try:
            self._commit(st, cols, row_offsets, end, keep_below, nbytes, self._unpublished)
        except LocationError as e:
            loc = next((held for cp, held in st.locations.items() if held.in_error or held.epoch != st.epochs.get(cp)), None)
            if loc is not None:
                self._block(st, loc)
            else:
                self._stop_partition(st, str(e))
            return
        except Exception as e:  # noqa: BLE001 - a partition stops, the DIS goes on
            self._stop_partition(st, f"cannot write its rows: {e!r}")
            return
        st.next_offset = end
        if keep_below is not None:
            self._stop_partition(st, f"poison message at offset {keep_below}: {poison[0][1]} "
                                     "(import.kafka ... on_poison: stop)")

    def _stop_partition(self, st: PartitionState, why: str) -> None:
        self._unassign(st)
        st.stopped = why
        log.error("kafka partition stopped", source=st.source, topic=st.topic, partition=st.partition,
                  next_offset=st.next_offset, error=why)

    def _commit(self, st: PartitionState, cols: list[pa.Array], row_offsets: np.ndarray, end: int,
                keep_below: int | None, nbytes: int, written: set) -> None:
        """Append each column partition's rows to its location with the next offset ``end``;
        every other location of the partition only moves its offset (never back)."""
        if keep_below is not None and len(row_offsets):
            n = int(np.searchsorted(row_offsets, keep_below, side="left"))
            cols, row_offsets = [c.slice(0, n) for c in cols], row_offsets[:n]
        position = SourcePosition(None, end, 0, st.topic, st.partition)
        by_partition = self._route(cols, len(row_offsets))
        # Every location of the batch first, before any offset moves: a new one is claimed at its
        # first row's offset (``_location``).
        offsets = {cp: row_offsets if idx is None else row_offsets[idx] for cp, idx in by_partition.items()}
        locs = {cp: self._location(st, cp, int(offs[0]) if len(offs) else end) for cp, offs in offsets.items()}
        done = set()
        for cp, idx in by_partition.items():
            loc, offs = locs[cp], offsets[cp]
            threshold = loc.resume_point.offset if _ours(loc.resume_point, st) else 0
            if threshold >= end:
                done.add(cp)
                continue
            take = idx
            if len(offs) and offs[0] < threshold:  # already in this location before a restart
                sel = np.flatnonzero(offs >= threshold)
                take = sel if idx is None else idx[sel]
            part = cols if take is None else [c.take(pa.array(take)) for c in cols]
            loc.append_committed(part, position, 0 if done else nbytes, epoch=st.epochs[cp])
            written.add(loc)
            done.add(cp)
        for cp, loc in list(st.locations.items()):
            if cp not in done and (not _ours(loc.resume_point, st) or loc.resume_point.offset < end):
                loc.append_committed([], position, epoch=st.epochs[cp])

    def _route(self, cols: list[pa.Array], n: int) -> dict[str, np.ndarray | None]:
        """Row indices of each column partition (None: all rows)."""
        if self.src.fixed_partition is not None:
            return {self.src.fixed_partition: None} if n else {}
        if not n:
            return {}
        column = self.src.partition_column
        assert column is not None  # a source has a partition column or a fixed partition
        ts = cols[self.src.schema.column_names.index(column)]
        days = np.asarray(ts.cast(pa.int64()).to_numpy(zero_copy_only=False)) // NS_PER_DAY
        first, last = days.min(), days.max()
        if first == last:
            return {_date(first): None}
        order = np.argsort(days, kind="stable")
        uniq, starts = np.unique(days[order], return_index=True)
        bounds = [*starts.tolist(), n]
        return {_date(d): np.sort(order[bounds[i]:bounds[i + 1]]) for i, d in enumerate(uniq.tolist())}

    def _location(self, st: PartitionState, cp: str, first: int) -> Any:
        """The partition's location for column partition ``cp``, created if new.

        A new location is claimed before it takes a row: its resume point is set to ``first``
        (the offset of its first row: it holds nothing of the partition below) and checkpointed
        at once.  The resume point after a restart is the smallest of the partition's
        locations', and the other locations' offsets move past this one's rows as soon as they
        are appended; a location whose durable record did not yet name our partition was left
        out of that minimum, so a crash before its first checkpoint lost the rows it took while
        the others' checkpoints already counted them."""
        loc = st.locations.get(cp)
        if loc is None:
            s = self.src.schema
            loc = self.engine.location(LocationKey(s.namespace, s.table, st.internal_partition, cp), create=True,
                                       version=s.version)
            st.locations[cp] = loc
            st.epochs[cp] = loc.epoch
            if not _ours(loc.resume_point, st) and not loc.in_error:
                loc.append_committed([], SourcePosition(None, first, 0, st.topic, st.partition), epoch=loc.epoch)
                loc.checkpoint()
        if loc.in_error:
            raise LocationError(loc.error, loc.error_errno)
        if loc.schema_version != self.src.schema.version:
            raise SchemaValueError(f"location {loc.key} is written in schema version {loc.schema_version}, the source "
                             f"decodes version {self.src.schema.version}")
        return loc

    def snapshot(self) -> list[PartitionState]:
        with self.lock:
            return list(self.partitions.values())


def _warm_up() -> None:
    """pyarrow imports pandas (its optional pandas shim, about 0.2 s) at the first conversion of
    Python or numpy data in a process; done at start, before any partition is assigned, so that
    the first batch does not pay it while its partition's messages queue up."""
    pa.array([0], pa.int64())


def _ours(pos: SourcePosition, st: PartitionState) -> bool:
    return pos.topic == st.topic and pos.partition == st.partition


def _date(day: int) -> str:
    return str(np.datetime64(int(day), "D"))
