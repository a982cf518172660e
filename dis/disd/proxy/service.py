"""What readers of a proxy call: the TableData service and the block endpoint's backend.

Everything a reader is told comes from the feeds' published snapshots (``disd.proxy.upstream``)
and every byte from the shared cache (``disd.proxy.cache``); last-by states from the last-by
feeds (``disd.proxy.lastby``): listings, subscriptions and the
sizes reads are checked against are the same facts, so a reader plans and reads exactly what an
upstream DIS published, as it would on the DIS itself.  Errors use the DIS's status codes.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Callable, Iterator, Sequence

import grpc

from disd.blocks import DisClientError, LocationSnapshot
from disd.names import LocationKey
from disd.proxy import lastby
from disd.proxy.cache import CachedBlocks
from disd.proxy.upstream import Upstream, snapshot_info
from disd.rpc.keys import key_from_proto
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from disd.schema import TableSchema
from disd.server.blockhttp import HttpRefused, listing_refused
from disd.server.listing import ListingRefused, messages, missing, projections, versions_of_json, versions_of_messages
from disd.server.tabledata import BLOCKS_MESSAGE_BYTES, Updates, batches, listing, ranges_messages

#: Seconds between a wildcard subscription's looks for tables that appeared upstream.
NEW_TABLES_S = 5.0


class ProxyTableData(dis_pb2_grpc.TableDataServicer):
    def __init__(self, upstream: Upstream, blocks: CachedBlocks, started: float) -> None:
        self.upstream = upstream
        self.blocks = blocks
        self.started = started
        self.subscribers = 0  # open reader Subscribe streams (dis_proxy_subscribers)
        self.lastby_subscribers = 0  # open reader SubscribeLastBy streams (dis_proxy_lastby_subscribers)
        self._lock = threading.Lock()

    def _upstream(self, context, call: Callable):  # noqa: ANN202
        """``call()``, an upstream failure turned into the status a DIS's own would have."""
        try:
            return call()
        except DisClientError as e:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"proxy: {e}")

    def ListTables(self, request, context):  # noqa: N802, ARG002 - gRPC's servicer signature
        return dis_pb2.ListTablesResponse(tables=self._upstream(context, self.upstream.tables))

    def ListLocations(self, request, context):  # noqa: N802
        feeds = self._upstream(context, lambda: self.upstream.matching_feeds(request.namespace, request.table))
        infos = [snapshot_info(s) for f in feeds for s in sorted_snaps(f)]
        try:
            found = self._upstream(context, lambda: upstream_projections(
                self.upstream, versions_of_messages(infos), request.namespace, request.table, request.version))
        except ListingRefused as r:
            context.abort(r.code, str(r))
        return dis_pb2.ListLocationsResponse(locations=infos, projections=messages(found))

    def Subscribe(self, request, context):  # noqa: N802
        for snaps, _listed in self._subscription(request, context):
            for snap in snaps:
                yield snapshot_info(snap)

    def SubscribeBatches(self, request, context):  # noqa: N802
        for snaps, listed in self._subscription(request, context):
            yield dis_pb2.LocationBatch(locations=[snapshot_info(s) for s in snaps], listed=listed)

    def _subscription(self, request, context) -> Iterator[tuple[Sequence[LocationSnapshot], bool]]:
        """``(snapshots, listed)`` as a DIS's subscription gives them: every published snapshot of
        the matching tables now, in batches, the last (possibly empty) one ``listed``; then each
        set of changes.  Each location's size is given once, increasing."""
        ns, table = request.namespace, request.table
        if ns and table and not self._upstream(context, lambda: self.upstream.known(ns, table)):
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown table {ns}.{table} (no upstream DIS serves it)")
        updates = Updates()
        sent: dict[LocationKey, int] = {}
        unlisten: dict[str, Callable[[], None]] = {}

        def push(snaps: list[LocationSnapshot]) -> None:
            for s in snaps:
                updates.push(s)

        def follow(feeds):  # noqa: ANN202 - listen first, then take the current state
            out = []
            for f in feeds:
                if f.name not in unlisten:
                    unlisten[f.name] = f.listen(push)
                    out += sorted_snaps(f)
            return out

        with self._lock:
            self.subscribers += 1
        try:
            pending = follow(self._upstream(context, lambda: self.upstream.matching_feeds(ns, table)))
            looked = time.monotonic()
            first = True
            while context.is_active():
                fresh = []
                for snap in pending:
                    if snap.rows > sent.get(snap.key, -1):  # each size once, increasing
                        sent[snap.key] = snap.rows
                        fresh.append(snap)
                if first:
                    yield from listing(fresh)
                    first = False
                else:
                    yield from ((part, False) for part in batches(fresh))
                pending = updates.take(timeout=1.0)
                if not (ns and table) and time.monotonic() - looked > NEW_TABLES_S:
                    looked = time.monotonic()
                    try:
                        pending += follow(self.upstream.matching_feeds(ns, table))
                    except DisClientError:
                        pass  # the DISes are away: keep following the tables known
        finally:
            for remove in unlisten.values():
                remove()
            with self._lock:
                self.subscribers -= 1

    def _snapshot(self, request, context) -> LocationSnapshot:
        """The proxy's published snapshot of the location a read names; NOT_FOUND as a DIS
        says it."""
        try:
            key = key_from_proto(request.location)
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        snap, why = self._upstream(context, lambda: published_snapshot(self.upstream, key))
        if snap is None:
            context.abort(grpc.StatusCode.NOT_FOUND, why)
        return snap

    def _published(self, request, context) -> tuple[LocationSnapshot, int]:
        """The proxy's published snapshot of the location a read names, and the file's size in
        it; NOT_FOUND as a DIS says it."""
        snap = self._snapshot(request, context)
        return snap, self._file_size(snap, request.file, context)

    @staticmethod
    def _file_size(snap: LocationSnapshot, file: str, context: grpc.ServicerContext) -> int:
        size = file_size(snap, file)
        if isinstance(size, str):
            context.abort(grpc.StatusCode.NOT_FOUND, size)
        return size

    def ReadBlock(self, request, context):  # noqa: N802
        snap, size = self._published(request, context)
        i = request.block_index
        data = self._upstream(context, lambda: self.blocks.blocks(snap, request.file, i, i))
        return dis_pb2.ReadBlockResponse(data=data[0] if data else b"", file_size=size)

    def ReadBlocks(self, request, context):  # noqa: N802
        snap, size = self._published(request, context)
        bs = snap.block_size
        end = min(request.first_block + request.block_count, -(-size // bs))
        per_message = max(1, BLOCKS_MESSAGE_BYTES // bs)
        window = max(per_message, 64)
        for a in range(request.first_block, end, window):
            b = min(end, a + window)
            blocks = self._upstream(context, lambda: self.blocks.blocks(snap, request.file, a, b - 1))
            for j in range(0, len(blocks), per_message):
                yield dis_pb2.ReadBlocksResponse(blocks=blocks[j : j + per_message], file_size=size)

    def ReadRanges(self, request, context):  # noqa: N802
        snap = self._snapshot(request, context)
        wanted = [(r, self._file_size(snap, r.file, context)) for r in request.ranges]
        yield from ranges_messages(wanted, snap.block_size, lambda file, first, n, size: self._upstream(
            context, lambda: self.blocks.blocks(snap, file, first, first + n - 1)))

    def LastBy(self, request, context):  # noqa: N802
        return lastby.last_by(self.upstream, request, context)

    def SubscribeLastBy(self, request, context):  # noqa: N802
        with self._lock:
            self.lastby_subscribers += 1
        try:
            yield from lastby.subscribe_last_by(self.upstream, request, context)
        finally:
            with self._lock:
                self.lastby_subscribers -= 1

    def Status(self, request, context):  # noqa: N802
        """The upstream owners' Status of the matching locations, with the proxy's version and
        uptime (a proxy has no disk of its own: disk fields are 0)."""
        from disd import __version__

        replies = self._upstream(context, lambda: self.upstream.status(request))
        return dis_pb2.StatusResponse(version=__version__, uptime_s=time.time() - self.started,
                                      locations=[loc for r in replies for loc in r.locations])


@functools.lru_cache(maxsize=256)
def _schema(versions_json: str, schema_json: str) -> TableSchema:
    """A table's newest schema with its other versions, as its DISes list it (``TableInfo``)."""
    if versions_json:
        return TableSchema.from_history_json(versions_json, "the upstream DIS's versions_json")
    return TableSchema.from_json(schema_json, "the upstream DIS's schema_json")


def upstream_projections(upstream: Upstream, listed: list[tuple[str, str, int]], namespace: str, table: str,
                         version: int) -> list[dict]:
    """``disd.server.listing.projections`` of a proxy's listing, from the versions its DISes
    list (``ListTables``, reused for a few seconds): when a listed location, or the version a
    reader presents, is of a version that listing predates (a DIS restarted with a newer
    schema), the tables are listed again first.  So a proxy's listing carries what its DISes'
    would, resolved by the same rules."""
    found: list[dict] = []
    for refresh in (False, True):
        infos = {(t.namespace, t.table): t for t in upstream.tables(refresh=refresh)}

        def schema_of(ns: str, tb: str) -> TableSchema | None:
            info = infos.get((ns, tb))
            return None if info is None else _schema(info.versions_json, info.schema_json)

        try:
            found = projections(schema_of, listed, namespace, table, version)
        except ListingRefused:
            if refresh:
                raise
            continue
        if not missing(found, listed):
            break
    return found


def sorted_snaps(feed) -> list[LocationSnapshot]:
    return sorted(feed.snapshots(), key=lambda s: (s.key.column_partition, s.key.internal_partition))


def published_snapshot(upstream: Upstream, key: LocationKey) -> tuple[LocationSnapshot | None, str]:
    """(snapshot, "") or (None, why not) for an unknown table or location (as a DIS words it)."""
    if not upstream.known(key.namespace, key.table):
        return None, f"unknown table {key.table_key}"
    snap = upstream.feed(key.namespace, key.table).snapshot(key)
    if snap is None:
        return None, f"no location {key}"
    return snap, ""


def published(upstream: Upstream, key: LocationKey, file: str) -> tuple[LocationSnapshot | None, int | str]:
    """(snapshot, size of ``file`` in it), or (None, why not) for an unknown table, location or
    file (as a DIS words it)."""
    snap, why = published_snapshot(upstream, key)
    if snap is None:
        return None, why
    size = file_size(snap, file)
    return (None, size) if isinstance(size, str) else (snap, size)


def file_size(snap: LocationSnapshot, file: str) -> int | str:
    """The size of ``file`` in ``snap``, or why not (as a DIS words it)."""
    size = snap.files.get(file)
    return f"location {snap.key} has no column file {file!r}" if size is None else size


class ProxyBlockBackend:
    """The block endpoint (``disd.server.blockhttp``) of a proxy: the same JSON and byte ranges
    as a DIS's, from the published snapshots and the cache."""

    def __init__(self, upstream: Upstream, blocks: CachedBlocks) -> None:
        self.upstream = upstream
        self.blocks = blocks

    def _call(self, call: Callable):  # noqa: ANN202
        try:
            return call()
        except DisClientError as e:
            raise HttpRefused(503, f"proxy: {e}") from None

    def tables(self) -> dict:
        infos = self._call(self.upstream.tables)
        return {"tables": [{"namespace": t.namespace, "table": t.table, "partition_column": t.partition_column,
                            "schema_json": t.schema_json, "fingerprint": t.fingerprint,
                            "versions_json": t.versions_json} for t in infos]}

    def locations(self, namespace: str, table: str, version: int = 0) -> dict:
        feeds = self._call(lambda: self.upstream.matching_feeds(namespace, table))
        out, block_size = [], 0
        for f in feeds:
            for s in sorted_snaps(f):
                k = s.key
                block_size = block_size or s.block_size
                out.append({"namespace": k.namespace, "table": k.table, "internal_partition": k.internal_partition,
                            "column_partition": k.column_partition, "rows": s.rows, "files": dict(s.files),
                            "schema_version": s.schema_version})
        try:
            found = self._call(lambda: upstream_projections(self.upstream, versions_of_json(out), namespace, table,
                                                            version))
        except ListingRefused as r:
            raise listing_refused(r) from None
        return {"block_size": block_size or 65536, "locations": out, "projections": found}

    def open_range(self, key: LocationKey, name: str, start: int, stop: int) -> Callable[[int, int], bytes]:
        snap, size = self._call(lambda: published(self.upstream, key, name))
        if snap is None:
            raise HttpRefused(404, size)
        if stop > size:
            raise HttpRefused(416, f"{key} {name}: bytes [{start}, {stop}) asked, {size} published")
        bs = snap.block_size

        def chunk(a: int, b: int) -> bytes:
            if b <= a:
                return b""
            blocks = self._call(lambda: self.blocks.blocks(snap, name, a // bs, (b - 1) // bs))
            data = b"".join(blocks)[a - (a // bs) * bs:][: b - a]
            if len(data) != b - a:
                raise HttpRefused(503, f"{key} {name}: upstream served {len(data)} of bytes [{a}, {b})")
            return data

        return chunk
