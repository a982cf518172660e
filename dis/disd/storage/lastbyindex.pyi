"""Stub of the C module lastbyindex.c (setup.py builds it): a last-by state's keys in a hash table."""

from typing import Any, Sequence, final

@final
class KeyIndex:
    # columns: (kind, width, sentinel) each
    # hash_bits: the bits of each hash kept (fewer only in tests: every comparison is made)
    def __init__(self, columns: Sequence[tuple[int, int, Any]], *, hash_bits: int = 64) -> None: ...
    # state: each key column's (validity, values, data, offset); batch: (rows, key columns) each;
    # (total, changed, rows): changed and rows are int64 buffers, or None with nothing changed
    def update(self, state: Sequence[Any], k: int, batch: Sequence[Any], n: int, max_keys: int,
               /) -> tuple[int, Any, Any]: ...
    def clear(self) -> None: ...
    @property
    def nbytes(self) -> int: ...
    def __len__(self) -> int: ...
