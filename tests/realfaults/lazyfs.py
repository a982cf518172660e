"""A LazyFS-style layer: a FUSE file system over a directory of a real disk that keeps every
file's writes and truncations in memory until the file is fsynced, and drops them all on a
"power cut" (the string ``cut`` written to ``/.lazyfs``), as a disk loses what was never synced.

A cut may also be armed to happen at an exact step of the process above: ``arm <name> <n>``
cuts the power right after the ``n``-th rename onto a file called ``<name>`` (the checkpoint's
``table.size``, say): the process that asked for the rename is stopped (SIGSTOP) before it can do
anything more, everything unsynced is dropped, and every later request fails with EIO until
``revive`` (the test kills the stopped process first).  Reading ``/.lazyfs`` gives the number
of cuts so far.

Only file contents are lazy, as in Jepsen's LazyFS: creating, renaming and removing names, and
directories, reach the disk at once (a directory fsync is then a no-op); what a lost directory
entry does is the loop-device recorder's to find (``blockrec``).  Unsynced state follows the
file, not its name (it is kept per inode), so a rename carries it along.

Run as a process: ``python -m realfaults.lazyfs MOUNTPOINT UNDERLYING``.
"""

from __future__ import annotations

import errno
import os
import sys
import threading
from dataclasses import dataclass, field

CTL = "/.lazyfs"
#: what a disk without power refuses (after a cut, until ``revive``)
DATA_OPS = frozenset({"read", "write", "truncate", "fsync", "create", "open", "mkdir", "rmdir", "unlink", "rename"})


@dataclass
class Pending:
    """A file's unsynced operations, in order: ``("w", offset, bytes)`` or ``("t", length, b"")``."""
    base_size: int
    ops: list[tuple[str, int, bytes]] = field(default_factory=list)
    size: int = 0

    def window(self, fd: int, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset + length)`` as the file reads with its pending operations."""
        buf = bytearray(length)
        base = os.pread(fd, length, offset) if offset < self.base_size else b""
        buf[:len(base)] = base
        size = self.base_size
        for kind, off, data in self.ops:
            if kind == "w":
                a, b = max(off, offset), min(off + len(data), offset + length)
                if a < b:
                    buf[a - offset:b - offset] = data[a - off:b - off]
                size = max(size, off + len(data))
            else:
                if off < offset + length:
                    cut = max(off, offset)
                    buf[cut - offset:] = bytes(offset + length - cut)
                size = off
        return bytes(buf[:max(0, min(length, size - offset))])


def _serve(mountpoint: str, root: str) -> None:
    from fuse import FUSE, FuseOSError, Operations

    class Lazy(Operations):
        def __init__(self) -> None:
            self.mutex = threading.Lock()
            self.pending: dict[int, Pending] = {}
            self.cuts = 0
            self.dead = False
            self.armed: tuple[str, int] | None = None

        def _cut(self) -> None:
            self.pending.clear()  # the power went: nothing unsynced survives
            self.cuts += 1
            self.dead = True

        def _p(self, path: str) -> str:
            return os.path.join(root, path.lstrip("/"))

        def _ino(self, fd: int) -> int:
            return os.fstat(fd).st_ino

        def _drop_if_last_link(self, full: str) -> None:
            try:
                st = os.lstat(full)
            except FileNotFoundError:
                return
            if st.st_nlink <= 1:
                self.pending.pop(st.st_ino, None)

        def __call__(self, op, path, *args):
            try:
                with self.mutex:
                    if self.dead and path != CTL and op in DATA_OPS:
                        raise FuseOSError(errno.EIO)
                    return super().__call__(op, path, *args)
            except OSError as e:
                if isinstance(e, FuseOSError):
                    raise
                raise FuseOSError(e.errno or errno.EIO) from None

        # -- names: at once ---------------------------------------------------------------
        def getattr(self, path, fh=None):  # noqa: ARG002 - fusepy calls each operation with its whole signature
            if path == CTL:
                return {"st_mode": 0o100600, "st_nlink": 1, "st_size": 4096}
            st = os.lstat(self._p(path))
            out = {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_atime",
                                                "st_mtime", "st_ctime", "st_ino")}
            p = self.pending.get(st.st_ino)
            if p is not None:
                out["st_size"] = p.size
            return out

        def readdir(self, path, fh):  # noqa: ARG002 - fusepy calls each operation with its whole signature
            return [".", "..", *os.listdir(self._p(path))]

        def mkdir(self, path, mode):
            os.mkdir(self._p(path), mode)

        def rmdir(self, path):
            os.rmdir(self._p(path))

        def unlink(self, path):
            self._drop_if_last_link(self._p(path))
            os.unlink(self._p(path))

        def rename(self, old, new):
            self._drop_if_last_link(self._p(new))
            os.rename(self._p(old), self._p(new))
            if self.armed is not None and os.path.basename(new) == self.armed[0]:
                name, n = self.armed
                self.armed = (name, n - 1) if n > 1 else None
                if n <= 1:
                    import signal

                    from fuse import fuse_get_context

                    os.kill(fuse_get_context()[2], signal.SIGSTOP)
                    self._cut()

        def chmod(self, path, mode):
            os.chmod(self._p(path), mode)

        def chown(self, path, uid, gid):
            os.chown(self._p(path), uid, gid)

        def utimens(self, path, times=None):
            os.utime(self._p(path), times)

        def access(self, path, amode):
            if path != CTL and not os.access(self._p(path), amode):
                raise FuseOSError(errno.EACCES)

        def statfs(self, path):
            st = os.statvfs(self._p(path))
            return {k: getattr(st, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                                "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

        def fsyncdir(self, path, datasync, fh):  # noqa: ARG002 - fusepy calls each operation with its whole signature
            return 0

        # -- contents: kept until fsync ---------------------------------------------------------
        def create(self, path, mode, fi=None):  # noqa: ARG002 - fusepy calls each operation with its whole signature
            return os.open(self._p(path), os.O_RDWR | os.O_CREAT, mode)

        def open(self, path, flags):
            if path == CTL:
                return os.open(os.devnull, os.O_RDWR)
            fd = os.open(self._p(path), os.O_RDWR if flags & os.O_ACCMODE != os.O_RDONLY else os.O_RDONLY)
            if flags & os.O_TRUNC:
                self._truncate(fd, 0)
            return fd

        def _pending(self, fd: int) -> Pending:
            st = os.fstat(fd)
            p = self.pending.get(st.st_ino)
            if p is None:
                p = self.pending[st.st_ino] = Pending(st.st_size, size=st.st_size)
            return p

        def _truncate(self, fd: int, length: int) -> None:
            p = self._pending(fd)
            p.ops.append(("t", length, b""))
            p.size = length

        def read(self, path, size, offset, fh):
            if path == CTL:
                return f"{self.cuts}\n".encode()[offset:offset + size]
            p = self.pending.get(self._ino(fh))
            return os.pread(fh, size, offset) if p is None else p.window(fh, offset, size)

        def write(self, path, data, offset, fh):
            if path == CTL:
                words = bytes(data).decode().split()
                if words == ["cut"]:
                    self._cut()
                elif words[:1] == ["arm"]:
                    self.armed = (words[1], int(words[2]))
                elif words == ["revive"]:
                    self.dead = False
                return len(data)
            p = self._pending(fh)
            p.ops.append(("w", offset, bytes(data)))
            p.size = max(p.size, offset + len(data))
            return len(data)

        def truncate(self, path, length, fh=None):
            if path == CTL:
                return
            if fh is None:
                fd = os.open(self._p(path), os.O_RDWR)
                try:
                    self._truncate(fd, length)
                finally:
                    os.close(fd)
            else:
                self._truncate(fh, length)

        def fsync(self, path, datasync, fh):  # noqa: ARG002 - fusepy calls each operation with its whole signature
            p = self.pending.pop(self._ino(fh), None)
            if p is not None:
                for kind, off, data in p.ops:
                    if kind == "w":
                        os.pwrite(fh, data, off)
                    else:
                        os.ftruncate(fh, off)
            os.fsync(fh)
            return 0

        def flush(self, path, fh):  # noqa: ARG002 - fusepy calls each operation with its whole signature
            return 0

        def release(self, path, fh):  # noqa: ARG002 - fusepy calls each operation with its whole signature
            os.close(fh)
            return 0

    # no caching of attributes or names: after a cut, sizes and names are what the disk kept
    FUSE(Lazy(), mountpoint, foreground=True, nothreads=False, allow_other=True, default_permissions=True,
         fsname="dis-lazyfs", attr_timeout=0, entry_timeout=0, negative_timeout=0)


if __name__ == "__main__":
    _serve(*sys.argv[1:3])
