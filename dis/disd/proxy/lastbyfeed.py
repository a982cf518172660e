"""The proxy's last-by states (docs/proxy.md, "Last-by"): one upstream ``SubscribeLastBy`` per
table (a last-by feed), and each location's state as the proxy has published it, from which its
readers' ``LastBy`` and ``SubscribeLastBy`` are answered.

Why a feed per table, as for sizes: a DIS pays for each ``SubscribeLastBy`` stream (a thread, the
changes it keeps per location); the proxy's readers share one, so the DIS sees one stream per
table per proxy however many readers ask, and a ``LastBy`` through the proxy costs the DIS nothing.

Why the proxy keeps its own published states: a location's state at ``rows`` rows is the last-by
of the location's rows ``[0, rows)``, one table wherever it is computed (replicas hold the same
rows), so the proxy may take it from any replica and any stream; but a DIS restarted after a
crash (recovered to its checkpoint) or a replica behind serves a state at fewer rows.  The feed
goes on following such a DIS and publishes a location's state only when it covers more rows than
the one published: a reader's state never goes back, and catches up when the DIS does.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable

import grpc
import pyarrow as pa

from disd.errors import DisError
from disd.names import LocationKey
from disd.proxy.follow import FollowedStream
from disd.rpc.keys import key_from_proto, key_to_proto
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from disd.storage.lastby import DELTAS_KEPT, from_ipc, last_by, to_ipc

if TYPE_CHECKING:
    from disd.proxy.upstream import Upstream

#: What a DIS answers about a table's last-by that stays so (no last-by keys, no such table, a DIS
#: without last-by): a feed stops and its readers are given the same answer.
REFUSALS = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNIMPLEMENTED)


class LastByStreamError(DisError, ValueError):
    """A last-by stream out of order (changes of a location before its whole state)."""


@dataclass
class State:
    """A location's last-by state at ``rows`` published rows, as a DIS's ``LastByState`` gives
    it; ``ipc``, its Arrow IPC bytes once known (as received, or encoded once when first asked)."""

    table: pa.Table
    rows: int
    schema_version: int
    keys: tuple[str, ...]
    ipc: bytes | None = field(default=None, repr=False)

    def ipc_bytes(self) -> bytes:
        if self.ipc is None:
            self.ipc = to_ipc(self.table)
        return self.ipc


def upsert(state: pa.Table, changes: pa.Table, keys: Iterable[str]) -> pa.Table:
    """``state`` with the latest rows of the keys that changed (a DIS's delta): a changed key's
    row replaced where it stands, new keys appended in their order, which is the DIS's own order
    (keys in order of first appearance), so the result equals the DIS's state table."""
    return last_by(pa.concat_tables([state, changes]), keys)


class LocationLastBy:
    """One location's state as the proxy has published it, ``seq`` its publishes (what orders a
    reader's messages through the proxy), and the changes of the latest publishes, kept while
    readers subscribe so a reader that lags is sent the keys that changed, not the whole state.
    A publish that is not one upstream change (a feed catching up on a restarted DIS or another
    replica) keeps no change: a reader behind it is sent the whole state, as a DIS does."""

    def __init__(self, key: LocationKey) -> None:
        self.key = key
        self.state: State | None = None
        self.seq = 0
        self._changes: collections.deque[tuple[int, pa.Table | None, bytes | None]] = collections.deque()
        self._change_rows = 0
        self._lock = threading.Lock()

    def publish(self, state: State, changes: pa.Table | None, changes_ipc: bytes | None, keep: bool) -> None:
        with self._lock:
            self.state, self.seq = state, self.seq + 1
            if not keep:
                self._changes.clear()
                self._change_rows = 0
                return
            self._changes.append((self.seq, changes, changes_ipc))
            self._change_rows += len(changes) if changes is not None else 0
            while len(self._changes) > DELTAS_KEPT or (self._change_rows > 2 * len(state.table)
                                                       and len(self._changes) > 1):
                dropped = self._changes.popleft()[1]
                self._change_rows -= len(dropped) if dropped is not None else 0

    def _message(self, state: State, seq: int, full: bool, ipc: bytes) -> dis_pb2.LastByState:
        return dis_pb2.LastByState(key=key_to_proto(self.key), rows=state.rows, arrow_ipc=ipc, full=full, seq=seq,
                                   schema_version=state.schema_version, keys=list(state.keys))

    def full(self) -> dis_pb2.LastByState:
        """The whole published state."""
        with self._lock:
            state, seq = self.state, self.seq
        assert state is not None  # published as it is made (``LastByFeed.take``)
        return self._message(state, seq, True, state.ipc_bytes())

    def changes_since(self, seen: int) -> dis_pb2.LastByState | None:
        """What a reader that was given publish ``seen`` lacks: None (nothing), the latest rows
        of the keys that changed since, or the whole state when those changes are not all kept."""
        with self._lock:
            state, seq = self.state, self.seq
            if seen == seq:
                return None
            kept = [(t, b) for q, t, b in self._changes if seen < q <= seq]
        assert state is not None  # published as it is made (``LastByFeed.take``)
        if seen > seq or len(kept) != seq - seen or any(t is None for t, _ in kept):
            return self._message(state, seq, True, state.ipc_bytes())
        ipc = kept[0][1]  # kept with its table (``publish``)
        if len(kept) == 1 and ipc is not None:
            return self._message(state, seq, False, ipc)
        return self._message(state, seq, False, to_ipc(last_by(pa.concat_tables([t for t, _ in kept]), state.keys)))


class LastByFeed(FollowedStream[LocationLastBy]):
    """One table's upstream ``SubscribeLastBy`` and the states the proxy has published.

    Its thread follows one member of the table's routing entry, chosen as the size feed chooses
    (``disd.proxy.follow``): it opens ``SubscribeLastBy``, asks ``LastBy`` (the states now:
    once answered, readers are answered from the feed), then takes every message of the stream —
    a whole state, or the latest rows of the keys that changed, upserted into the state the stream
    gave before.  A state with more rows than published (or of a new location) is published.
    A stream starts with every state whole, so nothing is missed.  A refusal that stays
    (``REFUSALS``: the table declares no last-by keys, is unknown, or the DIS has no last-by)
    from a member when no member answers ends the feed with that answer (``refused``), which its
    readers are given."""

    stream = "last-by subscription"
    unusable = (ValueError, pa.ArrowException)
    message = "last-by state"

    def __init__(self, upstream: "Upstream", namespace: str, table: str) -> None:
        super().__init__(upstream, namespace, table, thread="lastby-feed")
        self.locations: dict[LocationKey, LocationLastBy] = {}
        self._received: dict[LocationKey, State] = {}  # the states of the current upstream stream
        self._streamed: set[LocationKey] = set()  # locations the current stream has given whole
        self.refused: tuple[grpc.StatusCode, str] | None = None
        self.refused_at = 0.0

    # -- what readers see ----------------------------------------------------------------------
    def published(self) -> list[LocationLastBy]:
        """Every location with a published state, by (column partition, internal partition)."""
        with self._lock:
            locs = [loc for loc in self.locations.values() if loc.state is not None]
        return sorted(locs, key=lambda loc: (loc.key.column_partition, loc.key.internal_partition))

    # -- what the upstream stream gives ----------------------------------------------------------
    def _begin(self, answer: Iterable[dis_pb2.LastByState]) -> None:
        """A new stream: forget the last stream's states; take a ``LastBy`` answer's (whole)."""
        self._received.clear()
        self._streamed.clear()
        for m in answer:
            self.take(m, streamed=False)

    def take(self, m: dis_pb2.LastByState, streamed: bool = True) -> None:
        """One upstream state (whole, or the changes since the stream's last one for the
        location): kept as the stream's state, and published when it covers more rows."""
        key = key_from_proto(m.key)
        if key.namespace != self.namespace or key.table != self.table:
            return
        changes = None
        base_rows = -1  # of the state the changes start from
        if m.full:
            state = State(from_ipc(m.arrow_ipc), m.rows, m.schema_version, tuple(m.keys), m.arrow_ipc)
            if streamed:
                self._streamed.add(key)
        else:
            base = self._received.get(key)
            if base is None or key not in self._streamed:
                raise LastByStreamError(f"the DIS sent changes of {key} before its whole state")
            changes = from_ipc(m.arrow_ipc)
            base_rows = base.rows
            state = State(upsert(base.table, changes, m.keys), m.rows, m.schema_version, tuple(m.keys))
        self._received[key] = state
        with self._lock:
            loc = self.locations.get(key)
            if loc is None:
                loc = self.locations[key] = LocationLastBy(key)
            old = loc.state
            if old is not None and state.rows <= old.rows:
                return  # a DIS behind what was published: held back until it is past it
            # the upstream changes are the published state's only when they start from it
            follows = changes is not None and old is not None and base_rows == old.rows
            loc.publish(state, changes if follows else None, m.arrow_ipc if follows else None,
                        keep=bool(self._listeners))
            listeners = list(self._listeners)
        for f in listeners:
            f([loc])

    # -- the upstream stream -------------------------------------------------------------------
    def _follow(self, stub: dis_pb2_grpc.TableDataStub, address: str) -> None:
        request = dis_pb2.LastByRequest(namespace=self.namespace, table=self.table)
        self._call = call = stub.SubscribeLastBy(request)
        self._begin(stub.LastBy(request, timeout=self.upstream.timeout_s).locations)
        self._connected(address)
        for m in call:
            self.take(m)

    def _refusal(self, e: grpc.RpcError, address: str) -> tuple[grpc.StatusCode, str] | None:
        if e.code() not in REFUSALS:
            return None
        details = e.details() or ""
        if e.code() == grpc.StatusCode.UNIMPLEMENTED:
            details = f"the DIS at {address} does not serve last-by: {details}"
        return e.code(), details

    def _end_refused(self, code: grpc.StatusCode, details: str) -> None:
        self.refused, self.refused_at = (code, details), time.monotonic()
        self.primed.set()
