"""What a merge reads: the intraday locations of one column partition, pinned and described.

A merge of ``Namespace.Table`` for a value (a date) reads every internal partition of it, either
from a running DIS (``snapshot_from_dis``: the published rows, plus what ``Status`` says about
tailers and checkpoints) or straight from the column files on the DIS host
(``snapshot_from_files``: the rows of each ``table.size`` checkpoint, plus what lies past it, as
``disd.blocks.checkpointed_locations`` finds them).

Intraday files only grow and rows ``[0, n)`` never change once published, so a location's row
count and its column file sizes at that count identify its rows.  ``SourceSnapshot.identity``
hashes them (with the schema and the merge settings): two merges with the same identity write
the same rows, which is how a re-run knows it has nothing to do.  Each location is pinned with its
schema version (``IntradayLocation.schema_version``): the merge reads it in that version and
writes the table's newest.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from disd.blocks import BlockSourceError, checkpointed_locations, table_versions
from disd.errors import DisError
from disd.schema import TableSchema


class SourceError(DisError):
    """The intraday data cannot be read (no such table, a damaged checkpoint, an unreachable DIS)."""


@dataclass(frozen=True)
class IntradayLocation:
    """One internal partition of the column partition being merged, and the facts that tell
    whether it is still being written (judged by ``disd.historical.liveness``)."""

    internal_partition: str
    rows: int
    files: dict[str, int] = field(hash=False)
    tailer: str | None = None  # a connected tailer (DIS only)
    tailer_idle_s: float | None = None  # since table.size last changed (DIS only; None: unknown)
    rows_past_checkpoint: int = 0  # published but not yet checkpointed (DIS only)
    bytes_past_checkpoint: int = 0  # column file bytes beyond table.size (files only)
    checkpoint_age_s: float | None = None  # since table.size last changed (files only)
    schema_version: int = 0  # the schema version its files are written in (0: the table's newest)


@dataclass(frozen=True)
class SourceSnapshot:
    namespace: str
    table: str
    value: str  # the column partition
    schema: TableSchema
    kind: str  # "dis" or "files"
    where: str  # the DIS address or the database root
    locations: tuple[IntradayLocation, ...]

    @property
    def rows(self) -> int:
        return sum(loc.rows for loc in self.locations)

    def version_of(self, loc: IntradayLocation) -> int:
        return loc.schema_version or self.schema.version

    def identity(self, settings: dict[str, Any]) -> str:
        """SHA-256 of what determines the merged rows: columns, each location's rows and file
        sizes, and the merge settings.  Where the rows were read from is not part of it.  For a
        table of several schema versions, the presented version and each location's version
        (whose fingerprint pins its files' columns) are part of it too."""
        body: dict[str, Any] = {
            "fingerprint": self.schema.fingerprint, "partition_column": self.schema.partition_column,
            "value": self.value,
            "locations": [[loc.internal_partition, loc.rows, sorted(loc.files.items())] for loc in self.locations],
            "settings": settings,
        }
        if len(self.schema.versions) > 1:
            body["version"] = self.schema.version
            body["location_versions"] = {
                loc.internal_partition: [self.version_of(loc), self.schema.at_version(self.version_of(loc)).fingerprint]
                for loc in self.locations}
        return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def describe(self) -> dict[str, Any]:
        """The ``source`` of a location record (with each location's schema version and
        fingerprint when the table has several versions)."""
        out: dict[str, Any] = {"kind": self.kind, "from": self.where, "fingerprint": self.schema.fingerprint,
               "locations": {loc.internal_partition: loc.rows for loc in self.locations}}
        if len(self.schema.versions) > 1:
            out["schema_version"] = self.schema.version
            out["location_versions"] = {
                loc.internal_partition: {"schema_version": self.version_of(loc),
                                       "fingerprint": self.schema.at_version(self.version_of(loc)).fingerprint}
                for loc in self.locations}
        return out


def snapshot_from_dis(client, namespace: str, table: str, value: str) -> SourceSnapshot:  # noqa: ANN001
    """The published locations of ``value`` at the DIS that owns the table (``disd.client.Client``).

    With a set of hot replicas, each location is pinned as the replica that listed it has
    published it (the most advanced one, ``disd.blocks.GrpcBlocks.locations``), and its tailer and
    checkpoint facts come from that replica's Status.  The pinned rows are identical on every
    replica, so the merge's read of them may come from any replica that has published them."""
    try:
        schema = client.schema(namespace, table)
        snaps = [s for s in client.locations(namespace, table)
                 if (s.key.namespace, s.key.table, s.key.column_partition) == (namespace, table, value)]
        addresses = sorted({s.address for s in snaps}) or [client.replicas(namespace, table)[0]]
        status = {}
        for address in addresses:
            for loc in client.status(address).locations:
                k = loc.key
                if (k.namespace, k.table, k.column_partition) == (namespace, table, value):
                    status[(address, k.internal_partition)] = loc
    except BlockSourceError as e:
        raise SourceError(str(e)) from None
    locs = []
    for s in sorted(snaps, key=lambda s: s.key.internal_partition):
        st = status.get((s.address, s.key.internal_partition))
        locs.append(IntradayLocation(
            s.key.internal_partition, s.rows, dict(s.files),
            tailer=(st.tailer or None) if st is not None else None,
            tailer_idle_s=(float(st.checkpoint_changed_age_s)
                           if st is not None and st.checkpoint_changed_age_s > 0 else None),
            rows_past_checkpoint=max(0, int(st.rows) - int(st.checkpointed_rows)) if st is not None else 0,
            schema_version=s.schema_version,
        ))
    return SourceSnapshot(namespace, table, value, schema, "dis", ",".join(addresses), tuple(locs))


def snapshot_from_files(db_root: str, schema: TableSchema, value: str, now: float | None = None) -> SourceSnapshot:
    """The checkpointed locations of ``value`` under ``<db_root>/Intraday``, each with its schema
    version; ``schema`` (the schemas directory's) gains the versions stored for the table and
    becomes the newest of them (``disd.blocks.table_versions``)."""
    try:
        schema = table_versions(db_root, schema)
        locs = checkpointed_locations(db_root, schema, lambda v: v == value, now)
    except BlockSourceError as e:
        raise SourceError(str(e)) from None
    return SourceSnapshot(schema.namespace, schema.table, value, schema, "files", str(db_root), tuple(
        IntradayLocation(loc.key.internal_partition, loc.rows, dict(loc.files),
                         bytes_past_checkpoint=loc.bytes_past_checkpoint, checkpoint_age_s=loc.checkpoint_age_s,
                         schema_version=loc.schema_version)
        for loc in sorted(locs, key=lambda loc: loc.key.internal_partition)))
