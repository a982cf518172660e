"""The storage engine: decoded rows in, column files, flush, checkpoint and recovery out.

See docs/storage-format.md for the on-disk layout.
"""

from disd.storage.checkpoint import CheckpointError, CheckpointRecord, SourcePosition
from disd.config import ImportConfig, StorageConfig
from disd.storage.engine import StorageEngine, UnknownTableError, location_path
from disd.storage.filehandles import FileIdentityError, TrackedFileHandleFactory
from disd.storage.fsio import FileSystem, OsFileSystem
from disd.storage.columns import decode_column, decode_table
from disd.storage.location import Location, LocationError

__all__ = [
    "CheckpointError",
    "CheckpointRecord",
    "FileIdentityError",
    "FileSystem",
    "OsFileSystem",
    "ImportConfig",
    "decode_column",
    "decode_table",
    "Location",
    "LocationError",
    "SourcePosition",
    "StorageConfig",
    "StorageEngine",
    "TrackedFileHandleFactory",
    "UnknownTableError",
    "location_path",
]
