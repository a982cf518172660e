"""Where a location stops, and how its problems are told (docs/tailer.md, "Problems reported to
the DIS", "Failures"): the part of a location stream (``disd.tailer.location``) that runs its
streams one after the other and handles how each ended (a refusal, an address that is no DIS, a
location the DIS holds in error, a broken stream: each its own wait and backoff), decides to
stop before a file (a refused schema step, a corrupt frame, the DIS's refusal of a file), holds
the stream open while the cause lasts (so that a DIS that restarts is told again at once), waits
without a stream when none can be opened, and reports the location's problem whenever it
changes.  A mixin of ``LocationStream``: it works on that class's state (``problems``, the
status, the hint of the file the next stream opens with).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Callable

import grpc

from disd.binlog import CorruptLogError, LogHeader
from disd.tailer.behind import file_stat, repaired
from disd.tailer.protocol import LocationInError, NotADis, RefusedByDis, StreamBroken, StreamFlow, classify
from disd.tailer.schemastep import header_of, previous_header, schema_of, schema_step_problem
from disd.tailer.watch import LocationFiles, LogFile

#: the first reconnect delay of a broken stream (doubling to ``max_backoff_ms``)
INITIAL_BACKOFF_S = 0.1

if TYPE_CHECKING:
    import collections
    import threading

    from disd.tailer.config import TailerConfig
    from disd.tailer.core import Tailer
    from disd.tailer.problems import Problems
    from disd.tailer.status import StreamStatus


class Stops:
    """(mixin of ``LocationStream``)"""

    # The state of ``LocationStream`` this mixin works on, set by its ``__init__`` (declared here,
    # without values, for the type checker: the class is never used alone).
    tailer: Tailer
    cfg: TailerConfig
    log: Any  # structlog's bound logger
    problems: Problems
    refusals: collections.Counter[str]
    reachable: bool | None
    reconnects: int
    acked_bytes: int
    _lock: threading.Lock
    _status: StreamStatus
    _hint: str | None
    _corrupt: tuple[str, int, tuple] | None
    _opened: bool
    _opening_file: str | None
    _just_reported: bool
    _stop_said: tuple | None

    if TYPE_CHECKING:  # ``LocationStream``'s methods this mixin calls
        async def _stream(self) -> bool: ...
        async def _idle_wait(self, seconds: float | None = None) -> None: ...
        def _set(self, **kw: object) -> None: ...
        def files(self) -> LocationFiles: ...
        def problem(self) -> str: ...

    async def _run(self) -> None:
        backoff = INITIAL_BACKOFF_S
        reported: set[str] = set()
        retry_s = self.cfg.retry_refused_ms / 1000
        try:
            while True:
                self._opened = False
                if self._corrupt is not None:
                    # no stream could be opened (every file's header is corrupt): look again once
                    # the file is repaired, replaced or removed, or after the retry period
                    path, _, st = self._corrupt
                    await self._wait_stopped(lambda: repaired(st, file_stat(path)))
                last_corrupt, self._corrupt = self._corrupt, None
                acked_before = self.acked_bytes
                try:
                    if await self._stream():
                        backoff = INITIAL_BACKOFF_S
                        if not self._just_reported:
                            reported.clear()
                    self._just_reported = False
                except NotADis as e:
                    address = self._status.dis or ""
                    why = (f"{address} is not a DIS: it does not serve the Ingest service ({e}); a dis proxy serves "
                           "readers only: point the tailer at the DIS itself (dis: or routing:)")
                    with self._lock:
                        self.refusals[e.code] += 1
                        self.reachable = False  # nothing there takes the location's rows
                        self.problems.not_a_dis = why
                    self._set(state="refused", error=why, in_flight_bytes=0)
                    first = self.tailer.not_a_dis(address)  # one line per address, not per location
                    (self.log.error if first else self.log.debug)(
                        "the address is not a DIS (a dis proxy?); retrying later in case a DIS takes it over",
                        dis=address, error=str(e), retry_s=retry_s)
                    await asyncio.sleep(retry_s)
                except RefusedByDis as e:
                    with self._lock:
                        self.refusals[e.code] += 1
                        if e.code != "NOT_ROUTED":
                            self.reachable = True  # it answered
                    self._set(state="refused", error=str(e), in_flight_bytes=0)
                    self._note_refusal(e)
                    first = str(e) not in reported  # the same refusal again is logged at info
                    reported.add(str(e))
                    (self.log.warning if first else self.log.info)(
                        "location refused by the DIS; retrying later", code=e.code, error=e.details,
                        file=self._opening_file, dis=self._status.dis, retry_s=retry_s)
                    if self.problems.report_refusal_of is None:
                        # no stream can carry the problem: look again after the retry period, or
                        # once the refused file is gone
                        await self._wait_stopped(self._forget_missing_files)
                    # else at once: a stream of the schema before the refused file reports it, and
                    # waits there (``_follow``)
                except CorruptLogError as e:
                    path = e.path or ""
                    self._corrupt = (path, e.offset, file_stat(path))
                    self.problems.note_corrupt(e)
                    self._set(state="corrupt", error=str(e), in_flight_bytes=0)
                    # logged at error when new, or when the file changed and is still corrupt there
                    (self.log.info if self._corrupt == last_corrupt else self.log.error)(
                        "corrupt binary log: this location stops here until the file is repaired",
                        file=path, offset=e.offset, problem=e.problem, retry_s=retry_s)
                except LocationInError as e:
                    # the DIS answers, and holds the location in error: it may take it back by
                    # itself (space freed) or need an operator; try again with a backoff that grows
                    # to the retry period, saying it at warning once and at info after (once again
                    # after a stream that the DIS acknowledged rows on: a new failure)
                    if self.acked_bytes > acked_before:
                        backoff = INITIAL_BACKOFF_S
                        reported.clear()
                    with self._lock:
                        self.reconnects += 1
                        self.reachable = True
                    self._set(state="reconnecting", error=str(e), in_flight_bytes=0)
                    first = str(e) not in reported
                    reported.add(str(e))
                    (self.log.warning if first else self.log.info)(
                        "the DIS holds the location in error; trying again later", error=str(e),
                        backoff_s=round(backoff, 2))
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, max(self.cfg.max_backoff_ms, self.cfg.retry_refused_ms) / 1000)
                except (grpc.RpcError, StreamBroken, OSError) as e:
                    if self.tailer.stopping:
                        break
                    if self._opened:  # the stream had been working: a fresh failure, start over
                        backoff = INITIAL_BACKOFF_S
                        reported.clear()
                    detail = str(classify(e)) if isinstance(e, grpc.RpcError) else str(e)
                    with self._lock:
                        self.reconnects += 1
                        self.reachable = False
                    self._set(state="reconnecting", error=detail, in_flight_bytes=0)
                    first = detail not in reported
                    reported.add(detail)
                    (self.log.warning if first else self.log.info)(
                        "ingest stream failed; reconnecting", error=detail, backoff_s=round(backoff, 2))
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, self.cfg.max_backoff_ms / 1000)
                except Exception as e:  # a bug must not end the location silently
                    self._set(state="reconnecting", error=repr(e), in_flight_bytes=0)
                    self.log.exception("unexpected error in the location's stream; retrying")
                    await asyncio.sleep(self.cfg.max_backoff_ms / 1000)
        finally:
            self._set(state="stopped")

    async def _wait_stopped(self, cause_gone: Callable[[], bool]) -> None:
        """The wait of a location stopped with no stream open: ``retry_refused_ms``, or less once
        ``cause_gone()`` says so, looked at whenever the location's files change (the scans and
        inotify wake the location)."""
        deadline = time.monotonic() + self.cfg.retry_refused_ms / 1000
        while not cause_gone():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            await self._idle_wait(left)

    async def _hold(self, s: StreamFlow, accepts: bool, told: list, cause_gone: Callable[[], bool]) -> None:
        """The wait of a location stopped at a problem, on its open stream: until ``cause_gone()``
        (looked at whenever the location's files change) or ``retry_refused_ms`` passed, and the
        DIS is kept told of the problem meanwhile.  On the open stream, because a DIS that restarts
        (``kill -9``) ends it: the location then reconnects at once, and the rows before the
        problem that the DIS lost, and the problem itself, are sent again within its backoff
        instead of after the retry period.  StreamBroken when the stream ends."""
        deadline = time.monotonic() + self.cfg.retry_refused_ms / 1000
        while True:
            s.check()
            self._forget_missing_files()
            self._sync_problem(s, accepts, told)
            if cause_gone():
                return
            left = deadline - time.monotonic()
            if left <= 0:
                told[0] = None  # told again when looked at next: a report also keeps the stream alive
                return
            await self._idle_wait(left)

    def _say_stop(self, key: tuple, event: str, **kw: object) -> None:
        """Log why the location stops: at error the first time, at info when it is looked at again
        and still stops there for the same reason."""
        first = key != self._stop_said
        self._stop_said = key
        (self.log.error if first else self.log.info)(event, retry_s=self.cfg.retry_refused_ms / 1000, **kw)

    def _forget_missing_files(self) -> bool:
        return self.problems.forget_missing_files(self.files())

    # -- problems on this side, told to the DIS --------------------------------------------

    def _sync_problem(self, s: StreamFlow, accepts: bool, told: list) -> None:
        """Send the problem when it changed since the DIS was last told (``told[0]``)."""
        p = self.problem()
        if not p:
            self._stop_said = None  # a stop found again later is new
        if accepts and p != told[0]:
            s.report(p)
            told[0] = p

    def _note_refusal(self, e: RefusedByDis) -> None:
        """A FAILED_PRECONDITION refusal becomes the location's problem.  Refused at ``open`` for a
        file whose schema differs from the file before it, the next attempt opens with the earlier
        file's schema, to report it (``_follow``), unless this was that attempt."""
        if e.code != "FAILED_PRECONDITION":
            return
        problems = self.problems
        reporting = problems.report_refusal_of
        problems.report_refusal_of = None
        if self._opened:  # refused in the middle of a stream: a chunk of the file being sent
            file = self._status.file or self._opening_file or ""
        else:
            file = self._opening_file or ""
        if reporting is not None and self._opening_file != reporting:
            self._hint = reporting  # the earlier schema is refused too: go on trying the file itself
            return
        problem = (f"the DIS refuses the stream of {file}: {e.details}; its rows stay in the log and are "
                   f"sent once the DIS takes them")
        with self._lock:
            problems.refused = (file, problem, not self._opened)
        if self._opened:
            return
        lf = self.files()
        refused, prev = lf.find(file), previous_header(lf, file)
        if refused is None or prev is None:
            return  # no earlier file: the problem shows in this tailer's status and log only
        try:
            header = header_of(refused.path)
        except (CorruptLogError, OSError):
            return
        if header is not None and schema_of(header) != schema_of(prev[1]):
            problems.report_refusal_of = file
            self._hint = prev[0]

    async def _stop_at_corrupt(self, s: StreamFlow, accepts: bool, told: list, e: CorruptLogError) -> None:
        """A complete frame fails its checks: the frames before it are acknowledged (``drain``
        first); the location stops there, told to the DIS, until the file is repaired, replaced
        or removed (or the retry period passes: it is read there again)."""
        path = e.path or ""
        st = file_stat(path)
        self.problems.note_corrupt(e)
        self._sync_problem(s, accepts, told)
        self._set(state="corrupt", error=str(e), in_flight_bytes=0)
        self._say_stop(("corrupt", path, e.offset, e.problem, st[:1]),
                       "corrupt binary log: this location stops here until the file is repaired",
                       file=path, offset=e.offset, problem=e.problem)
        await self._hold(s, accepts, told, lambda: repaired(st, file_stat(path)))

    async def _check_step(self, s: StreamFlow, accepts: bool, told: list, lf: LocationFiles, cur: LogFile,
                          header: LogHeader) -> bool:
        """Before a file of another schema is sent: a change from the file before it that the
        rules refuse stops the location before the file (True), told to the DIS and held there
        (``_hold``) until the file is replaced or removed, or the retry period passes; a file that
        now passes ends the problem it stopped the location at (False)."""
        problems = self.problems
        prev = previous_header(lf, cur.name)
        problem = None if prev is None else schema_step_problem(prev[0], prev[1].schema, cur.name, header.schema)
        if prev is None or problem is None:
            with self._lock:
                if problems.schema_stop is not None and problems.schema_stop[0] == cur.name:
                    problems.schema_stop = None
            return False
        await s.drain()  # what went before the file is the DIS's
        with self._lock:
            problems.schema_stop = (cur.name, problem)
        self._hint = prev[0]  # a reconnect comes back here with the schema before the file
        self._sync_problem(s, accepts, told)
        self._set(state="refused", error=problem, in_flight_bytes=0)
        self._say_stop(("schema", problem), "schema change refused: this location stops before the file until it "
                       "is replaced", file=cur.name, problem=problem)
        path = cur.path
        st = file_stat(path)
        await self._hold(s, accepts, told, lambda: repaired(st, file_stat(path)))
        return True
