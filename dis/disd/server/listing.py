"""What a listing of locations carries besides their sizes: how each listed schema version reads
as the version a reader presents (docs/schema-versions.md, "Reading"; docs/grpc-contract.md).

The rules of schema versions have one home, ``disd.schemaversions``.  A Python reader applies them
itself; a reader in another language (the JVM Spark reader) would otherwise implement them a
second time, and two implementations of one rule drift apart.  So the DIS, and a proxy from the
versions its DISes list, resolve them in every listing (gRPC ``ListLocations``, the block
endpoint's ``/v1/locations``): per (table, stored version) of the listed locations, each
presented column with the stored column it comes from and that column's type
(``VersionProjection.listed``).  One projection per version, not per location: a listing of thousands
of locations written in a few versions carries a few.

The presented version is each table's newest, or the one the request names: a streaming query
keeps the version it started with, and rows of a newer version are projected back onto it.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import grpc

from disd.errors import DisError
from disd.rpc.v1 import dis_pb2
from disd.schema import TableSchema
from disd.schemaversions import projection

#: (namespace, table) -> the table's newest schema carrying its other versions, or None.
SchemaOf = Callable[[str, str], "TableSchema | None"]


class ListingRefused(DisError):
    """A listing the DIS cannot give: a presented version without its table (``not_found``
    False: a bad request), or one the table does not have (``not_found`` True)."""

    def __init__(self, message: str, not_found: bool) -> None:
        super().__init__(message)
        self.not_found = not_found

    @property
    def code(self) -> grpc.StatusCode:
        """The status ``ListLocations`` ends with."""
        return grpc.StatusCode.NOT_FOUND if self.not_found else grpc.StatusCode.INVALID_ARGUMENT


def presented_schema(schema_of: SchemaOf, namespace: str, table: str, version: int) -> TableSchema | None:
    """The schema a listing presents ``namespace.table`` in: its newest (``version`` 0), or
    ``version``, carrying every other version.  ListingRefused for a version without a table,
    or one the table does not have."""
    if not version:
        return schema_of(namespace, table) if namespace and table else None
    if not (namespace and table):
        raise ListingRefused(f"version {version}: a listing presents a schema version of one table; give its "
                             "namespace and table", not_found=False)
    newest = schema_of(namespace, table)
    if newest is None:
        raise ListingRefused(f"unknown table {namespace}.{table}", not_found=True)
    if version not in newest.versions:
        known = ", ".join(str(v) for v in newest.versions)
        raise ListingRefused(f"{namespace}.{table} has no schema version {version} here (versions {known})",
                             not_found=True)
    return newest.at_version(version).with_history(newest.versions.values())


def projections(schema_of: SchemaOf, listed: Iterable[tuple[str, str, int]], namespace: str = "",
                table: str = "", version: int = 0) -> list[dict[str, Any]]:
    """For each distinct (namespace, table, stored version) of ``listed`` (the listed
    locations'), the projection of that version onto the presented one (see
    ``presented_schema``), as JSON-able dicts: ``namespace``, ``table``, ``stored_version``,
    ``presented_version`` and ``columns`` (``VersionProjection.listed``).  A version 0 (not known: a
    location in error) and a table or version ``schema_of`` does not know are left out."""
    asked = presented_schema(schema_of, namespace, table, version)
    out, seen = [], set()
    for ns, tb, stored in listed:
        if not stored or (ns, tb, stored) in seen:
            continue
        seen.add((ns, tb, stored))
        schema = asked if asked is not None and (ns, tb) == (namespace, table) else schema_of(ns, tb)
        if schema is None or stored not in schema.versions:
            continue
        out.append({"namespace": ns, "table": tb, "stored_version": stored, "presented_version": schema.version,
                    "columns": projection(schema, stored).listed()})
    return out


def versions_of_messages(infos: Iterable[dis_pb2.LocationInfo]) -> list[tuple[str, str, int]]:
    """(namespace, table, schema version) of each listed ``LocationInfo``."""
    return [(m.key.namespace, m.key.table, m.schema_version) for m in infos]


def versions_of_json(locations: Iterable[dict[str, Any]]) -> list[tuple[str, str, int]]:
    """(namespace, table, schema version) of each location of a ``/v1/locations`` answer."""
    return [(x["namespace"], x["table"], x["schema_version"]) for x in locations]


def missing(found: list[dict[str, Any]], listed: Iterable[tuple[str, str, int]]) -> bool:
    """Whether a listed (namespace, table, version) has no projection in ``found`` (the
    schemas used were older than a location: a proxy lists its DISes' tables again)."""
    have = {(p["namespace"], p["table"], p["stored_version"]) for p in found}
    return any(v and (ns, tb, v) not in have for ns, tb, v in listed)


def messages(found: list[dict[str, Any]]) -> list[dis_pb2.VersionProjection]:
    """``projections`` as the ``ListLocationsResponse.projections`` of the gRPC contract (a
    column with no stored column has empty ``stored`` and ``stored_type``)."""
    return [dis_pb2.VersionProjection(
        namespace=p["namespace"], table=p["table"], stored_version=p["stored_version"],
        presented_version=p["presented_version"],
        columns=[dis_pb2.ColumnProjection(name=c["name"], type=c["type"], stored=c["stored"] or "",
                                          stored_type=c["stored_type"] or "") for c in p["columns"]])
        for p in found]
