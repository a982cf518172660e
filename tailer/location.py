"""One location's stream to one replica of its DIS, as a coroutine of the tailer's event loop
(``disd.tailer.loop``): the protocol a location follows, from its files' discovery to their
acknowledgement.  No thread of its own: it is woken by inotify (or the rescan) when its files
change, by its stream's acks and end, and by its timers.

A location routed to a replica set (hot replicas, docs/replicas.md) has one stream per replica:
each its own resume point (the one that replica gives), acks, backoff and refusals, so a dead or
slow replica never holds the others back, and one that comes back resumes from its own position
in the log files on disk.  Problems found in the files (a corrupt frame, a refused schema
change) are found by each stream and reported to its own replica.

The stream opens with the location and the schema fingerprint of the file it is at, learns the
resume point, and sends the files of the location in order from there, whole frames only.  It
never has more than ``max_in_flight_bytes`` unacknowledged, follows the last file as it grows,
moves to the next file once one exists and the current one has no more complete frames (giving
an incomplete tail ``torn_tail_grace_ms`` first), and reopens the stream when the next file has
another schema (``disd.tailer.schemastep``).  A small caught-up piece waits while one of the
location's chunks is unacknowledged (``COALESCE_BELOW_BYTES``).

Failures: a broken stream (DIS restart, network) reconnects with exponential backoff capped at
``max_backoff_ms``; a refusal is logged and retried after ``retry_refused_ms`` (a
FAILED_PRECONDITION refusal of a file's schema is reported through a stream opened with the
schema of the file before it); a corrupt log, or a schema change the rules refuse, stops this
location (the others go on), looked at again every ``retry_refused_ms``.  Nothing is skipped: the
rows stay in their files until the DIS acknowledges them.  What the DIS is told: ``Problems``
(``disd.tailer.problems``).
"""

from __future__ import annotations

import asyncio
import collections
import random
import threading
import time
from dataclasses import asdict
from typing import TYPE_CHECKING

import structlog

from disd.binlog import CorruptLogError, LogHeader
from disd.names import LocationKey
from disd.routing import Replica
from disd.rpc.keys import key_to_proto
from disd.rpc.v1 import dis_pb2
from disd.tailer.behind import HeaderSizes, bytes_behind, file_stat, is_idle, repaired
from disd.tailer.frames import FrameReader, Piece
from disd.tailer.passed import PassedFiles
from disd.tailer.problems import Problems
from disd.tailer.protocol import MultiplexUnsupported, RefusedByDis, StreamFlow
from disd.tailer.schemastep import header_of, schema_of
from disd.tailer.status import StreamStatus
from disd.tailer.stops import Stops
from disd.tailer.watch import LocationFiles, LogFile, order_of

if TYPE_CHECKING:
    from disd.tailer.core import Tailer

log = structlog.get_logger("disd.tailer")

#: A caught-up piece smaller than this waits while the location has a chunk unacknowledged, and
#: is then read again with what arrived meanwhile (Nagle's rule, per location).  Why: the DIS's
#: cost is per chunk far more than per row (a chunk of 2 rows costs it about what one of 250
#: does), so a location written a row at a time sent a chunk per row however far
#: behind the DIS was, and a DIS short of CPU fell further behind the more locations it had.
#: Waiting for the one chunk in flight makes the chunks grow as the DIS slows, which bounds its
#: work per second; a DIS keeping up acknowledges long before the next row, so nothing waits.
#: Pieces of a backlog (not caught up) and larger ones go at once, ``max_in_flight_bytes`` apart.
COALESCE_BELOW_BYTES = 64 << 10
#: the longest one wait for that ack lasts before the location looks again (the ack, the
#: stream's end and the tailer's stop all end the wait sooner)
COALESCE_WAIT_S = 5.0


class LocationStream(Stops):
    """Streams one location to one replica (``replica`` None: no routing entry takes the
    location's table, refused as NOT_ROUTED until one does).  Created, run and woken on the loop;
    ``status``, ``counters``, ``bytes_behind``, ``idle`` and ``passed_files`` are read from any
    thread."""

    def __init__(self, tailer: "Tailer", key: LocationKey, replica: Replica | None = None) -> None:
        if replica is None:
            members = tailer.config.routing.replicas(key.namespace, key.table)
            replica = members[0] if members else None
        self.tailer = tailer
        self.key = key
        self.replica = replica
        self.cfg = tailer.config
        self._lock = threading.Lock()
        self._status = StreamStatus(dis=replica.address if replica else None, replica=replica.name if replica else None)
        # did the replica answer the last attempt (a resume point or a refusal: True), or did the
        # attempt fail to reach it (False)?  None before the first attempt: for the replica metrics
        self.reachable: bool | None = None
        self._task: asyncio.Task | None = None
        self._waiter: asyncio.Future | None = None  # the idle wait in progress
        self._woken = False  # a wake-up arrived since the last idle wait
        self._session: StreamFlow | None = None
        self._hint: str | None = None  # the file the next stream opens with (its fingerprint)
        self._corrupt: tuple[str, int, tuple] | None = None  # (path, offset, stat) that stopped us
        self._opened = False  # the current attempt got a resume point
        self._opening_file: str | None = None  # the file whose schema the last stream opened with
        self._just_reported = False  # the last stream only reported a refusal: not progress
        self._stop_said: tuple | None = None  # the stop last logged at error (``_say_stop``)
        # the scan the location last looked at while following its last file, and that file's
        # size when last read: a rescan that finds the same files, that one no longer, need not
        # wake the location
        self._following: tuple[LocationFiles, int] | None = None
        # files the stream moved past: their end of complete frames (bytes after it are never sent)
        self._passed: dict[str, int] = {}
        self._headers = HeaderSizes()  # for bytes_behind (any thread but the loop)
        self.problems = Problems(self._lock)
        # every file before the stream's position, as long as it was when passed; bytes that
        # appear in them afterwards are stranded (disd.tailer.passed)
        self.passed_files = PassedFiles()
        # counters for the metrics (disd.tailer.metrics)
        self.reconnects = 0
        self.acked_bytes = 0
        self.refusals: collections.Counter[str] = collections.Counter()
        self.log = log.bind(location=str(key), replica=replica.name if replica else None)

    # -- life (on the loop) ------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    def is_alive(self) -> bool:
        """Its coroutine runs (until the tailer stops)."""
        return self._task is not None and not self._task.done()

    def wake(self) -> None:
        """Its files changed, or its stream ended: look again now."""
        self._woken = True
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def needs_look(self, lf: LocationFiles) -> bool:
        """Whether a rescan that lists ``lf`` found something this stream has not seen: other files
        than when it last looked, or the one it follows (the last) longer than when last read."""
        f = self._following
        if f is None or not lf.files:
            return True
        seen, size = f
        last = lf.files[-1]
        if last.size < 0 or last.size > size or len(lf.files) != len(seen.files):
            return True
        return any(a.name != b.name for a, b in zip(lf.files, seen.files))

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
        s = self._session
        if s is not None:
            s.close()  # type: ignore[attr-defined]

    # -- status (any thread) -----------------------------------------------------------------

    def status(self) -> dict:
        problem = self.problem() or None
        with self._lock:
            return asdict(self._status) | {"problem": problem}

    def counters(self) -> dict:
        """acked_bytes, corrupt_frames, corrupt_seen (the (path, offset) of each), reconnects,
        refusals (by gRPC status), stranded_bytes (in files the stream passed): for the metrics."""
        p = self.problems
        stranded = p.stranded_bytes()
        with self._lock:
            return {"acked_bytes": self.acked_bytes, "corrupt_frames": len(p.corrupt_seen),
                    "corrupt_seen": set(p.corrupt_seen), "reconnects": self.reconnects,
                    "refusals": dict(self.refusals), "stranded_bytes": stranded}

    def bytes_behind(self, lf: LocationFiles) -> int:
        """Bytes of the location's log files the DIS has not acknowledged (``disd.tailer.behind``)."""
        with self._lock:
            afile, aoff = self._status.acked_file, self._status.acked_offset
            passed = dict(self._passed)
        return bytes_behind(lf, afile, aoff, passed, self._headers)

    def idle(self) -> bool:
        """Every complete frame of the location's files is sent and acknowledged."""
        return is_idle(self.files(), self.status())

    def problem(self) -> str:
        """What is wrong on this side of the location, for the DIS ("" when nothing)."""
        return self.problems.text(self.tailer.skipped_for(self.key))

    def files(self) -> LocationFiles:
        return self.tailer.files_of(self.key)

    def _set(self, **kw: object) -> None:
        with self._lock:
            for k, v in kw.items():
                setattr(self._status, k, v)

    def _on_ack(self, ack: dis_pb2.Ack, inflight: int, nbytes: int) -> None:
        st = self._status
        with self._lock:
            self.acked_bytes += nbytes
            if ack.file_name != st.acked_file and self._passed:
                k = order_of(ack.file_name)
                self._passed = {n: e for n, e in self._passed.items() if order_of(n) >= k}
            st.acked_file = ack.file_name or None
            self.problems.refused_taken(ack.file_name)
            st.acked_offset = ack.offset
            st.committed_rows = ack.committed_rows
            st.in_flight_bytes = inflight

    # -- waiting (on the loop) ---------------------------------------------------------------

    async def _idle_wait(self, seconds: float | None = None) -> None:
        """Wait for a wake-up (an append to the location's files, its stream's end), at most
        ``seconds`` or the tailer's idle poll.  The poll is spread over 0.8-1.2 times its length:
        locations started together would otherwise time out together, thousands at a time."""
        if self._woken:
            self._woken = False
            return
        if seconds is None:
            seconds = self.tailer.idle_poll_s() * (0.8 + 0.4 * random.random())
        loop = asyncio.get_running_loop()
        w = self._waiter = loop.create_future()
        timer = loop.call_later(seconds, _resolve, w)
        try:
            await w
        finally:
            timer.cancel()
            self._waiter = None
            self._woken = False

    # -- the protocol ------------------------------------------------------------------------

    async def _stream(self) -> bool:
        """Open a stream and send until it must be reopened (True) or there is nothing to open
        it with yet (False).  Raises on failures."""
        lf = self.files()
        if not lf.files:
            self._set(state="waiting")
            await self._idle_wait()
            return False
        opening = self._opening_header(lf)
        if opening is None:
            self._set(state="waiting", error="no file with a complete header yet")
            await self._idle_wait()
            return False
        self._opening_file, header = opening
        replica = self.replica
        if replica is None:
            raise RefusedByDis("NOT_ROUTED", f"no DIS in the routing takes {self.key.table_key}")
        self._set(state="connecting", dis=replica.address)
        request = dis_pb2.IngestOpen(location=key_to_proto(self.key), schema_fingerprint=header.fingerprint,
                                     tailer_id=self.tailer.tailer_id, schema_json=header.schema.to_json())
        session = self._session = self.tailer.open_stream(replica.address, self._on_ack, self.wake)
        try:
            try:
                resume = await session.open(request)
            except MultiplexUnsupported:  # a DIS of an older release: a call of the stream's own
                session.close()
                session = self._session = self.tailer.open_stream(replica.address, self._on_ack, self.wake)
                resume = await session.open(request)
            with self._lock:
                self.reachable = True
                self.problems.not_a_dis = None
                r = self.problems.refused
                if r is not None and r[2] and r[0] == self._opening_file:
                    self.problems.refused = None  # the DIS takes the file it refused
            self.tailer.is_a_dis(replica.address)
            await self._follow(session, header, resume)
        finally:
            self._session = None
            self._following = None
            session.close()
        return True

    def _opening_header(self, lf: LocationFiles) -> tuple[str, LogHeader] | None:
        """The file and header whose fingerprint opens the stream: of the file the stream was at,
        else of the first file with a readable header (an empty or foreign file does not block the
        location; the file actually sent is checked again before its bytes go out)."""
        hinted = lf.find(self._hint) if self._hint else None
        candidates = ([hinted] if hinted else []) + [f for f in lf.files if f is not hinted]
        corrupt: CorruptLogError | None = None
        for f in candidates:
            try:
                header = header_of(f.path)
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

    async def _follow(self, s: StreamFlow, opened: LogHeader, resume: dis_pb2.ResumePoint) -> None:
        self._opened = True
        schema = schema_of(opened)
        cfg = self.cfg
        problems = self.problems
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
        problems.resumed()
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
            while True:
                s.check()
                lf = self.files()
                problems.check_stranded(self.passed_files, lf, name, self.log)
                problems.past_corruption(name, offset)
                self._forget_missing_files()
                self._sync_problem(s, accepts, told)
                piece: Piece | None = None
                if cur is None:  # the file at the position is gone: it may be back (replaced)
                    cur = lf.find(name)
                if cur is not None and reader is None and not problems.is_truncated(name):
                    try:
                        reader = FrameReader(cur.path)
                    except FileNotFoundError:
                        # removed (or being replaced) since the last scan: gone once a scan says so
                        cur = self.files().find(name)
                        if cur is not None:
                            await self._idle_wait(cfg.poll_interval_ms / 1000)
                        continue
                if cur is not None and reader is not None and not problems.is_truncated(name):
                    try:
                        piece = reader.read(offset, cfg.chunk_bytes)
                    except CorruptLogError as e:
                        await s.drain()  # the good frames before the corruption reach the DIS
                        await self._stop_at_corrupt(s, accepts, told, e)
                        # looked at again: read there anew (the file may be another one now); a
                        # file removed is left for the ones after it
                        reader.close()
                        reader, checked, cur = None, False, self.files().find(name)
                        continue
                    problems.past_corruption(name, offset, read_there=True)
                    if not piece.data and offset > 0 and piece.file_size < offset:
                        if problems.note_truncated(name, piece.file_size, offset):
                            self.log.warning("log file truncated below what was sent; nothing more of it is sent",
                                             file=cur.path, size=piece.file_size, sent_offset=offset)
                        continue
                    if piece.data and not checked:
                        # checked only when bytes of this file are to be sent: a resume point at
                        # the end of an older file of another schema must not cause a reopen
                        header = reader.header()
                        if header is not None and schema_of(header) != schema:
                            if await self._check_step(s, accepts, told, self.files(), cur, header):
                                # held before the file until it changed, or for the retry period:
                                # look at it anew
                                reader.close()
                                reader, cur = None, self.files().find(name)
                                continue
                            if problems.report_refusal_of == cur.name:
                                # opened with the schema before the file the DIS refused, to say so:
                                # said (at the top of the loop); wait here (a DIS that restarts ends
                                # the wait, and is sent again what it lost), then try the file again
                                await s.drain()
                                refused = problems.refused
                                self._set(state="refused", error=refused[1] if refused else None, in_flight_bytes=0)
                                self._hint = self._opening_file  # a reconnect reports it the same way
                                path = cur.path
                                st = file_stat(path)
                                await self._hold(s, accepts, told, lambda: repaired(st, file_stat(path)))
                                if problems.refused is None:  # the file is gone: on with the ones after it
                                    reader.close()
                                    reader, cur = None, self.files().find(name)
                                    continue
                                if accepts:
                                    await s.finish()
                                problems.report_refusal_of = None
                                self._hint = cur.name
                                self._just_reported = True
                                return
                            self.log.info("schema changes with this file; reopening the stream",
                                          file=cur.name, fingerprint=header.fingerprint,
                                          schema_version=header.schema.version)
                            await s.drain()
                            self._hint = cur.name
                            return
                        checked = True
                    if piece.data:
                        if piece.at_end and len(piece.data) < COALESCE_BELOW_BYTES and s.inflight_bytes:
                            await s.wait_acked(COALESCE_WAIT_S)
                            continue  # read again: rows that arrived meanwhile join this chunk
                        await s.send(name, piece)
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
                            await self._idle_wait(min(cfg.poll_interval_ms, cfg.torn_tail_grace_ms) / 1000)
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
                self._following = (lf, piece.file_size if piece is not None else -1) if lf.files and \
                    lf.files[-1].name == name else None
                if self._status.state != "following":
                    self._set(state="following", in_flight_bytes=s.inflight_bytes)
                await self._idle_wait()
        finally:
            if reader is not None:
                reader.close()

def _resolve(w: asyncio.Future) -> None:
    if not w.done():
        w.set_result(None)
