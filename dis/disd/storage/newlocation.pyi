"""Stub of the C module newlocation.c (setup.py builds it): a new location in one call."""

from os import PathLike
from typing import Any, Sequence

from typing_extensions import Buffer

_Path = str | bytes | PathLike[str] | PathLike[bytes]

# (fresh, opened): fresh True with [(fd, st_dev, st_ino), ...], False when the location was there,
# or (None, (op, errno, path)) when a step failed
def create(path: _Path, temp_name: _Path, record_name: _Path, record: Buffer,
           file_names: Sequence[_Path], /) -> tuple[bool | None, Any]: ...

# items: (path, temp_name, record_name, record, file_names, keep); one ``create`` answer each
def create_many(items: Sequence[tuple[_Path, _Path, _Path, Buffer, Sequence[_Path], bool]],
                at_once: int = 8, /) -> list[tuple[bool | None, Any]]: ...
