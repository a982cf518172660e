"""Making historical files visible safely: temp, fsync, rename; never replacing what a reader holds.

The file rules of the seeds, as operations:

* ``write_atomic`` — a small file (definition, index): write ``.<name>.tmp-<id>``, fsync it,
  rename it over the name, fsync the directory.  A crash leaves the old file or the new one.
* a directory of data files (``disd.historical.publish`` strings these together): the writer
  fills a staging directory (``stage_dir``), ``seal`` fsyncs every file and the directory,
  ``rename_dir`` renames it to a hidden version directory (``version_name``), and ``switch_link``
  points the location's symbolic link at it with one rename (atomic on POSIX).  The previous
  version is left where it is: a reader that opened its files keeps reading them.
* ``TableLock`` — one writer per table at a time (``flock``, released by the kernel if the writer
  is killed).
* ``sweep_staging`` — under the lock, remove staging directories and link temps a killed writer
  left.  They were never linked, so no reader can hold them.
"""

from __future__ import annotations

import fcntl
import os
import pathlib
import shutil
import time
import uuid
from typing import Iterable

from disd.errors import DisError
from disd.storage import fsio

STAGING_MARK = ".tmp-"
LINK_MARK = ".link-"
VERSION_MARK = ".v"


class PublishError(DisError):
    """A location cannot be published (something not written by dis is in the way)."""


def fsync_path(path: str | os.PathLike[str], directory: bool = False) -> None:
    """fsync a file, or (``directory``) a directory's entries."""
    if directory:
        fsio.fsync_dir(path)
        return
    fd = fsio.OS.open(str(path), os.O_RDONLY | os.O_CLOEXEC)
    try:
        fsio.OS.fsync(fd)
    finally:
        fsio.OS.close(fd)


def make_dirs(path: pathlib.Path) -> None:
    """``mkdir -p`` that fsyncs each parent whose entry it created (``disd.storage.fsio``'s)."""
    fsio.make_dirs(fsio.OS, str(path))


def write_atomic(path: pathlib.Path, data: bytes) -> None:
    make_dirs(path.parent)
    tmp = path.parent / f".{path.name}{STAGING_MARK}{uuid.uuid4().hex[:12]}"
    fsio.write_file(fsio.OS, str(tmp), data)
    os.rename(tmp, path)
    fsync_path(path.parent, directory=True)


def stage_dir(parent: pathlib.Path, name: str) -> pathlib.Path:
    """A fresh staging path ``<parent>/.<name>.tmp-<id>`` (not created: Spark creates it)."""
    make_dirs(parent)
    return parent / f".{name}{STAGING_MARK}{uuid.uuid4().hex}"


def seal(directory: pathlib.Path, files: Iterable[pathlib.Path]) -> None:
    """fsync the files, then the directory holding their names."""
    for f in files:
        fsync_path(f)
    fsync_path(directory, directory=True)


def version_name(name: str) -> str:
    return f".{name}{VERSION_MARK}{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"


def current_version(parent: pathlib.Path, name: str) -> str | None:
    """The version directory ``<parent>/<name>`` links to, or None when there is no location.
    Raises PublishError when ``<name>`` is something dis did not write (a real directory)."""
    link = parent / name
    if not os.path.lexists(link):
        return None
    if not link.is_symlink():
        raise PublishError(f"{link} exists and is not a link written by dis: move it away first")
    target = os.readlink(link)
    if "/" in target or not target.startswith(f".{name}{VERSION_MARK}"):
        raise PublishError(f"{link} links to {target!r}, not to a version directory written by dis")
    return target


def rename_dir(src: pathlib.Path, dst: pathlib.Path) -> None:
    """Rename a sealed directory into place and make the rename durable (both parents)."""
    make_dirs(dst.parent)
    os.rename(src, dst)
    fsync_path(dst.parent, directory=True)
    if src.parent != dst.parent:
        fsync_path(src.parent, directory=True)


def switch_link(parent: pathlib.Path, name: str, target: str) -> None:
    """Point ``<parent>/<name>`` at ``target`` with one atomic rename of a new link."""
    tmp = parent / f".{name}{LINK_MARK}{uuid.uuid4().hex[:12]}"
    os.symlink(target, tmp)
    try:
        os.rename(tmp, parent / name)
    except OSError as e:
        os.unlink(tmp)
        raise PublishError(f"cannot replace {parent / name}: {e.strerror}") from None
    fsync_path(parent, directory=True)


def ensure_link(link: pathlib.Path, target: str) -> None:
    """Create ``link -> target`` if absent (WritablePartitions entries)."""
    if os.path.lexists(link):
        return
    make_dirs(link.parent)
    tmp = link.parent / f".{link.name}{LINK_MARK}{uuid.uuid4().hex[:12]}"
    os.symlink(target, tmp)
    try:
        os.rename(tmp, link)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    fsync_path(link.parent, directory=True)


def sweep_staging(parent: pathlib.Path, name: str) -> list[str]:
    """Remove what a killed writer of ``<parent>/<name>`` left: staging directories and link
    temps.  Only call under the table's lock.  Versions are kept (a reader may hold one)."""
    removed: list[str] = []
    try:
        entries = list(os.scandir(parent))
    except FileNotFoundError:
        return removed
    for e in entries:
        if e.name.startswith(f".{name}{STAGING_MARK}"):
            if e.is_dir(follow_symlinks=False):
                shutil.rmtree(e.path, ignore_errors=True)
            else:
                os.unlink(e.path)
            removed.append(e.name)
        elif e.name.startswith(f".{name}{LINK_MARK}"):
            os.unlink(e.path)
            removed.append(e.name)
    if removed:
        fsync_path(parent, directory=True)
    return removed


class TableLock:
    """An exclusive ``flock`` on the table's lock file, held while the table is written."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        self._fd: int | None = None

    def __enter__(self) -> "TableLock":
        make_dirs(self.path.parent)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:  # noqa: ANN002
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
