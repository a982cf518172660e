"""Stub of the C module rowencode.c (setup.py builds it): a frame's rows encoded for the logger."""

from typing import Any, Sequence

from typing_extensions import Buffer

# columns: (kind, width, validity, values, data, offset) each; the frame's payload
def encode(flags: Buffer, columns: Sequence[tuple[int, int, Any, Any, Any, int]], row_size: int, /) -> bytes: ...
