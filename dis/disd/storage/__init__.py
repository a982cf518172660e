"""The storage engine: decoded rows in, column files, flush, checkpoint and recovery out.

See docs/storage-format.md for the on-disk layout.
"""

from disd.storage.checkpoint import CheckpointRecord, SourcePosition
from disd.storage.engine import ImportConfig, StorageConfig, StorageEngine, UnknownTableError, location_path
from disd.storage.filehandles import FileIdentityError, TrackedFileHandleFactory
from disd.storage.location import Location, LocationError

__all__ = [
    "CheckpointRecord",
    "FileIdentityError",
    "ImportConfig",
    "Location",
    "LocationError",
    "SourcePosition",
    "StorageConfig",
    "StorageEngine",
    "TrackedFileHandleFactory",
    "UnknownTableError",
    "location_path",
]
