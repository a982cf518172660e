"""What a scan is planned from: the table's schema and its locations, through the block seam.

Both readers of the ``dis`` source plan here — ``disd.spark.source`` (a DIS) and
``disd.spark.ondisk`` (the database root, whose ``all`` mode may also list a DIS) — so the
messages a user sees for an unreachable DIS, refused credentials or an unknown table are the
same whichever option brought them there.  Locations come from a ``disd.blocks.BlockSource``:
the DIS's ``Client`` (published sizes), or the column files (checkpointed sizes).
"""

from __future__ import annotations

from typing import Callable

from disd.blocks import BlockSource, BlockSourceError, LocationSnapshot, open_block_source
from disd.client import Client, DisClientError
from disd.schema import TableSchema
from disd.spark.errors import DisSourceError
from disd.spark.options import SourceOptions


def connect(o: SourceOptions) -> Client:
    """A client of the DIS the options name (nothing is called until it is used)."""
    return Client(o.routing_value(), o.security.client_security(), o.timeout_s, o.retry_s)


def explain(e: Exception, o: SourceOptions) -> DisSourceError:
    """A client or block-source failure, with the options to check."""
    msg = str(e)
    if "unreachable" in msg:
        hint = ("check option 'routing' and that every DIS in it runs" if o.routing
                else "check option 'address' and that `dis serve` runs there")
        return DisSourceError(f"{msg} — {hint}")
    if "refused the credentials" in msg:
        return DisSourceError(f"{msg} — check options 'token'/'tokenFile', 'ca', 'cert' and 'key'")
    return DisSourceError(msg)


def table_schema(client: Client, o: SourceOptions) -> TableSchema:
    """The table's schema from its DIS, with an error that lists the tables there is."""
    try:
        return client.schema(o.namespace, o.table)
    except DisClientError as e:
        if str(e).startswith("unknown table") or str(e).startswith("no DIS instance"):
            try:
                known = ", ".join(s.key for s in client.tables()) or "none"
            except DisClientError:
                known = "?"
            raise DisSourceError(
                f"unknown table {o.namespace}.{o.table} at {o.where} (tables there: {known}); "
                "check options 'namespace' and 'table'") from None
        raise explain(e, o) from None


def list_locations(source: BlockSource, o: SourceOptions,
                   wanted: Callable[[str], bool] | None = None) -> list[LocationSnapshot]:
    """The locations of the options' table that ``wanted`` admits (by column partition)."""
    try:
        snaps = source.locations(o.namespace, o.table, wanted)
    except BlockSourceError as e:
        raise explain(e, o) from None
    return [s for s in snaps if s.key.namespace == o.namespace and s.key.table == o.table]


def file_locations(o: SourceOptions, table: TableSchema,
                   wanted: Callable[[str], bool] | None = None) -> list[LocationSnapshot]:
    """The checkpointed intraday locations under option ``dbRoot`` (tasks then read the files
    directly: ``ReadSpec.db_root``)."""
    source = open_block_source(db_root=o.db_root, tables=[table])
    try:
        return list_locations(source, o, wanted)
    finally:
        source.close()
