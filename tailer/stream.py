"""One location's worker for one DIS: an Ingest stream to one replica of the routing entry that
owns the location, fed with whole frames.

A location routed to a replica set (hot replicas, docs/replicas.md) gets one worker per replica:
each has its own stream, its own resume point (the one that replica gives), its own acks and
backoff, so a dead or slow replica never holds the others back, and one that comes back resumes
from its own position in the log files on disk.  Problems found in the files (a corrupt frame, a
refused schema change) are found by each worker and reported to its own replica; a refusal is one
replica's and stops only that replica's stream.

The worker opens ``Ingest.Stream`` with the location and the schema fingerprint of the file it is
at, learns the resume point, and sends the files of the location in order from there.  It never
has more than ``max_in_flight_bytes`` unacknowledged (every chunk is answered by an Ack), follows
the last file as it grows, moves to the next file once one exists and the current one has no
more complete frames (giving an incomplete tail ``torn_tail_grace_ms`` first), and reopens the
stream when the next file has another schema (fingerprint or schema version): a stream carries
the rows of one schema, named at its ``open``.

Schema versions: before reopening for a file of another schema, the worker checks the change
between the two consecutive files' header schemas with ``disd.schemaversions.check_change``
(older version to newer; a file of a lower version after a higher one, a location fed by two
logger builds, is checked lower to higher all the same), and refuses a change the rules refuse:
the location stops before that file, its rows kept, the problem reported, and looked at again
every ``retry_refused_ms``.  (Two files of one version number with other columns are left to the
DIS, which refuses a log that is not its table's, as before versions.)  A stream the DIS
refuses with FAILED_PRECONDITION (the location exists in another version, a version it does not
hold) is retried like any refusal, and its message becomes the location's problem; to get it to
``dis status``, the next attempt opens the stream with the previous file's schema (which the DIS
takes), sends what remains of the files before, reports, and then tries the refused file again.

Failures: a broken stream (DIS restart, network) reconnects with exponential backoff capped at
``max_backoff_ms``; a refusal (unknown table, schema mismatch, bad name, not routed here) is
logged and retried after ``retry_refused_ms``; a corrupt log, or a schema change the rules refuse,
stops this location (the others go on), looked at again every ``retry_refused_ms`` until the file
is repaired.  Nothing is skipped: the rows stay in their files until the DIS acknowledges them.

Problems on the tailer's side of a location (the corrupt frame it stopped at, a refused schema
change between two of its files, the DIS's refusal of a schema version, files that seem meant for
the location but whose names do not parse) are sent to a DIS that accepts them as
``TailerReport``s, so ``dis status`` shows them; the worker also counts what the tailer's metrics
report (``disd.tailer.metrics``).
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import threading
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Callable, Iterator

import grpc
import structlog

from disd.binlog import CorruptLogError, LogHeader
from disd.names import LocationKey
from disd.rpc.keys import key_to_proto
from disd.routing import Replica
from disd.rpc.v1 import dis_pb2
from disd.schema import TableSchema
from disd.schemaversions import SchemaChangeError, check_change
from disd.tailer.frames import FrameReader, Piece
from disd.tailer.muxsession import MultiplexUnsupported
from disd.tailer.passed import PassedFiles, Stranded
from disd.tailer.session import LocationInError, NotADis, RefusedByDis, StreamBroken, classify
from disd.tailer.watch import LocationFiles, LogFile, order_of

if TYPE_CHECKING:
    from disd.tailer.core import Session, Tailer

log = structlog.get_logger("disd.tailer")

INITIAL_BACKOFF_S = 0.1
#: A caught-up piece smaller than this waits while the location has a chunk unacknowledged, and
#: is then read again with what arrived meanwhile (Nagle's rule, per location).  Why: the DIS's
#: cost is per chunk far more than per row (about 0.2 ms in process for 2 rows or for 250,
#: docs/benchmarks.md), so a location written a row at a time sent a chunk per row however far
#: behind the DIS was, and a DIS short of CPU fell further behind the more locations it had.
#: Waiting for the one chunk in flight makes the chunks grow as the DIS slows, which bounds its
#: work per second; a DIS keeping up acknowledges long before the next row, so nothing waits.
#: Pieces of a backlog (not caught up) and larger ones go at once, ``max_in_flight_bytes`` apart.
COALESCE_BELOW_BYTES = 64 << 10
#: the longest one wait for that ack lasts before the worker looks again: the ack, the stream's
#: end and the tailer's stop all end the wait, so this is long (thousands of workers waiting
#: on a slow DIS each woke twice a second with 0.5 s)
COALESCE_WAIT_S = 5.0


def schema_step_problem(prev_name: str, prev: TableSchema, name: str, new: TableSchema) -> str | None:
    """Why file ``name`` (schema ``new``) may not follow ``prev_name`` (``prev``) in a location, or
    None when it may: a change ``check_change`` allows from the lower version to the higher
    (whichever file comes first).  Files of one version number are not judged here: other columns
    under one number (as in every log written before versions, all version 1) are the DIS's to
    refuse against the table's schema, as they always were."""
    if prev.version == new.version:
        return None
    older, newer = sorted((prev, new), key=lambda s: s.version)
    try:
        check_change(older, newer)
    except SchemaChangeError as e:
        return (f"schema change from {prev_name} (version {prev.version}) to {name} (version {new.version}) "
                f"is not allowed: {e.problem}; the location stops before {name}, its rows kept")
    return None


@dataclass
class WorkerStatus:
    state: str = "starting"  # starting connecting streaming following refused corrupt reconnecting stopped
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


class LocationWorker(threading.Thread):
    """Streams one location to one replica (``replica`` None: no routing entry takes the
    location's table, refused as NOT_ROUTED until one does)."""

    def __init__(self, tailer: "Tailer", key: LocationKey, replica: Replica | None = None) -> None:
        if replica is None:
            members = tailer.config.routing.replicas(key.namespace, key.table)
            replica = members[0] if members else None
        super().__init__(name=f"tailer {key}" + (f" -> {replica.name}" if replica else ""), daemon=True)
        self.tailer = tailer
        self.key = key
        self.replica = replica
        self.cfg = tailer.config
        self.wake = threading.Event()
        self._halt = tailer._halt
        self._lock = threading.Lock()
        self._status = WorkerStatus(dis=replica.address if replica else None, replica=replica.name if replica else None)
        # did the replica answer the last attempt (a resume point or a refusal: True), or did the
        # attempt fail to reach it (False)?  None before the first attempt: for the replica metrics
        self.reachable: bool | None = None
        self._session: Session | None = None
        self._hint: str | None = None  # the file the next stream opens with (its fingerprint)
        self._corrupt: tuple[str, int, tuple] | None = None  # (path, offset, stat) that stopped us
        self._opened = False  # the current attempt got a resume point
        self._opening_file: str | None = None  # the file whose schema the last stream opened with
        # the corrupt frame the location stopped at (file name, offset), and what the DIS is told
        # about it, until the worker gets past it
        self._corrupt_at: tuple[str, int] | None = None
        self._corrupt_problem: str | None = None
        self._corrupt_seen: set[tuple[str, int]] = set()
        # a refused schema change: (the file the location stopped before, the problem)
        self._schema_stop: tuple[str, str] | None = None
        # the DIS refused a stream with FAILED_PRECONDITION: (the file, the problem, refused at
        # ``open``); and the file whose refusal at open the next stream, opened with the schema of
        # the file before it, is to report
        self._refused: tuple[str, str, bool] | None = None
        self._report_refusal_of: str | None = None
        self._just_reported = False  # the last stream only reported a refusal: not progress
        # a file found shorter than the offset already sent of it: (name, size, offset, problem);
        # nothing more of it is read, until it leaves the log directories
        self._truncated: tuple[str, int, int, str] | None = None
        self._not_a_dis: str | None = None  # the replica's address serves no Ingest: why
        self._stop_said: tuple | None = None  # the stop last logged at error (``_say_stop``)
        # files the worker moved past: their end of complete frames (bytes after it are never sent)
        self._passed: dict[str, int] = {}
        self._header_sizes: dict[str, tuple[int, int]] = {}  # path -> (inode, header bytes)
        # every file before the stream's position, as long as it was when passed; bytes that
        # appear in them afterwards are stranded (disd.tailer.passed)
        self.passed_files = PassedFiles()
        self._stranded: list[Stranded] = []
        self._stranded_seen: tuple[LocationFiles, str] | None = None  # (scan, file) last checked
        self._stranded_logged: set[tuple[str, int]] = set()
        self._has_turn = False  # holds one of the tailer's ``turns`` (disd.tailer.core)
        # counters for the metrics (disd.tailer.metrics)
        self.reconnects = 0
        self.corrupt_frames = 0
        self.acked_bytes = 0
        self.refusals: collections.Counter[str] = collections.Counter()
        self.log = log.bind(location=str(key), replica=replica.name if replica else None)

    # -- status ------------------------------------------------------------------------------

    def status(self) -> dict:
        problem = self.problem() or None
        with self._lock:
            return asdict(self._status) | {"problem": problem}

    def counters(self) -> dict:
        """acked_bytes, corrupt_frames, corrupt_seen (the (path, offset) of each), reconnects,
        refusals (by gRPC status), stranded_bytes (in files the stream passed): for the metrics."""
        with self._lock:
            return {"acked_bytes": self.acked_bytes, "corrupt_frames": self.corrupt_frames,
                    "corrupt_seen": set(self._corrupt_seen), "reconnects": self.reconnects,
                    "refusals": dict(self.refusals), "stranded_bytes": sum(x.nbytes for x in self._stranded)}

    def _set(self, **kw: object) -> None:
        with self._lock:
            for k, v in kw.items():
                setattr(self._status, k, v)

    def _on_ack(self, ack: dis_pb2.Ack, inflight: int, nbytes: int) -> None:
        with self._lock:
            self.acked_bytes += nbytes
            if ack.file_name != self._status.acked_file and self._passed:
                k = order_of(ack.file_name)
                self._passed = {n: e for n, e in self._passed.items() if order_of(n) >= k}
            self._status.acked_file = ack.file_name or None
            if (self._refused is not None and not self._refused[2] and ack.file_name
                    and order_of(ack.file_name) >= order_of(self._refused[0])):
                self._refused = None  # the DIS took rows of the file it refused a chunk of
            self._status.acked_offset = ack.offset
            self._status.committed_rows = ack.committed_rows
            self._status.in_flight_bytes = inflight

    def files(self) -> LocationFiles:
        return self.tailer.files_of(self.key)

    def stop(self) -> None:
        """Called with the tailer's halt event set: cut a stream that may be blocked."""
        self.wake.set()
        s = self._session
        if s is not None:
            s.cancel()

    # -- main loop ---------------------------------------------------------------------------

    def run(self) -> None:
        self._take_turn()
        try:
            self._run()
        finally:
            self._give_turn()

    def _run(self) -> None:
        backoff = INITIAL_BACKOFF_S
        reported: set[str] = set()
        while not self._halt.is_set():
            self._opened = False
            if self._corrupt is not None:
                # no stream could be opened (every file's header is corrupt): look again once the
                # file is repaired, replaced or removed, or after the retry period
                path, _, st = self._corrupt
                self._wait_stopped(lambda: _repaired(st, _stat(path)))
                if self._halt.is_set():
                    break
            last_corrupt, self._corrupt = self._corrupt, None
            acked_before = self.acked_bytes
            try:
                if self._stream():
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
                    self._not_a_dis = why
                self._set(state="refused", error=why, in_flight_bytes=0)
                first = self.tailer.not_a_dis(address)  # one line per address, not per location
                (self.log.error if first else self.log.debug)(
                    "the address is not a DIS (a dis proxy?); retrying later in case a DIS takes it over",
                    dis=address, error=str(e), retry_s=self.cfg.retry_refused_ms / 1000)
                self._wait(self.cfg.retry_refused_ms / 1000)
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
                    file=self._opening_file, dis=self._status.dis, retry_s=self.cfg.retry_refused_ms / 1000)
                if self._report_refusal_of is None:
                    # no stream can carry the problem: look again after the retry period, or
                    # once the refused file is gone
                    self._wait_stopped(self._forget_missing_files)
                # else at once: a stream of the schema before the refused file reports it, and
                # waits there (``_follow``)
            except CorruptLogError as e:
                path = e.path or ""
                self._corrupt = (path, e.offset, _stat(path))
                self._note_corrupt(e)
                self._set(state="corrupt", error=str(e), in_flight_bytes=0)
                # logged at error when new, or when the file changed and is still corrupt there
                (self.log.info if self._corrupt == last_corrupt else self.log.error)(
                    "corrupt binary log: this location stops here until the file is repaired",
                    file=path, offset=e.offset, problem=e.problem, retry_s=self.cfg.retry_refused_ms / 1000)
            except LocationInError as e:
                # the DIS answers, and holds the location in error: it may take it back by itself
                # (space freed) or need an operator; try again with a backoff that grows to the
                # retry period, saying it at warning once and at info after (once again after a
                # stream that the DIS acknowledged rows on: a new failure)
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
                self._wait(backoff)
                backoff = min(backoff * 2, max(self.cfg.max_backoff_ms, self.cfg.retry_refused_ms) / 1000)
            except (grpc.RpcError, StreamBroken, OSError) as e:
                if self._halt.is_set():
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
                self._wait(backoff)
                backoff = min(backoff * 2, self.cfg.max_backoff_ms / 1000)
            except Exception as e:  # a bug must not kill the location's thread silently
                self._set(state="reconnecting", error=repr(e), in_flight_bytes=0)
                self.log.exception("unexpected error in the location worker; retrying")
                self._wait(self.cfg.max_backoff_ms / 1000)
        self._set(state="stopped")

    def _wait(self, seconds: float) -> None:
        with self._off_turn():
            self._halt.wait(seconds)

    def _wait_stopped(self, cause_gone: Callable[[], bool]) -> None:
        """The wait of a location stopped with no stream open: ``retry_refused_ms``, or less once
        ``cause_gone()`` says so, looked at whenever the location's files change (the scans and
        inotify wake the worker)."""
        deadline = time.monotonic() + self.cfg.retry_refused_ms / 1000
        while not self._halt.is_set() and not cause_gone():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._idle_wait(left)

    def _hold(self, s: Session, accepts: bool, told: list, cause_gone: Callable[[], bool]) -> None:
        """The wait of a location stopped at a problem, on its open stream: until ``cause_gone()``
        (looked at whenever the location's files change) or ``retry_refused_ms`` passed, and the
        DIS is kept told of the problem meanwhile.  On the open stream, because a DIS that restarts
        (``kill -9``) ends it: the worker then reconnects at once, and the rows before the problem
        that the DIS lost, and the problem itself, are sent again within its backoff instead of
        after the retry period.  StreamBroken when the stream ends."""
        deadline = time.monotonic() + self.cfg.retry_refused_ms / 1000
        while not self._halt.is_set():
            s.check()
            self._forget_missing_files()
            self._sync_problem(s, accepts, told)
            if cause_gone():
                return
            left = deadline - time.monotonic()
            if left <= 0:
                told[0] = None  # told again when looked at next: a report also keeps the stream alive
                return
            self._idle_wait(left)

    def _say_stop(self, key: tuple, event: str, **kw: object) -> None:
        """Log why the location stops: at error the first time, at info when it is looked at again
        and still stops there for the same reason."""
        first = key != self._stop_said
        self._stop_said = key
        (self.log.error if first else self.log.info)(event, retry_s=self.cfg.retry_refused_ms / 1000, **kw)

    # -- turns: at most ``WORKER_TURNS`` workers of a tailer run at once -------------------------

    def _take_turn(self) -> None:
        """Wait for one of the tailer's turns (none once the tailer is stopping)."""
        while not self._halt.is_set():
            if self.tailer.turns.acquire(timeout=1.0):
                self._has_turn = True
                return

    def _give_turn(self) -> None:
        if self._has_turn:
            self._has_turn = False
            self.tailer.turns.release()

    @contextlib.contextmanager
    def _off_turn(self) -> Iterator[None]:
        """Give the turn back while waiting (for rows, an ack, a resume point, a backoff)."""
        self._give_turn()
        try:
            yield
        finally:
            self._take_turn()

    # -- problems on this side, told to the DIS --------------------------------------------

    def _note_corrupt(self, e: CorruptLogError) -> None:
        name = os.path.basename(e.path or "")
        with self._lock:
            if (e.path or "", e.offset) not in self._corrupt_seen:
                self._corrupt_seen.add((e.path or "", e.offset))
                self.corrupt_frames += 1
            self._corrupt_at = (name, e.offset)
            self._corrupt_problem = (f"corrupt binary log {name} at byte {e.offset}: {e.problem}; "
                                     "the location stops there until the file is repaired")

    def _past_corruption(self, name: str, offset: int, read_there: bool = False) -> None:
        """The worker is at ``offset`` of ``name``: past the corrupt frame it stopped at (or there,
        and the file now reads fine: ``read_there``), that problem is resolved."""
        at = self._corrupt_at
        if at is None:
            return
        here, there = (order_of(name), offset), (order_of(at[0]), at[1])
        if here > there or (read_there and here == there):
            with self._lock:
                self._corrupt_at = self._corrupt_problem = None

    def _note_refusal(self, e: RefusedByDis) -> None:
        """A FAILED_PRECONDITION refusal becomes the location's problem.  Refused at ``open`` for a
        file whose schema differs from the file before it, the next attempt opens with the earlier
        file's schema, to report it (``_follow``), unless this was that attempt."""
        if e.code != "FAILED_PRECONDITION":
            return
        reporting = self._report_refusal_of
        self._report_refusal_of = None
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
            self._refused = (file, problem, not self._opened)
        if self._opened:
            return
        lf = self.files()
        refused, prev = lf.find(file), self._previous_header(lf, file)
        if refused is None or prev is None:
            return  # no earlier file: the problem shows in this tailer's status and log only
        try:
            with FrameReader(refused.path) as r:
                header = r.header()
        except (CorruptLogError, OSError):
            return
        if header is not None and _schema_of(header) != _schema_of(prev[1]):
            self._report_refusal_of = file
            self._hint = prev[0]

    def _forget_missing_files(self) -> bool:
        """A problem about a file that is gone from the log directories is over: True if one was
        (a refused schema change, the DIS's refusal of a file, a corrupt frame, a truncation)."""
        if self._schema_stop is None and self._refused is None and self._corrupt_at is None and self._truncated is None:
            return False
        lf = self.files()
        gone = False
        with self._lock:
            if self._schema_stop is not None and lf.find(self._schema_stop[0]) is None:
                self._schema_stop, gone = None, True
            if self._refused is not None and lf.find(self._refused[0]) is None:
                self._refused, gone = None, True
                self._report_refusal_of = None
            if self._corrupt_at is not None and lf.find(self._corrupt_at[0]) is None:
                self._corrupt_at = self._corrupt_problem = None
                gone = True
            if self._truncated is not None and lf.find(self._truncated[0]) is None:
                self._truncated, gone = None, True
        return gone

    def _stop_at_corrupt(self, s: Session, accepts: bool, told: list, e: CorruptLogError) -> None:
        """A complete frame fails its checks: the frames before it are acknowledged (``drain``
        first); the location stops there, told to the DIS, until the file is repaired, replaced
        or removed (or the retry period passes: it is read there again)."""
        path = e.path or ""
        st = _stat(path)
        self._note_corrupt(e)
        self._sync_problem(s, accepts, told)
        self._set(state="corrupt", error=str(e), in_flight_bytes=0)
        self._say_stop(("corrupt", path, e.offset, e.problem, st[:1]),
                       "corrupt binary log: this location stops here until the file is repaired",
                       file=path, offset=e.offset, problem=e.problem)
        self._hold(s, accepts, told, lambda: _repaired(st, _stat(path)))

    def _note_truncated(self, f: LogFile, size: int, offset: int) -> None:
        """The file being sent is shorter than what was sent of it: a log is only ever appended
        to, so its bytes from ``size`` on changed under the DIS.  Nothing more of it is sent (not
        again from the start, and not bytes at the old offset, which now belong to other rows);
        warned once, and the location's problem until the file leaves the log directories."""
        name = f.name
        problem = (f"log {name} was truncated to {size} bytes, below the {offset} bytes of it already sent to "
                   "the DIS: nothing more of it is sent (a log must only be appended to); move it out of the log "
                   "directory once its rows are dealt with")
        with self._lock:
            if self._truncated is not None and self._truncated[0] == name:
                return
            self._truncated = (name, size, offset, problem)
        self.log.warning("log file truncated below what was sent; nothing more of it is sent", file=f.path,
                         size=size, sent_offset=offset)

    def _is_truncated(self, name: str) -> bool:
        t = self._truncated
        return t is not None and t[0] == name

    @staticmethod
    def _previous_header(lf: LocationFiles, name: str) -> tuple[str, LogHeader] | None:
        """(name, header) of the newest file before ``name`` whose header reads (a file with an
        unreadable header was never sent, so it does not count as the one before)."""
        k = order_of(name)
        for f in reversed([f for f in lf.files if f.order < k]):
            try:
                with FrameReader(f.path) as r:
                    header = r.header()
            except (CorruptLogError, OSError):
                continue
            if header is not None:
                return f.name, header
        return None

    def _check_step(self, s: Session, accepts: bool, told: list, lf: LocationFiles, cur: LogFile,
                    header: LogHeader) -> bool:
        """Before a file of another schema is sent: a change from the file before it that the
        rules refuse stops the location before the file (True), told to the DIS and held there
        (``_hold``) until the file is replaced or removed, or the retry period passes; a file that
        now passes ends the problem it stopped the location at (False)."""
        prev = self._previous_header(lf, cur.name)
        problem = None if prev is None else schema_step_problem(prev[0], prev[1].schema, cur.name, header.schema)
        if problem is None:
            with self._lock:
                if self._schema_stop is not None and self._schema_stop[0] == cur.name:
                    self._schema_stop = None
            return False
        s.drain()  # what went before the file is the DIS's
        with self._lock:
            self._schema_stop = (cur.name, problem)
        self._hint = prev[0]  # a reconnect comes back here with the schema before the file
        self._sync_problem(s, accepts, told)
        self._set(state="refused", error=problem, in_flight_bytes=0)
        self._say_stop(("schema", problem), "schema change refused: this location stops before the file until it "
                       "is replaced", file=cur.name, problem=problem)
        st = _stat(cur.path)
        self._hold(s, accepts, told, lambda: _repaired(st, _stat(cur.path)))
        return True

    def problem(self) -> str:
        """What is wrong on this side of the location, for the DIS ("" when nothing)."""
        parts = [self._corrupt_problem] if self._corrupt_problem else []
        with self._lock:
            parts += [x[1] for x in (self._schema_stop, self._refused) if x is not None]  # type: ignore[index]
            if self._truncated is not None:
                parts.append(self._truncated[3])
            parts += [x.describe() for x in self._stranded[:3]]
            if len(self._stranded) > 3:
                parts.append(f"and {len(self._stranded) - 3} more files with bytes the stream passed")
            if self._not_a_dis is not None:
                parts.append(self._not_a_dis)
        skipped = self.tailer.skipped_for(self.key)
        parts += [f"file {sk.name} is not streamed: {sk.problem}" for sk in skipped[:3]]
        if len(skipped) > 3:
            parts.append(f"and {len(skipped) - 3} more files whose names do not parse")
        return "; ".join(parts)

    def _sync_problem(self, s: Session, accepts: bool, told: list) -> None:
        """Send the problem when it changed since the DIS was last told (``told[0]``)."""
        p = self.problem()
        if not p:
            self._stop_said = None  # a stop found again later is new
        if accepts and p != told[0]:
            s.report(p)
            told[0] = p

    def _idle_wait(self, seconds: float | None = None) -> None:
        """Wait for a wake-up (an append to the location's files), at most ``seconds`` or the
        tailer's idle poll.  The poll is spread over 0.8-1.2 times its length: workers started
        together would otherwise time out together, thousands at a time, for ever."""
        if seconds is None:
            seconds = self.tailer.idle_poll_s() * (0.8 + 0.4 * random.random())
        with self._off_turn():
            self.wake.wait(seconds)
        self.wake.clear()

    # -- one stream --------------------------------------------------------------------------

    def _stream(self) -> bool:
        """Open a stream and send until it must be reopened (True) or there is nothing to open
        it with yet (False).  Raises on failures."""
        lf = self.files()
        if not lf.files:
            self._set(state="waiting")
            self._idle_wait()
            return False
        opening = self._opening_header(lf)
        if opening is None:
            self._set(state="waiting", error="no file with a complete header yet")
            self._idle_wait()
            return False
        self._opening_file, header = opening
        replica = self.replica
        if replica is None:
            raise RefusedByDis("NOT_ROUTED", f"no DIS in the routing takes {self.key.table_key}")
        self._set(state="connecting", dis=replica.address)
        session = self.tailer.open_session(replica.address, self._on_ack)
        session.wake = self.wake
        self._session = session
        if self._halt.is_set():
            session.close()
            return True
        try:
            opening = dis_pb2.IngestOpen(location=key_to_proto(self.key), schema_fingerprint=header.fingerprint,
                                         tailer_id=self.tailer.tailer_id, schema_json=header.schema.to_json())
            try:
                with self._off_turn():
                    resume = session.open(opening)
            except MultiplexUnsupported:  # a DIS of an older release: a call of the stream's own
                session.close()
                session = self._session = self.tailer.open_session(replica.address, self._on_ack)
                session.wake = self.wake
                with self._off_turn():
                    resume = session.open(opening)
            with self._lock:
                self.reachable = True
                self._not_a_dis = None
                if self._refused is not None and self._refused[2] and self._refused[0] == self._opening_file:
                    self._refused = None  # the DIS takes the file it refused
            self.tailer.is_a_dis(replica.address)
            self._follow(session, header, resume)
        finally:
            self._session = None
            session.close()
        return True

    def _opening_header(self, lf: LocationFiles):  # noqa: ANN202 - (file name, LogHeader) | None
        """The file and header whose fingerprint opens the stream: of the file the worker was at,
        else of the first file with a readable header (an empty or foreign file does not block the
        location; the file actually sent is checked again before its bytes go out)."""
        hinted = lf.find(self._hint) if self._hint else None
        candidates = ([hinted] if hinted else []) + [f for f in lf.files if f is not hinted]
        corrupt: CorruptLogError | None = None
        for f in candidates:
            try:
                with FrameReader(f.path) as r:
                    header = r.header()
            except CorruptLogError as e:
                corrupt = corrupt or e
                continue
            except FileNotFoundError:
                continue
            if header is not None:
                return f.name, header
        if corrupt is not None:
            raise corrupt
        return None

    def _follow(self, s: Session, opened: LogHeader, resume: dis_pb2.ResumePoint) -> None:
        self._opened = True
        schema = _schema_of(opened)
        cfg = self.cfg
        lf = self.files()
        cur: LogFile | None
        if resume.file_name:
            name, offset = resume.file_name, resume.offset
            cur = lf.find(name)
            if cur is None:
                self.log.warning("the resume file is not in the log directories; going on with newer files",
                                 file=name, offset=offset)
        else:
            cur = lf.files[0]
            name, offset = cur.name, 0
        self.passed_files.resumed(lf, resume.file_name or None)
        self._stranded_seen = None
        self._set(state="streaming", error=None, file=name, sent_offset=offset, acked_file=name or None,
                  acked_offset=offset, in_flight_bytes=0)
        self.log.info("ingest stream open", dis=self._status.dis, resume_file=resume.file_name or None,
                      resume_offset=resume.offset)
        accepts = resume.accepts_reports  # an older DIS refuses reports: it is not sent any
        told: list = [None]  # what the DIS was told on this stream: nothing yet
        reader: FrameReader | None = None
        checked = False  # the current file's fingerprint matches the stream's
        torn_since: float | None = None
        try:
            while not self._halt.is_set():
                s.check()
                self._check_stranded(name)
                self._past_corruption(name, offset)
                self._forget_missing_files()
                self._sync_problem(s, accepts, told)
                piece: Piece | None = None
                if cur is None:  # the file at the position is gone: it may be back (replaced)
                    cur = self.files().find(name)
                if cur is not None and not self._is_truncated(name) and reader is None:
                    try:
                        reader = FrameReader(cur.path)
                    except FileNotFoundError:
                        # removed (or being replaced) since the last scan: gone once a scan says so
                        cur = self.files().find(name)
                        if cur is not None:
                            self._idle_wait(cfg.poll_interval_ms / 1000)
                        continue
                if cur is not None and reader is not None and not self._is_truncated(name):
                    try:
                        piece = reader.read(offset, cfg.chunk_bytes)
                    except CorruptLogError as e:
                        s.drain()  # the good frames before the corruption reach the DIS
                        self._stop_at_corrupt(s, accepts, told, e)
                        # looked at again: read there anew (the file may be another one now); a
                        # file removed is left for the ones after it
                        reader.close()
                        reader, checked, cur = None, False, self.files().find(name)
                        continue
                    self._past_corruption(name, offset, read_there=True)
                    if not piece.data and offset > 0 and reader.size() < offset:
                        self._note_truncated(cur, reader.size(), offset)
                        continue
                    if piece.data and not checked:
                        # checked only when bytes of this file are to be sent: a resume point at
                        # the end of an older file of another schema must not cause a reopen
                        header = reader.header()
                        if header is not None and _schema_of(header) != schema:
                            if self._check_step(s, accepts, told, self.files(), cur, header):
                                # held before the file until it changed, or for the retry period:
                                # look at it anew
                                reader.close()
                                reader, cur = None, self.files().find(name)
                                continue
                            if self._report_refusal_of == cur.name:
                                # opened with the schema before the file the DIS refused, to say so:
                                # said (at the top of the loop); wait here (a DIS that restarts ends
                                # the wait, and is sent again what it lost), then try the file again
                                s.drain()
                                self._set(state="refused", error=self._refused[1] if self._refused else None,
                                          in_flight_bytes=0)
                                self._hint = self._opening_file  # a reconnect reports it the same way
                                st = _stat(cur.path)
                                self._hold(s, accepts, told, lambda: _repaired(st, _stat(cur.path)))
                                if self._refused is None:  # the file is gone: on with the ones after it
                                    reader.close()
                                    reader, cur = None, self.files().find(name)
                                    continue
                                if accepts:
                                    s.finish()
                                self._report_refusal_of = None
                                self._hint = cur.name
                                self._just_reported = True
                                return
                            self.log.info("schema changes with this file; reopening the stream",
                                          file=cur.name, fingerprint=header.fingerprint,
                                          schema_version=header.schema.version)
                            s.drain()
                            self._hint = cur.name
                            return
                        checked = True
                    if (piece.data and piece.at_end and len(piece.data) < COALESCE_BELOW_BYTES
                            and s.inflight_bytes):
                        with self._off_turn():
                            s.wait_acked(COALESCE_WAIT_S)
                        continue  # read again: rows that arrived meanwhile join this chunk
                    if piece.data:
                        if not s.send(name, piece):
                            return
                        offset = piece.end
                        torn_since = None
                        self._set(state="streaming", file=name, sent_offset=offset, in_flight_bytes=s.inflight_bytes)
                        continue
                newer = self.files().after(name)
                if newer:
                    if piece is not None and not piece.complete:
                        now = time.monotonic()
                        torn_since = torn_since or now
                        if now - torn_since < cfg.torn_tail_grace_ms / 1000:
                            self._idle_wait(min(cfg.poll_interval_ms, cfg.torn_tail_grace_ms) / 1000)
                            continue
                        self.log.warning("incomplete frame at the end of a file that has a newer one; moving on",
                                         file=name, offset=offset, tail_bytes=piece.tail)
                    if reader is not None:
                        reader.close()
                        reader = None
                    # its size as last read; a file not read (truncated below what was sent, gone):
                    # the offset sent, so only bytes beyond it would be stranded
                    self.passed_files.passed(name, piece.file_size if piece is not None and piece.file_size >= 0
                                             else offset)
                    with self._lock:
                        self._passed[name] = offset
                    cur = newer[0]
                    name, offset, checked, torn_since = cur.name, 0, False, None
                    self._hint = name
                    self.log.info("next file", file=name)
                    continue
                self._set(state="following", in_flight_bytes=s.inflight_bytes)
                self._idle_wait()
        finally:
            if reader is not None:
                reader.close()

    def _check_stranded(self, current: str) -> None:
        """Look for bytes in the files before ``current`` that the stream passed without them
        (``disd.tailer.passed``), once per directory scan and file: each new one is logged at
        warning and becomes part of the location's problem."""
        lf = self.files()
        seen = self._stranded_seen
        if seen is not None and seen[0] is lf and seen[1] == current:
            return
        self._stranded_seen = (lf, current)
        found = self.passed_files.stranded(lf, current)
        for x in found:
            if (x.name, x.size) not in self._stranded_logged:
                self._stranded_logged.add((x.name, x.size))
                self.log.warning("bytes in a log file the stream has passed: they cannot be ingested",
                                 file=x.name, passed_at=x.passed_at, size=x.size, stranded_bytes=x.nbytes,
                                 problem=x.describe())
        with self._lock:
            self._stranded = found

    # -- how far behind ----------------------------------------------------------------------

    def bytes_behind(self, lf: LocationFiles) -> int:
        """Bytes of the location's log files the DIS has not acknowledged: from the last ack (or
        the resume point) on, frames only (a file's header, and what follows the last complete
        frame of a file the worker moved past, are never sent)."""
        with self._lock:
            afile, aoff = self._status.acked_file, self._status.acked_offset
            passed = dict(self._passed)
        after = order_of(afile) if afile else None
        total = 0
        for f in lf.files:
            if after is not None and f.order < after:
                continue
            base = aoff if f.name == afile else 0
            end = passed.get(f.name)
            if end is None:
                try:
                    st = os.stat(f.path)
                except OSError:
                    continue
                end = st.st_size
            if base == 0:
                base = self._header_size(f.path)
            total += max(0, end - base)
        if len(self._header_sizes) > 2 * len(lf.files) + 16:
            paths = {f.path for f in lf.files}
            self._header_sizes = {p: v for p, v in self._header_sizes.items() if p in paths}
        return total

    def _header_size(self, path: str) -> int:
        """The size of a log's header (cached per inode); 0 while it is incomplete or unreadable."""
        try:
            ino = os.stat(path).st_ino
        except OSError:
            return 0
        cached = self._header_sizes.get(path)
        if cached is not None and cached[0] == ino:
            return cached[1]
        try:
            with FrameReader(path) as r:
                header = r.header()
        except (CorruptLogError, OSError):
            return 0
        if header is None:
            return 0
        self._header_sizes[path] = (ino, header.size)
        return header.size

    # -- idleness ----------------------------------------------------------------------------

    def idle(self) -> bool:
        """Every complete frame of the location's files is sent and acknowledged."""
        st = self.status()
        lf = self.files()
        if not lf.files:
            return True
        if st["file"] is None or st["state"] in ("refused", "corrupt", "reconnecting", "connecting", "starting"):
            # no position known from the DIS: idle only if there is nothing to send at all
            return all(not _has_frames(f.path, 0) for f in lf.files)
        if (st["acked_file"], st["acked_offset"]) != (st["file"], st["sent_offset"]):
            return False
        k = order_of(st["file"])
        cur = lf.find(st["file"])
        if cur is not None and _has_frames(cur.path, st["sent_offset"]):
            return False
        return all(not _has_frames(f.path, 0) for f in lf.files if f.order > k)


def _schema_of(header: LogHeader) -> tuple[str, int]:
    """What a stream is opened for: a file of another fingerprint or schema version needs its own."""
    return header.fingerprint, header.schema.version


def _has_frames(path: str, offset: int) -> bool:
    try:
        with FrameReader(path) as r:
            return bool(r.read(offset, 1).data)
    except CorruptLogError:
        return True  # frames the DIS will never have
    except OSError:
        return False


def _stat(path: str) -> tuple:
    try:
        st = os.stat(path)
    except OSError:
        return ()
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _repaired(before: tuple, now: tuple) -> bool:
    """Whether a file (``_stat`` then and now) changed in a way that can end a problem found in
    its bytes: removed, replaced (another inode), cut shorter, or rewritten in place (same size,
    newer time).  Appending cannot repair a frame already complete, and a logger appending to it
    must not make the worker read it again at every row."""
    if not before or not now:
        return before != now
    return now[0] != before[0] or now[1] < before[1] or (now[1] == before[1] and now[2] != before[2])
