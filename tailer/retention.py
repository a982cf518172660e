"""Log retention: delete (or move away) a binary log once the DIS checkpoint covers every row in it.

Why the checkpoint and nothing earlier: the resume point a stream learns, and every Ack, describe
what the DIS holds *in memory*.  After a crash the DIS truncates each location back to its last
checkpoint (``table.size``) and asks again from that checkpoint's source record (file, offset).
A log is therefore needed until that record has moved past it.  The tailer asks the owner of
each location for exactly that record with ``TableData.Status`` (``durable_checkpoint``: the DIS
fsyncs the location directory before answering, so the record cannot be undone by a power loss).

A file of a location is *covered* by a checkpoint at ``(F, offset, skip_rows)`` when

* it comes before ``F`` in the location's file order (the DIS never goes back to an older
  file), or
* it is ``F`` itself, ``offset`` is at (or past) its end and ``skip_rows`` is 0,

and in both cases it is not the location's newest file, the one a logger may still be writing.
A file before ``F`` must also be exactly as long as it was when every stream of the location moved
past it (``disd.tailer.passed``): bytes appended to it afterwards (a second writer on the location)
were never sent, so no checkpoint covers them, and the file is kept (and reported as stranded).
Nothing is removed while the DIS is unreachable, reports no checkpoint for the location, or
while the location is in error.

A location routed to a replica set (docs/replicas.md) is streamed to every replica, and each may
need to resume from its own checkpoint: every replica is asked, and a file is removed only when
the *oldest* of their checkpoints covers it.  A replica that cannot be asked (down, unreachable)
or has no checkpoint of the location keeps every file of it: when it comes back it catches up
from those files.  Only files in ``log_dirs`` are touched: never CSV spool logs,
whose removal would make the CSV be transcoded again.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Callable, Iterable

import grpc
import structlog

from disd.names import LocationKey
from disd.routing import Replica
from disd.rpc.channel import open_channel
from disd.rpc.keys import key_from_proto
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from disd.tailer.config import RetentionConfig
from disd.tailer.watch import LogFile, order_of

if TYPE_CHECKING:
    from disd.tailer.core import Tailer

log = structlog.get_logger("disd.tailer")

STATUS_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Checkpoint:
    """A location's checkpointed source record, as the DIS reports it."""

    file_name: str
    offset: int
    skip_rows: int = 0


def oldest_checkpoint(ckpts: Iterable[Checkpoint | None]) -> Checkpoint | None:
    """The least advanced of the replicas' checkpoints of one location; None when one of them has
    none (that replica needs every file)."""
    out: Checkpoint | None = None
    for c in ckpts:
        if c is None or not c.file_name:
            return None
        if out is None or (order_of(c.file_name), c.offset, c.skip_rows) < (order_of(out.file_name), out.offset,
                                                                          out.skip_rows):
            out = c
    return out


def covered_files(files: list[LogFile], ckpt: Checkpoint | None, size_of: Callable[[str], int],
                  passed_ends: Callable[[str], list[int | None]]) -> list[LogFile]:
    """The files of one location (oldest first) that the checkpoint covers (module docstring);
    ``passed_ends(name)``: the size each stream of the location passed file ``name`` at (None: a
    stream has not passed it)."""
    if ckpt is None or not ckpt.file_name or len(files) < 2:
        return []
    at = order_of(ckpt.file_name)
    out = []
    for f in files[:-1]:  # never the newest: a logger may still append to it
        if f.order < at:
            ends = passed_ends(f.name)
            known = [e for e in ends if e is not None]
            if ends and len(known) == len(ends) and size_of(f.path) <= min(known):
                out.append(f)
        elif f.name == ckpt.file_name and ckpt.skip_rows == 0 and ckpt.offset >= size_of(f.path):
            out.append(f)
    return out


@dataclass
class RetentionStatus:
    passes: int = 0
    removed_files: int = 0
    removed_bytes: int = 0
    errors: int = 0
    last_error: str | None = None  # of the latest pass; None once a pass went through cleanly


class LogRetention(threading.Thread):
    """One thread: every ``interval_ms``, ask each DIS (every replica) for the checkpoints of
    this tailer's locations and remove the files every replica's checkpoint covers."""

    def __init__(self, tailer: "Tailer", config: RetentionConfig, halt: threading.Event) -> None:
        super().__init__(name="tailer retention", daemon=True)
        self.tailer = tailer
        self.config = config
        self.halt = halt
        self.log_dirs = {os.path.realpath(d) for d in tailer.config.log_dirs}
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()
        self._status = RetentionStatus()
        self._reported: set[str] = set()

    def status(self) -> dict:
        with self._lock:
            return asdict(self._status)

    def run(self) -> None:
        try:
            while not self.halt.wait(self.config.interval_ms / 1000):
                try:
                    self.run_once()
                except Exception as e:  # a bug must not end retention silently
                    self._error(f"retention pass failed: {e!r}")
                    log.exception("log retention pass failed")
        finally:
            for ch in self._channels.values():
                ch.close()

    # -- one pass ----------------------------------------------------------------------------

    def run_once(self) -> list[str]:
        """One pass over every location; returns the paths removed."""
        errors_before = self.status()["errors"]
        by_address: dict[str, list[LocationKey]] = {}
        members: dict[LocationKey, tuple[Replica, ...]] = {}
        for key in self.tailer.locations():
            replicas = self.tailer.config.routing.replicas(key.namespace, key.table)
            if replicas:
                members[key] = replicas
                for r in replicas:
                    by_address.setdefault(r.address, []).append(key)
        answers = {address: self._checkpoints(address, keys) for address, keys in by_address.items()}
        removed: list[str] = []
        for key, replicas in members.items():
            per = [answers[r.address] for r in replicas]
            if any(a is None for a in per):
                continue  # a replica that cannot be asked keeps every file of its locations
            ckpt = oldest_checkpoint(a.get(key) for a in per)  # type: ignore[union-attr]
            if ckpt is None:
                continue
            files = [f for f in self.tailer.files_of(key).files
                     if os.path.realpath(os.path.dirname(f.path)) in self.log_dirs]
            workers = self.tailer.workers_of(key)
            for f in covered_files(files, ckpt, _size, lambda n: [w.passed_files.end_of(n) for w in workers]):
                if self.halt.is_set():
                    return removed
                if self._remove(f, key, ckpt):
                    removed.append(f.path)
        with self._lock:
            self._status.passes += 1
            if self._status.errors == errors_before:
                self._status.last_error = None
        return removed

    def _checkpoints(self, address: str, keys: Iterable[LocationKey]) -> dict[LocationKey, Checkpoint] | None:
        """The checkpoint of each location the DIS at ``address`` knows and has checkpointed;
        None when the DIS cannot be asked now."""
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = open_channel(address, self.tailer.config.security)
        stub = dis_pb2_grpc.TableDataStub(ch)
        wanted = set(keys)
        out: dict[LocationKey, Checkpoint] = {}
        # one call per (namespace, table, internal partition): usually one per table on a host
        for ns, table, ip in sorted({(k.namespace, k.table, k.internal_partition) for k in wanted}):
            try:
                reply = stub.Status(dis_pb2.StatusRequest(namespace=ns, table=table, internal_partition=ip,
                                                          durable_checkpoint=True), timeout=STATUS_TIMEOUT_S)
            except grpc.RpcError as e:
                code = e.code().name if hasattr(e, "code") else "error"
                self._error(f"DIS {address}: {code}: {e.details() if hasattr(e, 'details') else e}")
                return None
            for s in reply.locations:
                key = key_from_proto(s.key)
                if key in wanted and s.checkpoint_file and not s.error:
                    out[key] = Checkpoint(s.checkpoint_file, s.checkpoint_offset, s.checkpoint_skip_rows)
        return out

    def _remove(self, f: LogFile, key: LocationKey, ckpt: Checkpoint) -> bool:
        try:
            size = _size(f.path)
            if self.config.mode == "delete":
                os.unlink(f.path)
            else:
                _move(f.path, os.path.join(self.config.move_to or "", f.name))
        except FileNotFoundError:
            return False  # already gone (a pass before the directory was rescanned)
        except OSError as e:
            self._error(f"cannot {self.config.mode} {f.path}: {e}")
            return False
        with self._lock:
            self._status.removed_files += 1
            self._status.removed_bytes += size
        # "the DIS checkpoint": the oldest of the replicas' checkpoints (one for a plain entry)
        log.info("log file covered by the DIS checkpoint: " + ("deleted" if self.config.mode == "delete" else "moved"),
                 location=str(key), file=f.path, bytes=size, move_to=self.config.move_to,
                 checkpoint_file=ckpt.file_name, checkpoint_offset=ckpt.offset)
        self.tailer.watcher.poke()  # rescan: the workers must not look for the file any more
        return True

    def _error(self, message: str) -> None:
        with self._lock:
            self._status.errors += 1
            self._status.last_error = message
        if message not in self._reported:  # the same failure every pass is logged once
            self._reported.add(message)
            log.warning("log retention: nothing removed", error=message)


def _size(path: str) -> int:
    return os.stat(path).st_size


def _move(src: str, dst: str) -> None:
    """Move ``src`` to ``dst`` durably, refusing to replace an existing file.  Across
    filesystems: copy to a hidden temporary name, fsync, rename, fsync the directory, and only
    then remove the source."""
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, "the archive already holds a file of that name", dst)
    os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
    try:
        os.rename(src, dst)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        tmp = os.path.join(os.path.dirname(dst), "." + os.path.basename(dst) + ".tmp")
        with open(src, "rb") as fin, open(tmp, "wb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
            fout.flush()
            os.fsync(fout.fileno())
        os.rename(tmp, dst)
        _fsync_dir(os.path.dirname(dst))
        os.unlink(src)
        return
    _fsync_dir(os.path.dirname(dst))


def _fsync_dir(path: str) -> None:
    fd = os.open(path or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
