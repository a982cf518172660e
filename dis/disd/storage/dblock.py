"""Exclusive ownership of a database root: one writer at a time.

Two DISes on one root would each append to the same column files and overwrite each other's
rows, and nothing in the files would show it.  So whatever writes a root's intraday data — ``dis
serve``, an offline tool reading or repairing column files — first takes the lock
``<db_root>/dis.lock`` (``disd.ownerlock``: an ``flock`` the kernel drops when the process ends,
naming its holder) and holds it for as long as it runs.
"""

from __future__ import annotations

import os

from disd.errors import DisError
from disd.ownerlock import HeldLock, LockHolder, LockTaken, take_lock
from disd.ownerlock import read_holder as _read_lock_holder

LOCK_FILE_NAME = "dis.lock"

__all__ = ["LOCK_FILE_NAME", "DatabaseLock", "DatabaseLockedError", "LockHolder", "lock_database", "read_holder"]


class DatabaseLockedError(DisError):
    """Another process owns the database root."""

    def __init__(self, db_root: str, holder: LockHolder | None) -> None:
        who = holder.describe() if holder else "a process that left no record of itself"
        super().__init__(f"database root {db_root} is in use by {who}; one DIS (or offline writer) "
                         f"per database root: stop that one first, or give this one its own db_root")
        self.db_root, self.holder = db_root, holder


#: The held lock of one database root.
DatabaseLock = HeldLock


def read_holder(db_root: str) -> LockHolder | None:
    """Who last took the lock of ``db_root`` (whether or not it still holds it)."""
    return _read_lock_holder(os.path.join(db_root, LOCK_FILE_NAME))


def lock_database(db_root: str, what: str) -> DatabaseLock:
    """Take the exclusive lock of ``db_root`` (created if missing) for ``what``, or raise
    ``DatabaseLockedError`` naming the holder at once: never wait for it."""
    os.makedirs(db_root, exist_ok=True)
    try:
        return take_lock(os.path.join(db_root, LOCK_FILE_NAME), what)
    except LockTaken as e:
        raise DatabaseLockedError(db_root, e.holder) from None
