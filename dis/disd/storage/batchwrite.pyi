"""Stub of the C module batchwrite.c (setup.py builds it): many positional writes in one call."""

from typing import Sequence

from typing_extensions import Buffer

# writes: (fd, data, offset) each; (writes done, errno or 0)
def pwrite_all(writes: Sequence[tuple[int, Buffer, int]], /) -> tuple[int, int]: ...
