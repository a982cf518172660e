"""The storage engine's one door to the file system.

Every durable operation of the engine goes through a ``FileSystem``: column-file writes,
truncates and fsyncs (``storage.filehandles``), the ``table.size.tmp`` write, its fsync and
rename (``storage.checkpoint``), directory creation and directory fsyncs (``storage.location``).
Why a seam: the guarantees of docs/reliability.md are claims about *which bytes survive a power
loss* and *what happens when the disk refuses*, and neither can be tested on a healthy disk
without a kill switch on the power.  With every operation in one place, tests put a recording,
crashing or failing disk under a real engine (tests/faults) and nothing can slip past it.

``OsFileSystem`` is the real one: plain ``os`` calls, bound directly so the hot path pays no
extra Python frame.  ``MeteredFileSystem`` wraps any file system and counts its failures in
``dis_io_errors_total{op, errno}``; the engine always wraps, so injected and real errors are
counted alike.

Compound operations may be done by the file system itself: ``create_location``, a new
location's directories, ``table.size`` and column files.  ``OsFileSystem`` does it in C
(``disd.storage.newlocation``), the same calls in the same order in one call that gives up the
interpreter's lock once instead of some thirty times (docs/benchmarks-history.md, "new
locations in one call"); any other file system (the tests' recording and failing disks) gets the composition of
its own operations below, so every call still passes through it.  ``pwrite_all``, several
positional writes (a location's flush: a write per column file), is offered the same way: in C
(``disd.storage.batchwrite``) by ``OsFileSystem`` alone, composed of ``pwrite`` for any other; and so are the cuts and
writes of compiled write states
(``write_states``, ``storage.writeout``).
"""

from __future__ import annotations

import errno as errno_mod
import os
from typing import Any, Callable, Protocol, Sequence

from disd.storage import metrics

try:  # built by setup.py when a C compiler is there; without it, the composed operation below
    from disd.storage import newlocation
except ImportError:  # pragma: no cover - exercised only by a build without a C compiler
    newlocation = None  # type: ignore[assignment]  # (mypy cannot type "a module or None")
try:  # the same: without it, pwrite_all's composition of pwrite
    from disd.storage import batchwrite
except ImportError:  # pragma: no cover - exercised only by a build without a C compiler
    batchwrite = None  # type: ignore[assignment]  # (mypy cannot type "a module or None")
try:  # the same: without it, the write states' cuts and writes composed (storage.writeout)
    from disd.storage import ingestcore
except ImportError:  # pragma: no cover - exercised only by a build without a C compiler
    ingestcore = None  # type: ignore[assignment]  # (mypy cannot type "a module or None")

#: a new location's column files, opened: (descriptor, (st_dev, st_ino)) each, in the order asked
Opened = list[tuple[int, tuple[int, int]]]
#: one positional write of ``pwrite_all``: (descriptor, bytes, offset)
Write = tuple[int, "memoryview | bytes | bytearray", int]
#: one location of ``create_locations``: (path, temp name, record name, record, column file names,
#: keep their descriptors open)
NewLocation = tuple[str, str, str, bytes, "list[str]", bool]
#: the compound operations a file system may offer (``OsFileSystem``'s, in C)
CreateLocation = Callable[[str, str, str, bytes, "list[str]"], "Opened | None"]
CreateLocations = Callable[[Sequence[NewLocation], int], "list[Opened | None | OSError]"]
PwriteAll = Callable[[Sequence[Write]], None]
#: ``ingestcore.write_out``: (state, files, flush) each -> (failures, write sizes, transient opens)
WriteStates = Callable[[Sequence[Any]], tuple[list[Any], list[int], int]]


class FileSystem(Protocol):
    """What the storage engine asks of a file system: descriptors, positional I/O, names.

    A file system may also offer ``create_location`` and ``pwrite_all`` (the signatures of the
    functions of those names below, without ``fs``) to do them in one operation of its own;
    ``OsFileSystem`` does."""

    def open(self, path: str, flags: int, mode: int = 0o644) -> int: ...

    def close(self, fd: int) -> None: ...

    def fstat(self, fd: int) -> os.stat_result: ...

    def pwrite(self, fd: int, data: memoryview | bytes, offset: int) -> int: ...

    def pread(self, fd: int, size: int, offset: int) -> bytes: ...

    def ftruncate(self, fd: int, size: int) -> None: ...

    def fsync(self, fd: int) -> None: ...

    def stat(self, path: str) -> os.stat_result: ...

    def rename(self, src: str, dst: str) -> None: ...

    def unlink(self, path: str) -> None: ...

    def mkdir(self, path: str) -> None: ...

    def fsync_dir(self, path: str) -> None: ...


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory, so the entries created, renamed or removed in it survive a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class OsFileSystem:
    """The real file system."""

    close = staticmethod(os.close)
    fstat = staticmethod(os.fstat)
    pwrite = staticmethod(os.pwrite)
    pread = staticmethod(os.pread)
    ftruncate = staticmethod(os.ftruncate)
    fsync = staticmethod(os.fsync)
    stat = staticmethod(os.stat)
    rename = staticmethod(os.rename)
    unlink = staticmethod(os.unlink)
    fsync_dir = staticmethod(fsync_dir)

    @staticmethod
    def open(path: str, flags: int, mode: int = 0o644) -> int:
        return os.open(path, flags, mode)

    @staticmethod
    def mkdir(path: str) -> None:
        os.mkdir(path, 0o755)

    @property
    def create_location(self) -> CreateLocation | None:  # noqa: ANN201
        """``create_location`` in C when built, for the plain OS file system only: a subclass
        (a test's disk overriding some operations) must see every call, so it gets None and
        with it the composed operation."""
        return _native_create_location if newlocation is not None and type(self) is OsFileSystem else None

    @property
    def pwrite_all(self) -> PwriteAll | None:  # noqa: ANN201
        """``pwrite_all`` in C when built, for the plain OS file system only (as
        ``create_location``)."""
        return _native_pwrite_all if batchwrite is not None and type(self) is OsFileSystem else None

    @property
    def create_locations(self) -> CreateLocations | None:  # noqa: ANN201
        """``create_locations`` in C when built, for the plain OS file system only (as
        ``create_location``)."""
        return _native_create_locations if newlocation is not None and type(self) is OsFileSystem else None

    @property
    def write_states(self) -> WriteStates | None:  # noqa: ANN201
        """The due cuts and writes of compiled write states, many locations' in one call
        (``ingestcore.write_out``, see ``storage.writeout``): for the plain OS file system only
        (as ``create_location``); any other composes them of its own operations."""
        return ingestcore.write_out if ingestcore is not None and type(self) is OsFileSystem else None


def _native_create_location(path: str, temp_name: str, record_name: str, record: bytes,
                            file_names: list[str]) -> Opened | None:
    """``create_location`` in one call outside the interpreter's lock (``newlocation``)."""
    fresh, out = newlocation.create(path, temp_name, record_name, record, file_names)
    if fresh is None:
        op, code, where = out
        e = OSError(code, os.strerror(code), where)  # the errno's subclass, as ``os`` raises
        e.storage_op = op  # type: ignore[attr-defined]
        raise e
    return [(fd, (dev, ino)) for fd, dev, ino in out] if fresh else None


def _native_create_locations(items: Sequence["NewLocation"], at_once: int = 8) -> list["Opened | None | OSError"]:
    """``create_locations`` in one call outside the interpreter's lock (``newlocation``)."""
    out: list[Opened | None | OSError] = []
    answers = newlocation.create_many([(path, temp, name, record, [os.fsencode(n) for n in files], keep)
                                        for path, temp, name, record, files, keep in items], at_once)
    for fresh, got in answers:
        if fresh is None:
            op, code, where = got
            e = OSError(code, os.strerror(code), where)
            e.storage_op = op  # type: ignore[attr-defined]
            out.append(e)
        else:
            out.append([(fd, (dev, ino)) for fd, dev, ino in got] if fresh else None)
    return out


def _native_pwrite_all(writes: Sequence[Write]) -> None:
    """``pwrite_all`` in one call outside the interpreter's lock (``batchwrite``)."""
    done, code = batchwrite.pwrite_all(writes)
    if code:
        e = OSError(code, os.strerror(code))
        e.writes_done = done  # type: ignore[attr-defined]
        raise e


#: Failures that are answers, not errors: "is there a table.size?", "does this directory exist?".
_EXPECTED = (FileNotFoundError, FileExistsError)


def errno_name(code: int | None) -> str:
    """``ENOSPC`` for 28; ``E?`` when unknown."""
    return errno_mod.errorcode.get(code, f"E{code}") if code is not None else "E?"


def failed_op(e: BaseException) -> str | None:
    """The file-system operation that raised ``e`` (set by MeteredFileSystem), if any."""
    return getattr(e, "storage_op", None)


class MeteredFileSystem:
    """Counts every failed operation of ``inner`` in ``dis_io_errors_total{op, errno}`` and
    marks the exception with the operation (``failed_op``), so an error message can say
    "fsync failed" rather than guess."""

    def __init__(self, inner: FileSystem) -> None:
        self.inner = inner

    def _failed(self, op: str, e: OSError) -> None:
        if not isinstance(e, _EXPECTED):
            metrics.IO_ERRORS.labels(op, errno_name(e.errno)).inc()
        try:
            e.storage_op = op  # type: ignore[attr-defined]
        except AttributeError:
            pass

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        try:
            return self.inner.open(path, flags, mode)
        except OSError as e:
            self._failed("open", e)
            raise

    def close(self, fd: int) -> None:
        try:
            self.inner.close(fd)
        except OSError as e:
            self._failed("close", e)
            raise

    def fstat(self, fd: int) -> os.stat_result:
        try:
            return self.inner.fstat(fd)
        except OSError as e:
            self._failed("fstat", e)
            raise

    def pwrite(self, fd: int, data: memoryview | bytes, offset: int) -> int:
        try:
            return self.inner.pwrite(fd, data, offset)
        except OSError as e:
            self._failed("pwrite", e)
            raise

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        try:
            return self.inner.pread(fd, size, offset)
        except OSError as e:
            self._failed("pread", e)
            raise

    def ftruncate(self, fd: int, size: int) -> None:
        try:
            self.inner.ftruncate(fd, size)
        except OSError as e:
            self._failed("ftruncate", e)
            raise

    def fsync(self, fd: int) -> None:
        try:
            self.inner.fsync(fd)
        except OSError as e:
            self._failed("fsync", e)
            raise

    def stat(self, path: str) -> os.stat_result:
        try:
            return self.inner.stat(path)
        except OSError as e:
            self._failed("stat", e)
            raise

    def rename(self, src: str, dst: str) -> None:
        try:
            self.inner.rename(src, dst)
        except OSError as e:
            self._failed("rename", e)
            raise

    def unlink(self, path: str) -> None:
        try:
            self.inner.unlink(path)
        except OSError as e:
            self._failed("unlink", e)
            raise

    def mkdir(self, path: str) -> None:
        try:
            self.inner.mkdir(path)
        except OSError as e:
            self._failed("mkdir", e)
            raise

    def fsync_dir(self, path: str) -> None:
        try:
            self.inner.fsync_dir(path)
        except OSError as e:
            self._failed("fsync_dir", e)
            raise

    def _compound(self, name: str, op: str) -> Callable[..., Any] | None:  # noqa: ANN202
        """The inner file system's compound operation ``name``, metered (a failure counted as
        the call that failed, else as ``op``); None when it offers none."""
        inner = getattr(self.inner, name, None)
        if inner is None:
            return None

        def metered(*args: Any) -> Any:  # noqa: ANN002, ANN202
            try:
                return inner(*args)
            except OSError as e:
                self._failed(failed_op(e) or op, e)
                raise

        return metered

    @property
    def create_location(self) -> CreateLocation | None:  # noqa: ANN201
        return self._compound("create_location", "create_location")

    @property
    def pwrite_all(self) -> PwriteAll | None:  # noqa: ANN201
        return self._compound("pwrite_all", "pwrite")

    @property
    def create_locations(self) -> CreateLocations | None:  # noqa: ANN201
        """The inner one's, its failures (answered per location, not raised) counted."""
        inner = getattr(self.inner, "create_locations", None)
        if inner is None:
            return None

        def metered(items: Sequence[NewLocation], at_once: int = 8) -> list[Opened | None | OSError]:  # noqa: ANN001, ANN202
            out: list[Opened | None | OSError] = inner(items, at_once)
            for e in out:
                if isinstance(e, OSError):
                    self._failed(failed_op(e) or "create_location", e)
            return out

        return metered

    @property
    def write_states(self) -> WriteStates | None:  # noqa: ANN201
        """The inner one's, unwrapped: it reports failures per location instead of raising, and
        ``storage.writeout`` counts them."""
        return getattr(self.inner, "write_states", None)


OS = OsFileSystem()


# -- compound operations, built only from the FileSystem's ---------------------------------------


def write_file(fs: FileSystem, path: str, data: bytes) -> None:
    """Create or replace ``path`` with ``data`` and fsync it (the directory entry is the
    caller's business: a rename and a directory fsync follow)."""
    fd = fs.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        pwrite_whole(fs, fd, data, 0)
        fs.fsync(fd)
    finally:
        fs.close(fd)


def pwrite_whole(fs: FileSystem, fd: int, data: memoryview | bytes | bytearray, offset: int) -> int:
    """Write all of ``data`` at ``offset``: ``pwrite`` until every byte is written (the kernel
    may write short).  Returns the bytes written."""
    view = memoryview(data).cast("B")
    total = len(view)
    while view:
        n = fs.pwrite(fd, view, offset)
        view = view[n:]
        offset += n
    return total


def pwrite_all(fs: FileSystem, writes: Sequence[Write]) -> None:
    """Write each ``(fd, data, offset)`` whole, in order: ``pwrite`` until every byte is written,
    and nothing after a write that failed.  The OSError of a failed write carries
    ``writes_done``, how many writes before it were completed.  ``fs.pwrite_all`` does it when
    the file system offers one (the same calls in one operation), else ``fs.pwrite`` each."""
    native = getattr(fs, "pwrite_all", None)
    if native is not None:
        native(writes)
        return
    for done, (fd, data, offset) in enumerate(writes):
        try:
            pwrite_whole(fs, fd, data, offset)
        except OSError as e:
            e.writes_done = done  # type: ignore[attr-defined]
            raise


def create_locations(fs: FileSystem, items: Sequence[NewLocation], at_once: int = 8) -> list[Opened | None | OSError]:
    """Many new locations (``create_location`` each), each step for all before the next: their
    missing directories made, then each parent that gained an entry fsynced once; their records
    written, then each fsynced, renamed over ``table.size``, its directory fsynced; then their
    column files (closed again unless ``keep``: (-1, identity) each).  Per location, its column
    files' descriptors and identities, None when its directory existed (the caller opens it the
    usual way), or the OSError that stopped it (others go on).  The order of each location's own
    calls is ``create_location``'s, so are the durability rules (docs/storage-format.md, "A new
    location"); what a batch saves is the parents' repeated fsyncs and, in C, the interpreter's
    lock given up once, the waits overlapped.  ``at_once``: how many locations' column files are
    made at the same time (the descriptors the call holds beyond those kept: ``at_once`` times a
    location's files; here one at a time, in C on up to 8 threads)."""
    native: CreateLocations | None = getattr(fs, "create_locations", None)
    if native is not None:
        return native([(os.path.abspath(p), t, n, r, f, k) for p, t, n, r, f, k in items], at_once)
    out: list[Opened | None | OSError] = [None] * len(items)
    fresh: list[int] = []
    parents: dict[str, list[int]] = {}  # a directory that gained an entry -> the locations that made it
    for i, (path, *_rest) in enumerate(items):
        try:
            made, created = _missing_dirs(fs, os.path.abspath(path))
        except OSError as e:
            out[i] = e
            continue
        for d in made:
            parents.setdefault(os.path.dirname(d), []).append(i)
        if created:
            fresh.append(i)
    for parent in sorted(parents):
        try:
            fs.fsync_dir(parent)
        except OSError as e:
            for i in parents[parent]:
                out[i] = out[i] if isinstance(out[i], OSError) else e
    fresh = [i for i in fresh if not isinstance(out[i], OSError)]
    records: dict[int, int] = {}  # location -> its temp record's descriptor
    for i in fresh:
        path, temp, _name, record, _files, _keep = items[i]
        try:
            records[i] = fs.open(os.path.join(path, temp), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            pwrite_whole(fs, records[i], record, 0)
        except OSError as e:
            out[i] = e
    for i, fd in records.items():
        try:
            if not isinstance(out[i], OSError):
                fs.fsync(fd)
        except OSError as e:
            out[i] = e
        finally:
            try:
                fs.close(fd)
            except OSError as e:
                out[i] = out[i] if isinstance(out[i], OSError) else e
    steps: tuple[Callable[[str, str, str], None], ...] = (
        lambda p, t, n: fs.rename(os.path.join(p, t), os.path.join(p, n)), lambda p, t, n: fs.fsync_dir(p))
    for step in steps:
        for i in fresh:
            if isinstance(out[i], OSError):
                continue
            path, temp, name = items[i][:3]
            try:
                step(path, temp, name)
            except OSError as e:
                out[i] = e
    for i in fresh:
        if isinstance(out[i], OSError):
            continue
        path, _temp, _name, _record, files, keep = items[i]
        try:
            opened = _open_new_files(fs, path, files)
        except OSError as e:
            out[i] = e
            continue
        if not keep:
            for fd, _ in opened:
                fs.close(fd)
            opened = [(-1, ident) for _, ident in opened]
        out[i] = opened
    return out


def _missing_dirs(fs: FileSystem, path: str, fsync_each: bool = False) -> tuple[list[str], bool]:
    """Make ``path``'s missing directories, top down; (those made or found made meanwhile,
    whether ``path`` itself was made here).  ``fsync_each``: each one's parent fsynced right after
    it is made, before the next (``make_dirs``); else the caller fsyncs the parents, once each."""
    missing: list[str] = []
    p = path
    while not exists(fs, p):
        missing.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    created = False
    for d in reversed(missing):
        try:
            fs.mkdir(d)
            created = d == path
        except FileExistsError:
            pass  # made meanwhile by another location of the same table
        if fsync_each:
            fs.fsync_dir(os.path.dirname(d))
    return list(reversed(missing)), created


def _open_new_files(fs: FileSystem, path: str, file_names: Sequence[str]) -> Opened:
    opened: Opened = []
    try:
        for name in file_names:
            fd = fs.open(os.path.join(path, name), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                st = fs.fstat(fd)
            except BaseException:
                fs.close(fd)
                raise
            opened.append((fd, (st.st_dev, st.st_ino)))
    except BaseException:
        for fd, _ in opened:
            try:
                fs.close(fd)
            except OSError:
                pass
        raise
    return opened


def read_file(fs: FileSystem, path: str, limit: int) -> bytes | None:
    """At most ``limit`` bytes of ``path``; None when it does not exist."""
    try:
        fd = fs.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        parts = []
        got = 0
        while got < limit:
            b = fs.pread(fd, limit - got, got)
            if not b:
                break
            parts.append(b)
            got += len(b)
        return b"".join(parts)
    finally:
        fs.close(fd)


def size_or_zero(fs: FileSystem, path: str) -> int:
    try:
        return fs.stat(path).st_size
    except FileNotFoundError:
        return 0


def exists(fs: FileSystem, path: str) -> bool:
    try:
        fs.stat(path)
        return True
    except FileNotFoundError:
        return False


def make_dirs(fs: FileSystem, path: str) -> bool:
    """Create ``path`` and its missing parents, fsyncing each parent that gained an entry, so the
    directory survives a crash as surely as the files later made durable in it.  True when this
    call created ``path`` itself (so it is empty: nothing else writes under the database lock)."""
    return _missing_dirs(fs, os.path.abspath(path), fsync_each=True)[1]


def create_location(fs: FileSystem, path: str, temp_name: str, record_name: str, record: bytes,
                    file_names: list[str]) -> Opened | None:
    """A new location: ``path`` and its missing parents (``make_dirs``), its first record
    (``record`` written to ``temp_name``, fsynced, renamed to ``record_name``, the directory
    fsynced) and its column files, created and opened.  None, with nothing but missing parents
    made, when ``path`` already exists: the caller opens it as an existing location.  On a
    failure every descriptor opened is closed again and the OSError raised.

    The order is what makes creation crash-safe: the record is durable before any column file
    exists, so a location whose files hold data without a record is damage, never a crash
    (docs/storage-format.md)."""
    native: CreateLocation | None = getattr(fs, "create_location", None)
    if native is not None:
        return native(os.path.abspath(path), temp_name, record_name, record, list(file_names))
    if not make_dirs(fs, path):
        return None
    tmp = os.path.join(path, temp_name)
    write_file(fs, tmp, record)
    fs.rename(tmp, os.path.join(path, record_name))
    fs.fsync_dir(path)
    return _open_new_files(fs, path, file_names)
