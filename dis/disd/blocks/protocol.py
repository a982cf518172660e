"""The block seam's record and interface: what every source of intraday column bytes serves.

A reader needs two things from wherever the column files are: the locations of a table with
their sizes (``LocationSnapshot``: rows and column file sizes that cover those rows: exactly at a
checkpoint, and at a published size perhaps a flush's rows more, as a DIS reads the rows first),
and byte ranges of a column file below those sizes.  ``BlockSource`` is that interface and
nothing more (``disd.blocks`` says why it is enough); the errors a source raises are here too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

from disd.config import DEFAULT_BLOCK_SIZE_BYTES
from disd.errors import DisError
from disd.names import LocationKey
from disd.rpc.keys import key_from_proto
from disd.rpc.v1 import dis_pb2

#: Which column partitions (values, e.g. dates) to list; None lists them all.
Wanted = Callable[[str], bool]


@dataclass(frozen=True)
class LocationSnapshot:
    """A location at one published size: ``rows`` and the column file sizes covering them.

    ``address`` says where it was listed: a DIS's ``host:port``, or ``file:<db_root>`` for a
    location listed from its column files."""

    key: LocationKey
    rows: int
    files: dict[str, int] = field(hash=False)
    block_size: int
    address: str
    # The schema version the location's files are written in (0: not said, the table's newest).
    schema_version: int = 0

    @classmethod
    def from_msg(cls, m: dis_pb2.LocationInfo, address: str) -> LocationSnapshot:
        return cls(key_from_proto(m.key), int(m.rows), {f.name: int(f.size) for f in m.files},
                   int(m.block_size) or DEFAULT_BLOCK_SIZE_BYTES, address, int(m.schema_version))


class BlockSourceError(DisError):
    """A source cannot list or read: the message says what and where (an unreachable DIS, a
    refused credential, a column file shorter than its snapshot, a damaged checkpoint)."""


class DisClientError(BlockSourceError):
    """A failure a user can act on: unreachable DIS, unknown table, bad argument."""


class ColumnFileError(BlockSourceError):
    """Column files that cannot serve a snapshot: missing, shorter than their sizes, or a
    checkpoint that does not match the files or the schema."""


Range = tuple[str, int, int]
"""(column file name, start, stop): bytes [start, stop) of a column file."""


class BlockSource(Protocol):
    """Where the column bytes of locations come from (see the module docstring).

    A source is used by one thread at a time and holds what it opens (channels, descriptors)
    until ``close``."""

    def locations(self, namespace: str, table: str, wanted: Wanted | None = None) -> list[LocationSnapshot]:
        """The locations of ``namespace.table`` (those whose column partition ``wanted`` accepts),
        each at a size whose rows never change: published by a DIS, or checkpointed."""
        ...

    def read_range(self, snap: LocationSnapshot, file: str, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of a column file of ``snap``, never past its size in ``snap``
        (a shorter answer when ``stop`` is beyond it; an error when the source holds less)."""
        ...

    def read_ranges(self, snap: LocationSnapshot, ranges: Sequence[Range]) -> list[bytes]:
        """``read_range`` of each ``(file, start, stop)`` of ``ranges``, in order.  What a reader
        of a location's rows calls: a source that pays per request (a DIS: per call) serves them
        all in one."""
        ...

    def close(self) -> None:
        """Release channels and file descriptors; the source is not used afterwards."""
        ...

