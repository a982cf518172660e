"""The block seam: where every reader of intraday column data gets its bytes.

A reader (``disd.client.Client.read_table``, the Spark source's planning and tasks, a merge)
needs two things from wherever the column files are: the locations of a table with their sizes
(``LocationSnapshot``: rows and column file sizes that cover those rows: exactly at a checkpoint,
and at a published size perhaps a flush's rows more, as a DIS reads the rows first), and byte ranges
of a column file below those sizes.  ``BlockSource`` is that interface and nothing more; turning
the bytes into Arrow arrays is ``disd.storage.columns``'s job alone (``read_location``).

Why this is enough: column files only grow, and the bytes of rows ``[0, n)`` never change once
published (docs/storage-format.md).  So a snapshot pins what a read returns, and *any* source
that serves the bytes below a snapshot's sizes serves the same bytes.  Implementations can differ
in everything else:

* ``GrpcBlocks`` — DISes over gRPC: locations as the owning DIS lists them (published sizes,
  ``routing`` says which DIS, or which set of hot replicas, owns a table), a location's ranges
  fetched as 64 KiB blocks in one ``ReadRanges`` stream (a ``ReadBlocks`` stream or ``ReadBlock``
  calls per range against an older DIS), over channels with ``ClientSecurity``.  A read whose
  replica goes down continues on another replica that has published the bytes it reads
  (docs/replicas.md).
* ``LocalColumnFiles`` — the column files under a database root, read with ``pread``: on the DIS
  host or a shared mount.  It serves snapshots listed by a DIS (published sizes: Spark's
  ``dbRoot`` option) and lists locations itself at their ``table.size`` checkpoints (no DIS
  needed: the rows a checkpoint covers never change either).

``open_block_source`` is the one place that picks an implementation.  Later sources (a caching
proxy) plug in here: they take the same snapshots and must return the same bytes.

The modules, one concept each (import from ``disd.blocks``; the modules may change):

* ``protocol`` — ``LocationSnapshot``, ``BlockSource``, ``Range`` and the seam's errors;
* ``projection`` — ``read_location`` (a location's rows from a source, in the reader's version)
  and ``version_projection``;
* ``failover`` — a DIS down or restarting as a reader sees it: ``restarting``, ``explain``, the
  retry pauses, ``replica_order``;
* ``subscription`` — ``Subscription``, one DIS's stream of published snapshots;
* ``blockcalls`` — the three read calls (``ReadRanges``, ``ReadBlocks``, ``ReadBlock``) asked of
  one DIS, with the fall-backs for older DISes;
* ``grpcsource`` — ``GrpcBlocks``: which DIS or replica to ask, listing, failover, retries;
* ``localfiles`` — ``LocalColumnFiles`` and the locations at their checkpoints
  (``checkpointed_locations``).
"""

from __future__ import annotations

from typing import Sequence

from disd.blocks.blockcalls import READ_AHEAD
from disd.blocks.failover import (
    DEFAULT_RETRY_S,
    DOWN_S,
    RETRY_INITIAL_S,
    RETRY_MAX_S,
    explain,
    replica_order,
    restarting,
)
from disd.blocks.grpcsource import GrpcBlocks
from disd.blocks.localfiles import (
    CheckpointedLocation,
    LocalColumnFiles,
    checkpointed_locations,
    record_version,
    table_versions,
)
from disd.blocks.projection import read_location, version_projection
from disd.blocks.protocol import (
    BlockSource,
    BlockSourceError,
    ColumnFileError,
    DisClientError,
    LocationSnapshot,
    Range,
    Wanted,
)
from disd.blocks.subscription import Subscription
from disd.routing import Routing, resolve
from disd.schema import TableSchema
from disd.security import ClientSecurity

__all__ = [
    "DEFAULT_RETRY_S", "DOWN_S", "READ_AHEAD", "RETRY_INITIAL_S", "RETRY_MAX_S",
    "BlockSource", "BlockSourceError", "CheckpointedLocation", "ColumnFileError", "DisClientError", "GrpcBlocks",
    "LocalColumnFiles", "LocationSnapshot", "Range", "Subscription", "Wanted",
    "checkpointed_locations", "explain", "open_block_source", "read_location", "record_version", "replica_order",
    "restarting", "table_versions", "version_projection",
]


def open_block_source(*, db_root: str | None = None, address: str | None = None,
                      routing: str | Routing | None = None, security: ClientSecurity | None = None,
                      timeout_s: float = 30.0, tables: Sequence[TableSchema] = (),
                      origin: str | None = None, retry_s: float = DEFAULT_RETRY_S) -> BlockSource:
    """The block source for a read: the column files under ``db_root`` when it is given (they
    must be the files of the DIS that listed the snapshots, or be listed by the source itself:
    ``tables`` gives their schemas, ``origin`` names the root in errors), else the DIS at
    ``address`` (or the instances of ``routing``) over gRPC with ``security``, riding out a DIS
    that is unreachable for up to ``retry_s`` seconds."""
    if db_root is not None:
        return LocalColumnFiles(db_root, tables, origin)
    return GrpcBlocks(resolve(address, routing), security, timeout_s, retry_s)

