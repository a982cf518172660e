"""The last-by calls of the TableData service (docs/lastby.md): a location's state as Arrow IPC,
and a subscription that sends each location's full state, then only the keys each publish changed.

Why a delta stream: a dashboard of 100,000 symbols wants the few that moved, not the whole table
every 100 ms; a subscriber that falls further behind than the changes the DIS keeps is sent the
whole state again (``full``), so it never misses a change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator

import grpc
import pyarrow as pa

from disd.names import LocationKey
from disd.rpc.keys import key_to_proto
from disd.rpc.v1 import dis_pb2
from disd.server.ingest import RequestRefused, location_key
from disd.storage import Location, StorageEngine
from disd.storage.lastby import LastBy, to_ipc

if TYPE_CHECKING:  # tabledata, the service, imports this module
    from disd.server.tabledata import Updates


def _message(loc: Location, state: LastBy, full: bool, table: pa.Table, rows: int, seq: int) -> dis_pb2.LastByState:
    return dis_pb2.LastByState(key=key_to_proto(loc.key), rows=rows, arrow_ipc=to_ipc(table), full=full, seq=seq,
                               schema_version=loc.schema_version, keys=list(state.keys))


def matching(engine: StorageEngine, request: dis_pb2.LastByRequest,
             context: grpc.ServicerContext) -> list[tuple[Location, LastBy]]:
    """The locations a LastBy request names that keep a last-by state, each with that state;
    aborts with NOT_FOUND or FAILED_PRECONDITION naming the table when there is nothing to answer
    with."""
    key: LocationKey | None
    if request.HasField("location"):
        try:
            key = location_key(request.location)
        except RequestRefused as r:
            context.abort(r.code, r.details)
        namespace, table = key.namespace, key.table
    else:
        key, namespace, table = None, request.namespace, request.table
    if namespace and table and engine.schemas.get(namespace, table) is None:
        context.abort(grpc.StatusCode.NOT_FOUND, f"unknown table {namespace}.{table}")
    if namespace and table and not engine.import_config(f"{namespace}.{table}").last_by:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                      f"table {namespace}.{table} declares no last-by keys (import.tables.{namespace}.{table}.last_by)")
    out = []
    for loc in engine.locations():
        if key is not None and loc.key != key or namespace and loc.key.namespace != namespace \
                or table and loc.key.table != table:
            continue
        if loc.in_error and loc.lastby is not None and key is not None:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"location {loc.key} is in error: {loc.error}")
        if loc.lastby is not None and not loc.in_error:
            out.append((loc, loc.lastby))
    if key is not None and not out:
        context.abort(grpc.StatusCode.NOT_FOUND, f"no location {key} with a last-by state")
    return out


def last_by(engine: StorageEngine, request: dis_pb2.LastByRequest,
            context: grpc.ServicerContext) -> dis_pb2.LastByResponse:
    states = []
    for loc, state in matching(engine, request, context):
        s = state.snapshot()
        states.append(_message(loc, state, True, s.table, s.rows, s.seq))
    return dis_pb2.LastByResponse(locations=states)


def subscribe_last_by(engine: StorageEngine, request: dis_pb2.LastByRequest, context: grpc.ServicerContext,
                      updates: Updates,
                      subscribe: Callable[[Callable[..., object]], Callable[[], None]]) -> Iterator[dis_pb2.LastByState]:
    """``updates``: the service's coalescing queue of changed locations; ``subscribe`` its
    engine subscription (returns the unsubscribe)."""
    wanted = {loc.key for loc, _state in matching(engine, request, context)}
    unsubscribe = subscribe(lambda loc, _rows=None: updates.push(loc) if loc.lastby is not None and (
        loc.key in wanted or not request.HasField("location") and (not request.namespace or loc.key.namespace == request.namespace)
        and (not request.table or loc.key.table == request.table)) else None)
    seen: dict[LocationKey, int] = {}
    counted = [loc.lastby for loc in engine.locations() if loc.lastby is not None]
    for lb in counted:  # keep deltas while this stream is open
        lb.subscribers += 1
    try:
        for loc, state in matching(engine, request, context):
            s = state.snapshot()
            seen[loc.key] = s.seq
            yield _message(loc, state, True, s.table, s.rows, s.seq)
        while context.is_active():
            changed: list[Location] = updates.take(timeout=1.0)
            for loc in changed:
                if loc.in_error or loc.lastby is None:
                    continue
                full, table, seq, rows = loc.lastby.changes_since(seen.get(loc.key, -1))
                if seq != seen.get(loc.key):
                    seen[loc.key] = seq
                    yield _message(loc, loc.lastby, full, table, rows, seq)
    finally:
        unsubscribe()
        for lb in counted:
            lb.subscribers -= 1
