"""What ``TableData.Status`` reports per location: the operator's view (``dis status``) and the
tailer's log retention read it.

The checkpoint source record is read from the location's ``table.size`` on disk, not from
memory: that record is exactly where the location resumes after any crash, so it is the only
safe answer to "which log bytes may go".  With ``durable`` the location directory is fsynced
after the read, so a record whose rename the checkpointer has not yet synced cannot be undone by
a power loss after a tailer acted on it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from disd.rpc.v1 import dis_pb2
from disd.storage.checkpoint import FILE_NAME as CHECKPOINT_FILE
from disd.storage.checkpoint import CheckpointError, read_record
from disd.storage.fsio import fsync_dir

if TYPE_CHECKING:
    from disd.kafka.consumer import PartitionState
    from disd.server.ingestsessions import Session, TailerProblem
    from disd.storage import Location


@dataclass(frozen=True)
class CheckpointSource:
    file_name: str  # empty: nothing checkpointed yet
    offset: int
    skip_rows: int


NO_SOURCE = CheckpointSource("", 0, 0)


def checkpoint_source(path: str | os.PathLike[str], durable: bool) -> CheckpointSource:
    """The source record of the location's ``table.size``; NO_SOURCE when it is missing or
    unreadable (the location then reports its error itself)."""
    try:
        record = read_record(path)
    except (OSError, CheckpointError):
        return NO_SOURCE
    s = record.source if record is not None else None
    if s is None or not s.file_name:
        return NO_SOURCE
    if durable:
        try:
            fsync_dir(path)
        except OSError:
            return NO_SOURCE
    return CheckpointSource(s.file_name, int(s.offset), int(s.skip_rows))


def kafka_source(path: str | os.PathLike[str], state: PartitionState) -> dis_pb2.KafkaSource:
    """A Kafka location's source (``state``: its ``disd.kafka`` partition state): the offset of
    the checkpoint on disk and where the consumer is."""
    try:
        record = read_record(path)
    except (OSError, CheckpointError):
        record = None
    ckpt = record.source.offset if record is not None and record.source.topic == state.topic else -1
    return dis_pb2.KafkaSource(topic=state.topic, partition=state.partition, checkpoint_offset=ckpt,
                               next_offset=state.next_offset, high_watermark=state.high_watermark,
                               messages=state.messages, errors=state.errors, stopped=state.stopped or "",
                               source=state.source)


def location_status(loc: Location, key_msg: dis_pb2.LocationKey, session: Session | None, now: float,
                    durable: bool, problem: TailerProblem | None = None, kafka: PartitionState | None = None,
                    flush_age: float | None = None) -> dis_pb2.LocationStatus:
    """``flush_age``: ``StorageEngine.flush_age`` of the location (None: never flushed)."""
    src = checkpoint_source(loc.path, durable)
    last_ckpt = loc.last_checkpoint_time
    return dis_pb2.LocationStatus(
        key=key_msg, rows=loc.published_rows, checkpointed_rows=loc.checkpointed_rows,
        # ``now`` was taken before this location was looked at: a flush or checkpoint since then
        # is age 0, not a negative age (which reads as "never").
        last_flush_age_s=flush_age if flush_age is not None else -1.0,
        checkpoint_age_s=max(0.0, now - last_ckpt) if last_ckpt else -1.0,
        error=(loc.error or "") if loc.in_error else "",
        checkpoint_file=src.file_name, checkpoint_offset=src.offset, checkpoint_skip_rows=src.skip_rows,
        tailer=session.tailer_id if session else "",
        tailer_peer=session.peer if session else "",
        tailer_connected_s=(now - session.started) if session else 0.0,
        ingest_file=(session.file_name or "") if session else "",
        ingest_offset=session.offset if session else 0,
        tailer_problem=problem.problem if problem else "",
        tailer_problem_tailer=problem.tailer_id if problem else "",
        tailer_problem_age_s=max(0.0, now - problem.since) if problem else 0.0,
        checkpoint_changed_age_s=_changed_age(loc.path, now),
        schema_version=loc.schema_version,
        kafka=kafka_source(loc.path, kafka) if kafka is not None else None,
    )


def _changed_age(path: str | os.PathLike[str], now: float) -> float:
    """Seconds since ``table.size`` was last replaced (it is replaced only when rows changed)."""
    try:
        return max(0.0, now - os.stat(os.path.join(path, CHECKPOINT_FILE)).st_mtime)
    except OSError:
        return -1.0


def disk_usage(path: str) -> tuple[int, int]:
    """(free, total) bytes of the filesystem holding ``path``; (0, 0) when it cannot be read."""
    try:
        st = os.statvfs(path)
    except OSError:
        return 0, 0
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
