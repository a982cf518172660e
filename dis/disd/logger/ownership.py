"""One writer per location: the lock a logger holds on its internal partition of a table.

Why: two logger processes writing one location (the same table and internal partition: two
instances of one script, web-server workers with the default host-name partition, a restart that
overlaps the old process) each write files of it, stamped when each opened them.  The tailer
streams a location's files in order, one position per location, and moves to the newer file once
it exists and the older one has no more complete frames; rows appended to the older file after
that can never be ingested into the location (the DIS only ever goes forward in a location's
files).  Rows would be lost with nothing wrong to be seen at the time they are written.

So ``build()`` takes an exclusive ``flock`` (``disd.ownerlock``) on
``<log_dir>/.<Namespace>.<Table>.<InternalPartition>.lock`` and the logger holds it until
``close()``.  It covers every column partition of the internal partition: a logger may write any
of them (by write time, or by a partition function), so it owns them all.  The kernel drops the
lock when the process ends, ``kill -9`` included: nothing stale is ever left to clear.  The file
names its holder (host, pid, since, what), so a refusal names the other process.  Lock files
start with ``.``, so the tailer never takes them for logs; they stay after ``close()`` (removing
a lock file that another process may be opening would let two processes hold "the" lock).

When the lock is held, ``build()`` by default refuses (``LocationInUseError``): the internal
partition is the name operators and readers see for a process's rows, and silently taking another
one would scatter a process's rows over new locations at every overlapping restart and hide a
configuration mistake (two deployments sharing a name).  A refusal at ``build()`` happens before
any row is accepted, so it loses nothing.  Told to (``set_on_location_in_use("new_partition")``,
for a pool of identical worker processes), the builder takes the first free internal partition
of ``<name>_2``, ``<name>_3``, ... instead (before the ``-<version>`` suffix, when there is one).
"""

from __future__ import annotations

import os
import pathlib
import sys
from enum import Enum
from typing import Callable

from disd.logger.errors import LoggerError
from disd.ownerlock import HeldLock, LockHolder, LockTaken, take_lock
from disd.schema import TableSchema

#: At most this many internal partitions are tried by ``new_partition`` before giving up.
MAX_INSTANCES = 1000


class OnLocationInUse(str, Enum):
    """What ``build()`` does when another live logger holds the location."""

    REFUSE = "refuse"
    NEW_PARTITION = "new_partition"


class LocationInUseError(LoggerError):
    """Another live logger (process, or logger object) writes the table's internal partition in
    this log directory; ``holder`` names it when its lock file says."""

    def __init__(self, schema: TableSchema, log_dir: pathlib.Path, internal_partition: str,
                 holder: LockHolder | None, tried: int = 1) -> None:
        who = holder.describe() if holder else "another process (its lock file names no holder)"
        many = f" (and the next {tried - 1} numbered ones)" if tried > 1 else ""
        super().__init__(
            f"{schema.key} internal partition {internal_partition!r}{many} in {log_dir} is being written by {who}: "
            f"a location takes one logger at a time, or rows are lost. Give this logger a distinct process name "
            f"(set_process_name) or internal partition (set_internal_partition, set_internal_partition_suffix), "
            f"or let it take a free one: set_on_location_in_use('new_partition')")
        self.internal_partition, self.holder = internal_partition, holder


def lock_path(log_dir: pathlib.Path, schema: TableSchema, internal_partition: str) -> pathlib.Path:
    """The lock file of one internal partition of ``schema``'s table in ``log_dir``."""
    return log_dir / f".{schema.namespace}.{schema.table}.{internal_partition}.lock"


def claim_location(log_dir: pathlib.Path, schema: TableSchema, name_for: Callable[[int], str],
                   on_in_use: OnLocationInUse, process_name: str | None) -> tuple[str, HeldLock]:
    """(internal partition, its held lock): ``name_for(1)``, the configured name, or with
    ``NEW_PARTITION`` the first free of ``name_for(2)``, ``name_for(3)``, ...  Raises
    ``LocationInUseError`` naming the holder of the configured name."""
    what = f"a logger of {schema.key}" + (f" (process name {process_name})" if process_name else "")
    what += f": {' '.join(sys.argv)[:120]}" if sys.argv and sys.argv[0] else ""
    first: LockTaken | None = None
    last = MAX_INSTANCES if on_in_use is OnLocationInUse.NEW_PARTITION else 1
    for n in range(1, last + 1):
        name = name_for(n)
        try:
            # group-writable: loggers of several users share a log directory through its group
            return name, take_lock(os.fspath(lock_path(log_dir, schema, name)), what, mode=0o664)
        except LockTaken as e:
            first = first or e
    assert first is not None
    raise LocationInUseError(schema, log_dir, name_for(1), first.holder, last)
