"""Tracked file handles: every column-file descriptor of the DIS goes through one factory.

Modelled on the seeds' TrackedFileHandleFactory.  A DIS with thousands of locations has more
column files than the process may keep open, so handles are cheap objects that hold a descriptor
only while the factory lets them:

* Handles are queued by open time (the time their current descriptor was opened).
* Before opening a descriptor at capacity, cleanup runs: drop handles already closed, then close
  the least-recently-opened descriptors until usage is under 90% of capacity, even those of
  handles still in use (they reopen on their next operation).
* A background cleanup does the same every 60 s (``start``).
* Reclaiming 20% of capacity within 60 s is "fast cycling": a warning and a metric, because the
  limit is too small for the working set and operations keep paying for ``open()``.
* A handle whose descriptor was closed under it reopens transparently, and checks that the path
  still names the same file (device and inode).  A replaced or deleted column file raises
  FileIdentityError: writing to a new file at the old path would silently fork the data.

Concurrency.  Each operation holds the handle's own lock while it uses the descriptor, and the
reclaimer only closes descriptors whose lock it can take without waiting, so a descriptor is
never closed (and its number reused) in the middle of someone's read or write.  ``fsync`` is the
exception that must not hold the lock (it can take long, and ingestion keeps appending to the
same file meanwhile): it *pins* the descriptor instead, and the reclaimer skips pinned ones.
So the only descriptors cleanup cannot close are those in the middle of an operation right now;
with a bounded number of threads that is a handful, which is why the target is 90%, not 100%.

Lock order: a handle's lock, then the factory's lock.  The factory never waits for a handle's
lock while holding its own.

Every call on a descriptor goes through the factory's ``FileSystem`` (``storage.fsio``), the
real one unless a test puts a recording or failing disk underneath.
"""

from __future__ import annotations

import collections
import contextlib
import os
import resource
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import structlog

from disd.errors import DisError
from disd.storage import metrics
from disd.storage.fsio import OS, FileSystem, pwrite_all, pwrite_whole
from disd.storage.errors import StorageValueError

log = structlog.get_logger(__name__)

CLEANUP_INTERVAL_S = 60.0
FAST_CYCLE_WINDOW_S = 60.0
FAST_CYCLE_FRACTION = 0.2
TARGET_FRACTION = 0.9


#: descriptors a DIS keeps for what is not a column file: a socket per gRPC worker and per
#: block-endpoint connection (2 x ``server.max_workers``), and this margin (logs, the block cache's
#: reads, the metrics endpoint, a checkpoint's record and directory)
NON_COLUMN_MARGIN = 256
#: ``server.max_workers``' default (``disd.config.DisConfig``), for an engine made without a server
DEFAULT_WORKERS = 256


def max_open_files_for(nofile: int, max_workers: int = DEFAULT_WORKERS) -> int:
    """The column-file descriptors a process whose descriptor limit is ``nofile`` may keep: the
    limit less ``2 x max_workers + NON_COLUMN_MARGIN`` (README, "Configure": LimitNOFILE is at
    least ``max_open_files + 2 x server.max_workers + 256``; with this, exactly), at least 16."""
    return max(16, nofile - 2 * max_workers - NON_COLUMN_MARGIN)


def default_max_open_files(max_workers: int = DEFAULT_WORKERS) -> int:
    """``storage.max_open_files`` when ``dis.yaml`` leaves it out: from this process's descriptor
    limit (RLIMIT_NOFILE, LimitNOFILE under systemd), so a DIS given more descriptors keeps more
    column files open and cycles fewer (docs/storage-format.md, "File handles")."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max_open_files_for(int(soft), max_workers)


class FileIdentityError(DisError, OSError):
    """The path of a tracked file now names another file, or nothing."""


def identity_error(path: str, identity: tuple[int, int] | None, now: tuple[int, int] | None) -> FileIdentityError:
    """A column file deleted (``now`` None) or replaced (``now`` its device and inode) under the
    DIS."""
    if now is None:
        inode = identity[1] if identity is not None else "?"
        return FileIdentityError(
            f"{path}: column file was deleted while the DIS had it open "
            f"(inode {inode}); never delete or replace column files of a running DIS"
        )
    old = identity or ("?", "?")
    return FileIdentityError(
        f"{path}: column file was replaced while the DIS had it open (device/inode "
        f"{old[0]}/{old[1]} is now {now[0]}/{now[1]}); "
        "never delete or replace column files of a running DIS"
    )


@dataclass(frozen=True)
class NewFiles:
    """What ``TrackedFileHandleFactory.reserving_new`` lets a batch of new locations hold: per
    location whether its descriptors are kept, and how many locations' files are made at once."""

    keep: list[bool]
    at_once: int


class TrackedFile:
    """One column file: positional writes and reads, truncation and fsync through the factory.

    The object stays valid for the life of the location; its descriptor comes and goes."""

    def __init__(self, factory: "TrackedFileHandleFactory", path: str) -> None:
        self.factory = factory
        self.fs = factory.fs
        self.path = path
        self.lock = threading.RLock()
        self.fd: int | None = None
        self.identity: tuple[int, int] | None = None  # (st_dev, st_ino), fixed at first open
        #: (path, st_dev, st_ino), what a write of ``storage.writeout`` opens the file by when the
        #: handle holds no descriptor; None until the identity is fixed
        self.spec: tuple[bytes, int, int] | None = None
        self.closed = False
        self.pins = 0  # operations using ``fd`` without holding ``lock`` (fsync)
        self.opens = 0  # descriptors opened for this handle (1 + reopens)

    # The descriptor is valid only while self.lock is held (or the handle is pinned).
    def _fd(self) -> int:
        if self.closed:
            raise StorageValueError(f"{self.path}: handle is closed")
        if self.fd is None:
            self.factory._open_fd(self, create=False)  # noqa: SLF001 - TrackedFile and its factory are companions
        return self.fd  # type: ignore[return-value]

    # Errors of descriptor operations name no file; each operation adds the path, so an error
    # state says which column file the disk refused.
    def _named(self, e: OSError) -> None:
        if e.filename is None:
            e.filename = self.path

    def size(self) -> int:
        with self.lock:
            try:
                return self.fs.fstat(self._fd()).st_size
            except OSError as e:
                self._named(e)
                raise

    def pwrite(self, data: memoryview | bytes | bytearray, offset: int) -> int:
        """Write all of ``data`` at ``offset``; one ``pwrite`` call unless the kernel writes short."""
        with self.lock:
            fd = self._fd()
            try:
                return pwrite_whole(self.fs, fd, data, offset)
            except OSError as e:
                self._named(e)
                raise

    def _pin(self) -> int:
        """The descriptor, kept open until ``_unpin`` without holding the lock (see fsync)."""
        with self.lock:
            fd = self._fd()
            self.pins += 1
            return fd

    def _unpin(self) -> None:
        with self.lock:
            self.pins -= 1
            if self.pins == 0 and self.closed and self.fd is not None:
                self.factory._release(self)  # noqa: SLF001 - TrackedFile and its factory are companions

    def pread(self, size: int, offset: int) -> bytes:
        with self.lock:
            fd = self._fd()
            try:
                out = self.fs.pread(fd, size, offset)
                if len(out) == size or not out:
                    return out
                parts = [out]  # a short read of a regular file: keep reading until EOF
                got = len(out)
                while got < size:
                    more = self.fs.pread(fd, size - got, offset + got)
                    if not more:
                        break
                    parts.append(more)
                    got += len(more)
                return b"".join(parts)
            except OSError as e:
                self._named(e)
                raise

    def truncate(self, size: int) -> None:
        with self.lock:
            try:
                self.fs.ftruncate(self._fd(), size)
            except OSError as e:
                self._named(e)
                raise

    def fsync(self) -> None:
        """fsync without holding the handle's lock, so appends to the file go on meanwhile.

        A handle whose descriptor was reclaimed is synced on a descriptor opened for the fsync
        alone (its identity checked as a reopen checks it) and closed again, not reopened
        through the factory: a checkpoint visits every column file once an interval, and
        reopening each would push out, at capacity, the descriptors of files being written
        (``TrackedFileHandleFactory.fsync_unheld``)."""
        if self.fd is None and self.spec is not None and not self.closed:
            if self.factory.fsync_unheld(self):
                return
        fd = self._pin()
        try:
            self.fs.fsync(fd)
        except OSError as e:
            self._named(e)
            raise
        finally:
            self._unpin()

    def close(self) -> None:
        with self.lock:
            self.closed = True
            if self.pins == 0:
                self.factory._release(self)  # noqa: SLF001 - TrackedFile and its factory are companions

    def __repr__(self) -> str:
        return f"TrackedFile({self.path!r}, fd={self.fd})"


def pwrite_files(writes: Sequence[tuple[TrackedFile, memoryview | bytes | bytearray, int]]) -> None:
    """Write each ``(handle, data, offset)`` whole, in order, in one operation of the handles'
    file system (``fsio.pwrite_all``): a location's flush, a write per column file, gives up
    the interpreter's lock once instead of once per file (docs/benchmarks-history.md, "a
    location's flush in one call").  The handles must share one factory.

    Each descriptor is pinned, as ``fsync`` pins it, from when it is looked up until the writes
    are done: looking up the next one may reopen a descriptor and so run cleanup, which passes
    over pinned handles, so no descriptor of the call is closed (and its number reused) under
    it.  One handle's lock at a time is held, never several.  A call that would pin more than
    the factory lets one operation hold (``holds_at_once``) is made a write at a time instead.
    A failure is raised as the OSError of the write that failed,
    naming its file, with ``writes_done`` (the writes before it were completed)."""
    if len(writes) == 1 or not writes[0][0].factory.holds_at_once(len(writes)):
        for done, (h, data, offset) in enumerate(writes):
            try:
                h.pwrite(data, offset)
            except OSError as e:
                e.writes_done = done  # type: ignore[attr-defined]
                raise
        return
    pinned: list[TrackedFile] = []
    try:
        fds = []
        for h, _, _ in writes:
            fds.append(h._pin())  # noqa: SLF001 - TrackedFile and its factory are companions
            pinned.append(h)
        fs = writes[0][0].fs
        try:
            pwrite_all(fs, [(fd, data, offset) for fd, (_, data, offset) in zip(fds, writes)])
        except OSError as e:
            writes[getattr(e, "writes_done", 0)][0]._named(e)  # noqa: SLF001 - TrackedFile and its factory are companions
            raise
    finally:
        for h in pinned:
            h._unpin()  # noqa: SLF001 - TrackedFile and its factory are companions


class TrackedFileHandleFactory:
    """Opens column files and keeps the number of their descriptors within ``max_open_files``.

    The limit is exceeded only while every descriptor held is in use at that instant (its handle
    locked by a read or pinned by a write), and then by one for each operation opening a file
    meanwhile: an opener never waits for another's descriptor, since a write pins its files one
    after another and would wait on the very reads waiting for it.  Such operations run on the
    server's worker threads and the storage clock, which the descriptor headroom beyond
    ``max_open_files`` (``2 x server.max_workers + 256``) covers."""

    def __init__(self, max_open_files: int = 512, fs: FileSystem = OS) -> None:
        if max_open_files < 2:
            raise StorageValueError("max_open_files must be at least 2")
        self.capacity = max_open_files
        self.fs = fs
        self._lock = threading.Lock()
        self._opening = 0  # descriptors being opened now, outside the lock (see _open_fd)
        # id(handle) -> handle, in the order their current descriptors were opened
        self._handles: "collections.OrderedDict[int, TrackedFile]" = collections.OrderedDict()
        self._reclaims: collections.deque[float] = collections.deque()
        self._last_fast_warning = float("-inf")
        self.reclaimed_total = 0
        self.fast_cycling_total = 0
        self.cleanups = 0
        self.peak_open = 0
        self.transient_opens = 0  # files a compiled write opened for its writes alone
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def open(self, path: str, create: bool = True) -> TrackedFile:
        """A handle for ``path``.  With ``create`` the file is created if absent; its identity
        (device, inode) is fixed now, at the first open."""
        f = TrackedFile(self, str(path))
        with f.lock:
            self._open_fd(f, create=create)
        return f

    def open_created(self, paths: list[str],
                     create: Callable[[], list[tuple[int, tuple[int, int]]] | None]) -> list[TrackedFile] | None:
        """Handles for files that ``create`` creates and opens in one call of its own (a new
        location's, ``fsio.create_location``), with their identities fixed now; None, with
        nothing opened, when ``create`` returns None.  Their descriptors count against the
        limit while ``create`` runs, as ``open``'s do."""
        n = len(paths)
        with self._lock:
            self._reserve_locked(n)
        try:
            opened = create()
        except BaseException:
            with self._lock:
                self._opening -= n
            raise
        handles = []
        with self._lock:  # counted as being opened until counted as held: never neither
            self._opening -= n
            if opened is None:
                return None
            for path, (fd, identity) in zip(paths, opened, strict=True):
                f = TrackedFile(self, str(path))
                f.fd, f.identity, f.opens = fd, identity, 1
                f.spec = (os.fsencode(f.path), identity[0], identity[1])
                self._handles[id(f)] = f
                handles.append(f)
            self.peak_open = max(self.peak_open, len(self._handles))
        return handles

    def adopt(self, paths: Sequence[str], opened: Sequence[tuple[int, tuple[int, int]]]) -> list[TrackedFile]:
        """Handles for files created and opened elsewhere (a batch of new locations,
        ``fsio.create_locations``), their identities fixed now.  A descriptor of -1 was closed
        again (no room to keep it): its handle opens the file when it is first used."""
        handles = []
        with self._lock:
            for path, (fd, identity) in zip(paths, opened, strict=True):
                f = TrackedFile(self, str(path))
                f.identity = identity
                f.spec = (os.fsencode(f.path), identity[0], identity[1])
                if fd >= 0:
                    f.fd, f.opens = fd, 1
                    self._handles[id(f)] = f
                handles.append(f)
            self.peak_open = max(self.peak_open, len(self._handles))
        return handles

    def _room_locked(self) -> int:
        """Descriptors that could be opened now without reclaiming any (to 90% of capacity).
        Only under the lock, and acted on before it is released: room read and then reserved
        apart is room another caller may take meanwhile (``reserving_new``)."""
        return max(0, int(self.capacity * TARGET_FRACTION) - len(self._handles) - self._opening)

    @contextlib.contextmanager
    def reserving(self, n: int) -> Iterator[None]:
        """``n`` descriptors counted as being opened while a call elsewhere holds them (at most
        ``n`` at once), so the limit holds; cleanup makes room first if need be."""
        with self._lock:
            self._reserve_locked(n)
        try:
            yield
        finally:
            with self._lock:
                self._opening -= n

    def _reserve_locked(self, n: int) -> None:
        if len(self._handles) + self._opening + n > self.capacity:
            self._cleanup_locked(room=n)
        self._opening += n

    @contextlib.contextmanager
    def reserving_new(self, counts: Sequence[int], at_once: int) -> Iterator[NewFiles]:
        """For a batch of new locations whose files a call elsewhere creates (``counts``: each
        one's number of files; ``fsio.create_locations``): which of them keep their descriptors
        (in order, as many as there is room for now, to 90% of capacity; the rest are closed
        again once made) and how many of them (at most ``at_once``) are made at the same time,
        all counted as being opened until the block ends: ``adopt`` the kept ones within it.

        Decided and reserved in one step under the factory's lock: batches deciding apart
        (several tailers' requests at a burst's start) would each see the same room and together
        keep several times the limit, running the process out of descriptors (EMFILE) however
        ``max_open_files`` was chosen."""
        most = max(counts, default=0)
        with self._lock:
            room = self._room_locked()
            keep = []
            for count in counts:
                keep.append(count <= room)
                room -= count if keep[-1] else 0
            kept = sum(count for count, k in zip(counts, keep) if k)
            at_once = max(1, min(at_once, (self.capacity - kept) // most)) if most else 1
            reserved = kept + most * at_once
            self._reserve_locked(reserved)
        try:
            yield NewFiles(keep, at_once)
        finally:
            with self._lock:
                self._opening -= reserved

    def holds_at_once(self, n: int) -> bool:
        """Whether one operation may hold ``n`` descriptors at once (a new location's files, a
        flush's): up to a quarter of the limit.  With a limit set lower, such an operation is
        made a file at a time, so the limit still holds with several of them under way."""
        return n * 4 <= self.capacity

    def pin_for_write(self, handles: Sequence[TrackedFile]) -> tuple[tuple[Any, ...], list[TrackedFile]]:
        """For a compiled write of these handles' files (``storage.writeout``): each file's
        descriptor, pinned, or, for a handle whose descriptor was reclaimed, the ``spec`` to open
        it by for the writes alone; and the handles pinned (``unpin`` them after).  A reclaimed
        handle gets its descriptor back when the factory has room for it (under 90% of capacity):
        only when the column files outnumber the limit do writes open their files each time."""
        files: list[object] = []
        pinned: list[TrackedFile] = []
        target = int(self.capacity * TARGET_FRACTION)
        full = len(self._handles) + self._opening >= target
        try:
            for h in handles:
                spec = h.spec
                if full and h.fd is None and spec is not None and not h.closed:
                    # No room to reopen it: the write opens the file by its spec.  Read without
                    # the handle's lock: a descriptor opened for it meanwhile (by a thread that
                    # holds the lock) changes nothing, the write still opens its own.
                    files.append(spec)
                    continue
                with h.lock:
                    if h.closed:
                        raise StorageValueError(f"{h.path}: handle is closed")
                    if h.fd is None and (h.spec is None or len(self._handles) + self._opening < target):
                        self._open_fd(h, create=False)
                    if h.fd is not None:
                        h.pins += 1
                        pinned.append(h)
                        files.append(h.fd)
                    else:
                        files.append(h.spec)
        except BaseException:
            self.unpin(pinned)
            raise
        return tuple(files), pinned

    @staticmethod
    def unpin(handles: Sequence[TrackedFile]) -> None:
        for h in handles:
            h._unpin()  # noqa: SLF001 - TrackedFile and its factory are companions

    @contextlib.contextmanager
    def transient_slot(self) -> Iterator[None]:
        """Room for the one descriptor a compiled write holds at a time on a file it opened for
        its writes alone: counted as being opened, so the limit still holds."""
        with self._lock:
            if len(self._handles) + self._opening >= self.capacity:
                self._cleanup_locked(room=1)
            self._opening += 1
        try:
            yield
        finally:
            with self._lock:
                self._opening -= 1

    def fsync_unheld(self, f: TrackedFile) -> bool:
        """fsync ``f``'s file on a descriptor opened for it alone, when ``f`` holds none; False
        (nothing done) when it holds one by now.  The descriptor counts against the limit while
        it is open (as ``transient_slot``'s) and as a transient open for fast cycling."""
        with f.lock:
            if f.fd is not None or f.closed:
                return False
        with self.transient_slot():
            fd = self._open_checked(f, create=False)
            try:
                self.fs.fsync(fd)
            except OSError as e:
                f._named(e)  # noqa: SLF001 - TrackedFile and its factory are companions
                raise
            finally:
                _close_quietly(self.fs, fd)
        self.note_transient(1)
        return True

    def note_transient(self, n: int) -> None:
        """``n`` files were opened for their writes alone: descriptors the limit could not keep,
        counted towards fast cycling as reclaims are."""
        with self._lock:
            self.transient_opens += n
            self._note_reclaims(0, extra=n)

    @property
    def open_count(self) -> int:
        with self._lock:
            return len(self._handles)

    # -- internals: _open_fd and _release are called with f.lock held (never the factory's) -----
    def _open_fd(self, f: TrackedFile, create: bool) -> None:
        # The open itself runs without the factory's lock: creating a file can take milliseconds
        # (a new inode, on a busy file system), and a burst of new locations creates hundreds
        # side by side while every other handle may need the lock to reopen.  ``_opening``
        # counts the descriptors about to exist, so the capacity still holds.
        with self._lock:
            if len(self._handles) + self._opening >= self.capacity:
                self._cleanup_locked(exclude=f)
            self._opening += 1
        try:
            fd = self._open_checked(f, create)
        except BaseException:
            with self._lock:
                self._opening -= 1
            raise
        with self._lock:
            self._opening -= 1
            f.fd = fd
            f.opens += 1
            self._handles[id(f)] = f
            n = len(self._handles)
            if n > self.peak_open:
                self.peak_open = n

    def _open_checked(self, f: TrackedFile, create: bool) -> int:
        """A descriptor of ``f``'s file, which must be the file ``f`` first opened."""
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        try:
            fd = self.fs.open(f.path, flags, 0o644)
        except FileNotFoundError:
            if f.identity is None:
                raise
            raise identity_error(f.path, f.identity, None) from None
        try:
            st = self.fs.fstat(fd)
        except BaseException:
            _close_quietly(self.fs, fd)
            raise
        ident = (st.st_dev, st.st_ino)
        if f.identity is not None and ident != f.identity:
            self.fs.close(fd)
            raise identity_error(f.path, f.identity, ident)
        f.identity = ident
        f.spec = (os.fsencode(f.path), ident[0], ident[1])
        return fd

    def _release(self, f: TrackedFile) -> None:
        with self._lock:
            self._handles.pop(id(f), None)
            if f.fd is not None:
                fd, f.fd = f.fd, None
                _close_quietly(self.fs, fd)

    def _cleanup_locked(self, exclude: TrackedFile | None = None, room: int = 0) -> int:
        """Drop closed handles, then close least-recently-opened descriptors until usage, with
        ``room`` more about to be opened, is under 90% of capacity.  Handles busy this instant
        (locked or pinned) are passed over."""
        self.cleanups += 1
        for key, h in list(self._handles.items()):
            if h.fd is None:
                self._handles.pop(key, None)
        target = int(self.capacity * TARGET_FRACTION)
        closed = 0
        for key, h in list(self._handles.items()):
            if len(self._handles) + self._opening + room < target:
                break
            if h is exclude or not h.lock.acquire(blocking=False):
                continue
            try:
                if h.pins:
                    continue
                if h.fd is not None:
                    fd, h.fd = h.fd, None
                    _close_quietly(self.fs, fd)
                self._handles.pop(key, None)
                if not h.closed:
                    closed += 1
            finally:
                h.lock.release()
        if closed:
            self._note_reclaims(closed)
        return closed

    def _note_reclaims(self, n: int, now: float | None = None, extra: int = 0) -> None:
        """``n`` descriptors reclaimed (and ``extra`` files opened for a write alone, which the
        limit could not keep either): a warning when 20% of capacity cycled within the window."""
        now = time.monotonic() if now is None else now
        self.reclaimed_total += n
        if n:
            metrics.HANDLE_RECLAIMS.inc(n)
        self._reclaims.extend([now] * (n + extra))
        while self._reclaims and now - self._reclaims[0] > FAST_CYCLE_WINDOW_S:
            self._reclaims.popleft()
        if (
            len(self._reclaims) >= FAST_CYCLE_FRACTION * self.capacity
            and now - self._last_fast_warning >= FAST_CYCLE_WINDOW_S
        ):
            self._last_fast_warning = now
            self.fast_cycling_total += 1
            metrics.HANDLE_FAST_CYCLING.inc()
            log.warning(
                "file handles cycling fast",
                reclaimed_in_window=len(self._reclaims),
                window_s=FAST_CYCLE_WINDOW_S,
                max_open_files=self.capacity,
                hint="raise storage.max_open_files (and the process's LimitNOFILE)",
            )

    def cleanup(self) -> int:
        """Run cleanup now; returns how many descriptors of live handles were closed."""
        with self._lock:
            return self._cleanup_locked()

    def start(self, interval_s: float = CLEANUP_INTERVAL_S) -> None:
        """Start the background cleanup (every ``interval_s``)."""
        if self._thread is not None:
            return
        self._stop.clear()

        def loop() -> None:
            while not self._stop.wait(interval_s):
                try:
                    self.cleanup()
                except Exception as e:  # noqa: BLE001 - the cleaner must not die
                    log.error("file handle cleanup failed", error=repr(e))

        self._thread = threading.Thread(target=loop, name="dis-file-handle-cleanup", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def close_all(self) -> None:
        """Stop the cleaner and close every descriptor (handles stay usable: they reopen)."""
        self.stop()
        with self._lock:
            handles = list(self._handles.values())
        for h in handles:  # handle lock first, then the factory's: the one lock order
            with h.lock:
                if h.pins == 0:
                    self._release(h)


def _close_quietly(fs: FileSystem, fd: int) -> None:
    """Close a descriptor whose data needs nothing more: an error from close (NFS reports
    deferred write errors there) is logged, and the descriptor is gone either way (Linux frees
    it even when close fails).  Durability never rests on close: checkpoints fsync first."""
    try:
        fs.close(fd)
    except OSError as e:
        log.warning("closing a column file failed", error=str(e))
