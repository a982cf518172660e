"""Tracked file handles: every column-file descriptor of the DIS goes through one factory.

Modelled on the seeds' TrackedFileHandleFactory.  A DIS with thousands of locations has more
column files than the process may keep open, so handles are cheap objects that hold a descriptor
only while the factory lets them:

* Handles are queued by open time.  Before opening a descriptor at capacity, cleanup runs: drop
  handles already closed, then close the least-recently-opened descriptors until usage is under
  90% of capacity, even those of handles still in use (they reopen on their next operation).
* A background cleanup does the same every 60 s.
* Reclaiming 20% of capacity within 60 s is "fast cycling": a warning and a metric, because the
  limit is too small for the working set and every operation is paying for an open().
* A handle whose descriptor was closed under it reopens transparently, and checks that the path
  still names the same file (device and inode).  A replaced or deleted column file raises
  FileIdentityError: writing to a new file at the old path would silently fork the data.

Each operation holds the handle's own lock while it uses the descriptor, and the reclaimer only
closes descriptors whose lock it can take without waiting, so a descriptor is never closed (and
its number reused) in the middle of someone's read or write.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from typing import Callable

import structlog

from disd import metrics

log = structlog.get_logger(__name__)

CLEANUP_INTERVAL_S = 60.0
FAST_CYCLE_WINDOW_S = 60.0
FAST_CYCLE_FRACTION = 0.2
TARGET_FRACTION = 0.9


class FileIdentityError(OSError):
    """The path of a tracked file now names another file, or nothing."""


class TrackedFile:
    """A column file: appends, positional reads, truncation and fsync through the factory."""

    def __init__(self, factory: "TrackedFileHandleFactory", path: str) -> None:
        self.factory = factory
        self.path = path
        self.lock = threading.RLock()
        self.fd: int | None = None
        self.identity: tuple[int, int] | None = None
        self.closed = False

    # The descriptor is valid only while self.lock is held.
    def _fd(self) -> int:
        if self.closed:
            raise ValueError(f"{self.path}: handle is closed")
        if self.fd is None:
            self.factory._reopen(self)
        return self.fd  # type: ignore[return-value]

    def size(self) -> int:
        with self.lock:
            return os.fstat(self._fd()).st_size

    def pwrite(self, data, offset: int) -> None:  # noqa: ANN001
        with self.lock:
            fd = self._fd()
            view = memoryview(data)
            while view:
                n = os.pwrite(fd, view, offset)
                view = view[n:]
                offset += n

    def pread(self, size: int, offset: int) -> bytes:
        with self.lock:
            return os.pread(self._fd(), size, offset)

    def truncate(self, size: int) -> None:
        with self.lock:
            os.ftruncate(self._fd(), size)

    def fsync(self) -> None:
        with self.lock:
            os.fsync(self._fd())

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.factory._release(self)


class TrackedFileHandleFactory:
    def __init__(self, max_open_files: int = 512, opener: Callable[[str, int], int] | None = None) -> None:
        if max_open_files < 2:
            raise ValueError("max_open_files must be at least 2")
        self.capacity = max_open_files
        self._opener = opener or (lambda path, flags: os.open(path, flags, 0o644))
        self._lock = threading.Lock()
        self._handles: "collections.OrderedDict[int, TrackedFile]" = collections.OrderedDict()  # by open time
        self._reclaims: collections.deque[float] = collections.deque()
        self._last_fast_warning = 0.0
        self.reclaimed_total = 0
        self.fast_cycling_total = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def open(self, path: str, create: bool = True) -> TrackedFile:
        """A handle for ``path``; the file is created now when ``create`` (so its identity is
        fixed from the start), else it must exist."""
        f = TrackedFile(self, path)
        if not create and not os.path.exists(path):
            raise FileNotFoundError(path)
        with f.lock:
            self._open_fd(f, create=True if create else False)
        return f

    @property
    def open_count(self) -> int:
        with self._lock:
            return len(self._handles)

    # -- internals, called with f.lock held ----------------------------------------------------
    def _reopen(self, f: TrackedFile) -> None:
        self._open_fd(f, create=False)

    def _open_fd(self, f: TrackedFile, create: bool) -> None:
        with self._lock:
            if len(self._handles) >= self.capacity:
                self._cleanup_locked(exclude=f)
            flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
            try:
                fd = self._opener(f.path, flags)
            except FileNotFoundError:
                raise FileIdentityError(f"{f.path}: column file was deleted while in use") from None
            st = os.fstat(fd)
            ident = (st.st_dev, st.st_ino)
            if f.identity is not None and ident != f.identity:
                os.close(fd)
                raise FileIdentityError(
                    f"{f.path}: column file was replaced while in use (inode {f.identity[1]} is now {ident[1]}); "
                    "never delete or replace column files of a running DIS"
                )
            f.identity = ident
            f.fd = fd
            self._handles[id(f)] = f
            metrics.OPEN_FILE_HANDLES.set(len(self._handles))

    def _release(self, f: TrackedFile) -> None:
        with self._lock:
            self._handles.pop(id(f), None)
            if f.fd is not None:
                os.close(f.fd)
                f.fd = None
            metrics.OPEN_FILE_HANDLES.set(len(self._handles))

    def _cleanup_locked(self, exclude: TrackedFile | None = None) -> int:
        """Close least-recently-opened descriptors until usage is under 90% of capacity."""
        for key, h in list(self._handles.items()):
            if h.closed or h.fd is None:
                self._handles.pop(key, None)
        target = int(self.capacity * TARGET_FRACTION)
        closed = 0
        for key, h in list(self._handles.items()):
            if len(self._handles) < target:
                break
            if h is exclude or not h.lock.acquire(blocking=False):
                continue  # busy right now: the next one goes instead
            try:
                if h.fd is not None:
                    os.close(h.fd)
                    h.fd = None
                self._handles.pop(key, None)
                closed += 1
            finally:
                h.lock.release()
        if closed:
            self._note_reclaims(closed)
        metrics.OPEN_FILE_HANDLES.set(len(self._handles))
        return closed

    def _note_reclaims(self, n: int) -> None:
        now = time.monotonic()
        self.reclaimed_total += n
        metrics.HANDLE_RECLAIMS.inc(n)
        self._reclaims.extend([now] * n)
        while self._reclaims and now - self._reclaims[0] > FAST_CYCLE_WINDOW_S:
            self._reclaims.popleft()
        if len(self._reclaims) >= FAST_CYCLE_FRACTION * self.capacity and now - self._last_fast_warning > FAST_CYCLE_WINDOW_S:
            self._last_fast_warning = now
            self.fast_cycling_total += 1
            metrics.HANDLE_FAST_CYCLING.inc()
            log.warning("file handles cycling fast", reclaimed_in_60s=len(self._reclaims), max_open_files=self.capacity,
                        hint="raise storage.max_open_files (and LimitNOFILE)")

    def cleanup(self) -> int:
        with self._lock:
            return self._cleanup_locked()

    def start(self, interval_s: float = CLEANUP_INTERVAL_S) -> None:
        def loop() -> None:
            while not self._stop.wait(interval_s):
                with self._lock:
                    if len(self._handles) >= int(self.capacity * TARGET_FRACTION):
                        self._cleanup_locked()
                    else:
                        for key, h in list(self._handles.items()):
                            if h.closed:
                                self._handles.pop(key, None)

        self._thread = threading.Thread(target=loop, name="file-handle-cleanup", daemon=True)
        self._thread.start()

    def close_all(self) -> None:
        self._stop.set()
        with self._lock:
            for h in list(self._handles.values()):
                with h.lock:
                    if h.fd is not None:
                        os.close(h.fd)
                        h.fd = None
            self._handles.clear()
            metrics.OPEN_FILE_HANDLES.set(0)
