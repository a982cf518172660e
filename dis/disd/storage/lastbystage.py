"""The thread that builds last-by states ahead of their publishes (``LastBy.stage``).

Why a thread of its own: a publish's update (on the flusher) starts only at the publish, one
``flush_interval_ms`` after the rows came in, and while a burst streams in the flusher is idle
until then; the committed rows are final while the location's epoch stands, so their share of
the update can be made as they arrive, on a core the ingest thread leaves, and the publish's
update is left with the rows since.  A location asks for a visit after its ingest thread
committed enough rows (``Location.stage_lastby_soon``); the thread visits the locations that
asked, each once however often it asked.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    from disd.storage.location import Location

log = structlog.get_logger(__name__)

IDLE_WAKE_S = 0.5  # the longest the thread sleeps between looks at the stop event


class Stager:
    """Visits the locations that asked (``mark``), on its own thread (``run``)."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self._cond = threading.Condition()
        self._marked: dict[int, "Location"] = {}
        self.visits = 0

    def mark(self, loc: "Location") -> None:
        """Have ``loc``'s state built ahead at the thread's next turn; cheap when it already is."""
        with self._cond:
            if id(loc) not in self._marked:
                self._marked[id(loc)] = loc
                self._cond.notify()

    def run(self) -> None:
        while not self.stop.is_set():
            with self._cond:
                if not self._marked:
                    self._cond.wait(IDLE_WAKE_S)
                due, self._marked = list(self._marked.values()), {}
            for loc in due:
                try:
                    loc.stage_lastby()
                    self.visits += 1
                except Exception as e:  # noqa: BLE001 - one location must not stop the others
                    log.error("building a last-by state ahead failed", location=str(loc.key), error=repr(e))
