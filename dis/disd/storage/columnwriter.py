"""A column file being appended to, with its one block buffer.

Split from ``storage.location`` because the block-aligned write rule is a concept of its own
(docs/storage-format.md, Buffers): the location decides *what* to append and when to flush; the
writer decides *how* the bytes reach the file.
"""

from __future__ import annotations

from typing import Sequence

from disd.storage import metrics
from disd.storage.filehandles import TrackedFile, pwrite_files


class ColumnFileWriter:
    """A column file with its block buffer.

    The buffer holds the bytes between the file's on-disk end and the next multiple of the block
    size, so every full write is one aligned block: ``[k*B, (k+1)*B)``.  Appends fill the buffer
    and write it when it reaches the boundary; a run of appended bytes that covers whole blocks
    is written from the caller's memory, a block per call.  A flush (``flush_all``, for all of a
    location's writers at once) writes a partial buffer (a write may be 1 byte); the next write
    then completes that block.  No write exceeds the block
    size, and each write's size is recorded in ``dis_write_size_bytes``."""

    def __init__(self, handle: TrackedFile, disk_size: int, block_size: int) -> None:
        self.handle = handle
        self.disk_size = disk_size
        self.block_size = block_size
        self.buf = bytearray()

    @property
    def size(self) -> int:
        return self.disk_size + len(self.buf)

    def _write(self, data) -> None:  # noqa: ANN001
        n = self.handle.pwrite(data, self.disk_size)
        self.disk_size += n
        metrics.WRITE_SIZE.observe(n)

    def append(self, data) -> None:  # noqa: ANN001
        mv = memoryview(data).cast("B")
        bs = self.block_size
        while len(mv):
            limit = bs - self.disk_size % bs  # bytes from the on-disk end to the next block boundary
            if not self.buf and len(mv) >= limit:
                self._write(mv[:limit])
                mv = mv[limit:]
                continue
            take = min(limit - len(self.buf), len(mv))
            self.buf += mv[:take]
            mv = mv[take:]
            if len(self.buf) == limit:
                full, self.buf = self.buf, bytearray()
                self._write(full)

    def truncate_to(self, size: int) -> None:
        """Cut the file (buffer included) back to ``size`` bytes."""
        if size >= self.disk_size:
            del self.buf[size - self.disk_size :]
        else:
            self.handle.truncate(size)
            self.disk_size = size
            self.buf = bytearray()


def flush_all(writers: Sequence[ColumnFileWriter]) -> None:
    """Write each writer's buffer, with one operation of the file system for all of them
    (``filehandles.pwrite_files``): a location's flush gives up the interpreter's lock once, not
    once per column file.  After a failed write the writers are as flushing them one by one
    would leave them: those before it flushed, its own buffer taken, the rest untouched; the
    OSError is raised (and the location that flushed fails, ``Location._flush_locked``)."""
    todo = [w for w in writers if w.buf]
    if not todo:
        return
    data = [w.buf for w in todo]
    done = 0
    try:
        pwrite_files([(w.handle, d, w.disk_size) for w, d in zip(todo, data)])
        done = len(todo)
    except OSError as e:
        written = getattr(e, "writes_done", None)  # None: no write was made (a descriptor's reopen failed)
        if written is not None:
            done = written
            todo[done].buf = bytearray()
        raise
    finally:
        for w, d in zip(todo[:done], data):
            w.buf = bytearray()
            w.disk_size += len(d)
            metrics.WRITE_SIZE.observe(len(d))
