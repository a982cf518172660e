"""A location's write state: the bytes of its column files not written yet, its row counts, its
open transaction and its resume point, in one object that the compiled ingest path can work on
without the interpreter.

Why an object of its own: the chunks of a ``Multiplex`` request are scanned, decoded and
appended in C with the interpreter's lock given up (``disd.storage.ingestcore``), and code that
runs without that lock may touch no Python object.  So what a chunk changes (the buffers, the
written and committed rows and sizes, the transaction flag, the resume point) lives here, as C
data in ``ingestcore.WriteState``, or as Python data in ``PyWriteState``, the reference: the same
methods, the same results, chosen in one place (``new_write_state``) and held to each other by
tests/storage/test_ingest_differential.py.  ``storage.location`` owns a state and does the rest
(recovery, flush, checkpoint, errors), ``storage.ingest`` feeds it chunks.

Nothing here writes to a file.  Appends and rollbacks only change memory; the cuts and writes
they make due are taken by the location and made through its file system (``take_io``, or in C
``ingestcore.write_out``), the block-aligned write rule (docs/storage-format.md, "Writing"): a
file's buffered bytes go out up to the next block boundary and then in whole blocks as soon as
they fill them, the rest at a flush (a write may be 1 byte), so no write exceeds a block or
crosses a block boundary.
"""

from __future__ import annotations

import os
from typing import Protocol, Sequence, TypeGuard, cast

from disd.schema import ColumnType, TableSchema
from disd.storage.errors import StorageStateError, StorageValueError

try:  # built by setup.py when a C compiler is there; without it, PyWriteState everywhere
    from disd.storage import ingestcore as ingestcore  # (re-exported: storage.ingest calls it)
except ImportError:  # pragma: no cover - exercised only by a build without a C compiler
    ingestcore = None  # type: ignore[assignment]  # (mypy cannot type "a module or None")

#: the column types as the compiled state numbers them (ingestcore.h)
TYPE_CODES = {
    ColumnType.BOOL: 0, ColumnType.BYTE: 1, ColumnType.SHORT: 2, ColumnType.INT: 3, ColumnType.LONG: 4,
    ColumnType.FLOAT: 5, ColumnType.DOUBLE: 6, ColumnType.CHAR: 7, ColumnType.TIMESTAMP: 8, ColumnType.STRING: 9,
}

#: ``DIS_INGEST_CORE=python`` makes every new location use the reference (a measurement, a test)
_FORCE_PYTHON = os.environ.get("DIS_INGEST_CORE", "").lower() == "python"

Source = tuple[str | None, int, int]  # (file_name | None, offset, skip_rows)
Cut = tuple[int, int]  # (file index, size)
Write = tuple[int, memoryview, int]  # (file index, bytes-like, offset)


class WriteState(Protocol):
    """What a location keeps of its column files and rows in memory (file ``i`` is the schema's
    ``i``-th column file, ``columns.schema_file_names``)."""

    txn_open: bool
    source: Source

    @property
    def written_rows(self) -> int: ...

    @property
    def committed_rows(self) -> int: ...

    @property
    def nfiles(self) -> int: ...

    @property
    def buffered(self) -> int: ...

    def reset(self, rows: int, sizes: Sequence[int], source: Source) -> None:
        """Everything at a checkpoint: these rows and file sizes, nothing buffered, nothing to cut."""

    def append(self, parts: Sequence[object], rows: int) -> None:
        """Append each file's bytes (one part a file) and count ``rows`` more written."""

    def commit(self, rows: int, sizes: Sequence[int]) -> None:
        """The committed rows are now ``rows``, the files' sizes at them ``sizes``."""

    def rollback(self) -> int:
        """Cut every file back to its committed size; the rows cut."""

    def size(self, i: int) -> int: ...

    def sizes(self) -> tuple[int, ...]: ...

    def committed_sizes(self) -> tuple[int, ...]: ...

    def needs_io(self, flush: bool) -> bool:
        """Whether cuts or writes are due (with ``flush``, partial blocks count)."""

    def take_io(self, flush: bool) -> tuple[list[Cut], list[Write]]:
        """The cuts and writes due, the state advanced as if they were made."""


def new_write_state(schema: TableSchema, block_size: int, compiled: bool | None = None) -> WriteState:
    """The write state of a location written in ``schema``: the compiled one when it is built
    (and ``compiled`` is not False), else the reference."""
    kinds = bytes(TYPE_CODES[c.type] for c in schema.columns)
    use_c = ingestcore is not None and not _FORCE_PYTHON if compiled is None else compiled
    if use_c:
        if ingestcore is None:
            raise StorageStateError("disd.storage.ingestcore was not built (no C compiler?)")
        return ingestcore.WriteState(kinds, block_size)
    return PyWriteState(kinds, block_size)


def is_compiled(state: object) -> TypeGuard[ingestcore.WriteState]:
    return ingestcore is not None and isinstance(state, ingestcore.WriteState)


class _File:
    __slots__ = ("disk", "buf", "truncate", "committed")

    def __init__(self) -> None:
        self.disk = 0  # the file's size as far as the writes made so far go
        self.buf = bytearray()  # bytes [disk, disk + len(buf))
        self.truncate = -1  # a cut still to make before the next write, or -1
        self.committed = 0  # the file's size at the committed rows


class PyWriteState:
    """The reference write state, in Python (``ingestcore.WriteState`` is the same in C)."""

    def __init__(self, kinds: bytes, block_size: int) -> None:
        if block_size < 1:
            raise StorageValueError("block_size must be positive")
        self.block = block_size
        self.nfiles = sum(2 if k == TYPE_CODES[ColumnType.STRING] else 1 for k in kinds)
        self._files = [_File() for _ in range(self.nfiles)]
        self.written_rows = self.committed_rows = 0
        self.txn_open = False
        self.source: Source = (None, 0, 0)

    @property
    def buffered(self) -> int:
        return sum(len(f.buf) for f in self._files)

    def reset(self, rows: int, sizes: Sequence[int], source: Source) -> None:
        if len(sizes) != self.nfiles:
            raise StorageValueError(f"{self.nfiles} sizes expected")
        for f, size in zip(self._files, sizes):
            f.disk = f.committed = size
            f.buf = bytearray()
            f.truncate = -1
        self.written_rows = self.committed_rows = rows
        self.txn_open = False
        self.source = cast(Source, tuple(source))  # a list too, as the compiled state takes

    def append(self, parts: Sequence[object], rows: int) -> None:
        if len(parts) != self.nfiles:
            raise StorageValueError(f"{self.nfiles} parts expected")
        for f, part in zip(self._files, parts):
            # a part is bytes-like (numpy arrays among them), which numpy's stubs declare (as a
            # Buffer) only for Python >= 3.12
            f.buf += memoryview(part).cast("B")  # type: ignore[arg-type]
        self.written_rows += rows

    def commit(self, rows: int, sizes: Sequence[int]) -> None:
        for f, size in zip(self._files, sizes):
            f.committed = size
        self.committed_rows = rows

    def rollback(self) -> int:
        rolled = self.written_rows - self.committed_rows
        for f in self._files:
            if f.committed >= f.disk:
                del f.buf[f.committed - f.disk:]
            else:
                f.truncate = f.committed if f.truncate < 0 else min(f.truncate, f.committed)
                f.disk = f.committed
                f.buf = bytearray()
        self.written_rows = self.committed_rows
        self.txn_open = False
        return rolled

    def size(self, i: int) -> int:
        f = self._files[i]
        return f.disk + len(f.buf)

    def sizes(self) -> tuple[int, ...]:
        return tuple(f.disk + len(f.buf) for f in self._files)

    def committed_sizes(self) -> tuple[int, ...]:
        return tuple(f.committed for f in self._files)

    def needs_io(self, flush: bool) -> bool:
        bs = self.block
        return any(f.truncate >= 0 or (len(f.buf) > 0 if flush else len(f.buf) >= bs - f.disk % bs)
                   for f in self._files)

    def take_io(self, flush: bool) -> tuple[list[Cut], list[Write]]:
        cuts: list[Cut] = []
        writes: list[Write] = []
        bs = self.block
        for i, f in enumerate(self._files):
            if f.truncate >= 0:
                cuts.append((i, f.truncate))
                f.truncate = -1
            data, pos, disk = f.buf, 0, f.disk
            view = memoryview(data)
            while len(data) - pos >= (limit := bs - disk % bs):
                writes.append((i, view[pos:pos + limit], disk))
                pos += limit
                disk += limit
            if flush and pos < len(data):
                writes.append((i, view[pos:], disk))
                disk += len(data) - pos
                pos = len(data)
            if pos:
                f.buf = bytearray(view[pos:])  # the taken bytes stay where the writes' views see them
                f.disk = disk
        return cuts, writes
