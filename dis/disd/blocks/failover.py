"""A DIS that is down or restarting, as a reader over gRPC sees it: which failures mean that
(``restarting``), how they read (``explain``), how long and how often a call waits one out
(``DEFAULT_RETRY_S``, ``Backoff``), and the order in which the replicas of a set are asked for a
location (``replica_order``).  ``GrpcBlocks`` and the proxy's feeds follow these rules.
"""

from __future__ import annotations

import hashlib
import time
from typing import Sequence

import grpc

from disd.blocks.protocol import DisClientError

#: How long a reader rides out an unreachable DIS by default: a restart under systemd (the DIS
#: checkpoints on the way down, then recovers and listens again within seconds) fits with room.
DEFAULT_RETRY_S = 60.0
#: The first wait between attempts, doubled after each, at most the second.
RETRY_INITIAL_S, RETRY_MAX_S = 0.1, 2.0


def explain(e: grpc.RpcError, address: str) -> DisClientError:
    """A gRPC failure as a sentence that names the DIS."""
    code = e.code() if hasattr(e, "code") else None
    details = e.details() if hasattr(e, "details") else str(e)
    stopped = _stopped_before_handled(e)
    if stopped:
        details = "it stopped before answering"
    if code == grpc.StatusCode.UNAVAILABLE or stopped:
        return DisClientError(f"DIS at {address} is unreachable: {details}")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return DisClientError(f"DIS at {address} refused the credentials: {details}")
    return DisClientError(f"DIS at {address}: {code.name if code else 'error'}: {details}")


#: Words of an UNAVAILABLE status that a restart never causes: the TLS handshake failed (a
#: refused client certificate, an untrusted server).  Retrying those would only delay the error.
_NOT_A_RESTART = ("handshake", "ssl", "certificate", "tls")


#: The text of the CANCELLED status gRPC's core gives a call that reached a server as it stopped,
#: before a handler took it (grpc/grpc#41785).  Nobody cancelled that call: its DIS is going
#: away, as with UNAVAILABLE.  A call the caller cancels says "Locally cancelled by application!".
_STOPPED_BEFORE_HANDLED = "CANCELLED"


def _stopped_before_handled(e: grpc.RpcError) -> bool:
    if not hasattr(e, "code") or e.code() != grpc.StatusCode.CANCELLED:
        return False
    return ((e.details() if hasattr(e, "details") else "") or "").strip() == _STOPPED_BEFORE_HANDLED


def restarting(e: grpc.RpcError) -> bool:
    """Whether a failed call looks like its DIS being down or restarting (retry it), rather than
    a refusal that stays (answer at once)."""
    if _stopped_before_handled(e):
        return True
    if e.code() != grpc.StatusCode.UNAVAILABLE:
        return False
    details = (e.details() if hasattr(e, "details") else str(e)) or ""
    return not any(w in details.lower() for w in _NOT_A_RESTART)



class Backoff:
    """The pauses of a call that waits out unreachable DISes: 0.1 s doubling up to 2 s between
    rounds, for at most ``retry_s`` seconds from the first failed round."""

    def __init__(self, retry_s: float) -> None:
        self.retry_s = retry_s
        self.deadline: float | None = None
        self.delay = RETRY_INITIAL_S

    def expired(self) -> bool:
        """True once ``retry_s`` has passed since the first call (which starts the clock)."""
        now = time.monotonic()
        if self.deadline is None:
            self.deadline = now + self.retry_s
        return now >= self.deadline

    def sleep(self) -> None:
        time.sleep(max(0.0, min(self.delay, (self.deadline or 0.0) - time.monotonic())))
        self.delay = min(self.delay * 2, RETRY_MAX_S)



#: How long a replica that failed a call is asked last (after the other replicas of its set).
DOWN_S = 5.0


def replica_order(location: str, addresses: Sequence[str]) -> list[str]:
    """The replicas of a set in a location's own stable order (rendezvous hashing): by the first
    8 bytes of ``sha256("<location>@<address>")`` (big-endian, unsigned) descending, then address
    (a linear checksum such as CRC-32 would order two replicas the same way for every key).
    ``location`` is a location key as ``str(LocationKey)`` (``Namespace/Table/internal/column``).
    Readers spread locations over a set by trying them in this order: every reader picks the
    same replica for a location, and a replica that is down moves only its own locations to the
    others."""
    return sorted(addresses, key=lambda a: (-int.from_bytes(
        hashlib.sha256(f"{location}@{a}".encode()).digest()[:8], "big"), a))

