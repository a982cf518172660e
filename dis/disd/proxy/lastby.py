"""The last-by calls of the proxy's TableData service (docs/proxy.md, "Last-by"): ``LastBy`` and
``SubscribeLastBy`` answered from the last-by feeds' published states (``disd.proxy.lastbyfeed``)
as a DIS answers them (``disd.server.lastby``): the same messages, refusals and status codes."""

from __future__ import annotations

import time
from typing import Callable, Iterator

import grpc

from disd.blocks import DisClientError
from disd.names import LocationKey
from disd.proxy.lastbyfeed import LastByFeed, LocationLastBy
from disd.proxy.upstream import Upstream
from disd.rpc.keys import key_from_proto
from disd.rpc.v1 import dis_pb2
from disd.server.tabledata import Updates

#: Seconds between a subscription's looks for tables that appeared upstream (no table named).
NEW_TABLES_S = 5.0


class _Request:
    """What a ``LastByRequest`` names: a location (``key``), or a table, a namespace, or all."""

    def __init__(self, request: dis_pb2.LastByRequest, context: grpc.ServicerContext) -> None:
        self.key: LocationKey | None = None
        if request.HasField("location"):
            try:
                self.key = key_from_proto(request.location)
            except ValueError as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            self.namespace, self.table = self.key.namespace, self.key.table
        else:
            self.namespace, self.table = request.namespace, request.table

    def wants(self, key: LocationKey) -> bool:
        if self.key is not None:
            return key == self.key
        return (not self.namespace or key.namespace == self.namespace) and (not self.table or key.table == self.table)

    def feeds(self, upstream: Upstream, context: grpc.ServicerContext) -> list[LastByFeed]:
        """The last-by feeds of the tables asked for, each answered by a DIS.  A named table that
        no DIS serves is NOT_FOUND, one its DIS refuses is the DIS's refusal; asked for many
        tables, those without last-by states are left out, as a DIS leaves them out.  No DIS
        answering is UNAVAILABLE, as for every call of the proxy."""
        try:
            if self.namespace and self.table:
                if not upstream.known(self.namespace, self.table):
                    context.abort(grpc.StatusCode.NOT_FOUND,
                                  f"unknown table {self.namespace}.{self.table} (no upstream DIS serves it)")
                feed = upstream.lastby_feed(self.namespace, self.table)
                if feed.refused is not None:
                    context.abort(*feed.refused)
                return [feed]
            return self.table_feeds(upstream)
        except DisClientError as e:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"proxy: {e}")

    def table_feeds(self, upstream: Upstream) -> list[LastByFeed]:
        """The feeds of every upstream table matching a request that names no single table (those
        refused left out); DisClientError when the tables cannot be listed."""
        names = [(t.namespace, t.table) for t in upstream.tables()
                 if (not self.namespace or t.namespace == self.namespace) and (not self.table or t.table == self.table)]
        return [f for f in (upstream.lastby_feed(ns, t) for ns, t in names) if f.refused is None]

    def locations(self, feeds: list[LastByFeed], context: grpc.ServicerContext) -> list[LocationLastBy]:
        """The published locations asked for; NOT_FOUND, as a DIS says it, for a location the
        proxy has no state of."""
        out = [loc for f in feeds for loc in f.published() if self.wants(loc.key)]
        if self.key is not None and not out:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no location {self.key} with a last-by state")
        return out


def last_by(upstream: Upstream, request: dis_pb2.LastByRequest, context) -> dis_pb2.LastByResponse:  # noqa: ANN001
    asked = _Request(request, context)
    return dis_pb2.LastByResponse(locations=[loc.full() for loc in asked.locations(asked.feeds(upstream, context),
                                                                                     context)])


def subscribe_last_by(upstream: Upstream, request: dis_pb2.LastByRequest,
                      context: grpc.ServicerContext) -> Iterator[dis_pb2.LastByState]:
    """Every matching location's whole published state, then per publish of the proxy the
    latest rows of the keys that changed (the whole state again when the changes were not all
    kept).  Open while the DISes are away: it goes on when the feeds publish again.  A feed that
    is refused (its DIS restarted without last-by keys) ends the stream with the refusal."""
    asked = _Request(request, context)
    updates = Updates()
    unlisten: dict[str, Callable[[], None]] = {}
    followed: list[LastByFeed] = []
    seen: dict[LocationKey, int] = {}

    def push(locs: list[LocationLastBy]) -> None:
        for loc in locs:
            if asked.wants(loc.key):
                updates.push(loc)

    def follow(feeds: list[LastByFeed]) -> list[LocationLastBy]:  # listen first, then take the states now
        out = []
        for f in feeds:
            if f.name not in unlisten:
                unlisten[f.name] = f.listen(push)
                followed.append(f)
                out += [loc for loc in f.published() if asked.wants(loc.key)]
        return out

    try:
        first = follow(asked.feeds(upstream, context))
        if asked.key is not None and not first:
            asked.locations(followed, context)  # NOT_FOUND, as a DIS says it
        for loc in first:
            m = loc.full()
            seen[loc.key] = m.seq
            yield m
        looked = time.monotonic()
        while context.is_active():
            for loc in updates.take(timeout=1.0):
                m = loc.changes_since(seen.get(loc.key, -1))
                if m is not None:
                    seen[loc.key] = m.seq
                    yield m
            refused = next((f.refused for f in followed if f.refused is not None), None)
            if refused is not None:
                context.abort(*refused)
            if not (asked.namespace and asked.table) and time.monotonic() - looked > NEW_TABLES_S:
                looked = time.monotonic()
                try:
                    for loc in follow(asked.table_feeds(upstream)):
                        updates.push(loc)
                except DisClientError:
                    pass  # the DISes are away: keep following the tables known
    finally:
        for remove in unlisten.values():
            remove()
