"""The answer deadline of a call to a DIS (``ack_timeout_ms``, docs/tailer.md, "Connections"):
a call on which requests wait for an answer (an ``open`` its resume point, a chunk its ack) and
from which nothing at all has been heard for longer than the deadline is given up, so that its
streams reconnect with their backoff and the replica counts as down.

Why besides gRPC's keepalive (``keepalive_ms``): keepalive pings are answered by the DIS's gRPC
core, so they find a process that stopped (frozen, SIGSTOP, a host gone while its connections
stay open), not one whose core still answers while the ingest never does (a thread stuck).  The
deadline finds both, later; keepalive finds the first within seconds whatever the deadline.

One watcher per call, a timer every eighth of the deadline: no timer per request.  What counts
as heard is any reply on the call, not the oldest request's own ack: a DIS working through a
burst of opens answers them in order, and is alive while it does.  A tick that comes late by more
than half the deadline means the tailer's own loop stalled (replies may be waiting unread), and
restarts the count rather than blaming the DIS.
"""

from __future__ import annotations

import asyncio
from typing import Callable

#: the shortest tick of the watcher
MIN_TICK_S = 0.05


class AnswerDeadline:
    """Watches one call: ``heard()`` on every reply, ``waiting()`` says whether a request is
    unanswered.  ``expired()`` returns (the seconds of silence) once the deadline passed with a
    request unanswered; it never returns otherwise.  On the tailer's loop only."""

    def __init__(self, timeout_s: float, waiting: Callable[[], bool]) -> None:
        self.timeout_s = timeout_s
        self.waiting = waiting
        self._heard = asyncio.get_running_loop().time()

    def heard(self) -> None:
        self._heard = asyncio.get_running_loop().time()

    async def expired(self) -> float:
        loop = asyncio.get_running_loop()
        tick = max(MIN_TICK_S, self.timeout_s / 8)
        last = since = loop.time()  # since: the last tick that found nothing waiting
        while True:
            await asyncio.sleep(tick)
            now = loop.time()
            if now - last > tick + self.timeout_s / 2:
                since = now  # the loop itself stalled: what the DIS sent may be unread
            last = now
            if not self.waiting():
                since = now
                continue
            # every request waiting was sent after ``since``; one tick of slack: never early
            silent = now - max(since, self._heard)
            if silent > self.timeout_s + tick:
                return silent


def silence_problem(address: str, silent_s: float, ack_timeout_s: float, waiting: str) -> str:
    """What a call given up by its deadline says: the DIS, how long it was silent, what waited."""
    return (f"the DIS at {address} answered nothing for {silent_s:.1f} s while {waiting} waited for it "
            f"(ack_timeout_ms {round(ack_timeout_s * 1000)}): stopped or stuck")
