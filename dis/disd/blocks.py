"""The block seam: where every reader of intraday column data gets its bytes.

A reader (``disd.client.Client.read_table``, the Spark source's planning and tasks, a merge)
needs two things from wherever the column files are: the locations of a table with their sizes
(``LocationSnapshot``: rows and column file sizes that cover those rows: exactly at a checkpoint,
and at a published size perhaps a flush's rows more, as a DIS reads the rows first), and byte ranges
of a column file below those sizes.  ``BlockSource`` is that interface and nothing more; turning
the bytes into Arrow arrays is ``disd.storage.columns``'s job alone (``read_location``).

Why this is enough: column files only grow, and the bytes of rows ``[0, n)`` never change once
published (docs/storage-format.md).  So a snapshot pins what a read returns, and *any* source
that serves the bytes below a snapshot's sizes serves the same bytes.  Implementations can differ
in everything else:

* ``GrpcBlocks`` — DISes over gRPC: locations as the owning DIS lists them (published sizes,
  ``routing`` says which DIS, or which set of hot replicas, owns a table), a location's ranges
  fetched as 64 KiB blocks in one ``ReadRanges`` stream (a ``ReadBlocks`` stream or ``ReadBlock``
  calls per range against an older DIS), over channels with ``ClientSecurity``.  A read whose replica goes down continues on another replica
  that has published the bytes it reads (docs/replicas.md).
* ``LocalColumnFiles`` — the column files under a database root, read with ``pread``: on the DIS
  host or a shared mount.  It serves snapshots listed by a DIS (published sizes: Spark's
  ``dbRoot`` option) and lists locations itself at their ``table.size`` checkpoints (no DIS
  needed: the rows a checkpoint covers never change either).

``open_block_source`` is the one place that picks an implementation.  Later sources (a caching
proxy) plug in here: they take the same snapshots and must return the same bytes.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol, Self, Sequence, TypeVar

import grpc
import pyarrow as pa

from disd.config import DEFAULT_BLOCK_SIZE_BYTES
from disd.errors import DisError
from disd.names import InvalidNameError, LocationKey
from disd.routing import Instance, Routing, resolve
from disd.rpc.channel import open_channel
from disd.rpc.keys import key_from_proto, key_to_proto
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from disd.schema import SchemaError, TableSchema
from disd.schemaversions import Projection, projection
from disd.security import ClientSecurity
from disd.storage.checkpoint import FILE_NAME as CHECKPOINT_FILE
from disd.storage.checkpoint import CheckpointError, CheckpointRecord, read_record
from disd.storage.columns import DataEnds, read_rows_batched
from disd.storage.engine import location_path, subdirs
from disd.storage.versionstore import VersionStoreError, with_stored_history

#: ReadBlock requests kept in flight per read: enough to hide the round trip on loopback.
READ_AHEAD = 32
#: How long a reader rides out an unreachable DIS by default: a restart under systemd (the DIS
#: checkpoints on the way down, then recovers and listens again within seconds) fits with room.
DEFAULT_RETRY_S = 60.0
#: The first wait between attempts, doubled after each, at most the second.
RETRY_INITIAL_S, RETRY_MAX_S = 0.1, 2.0

#: Which column partitions (values, e.g. dates) to list; None lists them all.
Wanted = Callable[[str], bool]
T = TypeVar("T")


# -- the record and the interface --------------------------------------------------------------
@dataclass(frozen=True)
class LocationSnapshot:
    """A location at one published size: ``rows`` and the column file sizes covering them.

    ``address`` says where it was listed: a DIS's ``host:port``, or ``file:<db_root>`` for a
    location listed from its column files."""

    key: LocationKey
    rows: int
    files: dict[str, int] = field(hash=False)
    block_size: int
    address: str
    # The schema version the location's files are written in (0: not said, the table's newest).
    schema_version: int = 0

    @classmethod
    def from_msg(cls, m: dis_pb2.LocationInfo, address: str) -> LocationSnapshot:
        return cls(key_from_proto(m.key), int(m.rows), {f.name: int(f.size) for f in m.files},
                   int(m.block_size) or DEFAULT_BLOCK_SIZE_BYTES, address, int(m.schema_version))


class BlockSourceError(DisError):
    """A source cannot list or read: the message says what and where (an unreachable DIS, a
    refused credential, a column file shorter than its snapshot, a damaged checkpoint)."""


class DisClientError(BlockSourceError):
    """A failure a user can act on: unreachable DIS, unknown table, bad argument."""


class ColumnFileError(BlockSourceError):
    """Column files that cannot serve a snapshot: missing, shorter than their sizes, or a
    checkpoint that does not match the files or the schema."""


Range = tuple[str, int, int]
"""(column file name, start, stop): bytes [start, stop) of a column file."""


class BlockSource(Protocol):
    """Where the column bytes of locations come from (see the module docstring).

    A source is used by one thread at a time and holds what it opens (channels, descriptors)
    until ``close``."""

    def locations(self, namespace: str, table: str, wanted: Wanted | None = None) -> list[LocationSnapshot]:
        """The locations of ``namespace.table`` (those whose column partition ``wanted`` accepts),
        each at a size whose rows never change: published by a DIS, or checkpointed."""
        ...

    def read_range(self, snap: LocationSnapshot, file: str, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of a column file of ``snap``, never past its size in ``snap``
        (a shorter answer when ``stop`` is beyond it; an error when the source holds less)."""
        ...

    def read_ranges(self, snap: LocationSnapshot, ranges: Sequence[Range]) -> list[bytes]:
        """``read_range`` of each ``(file, start, stop)`` of ``ranges``, in order.  What a reader
        of a location's rows calls: a source that pays per request (a DIS: per call) serves them
        all in one."""
        ...

    def close(self) -> None:
        """Release channels and file descriptors; the source is not used afterwards."""
        ...


def read_location(source: BlockSource, schema: TableSchema, snap: LocationSnapshot,
                  columns: Sequence[str] | None = None, start: int = 0, stop: int | None = None,
                  ends: DataEnds | None = None) -> pa.Table:
    """Rows ``[start, stop)`` of one location (at most ``snap.rows``) as a pyarrow Table of
    ``schema``'s columns and Arrow types, decoded by ``disd.storage.columns`` from the bytes
    ``source`` serves.

    ``schema`` is the version a reader presents (the table's newest) carrying the others
    (``TableSchema.history``).  A location written in another version (``snap.schema_version``;
    0 means ``schema``'s own) is decoded in that version, from its files' names then, and only
    the columns the presented ones come from; ``version_projection`` turns those into
    ``schema``'s columns.  A location in ``schema``'s own version is decoded as it is: nothing
    extra on the common path.

    The bytes come in one ``source.read_ranges`` when the read goes to the snapshot's end and
    starts at row 0, or where ``ends`` (this location's ``DataEnds``) knows the string data to
    start; otherwise in two, the second for string data the offsets locate."""
    stop = snap.rows if stop is None else min(stop, snap.rows)
    fetch = lambda ranges: source.read_ranges(snap, ranges)  # noqa: E731
    # The snapshot's sizes cover at least its rows: a read to its end knows every range at once.
    sizes = snap.files if stop == snap.rows else None
    version = snap.schema_version or schema.version
    if version == schema.version:
        return read_rows_batched(schema, columns, start, max(start, stop), fetch, sizes, ends)
    proj = version_projection(schema, version, columns, f"location {snap.key}")
    stored = read_rows_batched(proj.stored, proj.stored_columns, start, max(start, stop), fetch, sizes, ends)
    try:
        return proj.apply(stored)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        # Only a newer location read as an older version narrows (see version_projection).
        raise BlockSourceError(
            f"location {snap.key} (schema version {version}) holds values that do not fit {schema.key} "
            f"version {schema.version}'s types ({e}); read the table in its newest version") from None


def version_projection(schema: TableSchema, version: int, columns: Sequence[str] | None = None,
                       what: str = "a location") -> Projection:
    """How rows stored in ``version`` of ``schema``'s table read as ``schema``'s columns (all, or
    ``columns``): ``disd.schemaversions.projection`` (an older version: renamed, widened, added
    columns null; a newer one, for a reader that started before the table moved on: renamed
    back, narrowed back only where every value fits).  A ``version`` that ``schema.versions``
    does not hold is a BlockSourceError naming ``what``."""
    if version not in schema.versions:
        known = ", ".join(str(v) for v in schema.versions)
        raise BlockSourceError(f"{what} is written in schema version {version} of {schema.key}, which this "
                               f"reader does not know (it knows versions {known}); read again to pick up "
                               "the table's newest version")
    return projection(schema, version, columns)


def open_block_source(*, db_root: str | None = None, address: str | None = None,
                      routing: str | Routing | None = None, security: ClientSecurity | None = None,
                      timeout_s: float = 30.0, tables: Sequence[TableSchema] = (),
                      origin: str | None = None, retry_s: float = DEFAULT_RETRY_S) -> BlockSource:
    """The block source for a read: the column files under ``db_root`` when it is given (they
    must be the files of the DIS that listed the snapshots, or be listed by the source itself:
    ``tables`` gives their schemas, ``origin`` names the root in errors), else the DIS at
    ``address`` (or the instances of ``routing``) over gRPC with ``security``, riding out a DIS
    that is unreachable for up to ``retry_s`` seconds."""
    if db_root is not None:
        return LocalColumnFiles(db_root, tables, origin)
    return GrpcBlocks(resolve(address, routing), security, timeout_s, retry_s)


# -- over gRPC ----------------------------------------------------------------------------------
def explain(e: grpc.RpcError, address: str) -> DisClientError:
    """A gRPC failure as a sentence that names the DIS."""
    code = e.code() if hasattr(e, "code") else None
    details = e.details() if hasattr(e, "details") else str(e)
    stopped = _stopped_before_handled(e)
    if stopped:
        details = "it stopped before answering"
    if code == grpc.StatusCode.UNAVAILABLE or stopped:
        return DisClientError(f"DIS at {address} is unreachable: {details}")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return DisClientError(f"DIS at {address} refused the credentials: {details}")
    return DisClientError(f"DIS at {address}: {code.name if code else 'error'}: {details}")


#: Words of an UNAVAILABLE status that a restart never causes: the TLS handshake failed (a
#: refused client certificate, an untrusted server).  Retrying those would only delay the error.
_NOT_A_RESTART = ("handshake", "ssl", "certificate", "tls")


#: The text of the CANCELLED status gRPC's core gives a call that reached a server as it stopped,
#: before a handler took it (grpc/grpc#41785).  Nobody cancelled that call: its DIS is going
#: away, as with UNAVAILABLE.  A call the caller cancels says "Locally cancelled by application!".
_STOPPED_BEFORE_HANDLED = "CANCELLED"


def _stopped_before_handled(e: grpc.RpcError) -> bool:
    if not hasattr(e, "code") or e.code() != grpc.StatusCode.CANCELLED:
        return False
    return ((e.details() if hasattr(e, "details") else "") or "").strip() == _STOPPED_BEFORE_HANDLED


def restarting(e: grpc.RpcError) -> bool:
    """Whether a failed call looks like its DIS being down or restarting (retry it), rather than
    a refusal that stays (answer at once)."""
    if _stopped_before_handled(e):
        return True
    if e.code() != grpc.StatusCode.UNAVAILABLE:
        return False
    details = (e.details() if hasattr(e, "details") else str(e)) or ""
    return not any(w in details.lower() for w in _NOT_A_RESTART)


class Subscription:
    """A subscription at one DIS (``stub``): iterated, sequences of ``LocationInfo``, one a
    message.  It asks for ``SubscribeBatches``, and a DIS without it (UNIMPLEMENTED) for
    ``Subscribe``, whose snapshots come one a message.  ``cancel()`` ends it, from any thread."""

    def __init__(self, stub, request: dis_pb2.SubscribeRequest) -> None:  # noqa: ANN001
        self._stub, self._request = stub, request
        self._cancelled = False
        self._call = stub.SubscribeBatches(request)

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()

    def __iter__(self) -> Iterator[Sequence]:
        try:
            first = next(self._call)
        except StopIteration:
            return
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            self._call = self._stub.Subscribe(self._request)
            if self._cancelled:  # cancelled while the first call was answered
                self._call.cancel()
            for m in self._call:
                yield (m,)
            return
        yield first.locations
        for m in self._call:
            yield m.locations


class _Backoff:
    """The pauses of a call that waits out unreachable DISes: 0.1 s doubling up to 2 s between
    rounds, for at most ``retry_s`` seconds from the first failed round."""

    def __init__(self, retry_s: float) -> None:
        self.retry_s = retry_s
        self.deadline: float | None = None
        self.delay = RETRY_INITIAL_S

    def expired(self) -> bool:
        """True once ``retry_s`` has passed since the first call (which starts the clock)."""
        now = time.monotonic()
        if self.deadline is None:
            self.deadline = now + self.retry_s
        return now >= self.deadline

    def sleep(self) -> None:
        time.sleep(max(0.0, min(self.delay, (self.deadline or 0.0) - time.monotonic())))
        self.delay = min(self.delay * 2, RETRY_MAX_S)


class _NotYetPublished(Exception):
    """A DIS served fewer bytes than a snapshot pins: it restarted and has not yet re-ingested
    rows it had published (a crash loses what was not checkpointed until the tailer resends it)."""


#: How long a replica that failed a call is asked last (after the other replicas of its set).
DOWN_S = 5.0


def replica_order(location: str, addresses: Sequence[str]) -> list[str]:
    """The replicas of a set in a location's own stable order (rendezvous hashing): by the first
    8 bytes of ``sha256("<location>@<address>")`` (big-endian, unsigned) descending, then address
    (a linear checksum such as CRC-32 would order two replicas the same way for every key).  ``location`` is a location key
    as ``str(LocationKey)`` (``Namespace/Table/internal/column``).  Readers spread locations over
    a set by trying them in this order: every reader picks the same replica for a location, and a
    replica that is down moves only its own locations to the others."""
    return sorted(addresses, key=lambda a: (-int.from_bytes(
        hashlib.sha256(f"{location}@{a}".encode()).digest()[:8], "big"), a))


class GrpcBlocks:
    """Blocks from DIS instances over gRPC: one channel per address, opened on first use.

    Which DIS: ``routing`` says which entry owns a table, and an entry is a set of replicas
    (one for a plain entry) holding byte-identical column files (docs/replicas.md).  An entry
    that lists proxies is read through them instead (``Routing.read_replicas``): a proxy serves
    the read side of a DIS, so its proxies are read as a replica set with all the rules below;
    a proxy itself reads with ``routing.upstream()``, the DISes.  A table is
    listed at every replica of its entry that answers, in parallel; each location is taken from
    the most advanced of them (the most rows), ties going to the first in the location's
    ``replica_order``, so in-sync replicas share the reads of a table's locations.  A snapshot's
    bytes are read from the replica that listed it (``snap.address``).

    A replica that goes down is a detour, not an error: a read that fails because its replica is
    unreachable (``UNAVAILABLE``, or ``DEADLINE_EXCEEDED`` when there is another replica to ask)
    continues on another replica of the set, but only on one whose ListLocations says it has
    published at least the end of the range read (bytes below a published size are the same on
    every replica; bytes above it a replica never said it has).  Listing, catalogue calls and
    subscriptions move to another replica the same way.

    A DIS restart is a pause, not an error: when no replica can serve a call (a set of one whose
    DIS restarts), it is tried again on fresh channels, with backoff, for up to ``retry_s``
    seconds, and so is a read of bytes no replica serves yet (after a crash a DIS republishes the
    rows a snapshot pinned once its tailer has resent them: the same rows, the same bytes).  Only
    then does the caller get an error, which says how long it waited.  ``retry_s=0`` asks each
    replica once (interactive commands)."""

    def __init__(self, routing: Routing, security: ClientSecurity | None = None, timeout_s: float = 30.0,
                 retry_s: float = DEFAULT_RETRY_S) -> None:
        self.routing = routing
        self.security = security
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, dis_pb2_grpc.TableDataStub] = {}
        self._unary_only: set[str] = set()  # DIS addresses without ReadBlocks
        self._no_ranges: set[str] = set()  # DIS addresses without ReadRanges
        self._down: dict[str, float] = {}  # address -> when a call to it last failed (monotonic)
        # What each replica said it published, per location (ListLocations answers): the sizes a
        # read may take from it when it fails over there.  Sizes only grow, so an old answer
        # only understates (re-asked then); a replica that lost rows in a crash serves short,
        # which a read detects (_NotYetPublished) and moves on.
        self._published: dict[tuple[str, LocationKey], dict[str, int]] = {}
        # Where reads of a snapshot went after its own replica failed: (key, snap.address) -> address.
        self._moved: dict[tuple[LocationKey, str], str] = {}

    # -- plumbing ------------------------------------------------------------------------------
    def stub(self, address: str) -> dis_pb2_grpc.TableDataStub:
        s = self._stubs.get(address)
        if s is None:
            ch = self._channels[address] = open_channel(address, self.security)
            s = self._stubs[address] = dis_pb2_grpc.TableDataStub(ch)
        return s

    def _call(self, address: str, method: str, request):  # noqa: ANN001, ANN202
        return self._retrying(address, lambda: getattr(self.stub(address), method)(request, timeout=self.timeout_s))

    def _forget(self, address: str) -> None:
        """Drop the channel of ``address``: the next call opens a new one (a channel that saw
        its DIS go away may sit in gRPC's own reconnect backoff for much longer than a restart)."""
        ch = self._channels.pop(address, None)
        self._stubs.pop(address, None)
        if ch is not None:
            # Closed off the caller's thread: grpcio's Channel.close() was seen to block for good
            # after a refused TLS handshake on a loaded machine, which would hang the reader
            # instead of letting it retry or fail with its message.
            threading.Thread(target=ch.close, name="dis-channel-close", daemon=True).start()

    def _mark_down(self, address: str) -> None:
        self._down[address] = time.monotonic()
        self._forget(address)

    def _is_down(self, address: str) -> bool:
        t = self._down.get(address)
        return t is not None and time.monotonic() - t < DOWN_S

    def _healthy_first(self, addresses: Sequence[str]) -> list[str]:
        """``addresses`` in their order, those that failed lately last."""
        return sorted(addresses, key=self._is_down)

    @staticmethod
    def _replica_down(e: grpc.RpcError, others: bool) -> bool:
        """Whether a failed call says its replica is down (ask another, or again later) rather
        than refusing for a reason that stays.  A call that timed out counts when ``others``
        (another replica can answer); a DIS of its own keeps answering DEADLINE_EXCEEDED at once."""
        if restarting(e):
            return True
        return others and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED

    def _retrying(self, address: str, attempt: Callable[[], T]) -> T:
        """``attempt()``, again while its DIS is unreachable or has not yet republished what it
        reads, for up to ``retry_s`` seconds; then the error, as a ``DisClientError``."""
        backoff = _Backoff(self.retry_s)
        while True:
            try:
                return attempt()
            except grpc.RpcError as e:
                if not restarting(e):
                    raise explain(e, address) from None
                failure: BlockSourceError = explain(e, address)
            except _NotYetPublished as e:
                failure = DisClientError(str(e))
            if backoff.expired():
                waited = f" (tried for {self.retry_s:g} s)" if self.retry_s > 0 else ""
                raise type(failure)(f"{failure}{waited}") from None
            self._forget(address)
            backoff.sleep()

    def _any_replica(self, addresses: Sequence[str], attempt: Callable[[str], T]) -> tuple[str, T]:
        """``(address, attempt(address))`` from the first replica of ``addresses`` (healthy ones
        first) that answers; rounds over them, with backoff, for up to ``retry_s`` seconds while
        none does.  Each round tries every replica once, so ``retry_s=0`` still fails over."""
        others = len(addresses) > 1
        backoff = _Backoff(self.retry_s)
        while True:
            failures: list[str] = []
            for address in self._healthy_first(addresses):
                try:
                    return address, attempt(address)
                except grpc.RpcError as e:
                    if not self._replica_down(e, others):
                        raise explain(e, address) from None
                    failures.append(str(explain(e, address)))
                    self._mark_down(address)
            if backoff.expired():
                raise DisClientError(_failed(failures, self.retry_s)) from None
            backoff.sleep()

    def _call_any(self, addresses: Sequence[str], method: str, request):  # noqa: ANN001, ANN202
        """``method(request)`` at the first replica of ``addresses`` that answers: (address, reply)."""
        return self._any_replica(
            addresses, lambda a: getattr(self.stub(a), method)(request, timeout=self.timeout_s))

    def _list_replicas(self, addresses: Sequence[str], request) -> dict[str, object]:  # noqa: ANN001
        """ListLocations at every replica of ``addresses`` that answers, asked in parallel: replicas
        that failed lately are asked only when no other answers.  At least one answer, or (after
        ``retry_s``) the error."""
        others = len(addresses) > 1
        backoff = _Backoff(self.retry_s)
        while True:
            healthy = [a for a in addresses if not self._is_down(a)]
            answers: dict[str, object] = {}
            failures: list[str] = []
            refused: BlockSourceError | None = None
            for ask in ([healthy, [a for a in addresses if a not in healthy]] if healthy else [list(addresses)]):
                pending = {a: self.stub(a).ListLocations.future(request, timeout=self.timeout_s) for a in ask}
                for a, fut in pending.items():
                    try:
                        answers[a] = fut.result()
                    except grpc.RpcError as e:
                        if not self._replica_down(e, others):
                            refused = refused or explain(e, a)
                            continue
                        failures.append(str(explain(e, a)))
                        self._mark_down(a)
                if answers:
                    return answers
            if refused is not None:
                raise refused
            if backoff.expired():
                raise DisClientError(_failed(failures, self.retry_s)) from None
            backoff.sleep()

    def _owner(self, namespace: str, table: str) -> str:
        return self._entry(namespace, table).address

    def _entry(self, namespace: str, table: str) -> Instance:
        inst = self.routing.owner(namespace, table)
        if inst is None:
            raise DisClientError(f"no DIS instance in the routing takes {namespace}.{table}")
        return inst

    def replicas(self, namespace: str, table: str) -> list[str]:
        """The addresses a table is read from, in the routing file's order: its entry's proxies
        when it lists any, else its replicas (``Routing.read_replicas``)."""
        return [r.address for r in self._entry(namespace, table).read_replicas]

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()
        self._stubs.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:  # noqa: ANN002
        self.close()

    # -- BlockSource ---------------------------------------------------------------------------
    def locations(self, namespace: str | None = None, table: str | None = None,
                  wanted: Wanted | None = None) -> list[LocationSnapshot]:
        """Published locations of a table (of every table when none is named), each listed by
        a replica of the entry that owns its table: the most advanced one that answered (see
        the class docstring)."""
        entries = [self._entry(namespace, table)] if namespace and table else list(self.routing.instances)
        request = dis_pb2.ListLocationsRequest(namespace=namespace or "", table=table or "")
        out = []
        for inst in entries:
            addresses = [r.address for r in inst.read_replicas]
            found: dict[LocationKey, list[LocationSnapshot]] = {}
            for address, resp in self._list_replicas(addresses, request).items():
                for m in resp.locations:
                    snap = LocationSnapshot.from_msg(m, address)
                    self._published[(address, snap.key)] = snap.files
                    if self.routing.owner(snap.key.namespace, snap.key.table) != inst:
                        continue
                    if wanted is None or wanted(snap.key.column_partition):
                        found.setdefault(snap.key, []).append(snap)
            for key, snaps in found.items():
                most = max(s.rows for s in snaps)
                order = replica_order(str(key), addresses)
                out.append(min((s for s in snaps if s.rows == most), key=lambda s: order.index(s.address)))
        return sorted(out, key=lambda s: (s.key.namespace, s.key.table, s.key.column_partition, s.key.internal_partition))

    def read_range(self, snap: LocationSnapshot, file: str, start: int, stop: int) -> bytes:
        """Bytes [start, stop) of a column file (``read_ranges`` of one range)."""
        return self.read_ranges(snap, [(file, start, stop)])[0]

    def read_ranges(self, snap: LocationSnapshot, ranges: Sequence[Range]) -> list[bytes]:
        """Byte ranges of column files of ``snap``: all in one ReadRanges stream (a DIS without
        ReadRanges is read a range at a time, with ReadBlocks or ReadBlock), from
        ``snap.address`` or, when that replica is down, from another replica of its set that has
        published at least the bytes read (see the class docstring)."""
        wanted = [(f, a, min(b, snap.files.get(f, 0))) for f, a, b in ranges]
        todo = [(f, a, b) for f, a, b in wanted if b > a]
        if not todo:
            return [b"" for _ in wanted]
        got = iter(self._read_replicas(snap, todo))
        return [next(got) if b > a else b"" for f, a, b in wanted]

    def _read_replicas(self, snap: LocationSnapshot, ranges: list[Range]) -> list[bytes]:
        candidates = self._read_candidates(snap)
        if len(candidates) == 1:
            return self._retrying(snap.address, lambda: self._read_from(snap.address, snap, ranges))
        others = True
        backoff = _Backoff(self.retry_s)
        while True:
            failures: list[str] = []
            moved = self._moved.get((snap.key, snap.address))
            for address in sorted(candidates, key=lambda a: (a != moved, self._is_down(a))):
                try:
                    if address != snap.address:
                        short = self._unpublished(address, snap.key, ranges)
                        if short is not None:
                            file, stop = short
                            have = self._published.get((address, snap.key), {}).get(file, 0)
                            failures.append(f"the DIS at {address} has published {have} bytes of {file} "
                                            f"of {snap.key}, fewer than {stop}")
                            continue
                    data = self._read_from(address, snap, ranges)
                except grpc.RpcError as e:
                    if not self._replica_down(e, others):
                        raise explain(e, address) from None
                    failures.append(str(explain(e, address)))
                    self._mark_down(address)
                    continue
                except _NotYetPublished as e:
                    failures.append(str(e))
                    continue
                if address != snap.address:
                    self._moved[(snap.key, snap.address)] = address
                return data
            if backoff.expired():
                what = ", ".join(f"[{a}, {b}) of {f}" for f, a, b in ranges)
                raise DisClientError(f"{snap.key}: no replica serves bytes {what}: "
                                     + _failed(failures, self.retry_s)) from None
            backoff.sleep()

    def _unpublished(self, address: str, key: LocationKey, ranges: list[Range]) -> tuple[str, int] | None:
        """The first (file, stop) of ``ranges`` the replica at ``address`` has not said it
        published, or None when it serves them all."""
        for file, _, stop in ranges:
            if not self._has_published(address, key, file, stop):
                return file, stop
        return None

    def _read_candidates(self, snap: LocationSnapshot) -> list[str]:
        """``snap.address`` and, when it is a replica of a set, the set's other replicas in the
        location's ``replica_order``."""
        inst = self.routing.owner(snap.key.namespace, snap.key.table)
        addresses = [r.address for r in inst.read_replicas] if inst is not None else []
        if snap.address not in addresses:
            return [snap.address]
        return [snap.address] + [a for a in replica_order(str(snap.key), addresses) if a != snap.address]

    def _has_published(self, address: str, key: LocationKey, file: str, size: int) -> bool:
        """Whether the replica at ``address`` said it published at least ``size`` bytes of
        ``file`` of location ``key`` (asking its ListLocations when what it said last is less).
        RpcError when it cannot be asked."""
        if self._published.get((address, key), {}).get(file, 0) >= size:
            return True
        resp = self.stub(address).ListLocations(
            dis_pb2.ListLocationsRequest(namespace=key.namespace, table=key.table), timeout=self.timeout_s)
        for m in resp.locations:
            self._published[(address, key_from_proto(m.key))] = {f.name: int(f.size) for f in m.files}
        return self._published.get((address, key), {}).get(file, 0) >= size

    def _read_from(self, address: str, snap: LocationSnapshot, ranges: list[Range]) -> list[bytes]:
        """The bytes of ``ranges`` from the DIS at ``address``, which must have published at
        least the bytes of each; _NotYetPublished when it serves fewer."""
        bs = snap.block_size
        blocks = [(f, a // bs, (b - 1) // bs) for f, a, b in ranges]
        if address in self._no_ranges:
            parts = [self._read_blocks(address, snap, f, first, last) for f, first, last in blocks]
        else:
            try:
                parts = self._read_ranges_stream(address, snap, blocks)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                self._no_ranges.add(address)
                parts = [self._read_blocks(address, snap, f, first, last) for f, first, last in blocks]
        out = []
        for (file, start, stop), (_, first, _), got in zip(ranges, blocks, parts):
            data = got[0] if len(got) == 1 else b"".join(got)
            off = start - first * bs
            cut = data[off : off + (stop - start)]
            if len(cut) != stop - start:
                raise _NotYetPublished(f"{snap.key}: {file} returned {len(cut)} bytes, expected {stop - start} "
                                       f"(the DIS at {address} publishes less than the snapshot read)")
            out.append(cut)
        return out

    def _read_blocks(self, address: str, snap: LocationSnapshot, file: str, first: int, last: int) -> list[bytes]:
        """Blocks first..last of one file: a ReadBlocks stream, or ReadBlock calls against a DIS
        without it."""
        if address not in self._unary_only:
            try:
                return self._read_blocks_stream(address, snap, file, first, last)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                self._unary_only.add(address)
        return self._read_blocks_unary(address, snap, file, first, last)

    def _read_ranges_stream(self, address: str, snap: LocationSnapshot,
                            blocks: list[tuple[str, int, int]]) -> list[list[bytes]]:
        """Blocks first..last of each (file, first, last), in one ReadRanges stream."""
        req = dis_pb2.ReadRangesRequest(location=key_to_proto(snap.key), ranges=[
            dis_pb2.BlockRange(file=f, first_block=first, block_count=last - first + 1) for f, first, last in blocks])
        out: list[list[bytes]] = [[] for _ in blocks]
        for m in self.stub(address).ReadRanges(req, timeout=self.timeout_s):
            for p in m.parts:
                if p.range >= len(out):
                    raise DisClientError(f"{snap.key}: the DIS at {address} answered range {p.range} of "
                                           f"{len(out)} asked")
                out[p.range].extend(p.blocks)
        return out

    def _read_blocks_stream(self, address: str, snap: LocationSnapshot, file: str, first: int, last: int) -> list[bytes]:
        req = dis_pb2.ReadBlocksRequest(location=key_to_proto(snap.key), file=file, first_block=first,
                                        block_count=last - first + 1)
        return [b for m in self.stub(address).ReadBlocks(req, timeout=self.timeout_s) for b in m.blocks]

    def _read_blocks_unary(self, address: str, snap: LocationSnapshot, file: str, first: int, last: int) -> list[bytes]:
        stub = self.stub(address)
        key = key_to_proto(snap.key)
        parts: list[bytes] = []
        pending: list = []
        idx = first
        try:
            while idx <= last or pending:
                while idx <= last and len(pending) < READ_AHEAD:
                    req = dis_pb2.ReadBlockRequest(location=key, file=file, block_index=idx)
                    pending.append(stub.ReadBlock.future(req, timeout=self.timeout_s))
                    idx += 1
                parts.append(pending.pop(0).result().data)
        except grpc.RpcError:
            for f in pending:
                f.cancel()
            raise
        return parts


def _failed(failures: Sequence[str], retry_s: float) -> str:
    """What a call that no replica answered says: each replica's failure, and how long it tried."""
    waited = f" (tried for {retry_s:g} s)" if retry_s > 0 else ""
    return "; ".join(dict.fromkeys(failures)) + waited


# -- from the column files ----------------------------------------------------------------------
@dataclass(frozen=True)
class CheckpointedLocation:
    """An intraday location as its files on disk show it: the rows of its ``table.size``."""

    key: LocationKey
    path: str
    rows: int
    files: dict[str, int] = field(hash=False)
    bytes_past_checkpoint: int = 0  # column file bytes beyond the checkpoint (all of them without one)
    checkpoint_age_s: float | None = None  # since table.size last changed; None without one
    schema_version: int = 0  # the version its files are written in (0: no checkpoint yet)

    def snapshot(self, db_root: str) -> LocationSnapshot:
        return LocationSnapshot(self.key, self.rows, dict(self.files), DEFAULT_BLOCK_SIZE_BYTES, f"file:{db_root}",
                                self.schema_version)


def table_versions(db_root: str, schema: TableSchema) -> TableSchema:
    """``schema`` with the versions the database stores for its table (``schema.versions`` under
    the table's directory): the newest of them, carrying the rest.  What every reader of column
    files without a DIS presents."""
    try:
        return with_stored_history(db_root, schema)
    except (VersionStoreError, SchemaError) as e:
        raise ColumnFileError(f"{schema.key}: {e}") from None


def checkpointed_locations(db_root: str, schema: TableSchema, wanted: Wanted | None = None,
                           now: float | None = None) -> list[CheckpointedLocation]:
    """Every location of ``schema``'s table under ``<db_root>/Intraday`` whose column partition
    ``wanted(value)`` accepts (all when None), at its checkpoint, with the schema version it is
    written in (the table's versions: ``table_versions``).  Read on the DIS host, whether or not
    the DIS runs: only rows a checkpoint covers are taken, and those never change."""
    now = time.time() if now is None else now
    schema = table_versions(db_root, schema)
    base = os.path.join(db_root, "Intraday", schema.namespace, schema.table)
    out = []
    for ip in subdirs(base):
        for value in subdirs(os.path.join(base, ip)):
            if wanted is not None and not wanted(value):
                continue
            try:
                key = LocationKey(schema.namespace, schema.table, ip, value)
            except InvalidNameError:
                continue
            path = location_path(db_root, key)
            if os.path.isdir(path):
                out.append(_checkpointed(key, path, schema, now))
    return sorted(out, key=lambda l: (l.key.column_partition, l.key.internal_partition))


def record_version(key: LocationKey, rec: CheckpointRecord, schema: TableSchema) -> int:
    """The schema version a checkpoint says its location is written in: its ``schema_version``
    (which must be one of ``schema.versions``, with the fingerprint the record names), or, in a
    record written before versions existed (0), the newest version with the record's
    fingerprint.  ColumnFileError when no version of the table matches."""
    versions = schema.versions
    if rec.schema_version:
        found = versions.get(rec.schema_version)
        if found is None:
            raise ColumnFileError(
                f"location {key} was written in schema version {rec.schema_version} of {schema.key}, which the "
                f"database's versions do not hold (known: {', '.join(str(v) for v in versions)}): check the "
                "schemas directory")
        if found.fingerprint != rec.fingerprint:
            raise ColumnFileError(
                f"location {key} was written for schema {rec.fingerprint} (version {rec.schema_version}), but "
                f"{schema.key} version {rec.schema_version} is {found.fingerprint}: check the schemas directory")
        return rec.schema_version
    matching = [v for v, s in versions.items() if s.fingerprint == rec.fingerprint]
    if not matching:
        raise ColumnFileError(f"location {key} was written for schema {rec.fingerprint}, the table's schema is "
                              f"{schema.fingerprint}: check the schemas directory")
    return max(matching)


def _checkpointed(key: LocationKey, path: str, schema: TableSchema, now: float) -> CheckpointedLocation:
    try:
        rec = read_record(path)
    except CheckpointError as e:
        raise ColumnFileError(f"location {key}: {e}") from None
    actual = _sizes(path)
    if rec is None:
        return CheckpointedLocation(key, path, 0, {}, bytes_past_checkpoint=sum(actual.values()))
    version = record_version(key, rec, schema)
    # a file the record counts as empty may be missing: a power cut after a new location's first
    # record and before anything synced its column files' directory entries (the DIS makes them)
    short = [n for n, size in rec.files.items() if actual.get(n, 0) < size]
    if short:
        raise ColumnFileError(f"location {key}: {', '.join(sorted(short))} shorter than its checkpoint "
                              "(run `dis verify`)")
    past = sum(max(0, actual.get(n, 0) - size) for n, size in rec.files.items())
    age = now - os.stat(os.path.join(path, CHECKPOINT_FILE)).st_mtime
    return CheckpointedLocation(key, path, rec.rows, dict(rec.files), past, age, version)


def _sizes(path: str) -> dict[str, int]:
    out = {}
    for e in os.scandir(path):
        if e.is_file() and (e.name.endswith(".dat") or e.name.endswith(".off")):
            out[e.name] = e.stat().st_size
    return out


class LocalColumnFiles:
    """The column files of a database root, read with ``pread``; files are opened on first use
    and closed by ``close``.

    Snapshots listed by a DIS are served at their published sizes (safe: those bytes never
    change); ``locations`` lists at the checkpoints and needs the tables' schemas (``tables``) to
    check them, each with the versions the database stores for it (``table_versions``); each
    snapshot says its location's version.  ``origin`` names the root in errors the way the user gave it (default: the path)."""

    def __init__(self, db_root: str, tables: Sequence[TableSchema] = (), origin: str | None = None) -> None:
        self.db_root = db_root
        self.origin = origin or f"database root {db_root}"
        self._tables = {(t.namespace, t.table): t for t in tables}
        self._fds: dict[str, int] = {}

    def locations(self, namespace: str, table: str, wanted: Wanted | None = None) -> list[LocationSnapshot]:
        """Locations with checkpointed rows, at their checkpoints."""
        schema = self._tables.get((namespace, table))
        if schema is None:
            raise ColumnFileError(f"no schema for {namespace}.{table} to read its column files with")
        locs = checkpointed_locations(self.db_root, schema, wanted)
        return [l.snapshot(self.db_root) for l in locs if l.rows > 0]

    def schema(self, schema: TableSchema) -> TableSchema:
        """``schema`` as a read of these files presents it: with the versions stored for its
        table (``table_versions``)."""
        return table_versions(self.db_root, schema)

    def path(self, snap: LocationSnapshot, name: str) -> str:
        if not name or os.path.basename(name) != name or name in (".", ".."):
            raise ColumnFileError(f"{snap.key}: refusing column file name {name!r}")
        return os.path.join(location_path(self.db_root, snap.key), name)

    def read_range(self, snap: LocationSnapshot, file: str, start: int, stop: int) -> bytes:
        """Bytes [start, stop) of a column file, at most its size in ``snap``."""
        stop = min(stop, snap.files.get(file, 0))
        if stop <= start:
            return b""
        path = self.path(snap, file)
        fd = self._fds.get(path)
        if fd is None:
            try:
                fd = self._fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as e:
                raise ColumnFileError(
                    f"{self.origin}: cannot open {path}: {e.strerror} (it must be the DIS's database root "
                    "as seen from every reader)") from None
        data = os.pread(fd, stop - start, start)
        if len(data) != stop - start:
            # A file shorter than its published size: not this DIS's root, or the DIS recovered
            # to an earlier checkpoint after the snapshot was taken.
            raise ColumnFileError(
                f"{snap.key}: {path} holds {start + len(data)} bytes, the DIS published {stop}; "
                f"is {self.origin} the root of the DIS at {snap.address}?")
        return data

    def read_ranges(self, snap: LocationSnapshot, ranges: Sequence[Range]) -> list[bytes]:
        """``read_range`` of each range (a ``pread`` costs the same however it is asked for)."""
        return [self.read_range(snap, f, a, b) for f, a, b in ranges]

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:  # noqa: ANN002
        self.close()
