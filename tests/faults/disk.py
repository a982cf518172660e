"""A test double of the disk under the storage engine's FileSystem seam (``disd.storage.fsio``).

``FaultyDisk`` does the real operation on the real files (the engine under test runs exactly as
in production) and, around it:

* records every operation that changes what a crash could leave (open, write, truncate, fsync,
  rename, unlink, mkdir, directory fsync, close) in ``trace``, in call order, with the written
  bytes copied, plus the test's own ``mark``s (the engine's row counts between steps), so
  ``crashsim.DiskModel`` can replay it and cut the power after any operation;
* injects faults: an operation whose rule matches raises ``OSError(errno)`` instead of running
  (or, for a write with ``short``, first writes half of the data, as a kernel running out of
  space does).  A failed fsync is recorded as ``fsync_failed``: Linux then drops the dirty pages
  it could not write (marks them clean), which the model reproduces.

Reads (``stat``, ``fstat``, ``pread``) pass through unrecorded: they change nothing a crash
could keep.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from dataclasses import dataclass, field
from typing import Any

from disd.server import daemon
from disd.storage.fsio import OsFileSystem


@dataclass(frozen=True)
class Op:
    """One recorded operation.  ``path`` is absolute; ``fd`` the descriptor it acted on."""

    kind: str  # open close pwrite ftruncate fsync fsync_failed rename unlink mkdir fsync_dir mark
    path: str | None = None
    fd: int | None = None
    flags: int = 0
    offset: int = 0
    size: int = 0
    data: bytes = b""
    dst: str | None = None
    note: dict[str, Any] | None = None


@dataclass
class Fault:
    """Fail matching operations with ``errno``.

    ``op`` is a FileSystem method name (``pwrite``, ``fsync``, ``rename``, ``fsync_dir``, ...);
    ``path_contains`` narrows it to paths containing the text (for descriptor operations, the
    path the descriptor was opened with); ``skip`` lets that many matching calls through first;
    ``times`` is how many calls fail (None: until removed).  ``short``: a failing write first
    writes half of its data and returns the short count; the next call fails."""

    op: str
    errno: int
    path_contains: str | None = None
    skip: int = 0
    times: int | None = None
    short: bool = False
    hits: int = 0  # calls that failed (or were cut short)
    seen: int = 0  # matching calls seen
    _short_pending: bool = field(default=False, repr=False)

    def matches(self, op: str, path: str | None) -> bool:
        return op == self.op and (self.path_contains is None or (path is not None and self.path_contains in path))

    def exhausted(self) -> bool:
        return self.times is not None and self.hits >= self.times


class FaultyDisk(OsFileSystem):
    """The real file system, recorded and with faults injected on demand (see the module doc)."""

    def __init__(self, record: bool = True, sync: bool = False) -> None:
        self.record = record
        self.sync = sync
        self.trace: list[Op] = []
        self.faults: list[Fault] = []
        self._paths: dict[int, str] = {}  # open descriptors -> the path they were opened with
        self._lock = threading.RLock()

    # -- faults -----------------------------------------------------------------------------
    def inject(self, op: str, errno: int, **kw: Any) -> Fault:
        f = Fault(op, errno, **kw)
        with self._lock:
            self.faults.append(f)
        return f

    def heal(self) -> None:
        """Remove every fault: space is back, the disk answers again."""
        with self._lock:
            self.faults.clear()

    def _fault(self, op: str, path: str | None) -> Fault | None:
        with self._lock:
            for f in self.faults:
                if f.matches(op, path) and not f.exhausted():
                    f.seen += 1
                    if f.seen > f.skip:
                        f.hits += 1
                        return f
        return None

    @staticmethod
    def _raise(f: Fault, path: str | None) -> None:
        raise OSError(f.errno, os.strerror(f.errno), path)

    def _rec(self, op: Op) -> None:
        if self.record:
            self.trace.append(op)

    def mark(self, **note: Any) -> None:
        """Record the test's own observation (row counts) between engine steps."""
        with self._lock:
            self._rec(Op("mark", note=note))

    # -- descriptors --------------------------------------------------------------------------
    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        f = self._fault("open", path)
        if f:
            self._raise(f, path)
        with self._lock:
            fd = os.open(path, flags, mode)
            self._paths[fd] = path
            self._rec(Op("open", path=path, fd=fd, flags=flags))
            return fd

    def close(self, fd: int) -> None:
        with self._lock:
            path = self._paths.pop(fd, None)
            os.close(fd)
            self._rec(Op("close", path=path, fd=fd))

    def pwrite(self, fd: int, data, offset: int) -> int:
        path = self._paths.get(fd)
        f = self._fault("pwrite", path)
        if f and f.short and not f._short_pending and len(data) > 1:  # noqa: SLF001 - the fault's own state, kept by the failing disk
            f._short_pending = True  # noqa: SLF001 - the fault's own state, kept by the failing disk
            f.hits -= 1  # a short write is not yet the failure
            data = memoryview(data)[: len(data) // 2]
        elif f:
            self._raise(f, path)
        with self._lock:
            n = os.pwrite(fd, data, offset)
            self._rec(Op("pwrite", path=path, fd=fd, offset=offset, data=bytes(memoryview(data)[:n])))
            return n

    def ftruncate(self, fd: int, size: int) -> None:
        path = self._paths.get(fd)
        f = self._fault("ftruncate", path)
        if f:
            self._raise(f, path)
        with self._lock:
            os.ftruncate(fd, size)
            self._rec(Op("ftruncate", path=path, fd=fd, size=size))

    def fsync(self, fd: int) -> None:
        path = self._paths.get(fd)
        f = self._fault("fsync", path)
        with self._lock:
            if f:
                # The kernel could not write the dirty pages back, and now calls them clean: the
                # bytes stay readable in the page cache but are not on the disk, and the next
                # fsync has nothing to write.
                self._rec(Op("fsync_failed", path=path, fd=fd))
                self._raise(f, path)
            # By default no real fsync: the trace says what is durable; the real disk's
            # durability is not what these tests measure, and skipping it keeps hundreds of
            # crash points fast.
            if self.sync:
                os.fsync(fd)
            self._rec(Op("fsync", path=path, fd=fd))

    # -- names ---------------------------------------------------------------------------------
    def rename(self, src: str, dst: str) -> None:
        f = self._fault("rename", dst)
        if f:
            self._raise(f, dst)
        with self._lock:
            os.rename(src, dst)
            self._rec(Op("rename", path=src, dst=dst))

    def unlink(self, path: str) -> None:
        f = self._fault("unlink", path)
        if f:
            self._raise(f, path)
        with self._lock:
            os.unlink(path)
            self._rec(Op("unlink", path=path))

    def mkdir(self, path: str) -> None:
        f = self._fault("mkdir", path)
        if f:
            self._raise(f, path)
        with self._lock:
            os.mkdir(path, 0o755)
            self._rec(Op("mkdir", path=path))

    def fsync_dir(self, path: str) -> None:
        f = self._fault("fsync_dir", path)
        if f:
            self._raise(f, path)
        with self._lock:
            if self.sync:
                super().fsync_dir(path)
            self._rec(Op("fsync_dir", path=path))


def engines_on(monkeypatch, disk: FaultyDisk | None, retry_initial_ms: int = 50, retry_max_ms: int = 300) -> None:
    """Every DIS server the test starts in process (``disd.server.daemon``) runs its storage
    engine on ``disk`` (None: the real one) and reopens a location in error after
    ``retry_initial_ms``, doubling up to ``retry_max_ms``: soon enough for a test to see."""
    real = daemon.StorageEngine

    def engine(db_root, schemas, storage, *args, **kw):
        fast = dataclasses.replace(storage, io_retry_initial_ms=retry_initial_ms, io_retry_max_ms=retry_max_ms)
        if disk is not None:
            kw["fs"] = disk
        return real(db_root, schemas, fast, *args, **kw)

    monkeypatch.setattr(daemon, "StorageEngine", engine)
