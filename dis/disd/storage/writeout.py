"""The cuts and writes locations' write states have made due, for many locations in one call.

A write state (``storage.writestate``) only changes memory; what it makes due (the whole blocks
its rows filled, a flush's partial blocks, the cut of a rollback below what is written) is made
here, through the engine's file system.  The real file system with the compiled state does all of
a batch's in C, giving up the interpreter's lock once (``ingestcore.write_out``, offered by
``fsio.OsFileSystem.write_states``): a ``Multiplex`` request's caught-up locations, or a flush
clock tick's, are flushed together.  Any other file system, or the reference state, gets the
composition of the handles' own operations, so a test's recording or failing disk sees every call.

Descriptors.  A column file whose descriptor the handle factory holds is written on it (pinned,
so cleanup cannot close it meanwhile).  One whose descriptor was reclaimed (more column files
than ``max_open_files``) is opened for its writes alone, its identity checked as a reopen checks
it, and closed again, in the same C call: at ten thousand live locations, where every write
finds its files closed, reopening them through the factory costs more interpreter time than the
rest of the write.  Such opens count as cycling
(``dis_file_handle_fast_cycling_total``), as reclaims do.

The caller holds each location's lock.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Sequence

from disd.storage import metrics
from disd.storage.filehandles import FileIdentityError, identity_error, pwrite_files
from disd.storage.fsio import WriteStates, errno_name
from disd.storage.writestate import is_compiled

if TYPE_CHECKING:
    from disd.storage.location import Location


def write_out(jobs: Sequence[tuple["Location", bool]], raise_first: bool = False) -> list[BaseException | None]:
    """Make each location's due cuts and writes (``(location, flush)``: with ``flush``, its
    partial blocks too).  Returns each job's failure (None when done); the first is raised
    instead with ``raise_first``.  A failed location's state is as if its writes were made: the
    caller puts it in error, and it is reopened from its checkpoint."""
    failures: list[BaseException | None] = [None] * len(jobs)
    native, composed = [], []
    for j, (loc, flush) in enumerate(jobs):
        state = loc.state
        if state is None or not state.needs_io(flush):
            continue
        if is_compiled(state) and getattr(loc.fs, "write_states", None) is not None:
            native.append(j)
        else:
            composed.append(j)
    if native:
        _native(jobs, native, failures)
    for j in composed:
        loc, flush = jobs[j]
        try:
            _composed(loc, flush)
        except Exception as e:  # noqa: BLE001 - the caller puts the location in error
            failures[j] = e
    if raise_first:
        for f in failures:
            if f is not None:
                raise f
    return failures


#: the most locations flushed together: one flush holds their locks, from the first taken until
#: all are written and published, and is timed as one (``dis_flush_duration_seconds``).  A flush
#: clock tick's locations, and a ``Multiplex`` request's chunks (``server.ingestmux``), go in
#: groups of at most this many, each group's locks released once it is published.  A tailer
#: following thousands of locations sends each one's write of a moment in one request; flushed
#: as one (about 25 µs of CPU a location whose column files must be reopened, stretched several
#: times on a busy machine), every one of its rows stayed unreadable until the last was written.
FLUSH_GROUP = 256


def flush_many(locs: Sequence["Location"]) -> int:
    """Flush these locations (the flush clock's tick), in groups of at most ``FLUSH_GROUP``: each
    group's locks taken (in one order for every caller), their writes made in one call, each
    published, the locks released, then the subscribers told.  A location flushed since it was
    marked (nothing to write or publish) is passed over, unless its last-by state is behind its
    published rows (an ingest thread handed the update over: ``Location.hand_off_lastby``); a
    failed flush puts its location in error.  Returns how many were flushed."""
    todo = {id(loc): loc for loc in locs if loc.dirty_since is not None or loc.lastby_behind()}
    order = [todo[k] for k in sorted(todo)]
    group = max(1, FLUSH_GROUP)
    for i in range(0, len(order), group):
        _flush_group(order[i:i + group])
    return len(todo)


def _flush_group(locs: Sequence["Location"]) -> None:
    t0 = time.perf_counter()
    held: list["Location"] = []
    published = []
    try:
        for loc in locs:
            loc.lock.acquire()
            held.append(loc)
        live = [loc for loc in held if not loc.closed and not loc.in_error]
        now = time.time()
        for loc, e in zip(live, write_out([(loc, True) for loc in live])):
            if e is not None:
                loc.fail_io("flush", e)
            elif loc.published_locked(now) or loc.lastby_behind():  # (an ingest thread's hand-off)
                published.append((loc, loc.publish_snapshot()))
    finally:
        for loc in reversed(held):
            loc.lock.release()
    metrics.FLUSH_DURATION.observe(time.perf_counter() - t0)
    for loc, what in published:
        loc.update_lastby(what)
        loc.published()


def _composed(loc: "Location", flush: bool) -> None:
    state = loc.state
    assert state is not None  # write_out passes over a location without a write state
    cuts, writes = state.take_io(flush)
    for i, size in cuts:
        loc.handles[i].truncate(size)
    if writes:
        pwrite_files([(loc.handles[i], data, offset) for i, data, offset in writes])
        for _, data, _ in writes:
            metrics.WRITE_SIZE.observe(len(data))


def _native(jobs: Sequence[tuple["Location", bool]], which: list[int], failures: list[BaseException | None]) -> None:
    factory = jobs[which[0]][0]._files  # noqa: SLF001 - one engine's locations share their factory
    fs = jobs[which[0]][0].fs
    calls, pinned = [], []
    try:
        made = []
        for j in which:
            loc, flush = jobs[j]
            try:
                files, held = factory.pin_for_write(loc.handles)
            except Exception as e:  # noqa: BLE001 - a descriptor that could not be reopened
                failures[j] = e
                continue
            pinned.extend(held)
            calls.append((loc.state, files, flush))
            made.append(j)
        if not calls:
            return
        # an optional operation of a file system (not in the FileSystem protocol); write_out
        # sends jobs here only when the locations' file system offers it
        write_states: WriteStates | None = getattr(fs, "write_states", None)
        assert write_states is not None
        with factory.transient_slot():
            results, sizes, transient = write_states(calls)
    finally:
        factory.unpin(pinned)
    metrics.WRITE_SIZE.observe_counts(sizes[:-1], sizes[-1])
    if transient:
        factory.note_transient(transient)
    for j, failure in zip(made, results):
        if failure is not None:
            failures[j] = _error(jobs[j][0], *failure)


def _error(loc: "Location", index: int, op: str, code: int, kind: int) -> BaseException:
    """The exception a failed compiled write stands for, as the composed one would raise it."""
    handle = loc.handles[index]
    if kind:  # the file is gone (1) or another one now (2)
        try:
            st = loc.fs.stat(handle.path) if kind == 2 else None
        except OSError:
            st = None
        now = (st.st_dev, st.st_ino) if st is not None else None
        return identity_error(handle.path, handle.identity, now)
    e = OSError(code, os.strerror(code), handle.path)
    e.storage_op = op  # type: ignore[attr-defined]
    metrics.IO_ERRORS.labels(op, errno_name(code)).inc()
    return e


__all__ = ["FLUSH_GROUP", "FileIdentityError", "flush_many", "write_out"]
