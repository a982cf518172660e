"""Exclusive ownership of a database root: one writer at a time.

Two DISes on one root would each append to the same column files and overwrite each other's
rows, and nothing in the files would show it.  So whatever writes a root's intraday data — ``dis
serve``, an offline tool reading or repairing column files — first takes an ``flock`` on
``<db_root>/dis.lock`` and holds it for as long as it runs.  The kernel releases an ``flock``
when its process ends, ``kill -9`` included, so a crashed DIS leaves no stale lock to clear by
hand, and the next start simply takes it.

The lock file's content (one JSON object: host, pid, since, what) only names the holder for the
error message of whoever is refused; the ``flock`` alone is the lock.  The descriptor is opened
close-on-exec, so child processes (a Spark JVM) never inherit it.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import socket
from dataclasses import dataclass

from disd.errors import DisError

LOCK_FILE_NAME = "dis.lock"


class DatabaseLockedError(DisError):
    """Another process owns the database root."""

    def __init__(self, db_root: str, holder: "LockHolder | None") -> None:
        who = holder.describe() if holder else "a process that left no record of itself"
        super().__init__(f"database root {db_root} is in use by {who}; one DIS (or offline writer) "
                         f"per database root: stop that one first, or give this one its own db_root")
        self.db_root, self.holder = db_root, holder


@dataclass(frozen=True)
class LockHolder:
    host: str
    pid: int
    since: str  # ISO 8601, UTC
    what: str  # "dis serve", "dis merge", ...

    def describe(self) -> str:
        return f"{self.what} (pid {self.pid} on host {self.host}, since {self.since})"


class DatabaseLock:
    """The held lock of one database root; ``release()`` (or leaving the ``with``) gives it up."""

    def __init__(self, db_root: str, fd: int, holder: LockHolder) -> None:
        self.db_root, self.holder = db_root, holder
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the last descriptor of the open file drops the flock

    def __enter__(self) -> "DatabaseLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def read_holder(db_root: str) -> LockHolder | None:
    """Who last took the lock of ``db_root`` (whether or not it still holds it)."""
    try:
        with open(os.path.join(db_root, LOCK_FILE_NAME), encoding="utf-8") as f:
            d = json.loads(f.read() or "null")
        return LockHolder(str(d["host"]), int(d["pid"]), str(d["since"]), str(d["what"]))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def lock_database(db_root: str, what: str) -> DatabaseLock:
    """Take the exclusive lock of ``db_root`` (created if missing) for ``what``, or raise
    ``DatabaseLockedError`` naming the holder at once: never wait for it."""
    os.makedirs(db_root, exist_ok=True)
    path = os.path.join(db_root, LOCK_FILE_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DatabaseLockedError(db_root, read_holder(db_root)) from None
    except BaseException:
        os.close(fd)
        raise
    holder = LockHolder(socket.gethostname(), os.getpid(),
                        dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), what)
    record = (json.dumps(holder.__dict__) + "\n").encode()
    os.pwrite(fd, record, 0)  # then cut: a reader never sees an empty file between the two
    os.ftruncate(fd, len(record))
    return DatabaseLock(db_root, fd, holder)
