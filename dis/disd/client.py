"""The table-data client: list tables and locations, subscribe to changes, read column data.

    from disd.client import connect
    with connect("127.0.0.1:22021") as c:            # or connect(routing="config/routing.yaml")
        c.tables()                                   # [TableSchema]
        c.locations("Market", "Trade")               # [LocationSnapshot]
        t = c.read_table("Market", "Trade", columns=["Sym", "Price"], partitions=["2026-11-22"])

Reads fetch raw 64 KiB blocks of the column files (many in flight at once) and rebuild Arrow
arrays from them with ``disd.storage.columns``; only the rows published when the location was
listed are read, so a read is repeatable however far ingestion has moved on.  Used by ``dis ls``,
the Spark source and users with pandas.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence

import grpc
import pyarrow as pa

from disd.binlog import LocationKey
from disd.routing import Routing, resolve
from disd.rpc.channel import ClientSecurity, open_channel
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from disd.schema import TableSchema

#: ReadBlock requests kept in flight per read: enough to hide the round trip on loopback.
READ_AHEAD = 32


class DisClientError(Exception):
    """A failure a user can act on: unreachable DIS, unknown table, bad argument."""


def _explain(e: grpc.RpcError, address: str) -> DisClientError:
    code = e.code() if hasattr(e, "code") else None
    details = e.details() if hasattr(e, "details") else str(e)
    if code == grpc.StatusCode.UNAVAILABLE:
        return DisClientError(f"DIS at {address} is unreachable: {details}")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return DisClientError(f"DIS at {address} refused the credentials: {details}")
    return DisClientError(f"DIS at {address}: {code.name if code else 'error'}: {details}")


@dataclass(frozen=True)
class LocationSnapshot:
    """A location at one published size: ``rows`` and the column file sizes covering them."""

    key: LocationKey
    rows: int
    files: dict[str, int] = field(hash=False)
    block_size: int
    address: str

    @classmethod
    def from_msg(cls, m: dis_pb2.LocationInfo, address: str) -> "LocationSnapshot":
        k = m.key
        return cls(
            LocationKey(k.namespace, k.table, k.internal_partition, k.column_partition),
            int(m.rows), {f.name: int(f.size) for f in m.files}, int(m.block_size) or 65536, address,
        )


def key_msg(key: LocationKey) -> dis_pb2.LocationKey:
    return dis_pb2.LocationKey(namespace=key.namespace, table=key.table,
                               internal_partition=key.internal_partition, column_partition=key.column_partition)


class Client:
    def __init__(self, routing: Routing, security: ClientSecurity | None = None, timeout_s: float = 30.0) -> None:
        self.routing = routing
        self.security = security
        self.timeout_s = timeout_s
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, dis_pb2_grpc.TableDataStub] = {}
        self._schemas: dict[tuple[str, str], TableSchema] = {}
        self._unary_only: set[str] = set()  # DIS addresses without ReadBlocks

    # -- plumbing ------------------------------------------------------------------------------
    def stub(self, address: str) -> dis_pb2_grpc.TableDataStub:
        s = self._stubs.get(address)
        if s is None:
            ch = self._channels[address] = open_channel(address, self.security)
            s = self._stubs[address] = dis_pb2_grpc.TableDataStub(ch)
        return s

    def _call(self, address: str, method: str, request):  # noqa: ANN001
        try:
            return getattr(self.stub(address), method)(request, timeout=self.timeout_s)
        except grpc.RpcError as e:
            raise _explain(e, address) from None

    def _owner(self, namespace: str, table: str) -> str:
        inst = self.routing.owner(namespace, table)
        if inst is None:
            raise DisClientError(f"no DIS instance in the routing takes {namespace}.{table}")
        return inst.address

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()
        self._stubs.clear()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:  # noqa: ANN002
        self.close()

    # -- catalogue -----------------------------------------------------------------------------
    def tables(self) -> list[TableSchema]:
        out: dict[tuple[str, str], TableSchema] = {}
        for address in self.routing.addresses:
            for t in self._call(address, "ListTables", dis_pb2.ListTablesRequest()).tables:
                if self.routing.owner(t.namespace, t.table) is None or self._owner(t.namespace, t.table) != address:
                    continue
                s = TableSchema.from_json(t.schema_json, f"DIS {address}")
                out[(s.namespace, s.table)] = s
        self._schemas.update(out)
        return sorted(out.values(), key=lambda s: s.key)

    def schema(self, namespace: str, table: str) -> TableSchema:
        s = self._schemas.get((namespace, table))
        if s is None:
            address = self._owner(namespace, table)
            for t in self._call(address, "ListTables", dis_pb2.ListTablesRequest()).tables:
                if t.namespace == namespace and t.table == table:
                    s = self._schemas[(namespace, table)] = TableSchema.from_json(t.schema_json, f"DIS {address}")
            if s is None:
                raise DisClientError(f"unknown table {namespace}.{table} (not served by {address})")
        return s

    def locations(self, namespace: str | None = None, table: str | None = None) -> list[LocationSnapshot]:
        if namespace and table:
            addresses = [self._owner(namespace, table)]
        else:
            addresses = self.routing.addresses
        out = []
        for address in addresses:
            resp = self._call(address, "ListLocations",
                              dis_pb2.ListLocationsRequest(namespace=namespace or "", table=table or ""))
            for m in resp.locations:
                snap = LocationSnapshot.from_msg(m, address)
                inst = self.routing.owner(snap.key.namespace, snap.key.table)
                if inst is not None and inst.address == address:
                    out.append(snap)
        return sorted(out, key=lambda s: (s.key.namespace, s.key.table, s.key.column_partition, s.key.internal_partition))

    def subscribe(self, namespace: str | None = None, table: str | None = None) -> Iterator[LocationSnapshot]:
        """Every matching location now, then one snapshot per new location or size change.
        Reads from the owner of the table (or the first instance when no table is given)."""
        address = self._owner(namespace, table) if namespace and table else self.routing.addresses[0]
        try:
            for m in self.stub(address).Subscribe(dis_pb2.SubscribeRequest(namespace=namespace or "", table=table or "")):
                yield LocationSnapshot.from_msg(m, address)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.CANCELLED:
                return
            raise _explain(e, address) from None

    def status(self, address: str | None = None) -> dis_pb2.StatusResponse:
        return self._call(address or self.routing.addresses[0], "Status", dis_pb2.StatusRequest())

    # -- data ----------------------------------------------------------------------------------
    def read_range(self, snap: LocationSnapshot, file: str, start: int, stop: int) -> bytes:
        """Bytes [start, stop) of a column file: its blocks in one ReadBlocks stream (a DIS
        without ReadBlocks is read block by block with ReadBlock, READ_AHEAD in flight)."""
        stop = min(stop, snap.files.get(file, 0))
        if stop <= start:
            return b""
        bs = snap.block_size
        first, last = start // bs, (stop - 1) // bs
        if snap.address in self._unary_only:
            parts = self._read_blocks_unary(snap, file, first, last)
        else:
            try:
                parts = self._read_blocks_stream(snap, file, first, last)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise _explain(e, snap.address) from None
                self._unary_only.add(snap.address)
                parts = self._read_blocks_unary(snap, file, first, last)
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        off = start - first * bs
        out = data[off : off + (stop - start)]
        if len(out) != stop - start:
            raise DisClientError(f"{snap.key}: {file} returned {len(out)} bytes, expected {stop - start}")
        return out

    def _read_blocks_stream(self, snap: LocationSnapshot, file: str, first: int, last: int) -> list[bytes]:
        req = dis_pb2.ReadBlocksRequest(location=key_msg(snap.key), file=file, first_block=first,
                                        block_count=last - first + 1)
        return [b for m in self.stub(snap.address).ReadBlocks(req, timeout=self.timeout_s) for b in m.blocks]

    def _read_blocks_unary(self, snap: LocationSnapshot, file: str, first: int, last: int) -> list[bytes]:
        stub = self.stub(snap.address)
        key = key_msg(snap.key)
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
        except grpc.RpcError as e:
            for f in pending:
                f.cancel()
            raise _explain(e, snap.address) from None
        return parts

    def read_location(self, snap: LocationSnapshot, columns: Sequence[str] | None = None,
                      start: int = 0, stop: int | None = None) -> pa.Table:
        """Rows [start, stop) of one location (at most ``snap.rows``) as a pyarrow Table."""
        from disd.storage.columns import read_rows

        schema = self.schema(snap.key.namespace, snap.key.table)
        stop = snap.rows if stop is None else min(stop, snap.rows)
        return read_rows(schema, columns, start, max(start, stop),
                         lambda name, a, b: self.read_range(snap, name, a, b))

    def read_table(self, namespace: str, table: str, columns: Sequence[str] | None = None,
                   partitions: Iterable[str] | None = None) -> pa.Table:
        """Every published row of a table (or of some column partitions), with the partition
        column (e.g. ``Date``) appended as a string column."""
        schema = self.schema(namespace, table)
        if columns is not None:
            for c in columns:
                if c != schema.partition_column:
                    schema.column(c) if c in schema.column_names else _unknown_column(schema, c)
        data_cols = [c for c in (columns or schema.column_names) if c != schema.partition_column]
        wanted = set(partitions) if partitions is not None else None
        parts = []
        for snap in self.locations(namespace, table):
            if wanted is not None and snap.key.column_partition not in wanted:
                continue
            t = self.read_location(snap, data_cols)
            t = t.append_column(pa.field(schema.partition_column, pa.string()),
                                pa.array([snap.key.column_partition] * t.num_rows, pa.string()))
            parts.append(t)
        out_schema = pa.schema([schema.arrow_schema().field(c) for c in data_cols]
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
            security: ClientSecurity | None = None, timeout_s: float = 30.0) -> Client:
    return Client(resolve(address, routing), security, timeout_s)
