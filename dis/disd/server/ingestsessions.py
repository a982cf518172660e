"""The open ingest streams of a DIS, whichever call carries them: one ``Session`` per location's
stream, the owner lock that orders a stream's takeover, ingest and end, each location's last
tailer-reported problem, and the idle reaper.

Split from ``server.ingest`` (which validates and ingests what a stream carries) because who owns
a location, and how another thread ends a stream (``EndStream``: cancelling a ``Stream`` call, or
ending one stream of a ``Multiplex`` call), is a concept of its own that ``Status``, the metrics
and the TableData service read too.
"""

from __future__ import annotations

import errno
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol

import grpc
import structlog

from disd.names import LocationKey
from disd.rpc.ingeststatus import location_in_error

if TYPE_CHECKING:
    from disd.storage import Location

log = structlog.get_logger("disd.server.ingest")


#: how often open streams are checked for idleness and for their location failing under them
REAP_INTERVAL_S = 0.25
#: the longest tailer-reported problem kept (characters); longer ones are cut, saying so
MAX_PROBLEM_CHARS = 2000


def error_status(os_errno: int | None) -> grpc.StatusCode:
    """The status a tailer gets from a location in error: RESOURCE_EXHAUSTED when the disk is
    full (ENOSPC, EDQUOT), UNAVAILABLE otherwise.  Both make the tailer reconnect with backoff;
    the location reopens itself from its checkpoint once the disk takes writes again, and the
    reconnect resumes from there."""
    if os_errno in (errno.ENOSPC, errno.EDQUOT):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return grpc.StatusCode.UNAVAILABLE


class EndStream(Protocol):
    """How another thread (the idle reaper, a taking-over stream) ends a location's stream with a
    status its tailer can read: cancelling a ``Stream`` call, or ending one stream of a
    ``Multiplex`` call.  Never called with a location's owner lock held by the callee's side."""

    def __call__(self, code: grpc.StatusCode, details: str) -> None: ...


@dataclass
class Session:
    key: LocationKey
    tailer_id: str
    peer: str
    end: EndStream
    started: float = field(default_factory=time.time)
    last_message: float = field(default_factory=time.monotonic)
    file_name: str | None = None
    offset: int = 0
    idle_cancelled: bool = False
    taken_over: bool = False
    epoch: int = 0  # the location's epoch when this stream learnt its resume point
    location: "Location | None" = None  # the storage Location this stream feeds
    ended_for_error: bool = False
    closed: bool = False  # ended (under the owner lock): it may not ingest any more


def end_stream(context: grpc.ServicerContext, code: grpc.StatusCode, details: str) -> None:
    """End a stream from another thread (the idle reaper, a taking-over stream) with a status
    the client can read.

    ``ServicerContext.cancel()`` only says ``CANCELLED`` with no reason, which leaves an operator
    guessing; the context's core call can cancel with a status and message (the C core's
    ``grpc_call_cancel_with_status``).  That handle is not public API, so when it is missing or
    refuses the arguments, fall back to a bare cancel: the stream still ends."""
    call: Any = getattr(getattr(context, "_rpc_event", None), "call", None)
    try:
        call.cancel(code.value[0], details)
    except (AttributeError, TypeError):
        context.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leaves RpcContext.cancel unannotated


@dataclass(frozen=True)
class TailerProblem:
    """The last problem a location's tailer reported (``TailerReport``) and has not resolved."""

    problem: str
    tailer_id: str
    since: float  # time.time() of the first report of this problem


@dataclass(eq=False)  # hashed by identity: kept in a set
class UnopenedCall:
    """A call that has not sent its ``open`` yet (a ``Multiplex`` call: its first frame):
    watched by the reaper too, so a client that connects and sends nothing cannot hold a server
    thread forever."""

    peer: str
    end: EndStream
    since: float = field(default_factory=time.monotonic)
    cancelled: bool = False


class SessionRegistry:
    """The open ingest streams: at most one per location (a newer stream takes over), and the
    idle reaper that cancels streams that send nothing for ``idle_timeout_s``.

    Each location has an owner lock.  Taking over (and reading the resume point), ingesting a
    chunk and ending a stream all hold it, so a stream that has been taken over can never
    ingest after its successor learnt where to resume (which would duplicate rows), and a
    departing stream's rollback can never truncate rows of its successor."""

    def __init__(self, idle_timeout_s: float, failures: Callable[[], int] | None = None) -> None:
        self.idle_timeout_s = idle_timeout_s
        # a number that changes whenever a location goes into error or is reopened
        # (``StorageEngine.failures``); None: every stream is looked at on every pass
        self._failures = failures
        self._by_key: dict[LocationKey, Session] = {}
        self._owner_locks: dict[LocationKey, threading.Lock] = {}
        self._pending: set[UnopenedCall] = set()
        self._problems: dict[LocationKey, TailerProblem] = {}
        # when the last stream of a location ended (monotonic), while no other is open: a problem
        # reported on it is dropped ``idle_timeout_s`` later (``_expire_problems``)
        self._ended: dict[LocationKey, float] = {}
        self._expire_after = float("inf")  # the first time one of them may be dropped
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name="ingest-idle-reaper", daemon=True)
        self._reaper.start()

    def owner_lock(self, key: LocationKey) -> threading.Lock:
        with self._lock:
            lock = self._owner_locks.get(key)
            if lock is None:
                lock = self._owner_locks[key] = threading.Lock()
            return lock

    def add(self, s: Session) -> None:
        """Make ``s`` the location's stream; the caller holds the owner lock."""
        with self._lock:
            old = self._by_key.get(s.key)
            self._by_key[s.key] = s
            self._ended.pop(s.key, None)
        if old is not None:
            old.taken_over = True
            log.warning("ingest stream taken over", location=str(s.key), old=old.tailer_id, new=s.tailer_id)
            old.end(grpc.StatusCode.CANCELLED,
                    f"taken over by a newer ingest stream for {s.key} (tailer {s.tailer_id} at {s.peer})")

    def remove(self, s: Session) -> bool:
        """Forget ``s``; True if it still owned its location (it was not taken over)."""
        with self._lock:
            if self._by_key.get(s.key) is s:
                del self._by_key[s.key]
                if s.key in self._problems:
                    now = time.monotonic()
                    self._ended[s.key] = now
                    self._expire_after = min(self._expire_after, now + self.idle_timeout_s)
                return True
            return False

    def get(self, key: LocationKey) -> Session | None:
        with self._lock:
            return self._by_key.get(key)

    def sessions(self) -> list[Session]:
        with self._lock:
            return list(self._by_key.values())

    def report(self, s: Session, problem: str) -> None:
        """Record what the tailer of ``s`` reports about its location (empty: no problem).  It
        outlives the stream, until that location's tailer reports otherwise (a tailer stopped at
        a problem keeps a stream open, or opens one now and then to say it again), or until no
        stream of the location has been open for ``idle_timeout_s``: its tailer is gone (the
        ``DisTailerDisconnected`` alert says so) or no longer has the location's files, and a
        problem nobody stands behind any more must not keep an alert firing for ever."""
        if len(problem) > MAX_PROBLEM_CHARS:
            problem = problem[:MAX_PROBLEM_CHARS] + f" ... ({len(problem) - MAX_PROBLEM_CHARS} more characters)"
        with self._lock:
            old = self._problems.get(s.key)
            if problem:
                if old is None or old.problem != problem:
                    self._problems[s.key] = TailerProblem(problem, s.tailer_id, time.time())
            else:
                self._problems.pop(s.key, None)
        if problem and (old is None or old.problem != problem):
            log.warning("tailer reports a problem", location=str(s.key), tailer=s.tailer_id, problem=problem)
        elif not problem and old is not None:
            log.info("tailer problem resolved", location=str(s.key), tailer=s.tailer_id, problem=old.problem)

    def problem(self, key: LocationKey) -> TailerProblem | None:
        self._expire_problems()
        with self._lock:
            return self._problems.get(key)

    def problems(self) -> dict[LocationKey, TailerProblem]:
        self._expire_problems()
        with self._lock:
            return dict(self._problems)

    def _expire_problems(self) -> None:
        """Drop the problems of locations whose last stream ended ``idle_timeout_s`` ago (looked
        for only once one may be due: ``Status`` asks for every location's problem)."""
        now = time.monotonic()
        if now < self._expire_after:
            return
        with self._lock:
            gone = [k for k, t in self._ended.items() if now - t > self.idle_timeout_s]
            dropped = []
            for k in gone:
                del self._ended[k]
                p = self._problems.pop(k, None)
                if p is not None:
                    dropped.append((k, p))
            self._expire_after = min(self._ended.values(), default=float("inf")) + self.idle_timeout_s
        for k, p in dropped:
            log.info("tailer problem dropped: no stream of the location for server.idle_timeout_s", location=str(k),
                     tailer=p.tailer_id, problem=p.problem, idle_timeout_s=self.idle_timeout_s)

    def wait_open(self, peer: str, end: EndStream) -> UnopenedCall:
        p = UnopenedCall(peer, end)
        with self._lock:
            self._pending.add(p)
        return p

    def opened(self, p: UnopenedCall) -> None:
        with self._lock:
            self._pending.discard(p)

    def _reap(self) -> None:
        """Every pass: the streams whose location failed (only when a location failed or was
        reopened since the last look), then, every twentieth of the idle timeout, the idle ones.
        Why not every stream every pass: at ten thousand streams, four passes a second over all
        of them were a seventh of the DIS's interpreter time."""
        seen_failures: int | None = None
        idle_every = max(REAP_INTERVAL_S, self.idle_timeout_s / 20)
        idle_looked = time.monotonic()
        while not self._stop.wait(min(REAP_INTERVAL_S, self.idle_timeout_s / 4)):
            now = time.monotonic()
            failures = self._failures() if self._failures is not None else None
            look_failed = failures is None or failures != seen_failures
            seen_failures = failures
            look_idle = now - idle_looked >= idle_every
            if look_idle:
                idle_looked = now
            if not (look_failed or look_idle):
                continue
            for s in self.sessions():
                if look_failed:
                    self._end_if_location_failed(s)
                if look_idle and now - s.last_message > self.idle_timeout_s and not s.idle_cancelled:
                    s.idle_cancelled = True
                    idle = round(now - s.last_message, 1)
                    log.warning("ingest stream idle, closing", location=str(s.key), tailer=s.tailer_id, idle_s=idle)
                    s.end(grpc.StatusCode.CANCELLED,
                          f"idle for {idle} s (server.idle_timeout_s is {self.idle_timeout_s:g}): closed by the DIS")
            with self._lock:
                pending = list(self._pending)
            for p in pending:
                if now - p.since > self.idle_timeout_s and not p.cancelled:
                    p.cancelled = True
                    idle = round(now - p.since, 1)
                    log.warning("ingest stream sent no 'open', closing", peer=p.peer, idle_s=idle)
                    p.end(grpc.StatusCode.CANCELLED,
                          f"idle for {idle} s without an 'open' message (server.idle_timeout_s is "
                          f"{self.idle_timeout_s:g}): closed by the DIS")

    @staticmethod
    def _end_if_location_failed(s: Session) -> None:
        """A stream whose location went into error, or was reopened from its checkpoint, while
        the stream waited for data is ended now with the reason: a tailer with nothing more to
        send would otherwise never learn that rows it had sent must be sent again."""
        loc = s.location
        if loc is None or s.ended_for_error:
            return
        if loc.in_error:
            code, why = error_status(loc.error_errno), location_in_error(s.key, loc.error)
        elif loc.epoch != s.epoch:
            code, why = (grpc.StatusCode.UNAVAILABLE, f"location {s.key} was reopened from its checkpoint after an "
                         "I/O error: reconnect and resume from its resume point")
        else:
            return
        s.ended_for_error = True
        log.warning("ingest stream ended: its location failed", location=str(s.key), tailer=s.tailer_id,
                    code=code.name, reason=why)
        s.end(code, why)

    def close(self) -> None:
        self._stop.set()
