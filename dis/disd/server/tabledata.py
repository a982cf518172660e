"""The TableData service: what readers (disd.client, dis ls, the Spark source) call.

Listing and subscription report each location's published row count with the sizes of its
column files at that count; ReadBlock returns raw bytes of published rows only, so a reader that
plans a scan at one size reads exactly those rows however far ingestion has moved on.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Hashable, Iterator, Sequence, TypeVar

import grpc

from disd.names import LocationKey
from disd.rpc.keys import key_to_proto
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from disd.server import lastby, metrics
from disd.server.blockcache import BlockCache
from disd.server.ingest import RequestRefused, location_key
from disd.server.ingestsessions import SessionRegistry
from disd.server.listing import ListingRefused, versions_of_messages
from disd.server.listing import messages as projection_messages
from disd.server.listing import projections as listing_projections
from disd.storage import Location, StorageEngine

if TYPE_CHECKING:
    from disd.kafka.consumer import PartitionState

T = TypeVar("T")

BLOCKS_MESSAGE_BYTES = 1 << 20  # blocks per ReadBlocks or ReadRanges message: gRPC's per-message cost is paid per MiB
#: locations per SubscribeBatches message (about 250 KB of Market.Trade's, far under gRPC's 4 MiB)
BATCH_LOCATIONS = 1000


def batches(items: Sequence[T], size: int | None = None) -> Iterator[Sequence[T]]:
    """``items`` in slices of at most ``size`` (default ``BATCH_LOCATIONS``)."""
    size = size or BATCH_LOCATIONS
    for i in range(0, len(items), size):
        yield items[i:i + size]


def listing(items: Sequence[T]) -> Iterator[tuple[Sequence[T], bool]]:
    """A subscription's first listing as ``(batch, listed)``: ``items`` in batches, the last
    one ``listed``; one empty batch when there are none, so the listing always ends."""
    parts: list[Sequence[T]] = list(batches(items)) or [[]]
    for i, part in enumerate(parts):
        yield part, i == len(parts) - 1


def location_info(loc: Location, block_size: int) -> dis_pb2.LocationInfo:
    rows = loc.published_rows  # read before the files: files then cover at least these rows
    files = loc.column_files()
    return dis_pb2.LocationInfo(
        key=key_to_proto(loc.key), rows=rows, block_size=block_size,
        files=[dis_pb2.ColumnFile(name=n, size=sz) for n, sz in sorted(files.items())],
        schema_version=loc.schema_version,  # its files are in this version; readers project to the newest
    )


def ranges_messages(wanted: Sequence[tuple[dis_pb2.BlockRange, int]], block_size: int,
                    read: Callable[[str, int, int, int], list[bytes]]) -> Iterator[dis_pb2.ReadRangesResponse]:
    """ReadRanges' answer (a DIS's and a proxy's): for each (range, its file's published size),
    its blocks below that size in order, packed about BLOCKS_MESSAGE_BYTES of blocks a message.
    ``read(file, first, n, size)`` returns ``n`` blocks of ``file`` from block ``first``."""
    per_message = max(1, BLOCKS_MESSAGE_BYTES // block_size)
    parts: list[dis_pb2.RangeBlocks] = []
    held = 0  # blocks in ``parts``
    for index, (r, size) in enumerate(wanted):
        end = min(r.first_block + r.block_count, -(-size // block_size))
        first = r.first_block
        while True:
            take = min(end - first, per_message - held) if first < end else 0
            blocks = read(r.file, first, take, size) if take else []
            parts.append(dis_pb2.RangeBlocks(range=index, blocks=blocks, file_size=size))
            held += take
            first += take
            if held >= per_message:
                yield dis_pb2.ReadRangesResponse(parts=parts)
                parts, held = [], 0
            if first >= end:
                break
    if parts:
        yield dis_pb2.ReadRangesResponse(parts=parts)


def readable_location(engine: StorageEngine, key: LocationKey) -> tuple[Location | None, str]:
    """The open location a read names (TableData's, the block endpoint's), or (None, why not):
    an unknown table or location, as NOT_FOUND (404) words it."""
    if engine.schemas.get(key.namespace, key.table) is None:
        return None, f"unknown table {key.table_key}"
    try:
        loc = engine.location(key, create=False)
    except (KeyError, LookupError, FileNotFoundError):
        loc = None
    return (None, f"no location {key}") if loc is None else (loc, "")


class Updates:
    """A subscriber's pending updates, coalesced per location: bounded by the number of
    locations however slowly the subscriber reads.  An update is anything with a hashable
    ``key``: a ``Location`` here, a proxy's snapshot in ``disd.proxy``."""

    def __init__(self) -> None:
        self.pending: dict[Hashable, Any] = {}
        self.cond = threading.Condition()

    def push(self, loc: Any) -> None:
        with self.cond:
            self.pending[loc.key] = loc
            self.cond.notify()

    def take(self, timeout: float) -> list[Any]:
        with self.cond:
            if not self.pending:
                self.cond.wait(timeout)
            out = list(self.pending.values())
            self.pending.clear()
            return out


#: the read calls that name a location (and the column files of it they read)
_ReadRequest = dis_pb2.ReadBlockRequest | dis_pb2.ReadBlocksRequest | dis_pb2.ReadRangesRequest


class TableDataService(dis_pb2_grpc.TableDataServicer):
    def __init__(self, engine: StorageEngine, sessions: SessionRegistry, cache: BlockCache,
                 block_size: int, routed: Callable[[str, str], bool], started: float) -> None:
        self.engine = engine
        self.sessions = sessions
        #: LocationKey -> the Kafka partition feeding it, or None (``disd.kafka``, set by dis serve)
        self.kafka_status: Callable[[LocationKey], PartitionState | None] | None = None
        self.cache = cache
        self.block_size = block_size
        self.routed = routed
        self.started = started
        self.subscribers = 0  # open Subscribe streams (the dis_subscribers gauge)
        self._subscribers_lock = threading.Lock()

    def _matching(self, namespace: str, table: str) -> Iterator[Location]:
        for loc in self.engine.locations():
            if namespace and loc.key.namespace != namespace:
                continue
            if table and loc.key.table != table:
                continue
            yield loc

    def ListTables(self, request: dis_pb2.ListTablesRequest,  # noqa: N802, ARG002 - gRPC's servicer signature
                   context: grpc.ServicerContext) -> dis_pb2.ListTablesResponse:  # noqa: ARG002 - gRPC's servicer signature
        return dis_pb2.ListTablesResponse(
            tables=[
                dis_pb2.TableInfo(namespace=s.namespace, table=s.table, partition_column=s.partition_column,
                                  schema_json=s.to_json(), fingerprint=s.fingerprint,
                                  versions_json=s.history_json())
                for s in self.engine.schemas if self.routed(s.namespace, s.table)
            ]
        )

    def ListLocations(self, request: dis_pb2.ListLocationsRequest,  # noqa: N802
                      context: grpc.ServicerContext) -> dis_pb2.ListLocationsResponse:
        infos = [location_info(loc, self.block_size) for loc in self._matching(request.namespace, request.table)]
        try:
            found = listing_projections(self.engine.schemas.get, versions_of_messages(infos), request.namespace,
                                        request.table, request.version)
        except ListingRefused as r:
            context.abort(r.code, str(r))
        return dis_pb2.ListLocationsResponse(locations=infos, projections=projection_messages(found))

    def Subscribe(self, request: dis_pb2.SubscribeRequest,  # noqa: N802
                  context: grpc.ServicerContext) -> Iterator[dis_pb2.LocationInfo]:
        for locs, _listed in self._subscription(request, context):
            for loc in locs:
                yield location_info(loc, self.block_size)

    def SubscribeBatches(self, request: dis_pb2.SubscribeRequest,  # noqa: N802
                         context: grpc.ServicerContext) -> Iterator[dis_pb2.LocationBatch]:
        for locs, listed in self._subscription(request, context):
            yield dis_pb2.LocationBatch(locations=[location_info(loc, self.block_size) for loc in locs], listed=listed)

    def _subscription(self, request: dis_pb2.SubscribeRequest,
                      context: grpc.ServicerContext) -> Iterator[tuple[Sequence[Location], bool]]:
        """``(locations, listed)``: every matching location now, in batches, the last (possibly
        empty) one ``listed``; then each set of changes gathered while the last was sent."""
        updates = Updates()

        def on_change(loc: Location, _rows: object = None) -> None:
            if (not request.namespace or loc.key.namespace == request.namespace) and (
                not request.table or loc.key.table == request.table
            ):
                updates.push(loc)

        unsubscribe = self.engine.subscribe(on_change)
        with self._subscribers_lock:
            self.subscribers += 1
        try:
            yield from listing(list(self._matching(request.namespace, request.table)))
            while context.is_active():
                for locs in batches(updates.take(timeout=1.0)):
                    yield locs, False
        finally:
            unsubscribe()
            with self._subscribers_lock:
                self.subscribers -= 1

    def _location(self, request: _ReadRequest, context: grpc.ServicerContext) -> tuple[LocationKey, Location]:
        """The key and location a read names, or abort."""
        try:
            key = location_key(request.location)
        except RequestRefused as r:
            context.abort(r.code, r.details)
        loc, why = readable_location(self.engine, key)
        if loc is None:
            context.abort(grpc.StatusCode.NOT_FOUND, why)
        return key, loc

    @staticmethod
    def _file_size(key: LocationKey, sizes: dict[str, int], file: str, context: grpc.ServicerContext) -> int:
        """The published size of a column file a read names, or abort."""
        size = sizes.get(file)
        if size is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"location {key} has no column file {file!r}")
        return size

    def _column_file(self, request: dis_pb2.ReadBlockRequest | dis_pb2.ReadBlocksRequest,
                     context: grpc.ServicerContext) -> tuple[LocationKey, Location, int]:
        """The location and published size of the column file a read names, or abort."""
        key, loc = self._location(request, context)
        return key, loc, self._file_size(key, loc.column_files(), request.file, context)

    def _block(self, key: LocationKey, loc: Location, file: str, index: int, size: int) -> bytes:
        """Block ``index`` of a column file cut at its published ``size`` (as the call read it),
        through ``Location.read_range``; full blocks are cached (their bytes never change once
        published)."""
        metrics.BLOCK_READS.inc()
        bs = self.block_size
        start = index * bs
        if start >= size:
            return b""
        cache_key = (key, file, index)
        full = start + bs <= size
        if full:
            data = self.cache.get(cache_key)
            if data is not None:
                metrics.BLOCK_CACHE_HITS.inc()
                return data
        data = loc.read_range(file, start, min(start + bs, size))
        if full and len(data) == bs:
            self.cache.put(cache_key, data)
        return data

    def ReadBlock(self, request: dis_pb2.ReadBlockRequest,  # noqa: N802
                  context: grpc.ServicerContext) -> dis_pb2.ReadBlockResponse:
        key, loc, size = self._column_file(request, context)
        return dis_pb2.ReadBlockResponse(data=self._block(key, loc, request.file, request.block_index, size),
                                         file_size=size)

    def ReadBlocks(self, request: dis_pb2.ReadBlocksRequest,  # noqa: N802
                   context: grpc.ServicerContext) -> Iterator[dis_pb2.ReadBlocksResponse]:
        key, loc, size = self._column_file(request, context)
        end = min(request.first_block + request.block_count, -(-size // self.block_size))
        per_message = max(1, BLOCKS_MESSAGE_BYTES // self.block_size)
        for first in range(request.first_block, end, per_message):
            blocks = [self._block(key, loc, request.file, i, size) for i in range(first, min(end, first + per_message))]
            yield dis_pb2.ReadBlocksResponse(blocks=blocks, file_size=size)

    def ReadRanges(self, request: dis_pb2.ReadRangesRequest,  # noqa: N802
                   context: grpc.ServicerContext) -> Iterator[dis_pb2.ReadRangesResponse]:
        key, loc = self._location(request, context)
        sizes = loc.column_files()  # once: every range is read below the sizes of one moment
        wanted = [(r, self._file_size(key, sizes, r.file, context)) for r in request.ranges]
        yield from ranges_messages(wanted, self.block_size, lambda file, first, n, size: [
            self._block(key, loc, file, i, size) for i in range(first, first + n)])

    def Status(self, request: dis_pb2.StatusRequest,  # noqa: N802
               context: grpc.ServicerContext) -> dis_pb2.StatusResponse:  # noqa: ARG002 - gRPC's servicer signature
        from disd import __version__
        from disd.server.status import disk_usage, location_status

        now = time.time()
        out = [
            location_status(loc, key_to_proto(loc.key), self.sessions.get(loc.key), now, request.durable_checkpoint,
                            self.sessions.problem(loc.key),
                            self.kafka_status(loc.key) if self.kafka_status is not None else None,
                            self.engine.flush_age(loc, now))
            for loc in self._matching(request.namespace, request.table)
            if not request.internal_partition or loc.key.internal_partition == request.internal_partition
        ]
        free, total = disk_usage(self.engine.db_root)
        return dis_pb2.StatusResponse(version=__version__, uptime_s=now - self.started, locations=out,
                                      disk_free_bytes=free, disk_total_bytes=total)

    def LastBy(self, request: dis_pb2.LastByRequest,  # noqa: N802
               context: grpc.ServicerContext) -> dis_pb2.LastByResponse:
        return lastby.last_by(self.engine, request, context)

    def SubscribeLastBy(self, request: dis_pb2.LastByRequest,  # noqa: N802
                        context: grpc.ServicerContext) -> Iterator[dis_pb2.LastByState]:
        yield from lastby.subscribe_last_by(self.engine, request, context, Updates(), self.engine.subscribe)
