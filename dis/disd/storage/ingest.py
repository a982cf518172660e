"""A log's chunks into their locations: the one owner of a chunk, from its bytes to its ack.

A chunk (file name, offset, bytes) of a stream's location is checked against where the stream
is in its logs (the file, the next offset, a new file's header and schema), its frames scanned
and checksummed, its rows decoded, their transaction flags planned, their column bytes appended
to the location's buffers, its writes made and, when its sender has caught up, its rows
published; the answer is its ack or why it was refused.  ``ingest_chunks`` takes the chunks of
many locations together (a ``Multiplex`` request's): the byte work of all of them runs in one C
call with the interpreter's lock given up (``storage.ingestcore``), their writes in another
(``storage.writeout``), and the bookkeeping (metrics, the flush clock, subscribers) is counted
once a batch.  A location whose table keeps last-by state takes the compiled path too: after
the call, the rows it appended go to the state's ``Pending`` as Arrow arrays of their column
bytes (``_feed_lastby``).  Locations whose write state is the Python reference, and every chunk
the compiled path does not take as it is, go the reference path: ``binlog.format``'s scan and
decode, then ``storage.decodedrows``.
Refusals carry the message the reference gives (docs/grpc-contract.md, "Ingest").

The protocol and session rules (who owns a location, opens, takeovers, ends) are the Ingest
service's (``server.ingest``), which holds the streams' owner locks across a batch.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import structlog

from disd.binlog import (
    CorruptLogError,
    InvalidLogFileName,
    LogFileName,
    decode_frames,
    decode_header,
    scan_frames,
)
from disd.names import LocationKey
from disd.schema import TableSchema, column_differences
from disd.storage import decodedrows, metrics
from disd.storage.checkpoint import SourcePosition
from disd.storage.lastbyfeed import tail_columns
from disd.storage.location import Location, LocationError
from disd.storage.writeout import write_out
from disd.storage.writestate import ingestcore, is_compiled

log = structlog.get_logger(__name__)


class RefusalKind(enum.Enum):
    """Why a chunk was refused; the Ingest service answers each with a gRPC status."""

    INVALID = "invalid argument"  # names, offsets, frame boundaries
    DATA_LOSS = "data loss"  # corrupt bytes
    SCHEMA = "failed precondition"  # a file header of another schema or version
    LOCATION = "location"  # the location is in error, closed or reopened (``errno`` says which status)
    CANCELLED = "cancelled"  # the session's own rule (a stream taken over or closed)


@dataclass(frozen=True, slots=True)
class Refused:
    kind: RefusalKind
    message: str
    errno: int | None = None


@dataclass(slots=True)
class ChunkResult:
    """A chunk's answer: its ack (the file, the offset just past it, the committed rows), or
    ``refused``.  ``took``: the chunk held frames (counted in ``dis_ingest_chunks_total``)."""

    file_name: str
    offset: int
    committed_rows: int
    refused: Refused | None = None
    took: bool = False


class Chunk(Protocol):
    """A ``LogChunk``'s fields (``rpc.ingestwire.ChunkView`` is one), read only."""

    @property
    def file_name(self) -> str: ...
    @property
    def offset(self) -> int: ...
    @property
    def data(self) -> bytes | memoryview: ...
    @property
    def caught_up(self) -> bool: ...


class LocationIngest:
    """One stream's ingest into its location: where the stream is in its logs (the file, its
    name parsed once, the next offset) and the location's epoch when it learnt its resume point.
    Made by the stream's open, from the resume point; changed only by ``ingest_chunks``."""

    __slots__ = ("location", "key", "schema", "file_name", "name", "offset", "epoch")

    def __init__(self, location: Location, schema: TableSchema, resume: SourcePosition, epoch: int) -> None:
        self.location = location
        self.key: LocationKey = location.key
        self.schema = schema  # the version the stream's logs are in
        self.file_name: str | None = resume.file_name
        self.name: LogFileName | None = LogFileName.try_parse(resume.file_name) if resume.file_name else None
        self.offset = resume.offset
        self.epoch = epoch


Item = tuple["LocationIngest", "Chunk", "Refused | None"]  # (LocationIngest, Chunk, Refused | None): a chunk, and the session's veto on it


def schema_mismatch_message(table: TableSchema, fingerprint: str, log_schema: TableSchema | None, where: str) -> str:
    """A log of another schema than ``table`` (the version the log is compared with), naming the
    columns that differ when the log's schema is known."""
    diff = ""
    if isinstance(log_schema, TableSchema) and log_schema.fingerprint == fingerprint:
        diff = column_differences(table, log_schema)
    detail = f": {diff}" if diff else " (its columns were not sent)"
    same_number = (f" (both say version {table.version}: a changed schema needs a new version number)"
                   if isinstance(log_schema, TableSchema) and log_schema.version == table.version else "")
    return (f"{where}schema mismatch: the log's schema differs from table {table.key}{detail}; "
            f"log fingerprint {fingerprint or '(none)'}, table fingerprint {table.fingerprint}{same_number}")


def version_mismatch_message(key: LocationKey, location_version: int, log_version: int, where: str = "") -> str:
    """A log of another schema version than its location: a location is written in one version
    for ever, so the rows must go to another internal partition."""
    suffixed = f"{key.internal_partition}-{log_version}"
    return (f"{where}location {key} is written in schema version {location_version} of {key.table_key}, the log is "
            f"version {log_version}: a location keeps the version it was created in, so nothing was written. "
            f"Write each version to its own internal partition: the logger's "
            f"set_suffix_internal_partition_with_log_format(True) logs version {log_version} to "
            f"internal partition {suffixed!r}")


def location_refusal(loc: Location, e: LocationError) -> Refused:
    state = "is in error" if loc.in_error else "refused the chunk"
    return Refused(RefusalKind.LOCATION, f"location {loc.key} {state}: {e}", e.errno)


# -- the checks of a chunk against its stream ---------------------------------------------------


def _where(cur: LocationIngest, ch: Chunk, name: LogFileName | None) -> Refused | tuple[int, LogFileName | None]:
    """Where a chunk's frames start (after a new file's header), and its file's name; or why it
    is refused.  A chunk of the stream's file at its next offset needs no look at its name."""
    fname, offset = ch.file_name, ch.offset
    if fname == cur.file_name:
        if offset != cur.offset:
            return Refused(RefusalKind.INVALID, f"{fname}: chunk at offset {offset}, expected {cur.offset}")
        return (0, name)
    try:
        parsed = LogFileName.parse(fname)
    except InvalidLogFileName as e:
        return Refused(RefusalKind.INVALID, str(e))
    if parsed.location != cur.key:
        return Refused(RefusalKind.INVALID, f"file {fname} is not of location {cur.key}")
    if offset != 0:
        return Refused(RefusalKind.INVALID, f"{fname}: a new file must start at offset 0, got {offset}")
    if cur.file_name is not None:
        current = cur.name
        if current is not None and (parsed.sort_key, fname) < (current.sort_key, cur.file_name):
            return Refused(RefusalKind.INVALID, f"{fname} is older than {cur.file_name}, already ingested")
    try:
        header = decode_header(ch.data, fname)
    except CorruptLogError as e:
        return Refused(RefusalKind.DATA_LOSS, str(e))
    if header is None:
        return Refused(RefusalKind.INVALID, f"{fname}: first chunk lacks the whole header")
    schema, logged = cur.schema, header.schema
    if logged.version != schema.version:
        return Refused(RefusalKind.SCHEMA, version_mismatch_message(cur.key, schema.version, logged.version,
                                                                    f"{fname}: "))
    if header.fingerprint != schema.fingerprint:
        return Refused(RefusalKind.SCHEMA, schema_mismatch_message(schema, header.fingerprint, logged, f"{fname}: "))
    return (header.size, parsed)


def _reference(cur: LocationIngest, ch: Chunk, start: int, veto: Refused | None) -> tuple[Refused | None, bool]:
    """The reference path of one chunk (under its location's lock): the Python scan and decode,
    then its rows appended (``storage.decodedrows``).  A veto (the session's, or the location's
    own refusal) answers a chunk with frames whose bytes are good.  (Why it is refused, or None;
    whether it holds frames.)"""
    data, fname, loc = ch.data, ch.file_name, cur.location
    try:
        run = scan_frames(data, ch.offset, cur.schema, start=start, path=fname)
    except CorruptLogError as e:
        return Refused(RefusalKind.DATA_LOSS, str(e)), False
    end = ch.offset + len(data)
    if run.end_offset != end:
        return Refused(RefusalKind.INVALID, f"{fname}: chunk at {ch.offset} does not end on a frame boundary "
                                            f"(whole frames end at {run.end_offset}, chunk at {end})"), False
    if not run.starts:
        return None, False
    try:
        rows = decode_frames(data, ch.offset, run, cur.schema)
    except CorruptLogError as e:
        return Refused(RefusalKind.DATA_LOSS, str(e)), True
    if veto is not None:
        return veto, True
    try:
        decodedrows.ingest(loc, fname, run, rows)
    except LocationError as e:
        return location_refusal(loc, e), True
    return None, True


def _usable(cur: LocationIngest) -> Refused | None:
    """Under the location's lock: why it takes no rows from this stream now, if it does not."""
    loc = cur.location
    try:
        loc.check_epoch(cur.epoch)
    except LocationError as e:
        return location_refusal(loc, e)
    return None


# -- a batch ------------------------------------------------------------------------------------


class _Batch:
    """One ``ingest_chunks`` call: its items' checks and results, and the bookkeeping counted
    once for the batch."""

    def __init__(self, items: Sequence[Item]) -> None:
        self.items = items
        self.results: list[ChunkResult | None] = [None] * len(items)
        self.checked: list[tuple[int, LogFileName | None] | None] = [None] * len(items)
        self.dead: set[int] = set()  # streams refused in this batch (ids of their LocationIngest)
        self.rows: dict[str, list[int]] = {}  # table -> [rows ingested, log bytes, rows committed]
        self.touched: dict[int, Location] = {}  # id -> a location that took a chunk
        self.dirty: dict[int, Location] = {}  # id -> one that took rows or cut some back
        self.caught_up: dict[int, Location] = {}  # id -> its sender has caught up

    def refuse(self, i: int, refused: Refused) -> None:
        cur, ch, _ = self.items[i]
        self.results[i] = ChunkResult(ch.file_name, ch.offset, cur.location.committed_rows, refused)
        self.dead.add(id(cur))

    def ack(self, i: int, committed: int, took: bool) -> None:
        cur, ch, _ = self.items[i]
        loc = cur.location
        self.results[i] = ChunkResult(ch.file_name, ch.offset + len(ch.data), committed, None, took)
        self.touched[id(loc)] = loc
        if ch.caught_up:
            self.caught_up[id(loc)] = loc

    def count(self, table: str, kept: int, nbytes: int, committed: int) -> None:
        acc = self.rows.get(table)
        if acc is None:
            acc = self.rows[table] = [0, 0, 0]
        acc[0] += kept
        acc[1] += nbytes
        acc[2] += committed

    def metrics(self) -> None:
        for table, (kept, nbytes, committed) in self.rows.items():
            if nbytes:
                metrics.ROWS_INGESTED.labels(table).inc(kept)
                metrics.BYTES_INGESTED.labels(table).inc(nbytes)
            if committed:
                metrics.ROWS_COMMITTED.labels(table).inc(committed)


def ingest_chunks(items: Sequence[Item]) -> list[ChunkResult | None]:
    """Each ``(stream's ingest, chunk, veto)``, in order: its result, or None for a chunk after
    its stream's refused one in the batch (the stream ends at that one; nothing of the later
    ones is taken).  ``veto`` (None: none) is the session's refusal of a chunk whose bytes are
    good.  The caller holds the streams' owner locks; the locations' locks are taken here, in
    one order for every batch, so two batches never wait for each other."""
    batch = _Batch(items)
    if not items:
        return batch.results
    locs = {id(cur.location): cur.location for cur, _, _ in items}
    held = []
    try:
        for k in sorted(locs):
            locs[k].lock.acquire()
            held.append(locs[k])
        _check(batch)
        _run(batch)
        flushed = _write(batch)
    finally:
        for loc in reversed(held):
            loc.lock.release()
    batch.metrics()
    for loc, published in flushed:
        loc.hand_off_lastby(published)
        loc.published()
    return batch.results


def _check(batch: _Batch) -> None:
    """Each chunk against its stream's place in its logs, in order, the stream moved past each
    chunk as if it is taken (a refused one ends the stream, whose place no longer matters)."""
    for i, (cur, ch, _) in enumerate(batch.items):
        if id(cur) in batch.dead:
            continue
        where = _where(cur, ch, cur.name)
        if isinstance(where, Refused):
            batch.refuse(i, where)
            continue
        batch.checked[i] = where
        if ch.file_name != cur.file_name:
            cur.file_name, cur.name = ch.file_name, where[1]
        cur.offset = ch.offset + len(ch.data)


def _run(batch: _Batch) -> None:
    """Scan, decode and append every chunk checked, in rounds: a round's compiled chunks in one
    C call.  A location's chunks stay in order: one the compiled path does not take (refused, or
    left to the reference) stops its location's later ones in that call, which the next round
    sends again once the reference has dealt with it."""
    items = batch.items
    todo = [i for i in range(len(items)) if batch.checked[i] is not None]
    while todo:
        native, native_at, later = [], [], []
        fed: list[Location] = []  # last-by locations with chunks in this round's C call
        compiled_locs: set[int] = set()  # locations with a chunk in this round's C call
        deferred: set[int] = set()  # locations whose chunks wait for the next round
        for i in todo:
            cur, ch, veto = items[i]
            loc = cur.location
            if id(cur) in batch.dead:
                continue
            if id(loc) in deferred:
                later.append(i)
                continue
            checked = batch.checked[i]
            assert checked is not None  # todo holds the checked chunks only
            start = checked[0]
            veto = veto or _usable(cur)
            state = loc.state
            if veto is None and is_compiled(state):
                if loc.lastby is not None and id(loc) not in compiled_locs:
                    state.mark()  # the rows the call appends past here go to its last-by state
                    fed.append(loc)
                native.append((state, ch.data, ch.offset, start, ch.file_name, ch.file_name == state.source[0]))
                native_at.append(i)
                compiled_locs.add(id(loc))
            elif id(loc) in compiled_locs:
                later.append(i)  # after the location's chunks in this round's C call
                deferred.add(id(loc))
            else:
                _by_reference(batch, i, start, veto)
        if native:
            outs = ingestcore.ingest_batch(native)
            for loc in fed:  # before any chunk of theirs goes the reference path below
                _feed_lastby(loc)
            for i, out in zip(native_at, outs):
                status = out[0]
                if status == ingestcore.OK or status == ingestcore.NO_FRAMES:
                    _compiled(batch, i, out)
                elif status == ingestcore.SKIPPED:
                    later.append(i)
                elif status == ingestcore.NOMEM:
                    raise MemoryError("no memory for a chunk's rows")
                else:  # refused, or left to the reference: nothing of it was applied
                    checked = batch.checked[i]
                    assert checked is not None  # only checked chunks went to the C call
                    refused = _by_reference(batch, i, checked[0], None)
                    if status == ingestcore.REFUSED and refused is None:
                        cur, ch, _ = items[i]
                        log.error("the compiled ingest path refused a chunk the reference takes",
                                  location=str(cur.key), file=ch.file_name, offset=ch.offset)
        todo = sorted(later)


def _feed_lastby(loc: Location) -> None:
    """Under the location's lock, after a C call: the rows it appended (their column bytes,
    still in the write state's buffers) to the last-by state's ``Pending``, which first drops
    what a rollback in the call cut; so a publish's update neither reads them back from the
    files nor decodes the chunk again."""
    lastby, state = loc.lastby, loc.state
    assert lastby is not None and state is not None and is_compiled(state)
    try:
        tail = state.take_tail()
    except MemoryError:  # (the rows are taken all the same: the update reads them from the files)
        tail = None
    if tail is None:  # (not all in the buffers, or no memory for their copy: the files are read instead)
        lastby.pending.clear()
        return
    first, n, parts = tail
    lastby.pending.put(first, tail_columns(loc.schema, n, parts))


def _by_reference(batch: _Batch, i: int, start: int, veto: Refused | None) -> Refused | None:
    cur = batch.items[i][0]
    refused, took = _reference(cur, batch.items[i][1], start, veto)
    if refused is not None:
        batch.refuse(i, refused)
    else:
        batch.ack(i, cur.location.committed_rows, took)
    return refused


def _compiled(batch: _Batch, i: int, out: tuple[Any, ...]) -> None:
    _, dirty, frames, kept, committed, nbytes, abandoned, ends_without_start, restarts, rolled, after = out
    cur = batch.items[i][0]
    loc = cur.location
    batch.ack(i, after, frames > 0)
    if not frames:
        return
    batch.count(loc.schema.key, kept, nbytes, committed)
    if abandoned or ends_without_start:
        decodedrows.note_malformed(loc, abandoned, ends_without_start)
    if restarts:
        loc.import_state["restarts"] += restarts
    if rolled:
        loc.note_rolled_back(rolled)
    if dirty:
        batch.dirty[id(loc)] = loc


def _write(batch: _Batch) -> list[tuple[Location, tuple[int, dict[str, int], int] | None]]:
    """The batch's writes: whole blocks and cuts of every location that took a chunk (a failure
    puts the location in error and refuses its chunks of the batch, as a failed append did),
    then the flush of those whose senders have caught up (a failure puts the location in error;
    its acks stand, as after a failed flush).  Returns the locations published, with what."""
    touched = [loc for loc in batch.touched.values() if loc.state is not None and loc.state.needs_io(False)]
    for loc, e in zip(touched, write_out([(loc, False) for loc in touched])):
        if e is not None:
            loc.fail_io("write", e)
            _refuse_location(batch, loc)
    now = time.time()
    flush = [loc for loc in batch.caught_up.values() if not loc.in_error and loc.flush_due_soon(now)]
    flushed = []
    if flush:
        t0 = time.perf_counter()
        for loc, e in zip(flush, write_out([(loc, True) for loc in flush])):
            batch.dirty.pop(id(loc), None)
            if e is not None:
                loc.fail_io("flush", e)
            elif loc.published_locked(now):
                flushed.append((loc, loc.publish_snapshot()))
        metrics.FLUSH_DURATION.observe(time.perf_counter() - t0)
    for loc in batch.dirty.values():
        if not loc.in_error:
            loc.mark_dirty()
    return flushed


def _refuse_location(batch: _Batch, loc: Location) -> None:
    """The location failed under the batch's chunks: each of them is refused (its sender resumes
    from the resume point once the location is reopened)."""
    refused = location_refusal(loc, LocationError(loc.error, loc.error_errno))
    for i, (cur, ch, _) in enumerate(batch.items):
        r = batch.results[i]
        if cur.location is loc and r is not None and r.refused is None:
            batch.results[i] = ChunkResult(ch.file_name, ch.offset, loc.committed_rows, refused)
            batch.dead.add(id(cur))
