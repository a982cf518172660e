"""The table-data client: list tables and locations, subscribe to changes, read column data.

    from disd.client import connect
    with connect("127.0.0.1:22021") as c:            # or connect(routing="config/routing.yaml")
        c.tables()                                   # [TableSchema]
        c.locations("Market", "Trade")               # [LocationSnapshot]
        t = c.read_table("Market", "Trade", columns=["Sym", "Price"], partitions=["2026-11-22"])

Reads go through the block seam (``disd.blocks``): a ``Client`` is the gRPC ``BlockSource``,
fetching raw 64 KiB blocks of the column files (many in one stream) that ``disd.storage.columns``
rebuilds into Arrow arrays (a char column as one-character strings: ``disd.values.char_strings``,
as Spark and merged Parquet read it); only the rows published when the location was listed are read, so a
read is repeatable however far ingestion has moved on.  With a routing entry of hot replicas, every
call goes to a replica that answers and a read continues on another replica when its own goes down
(``disd.blocks.GrpcBlocks``); with an entry that lists proxies (``dis proxy``), every read call goes
to them instead.  ``table_from_blocks`` reads a table from
any ``BlockSource``.  Used by ``dis ls``, the Spark source and users with pandas.
"""

from __future__ import annotations

import collections
from typing import Iterable, Iterator, Sequence

import grpc
import pyarrow as pa

from disd.blocks import (
    DEFAULT_RETRY_S,
    BlockSource,
    DisClientError,
    GrpcBlocks,
    LocalColumnFiles,
    LocationSnapshot,
    Subscription,
    explain,
    read_location,
    restarting,
)
from disd.names import LocationKey
from disd.routing import Routing, resolve
from disd.rpc.keys import key_from_proto, key_to_proto
from disd.rpc.v1 import dis_pb2
from disd.schema import ColumnType, TableSchema
from disd.security import ClientSecurity
from disd.values import char_strings

__all__ = ["Client", "DisClientError", "LocationSnapshot", "as_read", "connect", "table_from_blocks"]

#: locations whose string data ends a client remembers (least recently read forgotten first)
ENDS_LOCATIONS = 100_000
#: ends remembered per location: a follower needs only where its last read stopped
ENDS_PER_LOCATION = 8


class _LocationEnds(dict):
    """One location's ``DataEnds``: at most ENDS_PER_LOCATION, the oldest forgotten first."""

    def __setitem__(self, key: tuple[str, int], end: int) -> None:
        super().__setitem__(key, end)
        if len(self) > ENDS_PER_LOCATION:
            del self[next(iter(self))]


class Client(GrpcBlocks):
    """A DIS's catalogue (tables, schemas, subscriptions, status) on top of its blocks: the
    ``disd.blocks.BlockSource`` over gRPC that every read of this client goes through."""

    def __init__(self, routing: Routing, security: ClientSecurity | None = None, timeout_s: float = 30.0,
                 retry_s: float = DEFAULT_RETRY_S) -> None:
        super().__init__(routing, security, timeout_s, retry_s)
        self._schemas: dict[tuple[str, str], TableSchema] = {}
        self._ends: collections.OrderedDict[LocationKey, _LocationEnds] = collections.OrderedDict()

    # -- catalogue -----------------------------------------------------------------------------
    def tables(self) -> list[TableSchema]:
        """Every table's newest schema, carrying its earlier versions (``TableSchema.history``):
        each routing entry's tables as one of its replicas that answers lists them."""
        out: dict[tuple[str, str], TableSchema] = {}
        for inst in self.routing.instances:
            address, reply = self._call_any([r.address for r in inst.read_replicas], "ListTables",
                                            dis_pb2.ListTablesRequest())
            for t in reply.tables:
                if self.routing.owner(t.namespace, t.table) != inst:
                    continue
                s = table_info_schema(t, address)
                out[(s.namespace, s.table)] = s
        self._schemas.update(out)
        return sorted(out.values(), key=lambda s: s.key)

    def schema(self, namespace: str, table: str, refresh: bool = False) -> TableSchema:
        """The table's newest schema with its earlier versions, as its DIS (a replica of its set
        that answers) holds them (asked once per client; ``refresh`` asks again: a DIS restarted
        with a newer version of the table)."""
        s = None if refresh else self._schemas.get((namespace, table))
        if s is None:
            address, reply = self._call_any(self.replicas(namespace, table), "ListTables", dis_pb2.ListTablesRequest())
            for t in reply.tables:
                if t.namespace == namespace and t.table == table:
                    s = self._schemas[(namespace, table)] = table_info_schema(t, address)
            if s is None:
                raise DisClientError(f"unknown table {namespace}.{table} (not served by {address})")
        return s

    def subscribe(self, namespace: str | None = None, table: str | None = None) -> Iterator[LocationSnapshot]:
        """Every matching location now, then one snapshot per new location or size change.

        Follows one replica of the table's entry (of the first entry when no table is given).
        When its stream ends because that DIS went away, it subscribes again: to another replica
        of the set when one answers, else to the same DIS once it is back (within ``retry_s``).
        The new stream starts with every matching location's current size, so no change is
        missed; a size smaller than one already given for a location (a replica behind the one
        followed before, or a DIS that lost unflushed rows) is held back until it is reached
        again, so the sizes of a location never go down."""
        if namespace and table:
            addresses = self.replicas(namespace, table)
        else:
            addresses = [r.address for r in self.routing.instances[0].read_replicas]
        request = dis_pb2.SubscribeRequest(namespace=namespace or "", table=table or "")
        given: dict = {}
        while True:
            def start(a: str) -> tuple[Subscription, Iterator]:
                sub = Subscription(self.stub(a), request)
                return sub, _first_and_rest(iter(sub))

            address, (sub, batches) = self._any_replica(addresses, start)
            try:
                for batch in batches:
                    for m in batch:
                        snap = LocationSnapshot.from_msg(m, address)
                        if snap.rows < given.get(snap.key, 0):
                            continue
                        given[snap.key] = snap.rows
                        yield snap
                return
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.CANCELLED and not restarting(e):
                    return  # cancelled by its consumer
                refusal = self._refusal(e, address)
                if refusal is not None:
                    raise refusal from None
                if self.retry_s <= 0 and len(addresses) == 1:
                    raise explain(e, address) from None
                self._mark_down(address)
            finally:
                sub.cancel()  # a consumer that stops iterating ends the stream at the DIS too

    def status(self, address: str | None = None) -> dis_pb2.StatusResponse:
        """The Status of the DIS at ``address`` (default: the first DIS of the routing that
        answers)."""
        if address is not None:
            return self._call(address, "Status", dis_pb2.StatusRequest())
        return self._call_any(self.routing.addresses, "Status", dis_pb2.StatusRequest())[1]

    # -- last-by (docs/lastby.md) ---------------------------------------------------------------
    def last_by_states(self, namespace: str, table: str, location=None) -> list[dis_pb2.LastByState]:  # noqa: ANN001
        """Each location's last-by state as the DIS holds it (``location``: one ``LocationKey``)."""
        req = dis_pb2.LastByRequest(namespace=namespace, table=table,
                                    location=key_to_proto(location) if location is not None else None)
        return list(self._call_any(self.replicas(namespace, table), "LastBy", req)[1].locations)

    def last_by(self, namespace: str, table: str, location=None,  # noqa: ANN001
                partitions: Iterable[str] | None = None) -> pa.Table:
        """The latest row per key of a table (or of one location, or of some column partitions)
        in the table's newest version, with the partition column appended; across locations a
        later column partition wins (``disd.storage.lastby.combine``)."""
        from disd.storage.lastby import combine

        schema = self.schema(namespace, table)
        states = self.last_by_states(namespace, table, location)
        wanted = set(partitions) if partitions is not None else None
        parts = [(key_from_proto(m.key), state_table(schema, m)) for m in states
                 if wanted is None or m.key.column_partition in wanted]
        keys = list(states[0].keys) if states else []
        return combine(parts, keys, schema.partition_column, schema.read_arrow_schema())

    def subscribe_last_by(self, namespace: str, table: str, location=None) -> Iterator[tuple[dis_pb2.LastByState, pa.Table]]:  # noqa: ANN001
        """Every matching location's full state, then per publish the latest rows of the keys
        that changed (``msg.full`` false), each with its rows as a table of the newest version."""
        schema = self.schema(namespace, table)
        req = dis_pb2.LastByRequest(namespace=namespace, table=table,
                                    location=key_to_proto(location) if location is not None else None)
        address = self.replicas(namespace, table)[0]
        try:
            for m in self.stub(address).SubscribeLastBy(req):
                yield m, state_table(schema, m)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                raise explain(e, address) from None

    # -- data ----------------------------------------------------------------------------------
    def read_location(self, snap: LocationSnapshot, columns: Sequence[str] | None = None,
                      start: int = 0, stop: int | None = None) -> pa.Table:
        """Rows [start, stop) of one location (at most ``snap.rows``) as a pyarrow Table of the
        table's newest version (a location written in an older one is projected onto it).

        A read to the snapshot's end is one call to the DIS (``ReadRanges``), and so is the next
        read from where it stopped (a follower's): the client remembers where each location's
        string data ended (``disd.storage.columns.DataEnds``)."""
        schema = self.schema(snap.key.namespace, snap.key.table)
        return as_read(schema, read_location(self, schema, snap, columns, start, stop, self._location_ends(snap.key)))

    def _location_ends(self, key: LocationKey) -> "_LocationEnds":
        ends = self._ends.get(key)
        if ends is None:
            ends = self._ends[key] = _LocationEnds()
            if len(self._ends) > ENDS_LOCATIONS:
                self._ends.popitem(last=False)
        else:
            self._ends.move_to_end(key)
        return ends

    def read_table(self, namespace: str, table: str, columns: Sequence[str] | None = None,
                   partitions: Iterable[str] | None = None) -> pa.Table:
        """Every published row of a table (or of some column partitions) in the table's newest
        version, with the partition column (e.g. ``Date``) appended as a string column."""
        return table_from_blocks(self, self.schema(namespace, table), columns, partitions)


def state_table(schema: TableSchema, m: dis_pb2.LastByState) -> pa.Table:
    """A LastByState's rows in ``schema``'s version (projected from the location's own), as
    readers get them (``as_read``: the DIS sends its state in the types it holds)."""
    from disd.blocks import version_projection
    from disd.storage.lastby import from_ipc

    t = from_ipc(m.arrow_ipc)
    version = m.schema_version or schema.version
    if version != schema.version:
        proj = version_projection(schema, version, None, f"location {key_from_proto(m.key)}")
        t = proj.apply(t.select(proj.stored_columns))
    return as_read(schema, t)


def as_read(schema: TableSchema, table: pa.Table) -> pa.Table:
    """``table`` (columns of ``schema`` decoded as held: ``TableSchema.arrow_schema``) as a reader
    gets it (``TableSchema.read_arrow_schema``): each char column as one-character strings
    (``disd.values.char_strings``); nothing else changes, and a table without chars is returned as is."""
    chars = [i for i, name in enumerate(table.column_names)
             if name in schema.column_names and schema.column(name).type is ColumnType.CHAR]
    for i in chars:
        table = table.set_column(i, pa.field(table.column_names[i], pa.string()), char_strings(table.column(i)))
    return table


def table_info_schema(info: dis_pb2.TableInfo, address: str) -> TableSchema:
    """The schema a DIS lists for a table: its newest version carrying the earlier ones
    (``versions_json``), or, from a DIS older than schema versions, its one schema."""
    if info.versions_json:
        return TableSchema.from_history_json(info.versions_json, f"DIS {address}")
    return TableSchema.from_json(info.schema_json, f"DIS {address}")


def table_from_blocks(source: BlockSource, schema: TableSchema, columns: Sequence[str] | None = None,
                      partitions: Iterable[str] | None = None) -> pa.Table:
    """The rows of every location ``source`` lists for ``schema``'s table (or for some column
    partitions), with the partition column appended as a string column (``Client.read_table``).
    Rows are presented in ``schema``'s version: each location is decoded in its own version and
    projected (``disd.blocks.read_location``), in the types readers get (``as_read``)."""
    if isinstance(source, LocalColumnFiles):
        schema = source.schema(schema)  # the versions stored beside the column files
    if columns is not None:
        for c in columns:
            if c != schema.partition_column:
                schema.column(c) if c in schema.column_names else _unknown_column(schema, c)
    data_cols = [c for c in (columns or schema.column_names) if c != schema.partition_column]
    wanted = set(partitions) if partitions is not None else None
    parts = []
    for snap in source.locations(schema.namespace, schema.table, None if wanted is None else wanted.__contains__):
        t = as_read(schema, read_location(source, schema, snap, data_cols))
        t = t.append_column(pa.field(schema.partition_column, pa.string()),
                            pa.array([snap.key.column_partition] * t.num_rows, pa.string()))
        parts.append(t)
    out_schema = pa.schema([schema.read_arrow_schema().field(c) for c in data_cols]
                           + [pa.field(schema.partition_column, pa.string())])
    if not parts:
        return out_schema.empty_table()
    result = pa.concat_tables(parts)
    if columns is not None:
        result = result.select(list(columns))
    return result


def _unknown_column(schema: TableSchema, name: str) -> None:
    raise DisClientError(f"{schema.key} has no column {name!r} (columns: {', '.join(schema.column_names)})")


def connect(address: str | None = None, routing: str | Routing | None = None,
            security: ClientSecurity | None = None, timeout_s: float = 30.0,
            retry_s: float = DEFAULT_RETRY_S) -> Client:
    """A client of the DIS at ``address`` (or of every instance of ``routing``).  Calls that find
    their DIS unreachable are retried for up to ``retry_s`` seconds (a restart is a pause);
    ``retry_s=0`` fails at once."""
    return Client(resolve(address, routing), security, timeout_s, retry_s)


def _first_and_rest(stream):  # noqa: ANN001, ANN202
    """The messages of a server stream, its first one already received: a stream that cannot
    start (the DIS is down) fails here, inside the retry, rather than at the first ``next``."""
    first = next(stream, None)

    def gen():  # noqa: ANN202
        if first is not None:
            yield first
        yield from stream

    return gen()
