"""The DISes behind a proxy: one feed (upstream Subscribe stream) per table, the sizes the proxy
has published, and the catalogue, status and byte reads forwarded to them.

Why one feed per table: a DIS pays for each Subscribe stream (a thread, a wake-up per flush);
readers of a proxy share its feed, so the DIS sees one stream per table per proxy however many
readers subscribe.  Why the proxy keeps its own published sizes: everything it tells readers
(listings, subscriptions, the sizes reads are checked against) comes from them, so a reader can
never be shown, or read, more than an upstream DIS published, and the sizes of a location only
grow even when the feed moves to another replica or a restarted DIS that is behind (such an
answer is held back until the DIS catches up).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Iterable, Sequence

import grpc
import structlog

from disd.blocks import (
    DOWN_S,
    RETRY_INITIAL_S,
    RETRY_MAX_S,
    DisClientError,
    GrpcBlocks,
    LocationSnapshot,
    Range,
    Subscription,
    explain,
    replica_order,
    restarting,
)
from disd.names import LocationKey
from disd.proxy.follow import FollowedStream
from disd.proxy.lastbyfeed import LastByFeed
from disd.routing import Routing
from disd.rpc.channel import open_channel
from disd.rpc.keys import key_to_proto
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from disd.security import ClientSecurity

log = structlog.get_logger(__name__)

#: Seconds a listing of the upstream tables is reused (wildcard subscriptions re-check it); also
#: how long a last-by feed's refusal is the answer before a reader's call asks the DIS again.
TABLES_TTL_S = 5.0


class UpstreamError(DisClientError):
    """No upstream DIS answers for a table (after ``upstream.retry_s``), or one refuses."""


def snapshot_info(snap: LocationSnapshot) -> dis_pb2.LocationInfo:
    """A snapshot as the LocationInfo a DIS lists: what readers of the proxy are given."""
    return dis_pb2.LocationInfo(
        key=key_to_proto(snap.key), rows=snap.rows, block_size=snap.block_size,
        files=[dis_pb2.ColumnFile(name=n, size=s) for n, s in sorted(snap.files.items())],
        schema_version=snap.schema_version)


class Feed(FollowedStream[LocationSnapshot]):
    """One table's upstream subscription and the proxy's published snapshot of each location.

    Its thread follows one replica of the table's routing entry (``disd.proxy.follow``):
    ListLocations, then Subscribe, publishing every snapshot whose rows are more than the proxy
    published for its location (a new location is published at once).  A new stream starts from
    the state listed again, so no change is missed, and what is not more than published is
    dropped, so no size is repeated."""

    def __init__(self, upstream: "Upstream", namespace: str, table: str) -> None:
        super().__init__(upstream, namespace, table, thread="feed")
        self.snaps: dict[LocationKey, LocationSnapshot] = {}

    # -- what readers see ----------------------------------------------------------------------
    def snapshots(self) -> list[LocationSnapshot]:
        with self._lock:
            return list(self.snaps.values())

    def snapshot(self, key: LocationKey) -> LocationSnapshot | None:
        with self._lock:
            return self.snaps.get(key)

    def publish(self, infos: Iterable[dis_pb2.LocationInfo], address: str) -> list[LocationSnapshot]:
        """Take what ``address`` listed: a snapshot with more rows than published (or of a new
        location) replaces the published one and goes to every listener."""
        changed = []
        with self._lock:
            for m in infos:
                snap = LocationSnapshot.from_msg(m, address)
                if snap.key.namespace != self.namespace or snap.key.table != self.table:
                    continue
                old = self.snaps.get(snap.key)
                if old is not None and snap.rows <= old.rows:
                    continue
                self.snaps[snap.key] = snap
                changed.append(snap)
            listeners = list(self._listeners)
        if changed:
            for f in listeners:
                f(changed)
        return changed

    # -- the upstream stream -------------------------------------------------------------------
    def _follow(self, stub: dis_pb2_grpc.TableDataStub, address: str) -> None:
        self._call = sub = Subscription(stub, dis_pb2.SubscribeRequest(namespace=self.namespace, table=self.table))
        listing = dis_pb2.ListLocationsRequest(namespace=self.namespace, table=self.table)
        self.publish(stub.ListLocations(listing, timeout=self.upstream.timeout_s).locations, address)
        self._connected(address)
        for batch in sub:
            self.publish(batch, address)


class Upstream:
    """The proxy's view of its DISes (``routing`` with ``security``): feeds, tables, reads."""

    def __init__(self, routing: Routing, security: ClientSecurity | None, retry_s: float,
                 timeout_s: float = 30.0, feed_options: tuple[tuple[str, object], ...] = ()) -> None:
        self.routing = routing
        self.security = security
        #: more gRPC options of the feeds' channels: their keepalive (``upstream.keepalive_s``)
        self.feed_options = feed_options
        self.retry_s = retry_s
        self.timeout_s = timeout_s
        self.closed = threading.Event()
        self._feeds: dict[tuple[str, str], Feed] = {}
        self._lastby: dict[tuple[str, str], LastByFeed] = {}
        self._lock = threading.Lock()
        self._tables: list[dis_pb2.TableInfo] = []
        self._tables_at = -1e9
        self._tables_lock = threading.Lock()
        # Readers' threads read upstream concurrently; a GrpcBlocks is used by one thread at a
        # time, so each borrows one from this pool (they share gRPC's subchannels).
        self._pool: list[GrpcBlocks] = []
        self._pool_lock = threading.Lock()

    # -- feeds ---------------------------------------------------------------------------------
    def feed(self, namespace: str, table: str, wait: bool = True) -> Feed:
        """The table's feed, started on first use; with ``wait``, once it has listed the table
        (UpstreamError when no DIS of the table answers within ``retry_s``)."""
        if self.routing.owner(namespace, table) is None:
            raise UpstreamError(f"no DIS instance in the proxy's routing takes {namespace}.{table}")
        with self._lock:
            f = self._feeds.get((namespace, table))
            if f is None:
                f = self._feeds[(namespace, table)] = Feed(self, namespace, table).start()
        if wait and not f.primed.wait(max(self.retry_s, 1.0)):
            raise UpstreamError(f"no upstream DIS of {namespace}.{table} answers"
                                f" (tried for {max(self.retry_s, 1.0):g} s): {f.last_error}")
        return f

    def known(self, namespace: str, table: str) -> bool:
        """Whether an upstream DIS serves the table (its routing entry lists it).  A table with
        a feed is known without asking: reads of it go on while its DISes are away."""
        with self._lock:
            if (namespace, table) in self._feeds:
                return True
        return any(t.namespace == namespace and t.table == table for t in self.tables())

    def matching_feeds(self, namespace: str, table: str) -> list[Feed]:
        """The feeds of every upstream table matching a request's namespace and table (empty:
        all), started and listed."""
        if namespace and table:
            return [self.feed(namespace, table)] if self.known(namespace, table) else []
        names = [(t.namespace, t.table) for t in self.tables()
                 if (not namespace or t.namespace == namespace) and (not table or t.table == table)]
        return [self.feed(ns, t) for ns, t in names]

    def subscriptions(self) -> dict[str, int]:
        """Open upstream Subscribe streams per table (``<Ns>.<Table>``): 1 each while connected."""
        with self._lock:
            feeds = list(self._feeds.values())
        return {f.name: int(f.connected_to is not None) for f in feeds}

    def follow_order(self, name: str, namespace: str, table: str, down: dict[str, float]) -> list[str]:
        """The members of the table's routing entry in the order a feed tries them: the table's
        rendezvous order (``replica_order``), members that failed (``down``: address -> when)
        in the last DOWN_S seconds last."""
        addresses = [r.address for r in self.routing.replicas(namespace, table)]
        now = time.monotonic()
        return sorted(replica_order(name, addresses), key=lambda a: now - down.get(a, -1e9) < DOWN_S)

    # -- last-by feeds (disd.proxy.lastbyfeed) --------------------------------------------------
    def lastby_feed(self, namespace: str, table: str, wait: bool = True) -> LastByFeed:
        """The table's last-by feed, started on first use (and again when its refusal is older
        than TABLES_TTL_S: the DIS may have been restarted with last-by keys); with ``wait``, once
        a DIS answered or refused (UpstreamError when none answers within ``retry_s``)."""
        if self.routing.owner(namespace, table) is None:
            raise UpstreamError(f"no DIS instance in the proxy's routing takes {namespace}.{table}")
        with self._lock:
            f = self._lastby.get((namespace, table))
            if f is None or f.refused is not None and time.monotonic() - f.refused_at > TABLES_TTL_S:
                f = self._lastby[(namespace, table)] = LastByFeed(self, namespace, table).start()
        if wait and not f.primed.wait(max(self.retry_s, 1.0)):
            raise UpstreamError(f"no upstream DIS of {namespace}.{table} answers for its last-by states"
                                f" (tried for {max(self.retry_s, 1.0):g} s): {f.last_error}")
        return f

    def lastby_subscriptions(self) -> dict[str, int]:
        """Open upstream SubscribeLastBy streams per table: 1 each while connected."""
        with self._lock:
            feeds = [f for f in self._lastby.values() if f.refused is None]
        return {f.name: int(f.connected_to is not None) for f in feeds}

    # -- catalogue and status -------------------------------------------------------------------
    def tables(self, refresh: bool = False) -> list[dis_pb2.TableInfo]:
        """Every table of every routing entry, as a replica of the entry that answers lists it
        (reused for TABLES_TTL_S)."""
        with self._tables_lock:
            if not refresh and time.monotonic() - self._tables_at < TABLES_TTL_S:
                return self._tables
            # With an earlier answer at hand, each DIS is asked once: a refresh while the DISes
            # are away must not hold every reader for retry_s (the earlier answer is served).
            retry = not self._tables
            out = []
            try:
                for inst in self.routing.instances:
                    reply = self._any([r.address for r in inst.members], "ListTables", dis_pb2.ListTablesRequest(),
                                      retry)
                    out += [t for t in reply.tables if self.routing.owner(t.namespace, t.table) == inst]
            except UpstreamError as e:
                if retry:
                    raise
                log.warning("upstream tables not listed, serving the last listing", error=str(e))
                self._tables_at = time.monotonic()
                return self._tables
            self._tables, self._tables_at = out, time.monotonic()
            return out

    def status(self, request: dis_pb2.StatusRequest) -> list[dis_pb2.StatusResponse]:
        """Status of the entries that own the matching tables: one replica of each that answers."""
        entries = []
        for inst in self.routing.instances:
            if request.namespace and request.table and not inst.owns(request.namespace, request.table):
                continue
            entries.append(inst)
        return [self._any([r.address for r in inst.members], "Status", request) for inst in entries]

    def _any(self, addresses: list[str], method: str, request, retry: bool = True):  # noqa: ANN001, ANN202
        """``method(request)`` at the first of ``addresses`` that answers, each retried while
        restarting for ``retry_s`` (with ``retry``; else asked once)."""
        failures = []
        for address in addresses:
            try:
                return self._call(address, method, request, retry)
            except DisClientError as e:
                failures.append(str(e))
        raise UpstreamError("; ".join(failures))

    def _call(self, address: str, method: str, request, retry: bool = True):  # noqa: ANN001, ANN202
        """One unary call on a fresh channel (a channel that saw its DIS go away may sit in
        gRPC's reconnect backoff far longer than a restart), again while the DIS restarts."""
        deadline = time.monotonic() + (self.retry_s if retry else 0.0)
        delay = RETRY_INITIAL_S
        while True:
            channel = open_channel(address, self.security)
            try:
                return getattr(dis_pb2_grpc.TableDataStub(channel), method)(request, timeout=self.timeout_s)
            except grpc.RpcError as e:
                if not restarting(e) or time.monotonic() >= deadline:
                    raise explain(e, address) from None
            finally:
                channel.close()
            time.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)

    # -- bytes ---------------------------------------------------------------------------------
    def borrow(self) -> "_Borrowed":
        return _Borrowed(self)

    def read_range(self, snap: LocationSnapshot, file: str, start: int, stop: int) -> bytes:
        """Bytes [start, stop) of a column file below the proxy's published ``snap``, from the
        replica that listed it or another of its set that published them (GrpcBlocks: retried
        while the DIS restarts and has not yet republished them, for ``retry_s``)."""
        with self.borrow() as blocks:
            return blocks.read_range(snap, file, start, stop)

    def read_ranges(self, snap: LocationSnapshot, ranges: Sequence[Range]) -> list[bytes]:
        """``read_range`` of each range, in one upstream call."""
        with self.borrow() as blocks:
            return blocks.read_ranges(snap, ranges)

    def close(self) -> None:
        self.closed.set()
        with self._lock:
            feeds: list[FollowedStream[Any]] = [*self._feeds.values(), *self._lastby.values()]
        for f in feeds:
            f.stop()
        with self._pool_lock:
            for b in self._pool:
                b.close()
            self._pool.clear()


class _Borrowed:
    """A GrpcBlocks of the pool for one ``with`` block."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.blocks: GrpcBlocks | None = None

    def __enter__(self) -> GrpcBlocks:
        u = self.upstream
        with u._pool_lock:  # noqa: SLF001 - the lease of Upstream's channel pool, its companion
            self.blocks = u._pool.pop() if u._pool else None  # noqa: SLF001 - the lease of Upstream's channel pool, its companion
        if self.blocks is None:
            self.blocks = GrpcBlocks(u.routing, u.security, u.timeout_s, u.retry_s)
        return self.blocks

    def __exit__(self, *exc) -> None:  # noqa: ANN002
        u, blocks = self.upstream, self.blocks
        assert blocks is not None  # taken by ``__enter__``
        with u._pool_lock:  # noqa: SLF001 - the lease of Upstream's channel pool, its companion
            if not u.closed.is_set():
                u._pool.append(blocks)  # noqa: SLF001 - the lease of Upstream's channel pool, its companion
                return
        blocks.close()
