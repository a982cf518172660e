"""An exclusive lock file that names its holder: one owner of a resource at a time.

Two writers of one resource (a database root, a logger's location) would each write as if alone
and nothing in the data would show it.  So the owner takes an ``flock`` on a lock file beside the
resource and holds it for as long as it runs.  The kernel releases an ``flock`` when its process
ends, ``kill -9`` included, so a crashed owner leaves no stale lock to clear by hand, and the next
one simply takes it.

The lock file's content (one JSON object: host, pid, since, what) only names the holder for the
message of whoever is refused; the ``flock`` alone is the lock.  The descriptor is opened
close-on-exec, so child processes never inherit it.  An ``flock`` belongs to an open file, not to
a process: a second ``take_lock`` of the same path in the same process is refused too.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import socket
from dataclasses import asdict, dataclass

from disd.errors import DisError


@dataclass(frozen=True)
class LockHolder:
    """Who took a lock: for the message of whoever is refused."""

    host: str
    pid: int
    since: str  # ISO 8601, UTC
    what: str  # "dis serve", "logger of Market.Trade (process feed)", ...

    def describe(self) -> str:
        return f"{self.what} (pid {self.pid} on host {self.host}, since {self.since})"


class LockTaken(DisError):
    """Another open file holds the lock at ``path``; ``holder`` names it when its record reads."""

    def __init__(self, path: str, holder: LockHolder | None) -> None:
        who = holder.describe() if holder else "a process that left no record of itself"
        super().__init__(f"{path} is held by {who}")
        self.path, self.holder = path, holder


class HeldLock:
    """A lock this process holds; ``release()`` (or leaving the ``with``) gives it up."""

    def __init__(self, path: str, fd: int, holder: LockHolder) -> None:
        self.path, self.holder = path, holder
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the last descriptor of the open file drops the flock

    def __enter__(self) -> "HeldLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def read_holder(path: str) -> LockHolder | None:
    """Who last took the lock at ``path`` (whether or not it still holds it)."""
    try:
        with open(path, encoding="utf-8") as f:
            d = json.loads(f.read() or "null")
        return LockHolder(str(d["host"]), int(d["pid"]), str(d["since"]), str(d["what"]))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def take_lock(path: str, what: str, mode: int = 0o644) -> HeldLock:
    """Take the exclusive lock at ``path`` (the file is created with ``mode`` if missing) for
    ``what``, or raise ``LockTaken`` naming the holder at once: never wait for it.  A lock file
    this process may not write (another user's, in a directory shared by a group) is locked all
    the same, read-only, and its record left as it is."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, mode)
        writable = True
    except PermissionError:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        writable = False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise LockTaken(path, read_holder(path)) from None
    except BaseException:
        os.close(fd)
        raise
    holder = LockHolder(socket.gethostname(), os.getpid(),
                        dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), what)
    if writable:
        record = (json.dumps(asdict(holder)) + "\n").encode()
        os.pwrite(fd, record, 0)  # then cut: a reader never sees an empty file between the two
        os.ftruncate(fd, len(record))
    return HeldLock(path, fd, holder)
