"""The log lines of refused Ingest requests, said once per cause.

A tailer retries a refused location for ever: every ``retry_refused_ms`` for a refusal, within its
backoff for a location the DIS holds in error.  A warning per attempt, per location, for as long
as the cause lasts buried everything else in the DIS's log (one every 5 s per location in error).
So each refusal (its location, status and details) is logged at warning the first time; its
repeats are counted (``dis_ingest_rejections_total`` counts every one) and said at info at most
once every ``REPEATS_SAID_EVERY_S``, with how many there were since.
"""

from __future__ import annotations

import collections
import threading
import time

import structlog

log = structlog.get_logger("disd.server.ingest")

#: how often the repeats of one refusal are said (with their count) after its first warning
REPEATS_SAID_EVERY_S = 300.0
#: the most refusals remembered; the least recently seen is forgotten first (and would be said at
#: warning again), so that a DIS refusing many locations or hostile clients stays bounded
MAX_REMEMBERED = 4096


class RefusalLog:
    """Logs refusals: a new one at warning, its repeats counted and said at info now and then."""

    def __init__(self, repeats_every_s: float = REPEATS_SAID_EVERY_S, max_remembered: int = MAX_REMEMBERED) -> None:
        self.repeats_every_s = repeats_every_s
        self.max_remembered = max_remembered
        self._lock = threading.Lock()
        # (location, code, details) -> [when last said (monotonic), repeats since]
        self._said: collections.OrderedDict[tuple[str | None, str, str], list[float]] = collections.OrderedDict()

    def refused(self, code: str, details: str, peer: str, location: str | None, tailer: str | None) -> None:
        key = (location, code, details)
        now = time.monotonic()
        with self._lock:
            entry = self._said.get(key)
            if entry is None:
                self._said[key] = [now, 0]
                while len(self._said) > self.max_remembered:
                    self._said.popitem(last=False)
                repeats = None
            else:
                self._said.move_to_end(key)
                entry[1] += 1
                if now - entry[0] < self.repeats_every_s:
                    return
                repeats, since = entry[1], round(now - entry[0])
                entry[0], entry[1] = now, 0
        if repeats is None:
            log.warning("ingest refused", code=code, details=details, peer=peer, location=location, tailer=tailer)
        else:
            log.info("ingest refused again", code=code, details=details, peer=peer, location=location, tailer=tailer,
                     repeats=repeats, over_s=since)
