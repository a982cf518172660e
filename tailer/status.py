"""What a location's stream says of itself: its status (``Tailer.status()``) and the replicas'
connectedness (``Tailer.replica_status()``, ``dis_tailer_replica_connected``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StreamStatus:
    state: str = "starting"  # starting waiting connecting streaming following refused corrupt reconnecting stopped
    file: str | None = None  # the file being sent
    sent_offset: int = 0  # offset in ``file`` after the last chunk sent
    acked_file: str | None = None
    acked_offset: int = 0  # the DIS has ingested every byte of ``acked_file`` before this
    committed_rows: int = 0
    in_flight_bytes: int = 0
    dis: str | None = None  # the replica's address
    replica: str | None = None  # the replica's name in the routing
    error: str | None = None
    problem: str | None = None  # what the DIS is told is wrong on this side; filled in by status()


def replica_connected(reachable: list[bool | None]) -> bool:
    """A replica is connected when one of its location streams has an open stream to it or got
    an answer from it at its last attempt; not connected when their attempts fail and none has; a
    replica no stream has tried yet counts as connected (nothing is failing)."""
    if any(r is True for r in reachable):
        return True
    return not any(r is False for r in reachable)
