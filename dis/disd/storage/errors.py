"""The storage engine's errors for a bad argument or a closed part, all under ``DisError``.

Each keeps the builtin base its callers catch (a bad value is a ``ValueError``, a file a
location does not have a ``KeyError``, a closed engine a ``RuntimeError``), as ``disd.errors``
asks.  Errors of a damaged or failed location are ``storage.location.LocationError``.
"""

from __future__ import annotations

from disd.errors import DisError

__all__ = ["NoLocationError", "StorageKeyError", "StorageStateError", "StorageValueError"]


class StorageValueError(DisError, ValueError):
    """An argument the storage engine cannot take (a size, an offset, columns that do not match
    their location's schema), or column bytes that are not what their file should hold."""


class StorageKeyError(DisError, KeyError):
    """A column file a location or a column set does not have."""


class StorageStateError(DisError, RuntimeError):
    """The engine is closed, or a C module the call needs was not built."""


class NoLocationError(DisError, LookupError):
    """No location of that key exists (and none was to be created)."""
