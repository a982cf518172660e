"""One location's worker: an Ingest stream to the DIS that owns it, fed with whole frames.

The worker opens ``Ingest.Stream`` with the location and the schema fingerprint of the file it is
at, learns the resume point, and sends the files of the location in order from there.  It never
has more than ``max_in_flight_bytes`` unacknowledged (every chunk is answered by an Ack), follows
the last file as it grows, moves to the next file once one exists and the current one has no
more complete frames (giving an incomplete tail ``torn_tail_grace_ms`` first), and reopens the
stream when the next file has another schema fingerprint.

Failures: a broken stream (DIS restart, network) reconnects with exponential backoff capped at
``max_backoff_ms``; a refusal (unknown table, schema mismatch, bad name, not routed here) is
logged and retried after ``retry_refused_ms``; a corrupt log stops this location (the others go
on), looked at again every ``retry_refused_ms`` until the file is repaired.

Problems on the tailer's side of a location (the corrupt frame it stopped at, files that seem
meant for the location but whose names do not parse) are sent to a DIS that accepts them as
``TailerReport``s, so ``dis status`` shows them; the worker also counts what the tailer's metrics
report (``disd.tailer.metrics``).
"""

from __future__ import annotations

import collections
import os
import threading
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import grpc
import structlog

from disd.binlog import CorruptLogError
from disd.names import LocationKey
from disd.rpc.channel import open_channel
from disd.rpc.keys import key_to_proto
from disd.rpc.v1 import dis_pb2
from disd.tailer.frames import FrameReader, Piece
from disd.tailer.session import IngestSession, RefusedByDis, StreamBroken, classify
from disd.tailer.watch import LocationFiles, LogFile, order_of

if TYPE_CHECKING:
    from disd.tailer.core import Tailer

log = structlog.get_logger("disd.tailer")

INITIAL_BACKOFF_S = 0.1


@dataclass
class WorkerStatus:
    state: str = "starting"  # starting connecting streaming following refused corrupt reconnecting stopped
    file: str | None = None  # the file being sent
    sent_offset: int = 0  # offset in ``file`` after the last chunk sent
    acked_file: str | None = None
    acked_offset: int = 0  # the DIS has ingested every byte of ``acked_file`` before this
    committed_rows: int = 0
    in_flight_bytes: int = 0
    dis: str | None = None
    error: str | None = None
    problem: str | None = None  # what the DIS is told is wrong on this side; filled in by status()


class LocationWorker(threading.Thread):
    def __init__(self, tailer: "Tailer", key: LocationKey) -> None:
        super().__init__(name=f"tailer {key}", daemon=True)
        self.tailer = tailer
        self.key = key
        self.cfg = tailer.config
        self.wake = threading.Event()
        self._halt = tailer._halt
        self._lock = threading.Lock()
        self._status = WorkerStatus()
        self._session: IngestSession | None = None
        self._hint: str | None = None  # the file the next stream opens with (its fingerprint)
        self._corrupt: tuple[str, int, tuple] | None = None  # (path, offset, stat) that stopped us
        self._opened = False  # the current attempt got a resume point
        self._opening_file: str | None = None  # the file whose schema the last stream opened with
        # the corrupt frame the location stopped at (file name, offset), and what the DIS is told
        # about it, until the worker gets past it
        self._corrupt_at: tuple[str, int] | None = None
        self._corrupt_problem: str | None = None
        self._corrupt_seen: set[tuple[str, int]] = set()
        # files the worker moved past: their end of complete frames (bytes after it are never sent)
        self._passed: dict[str, int] = {}
        self._header_sizes: dict[str, tuple[int, int]] = {}  # path -> (inode, header bytes)
        # counters for the metrics (disd.tailer.metrics)
        self.reconnects = 0
        self.corrupt_frames = 0
        self.acked_bytes = 0
        self.refusals: collections.Counter[str] = collections.Counter()
        self.log = log.bind(location=str(key))

    # -- status ------------------------------------------------------------------------------

    def status(self) -> dict:
        problem = self.problem() or None
        with self._lock:
            return asdict(self._status) | {"problem": problem}

    def counters(self) -> dict:
        """acked_bytes, corrupt_frames, reconnects, refusals (by gRPC status): for the metrics."""
        with self._lock:
            return {"acked_bytes": self.acked_bytes, "corrupt_frames": self.corrupt_frames,
                    "reconnects": self.reconnects, "refusals": dict(self.refusals)}

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
            s.call.cancel()

    # -- main loop ---------------------------------------------------------------------------

    def run(self) -> None:
        backoff = INITIAL_BACKOFF_S
        reported: set[str] = set()
        while not self._halt.is_set():
            self._opened = False
            if self._corrupt is not None:
                # stopped at a corrupt frame: look again later (and tell the DIS again: it may
                # have restarted and forgotten); a file the operator repaired goes on from there
                self._wait(self.cfg.retry_refused_ms / 1000)
                if self._halt.is_set():
                    break
            last_corrupt, self._corrupt = self._corrupt, None
            try:
                if self._stream():
                    backoff = INITIAL_BACKOFF_S
                    reported.clear()
            except RefusedByDis as e:
                with self._lock:
                    self.refusals[e.code] += 1
                self._set(state="refused", error=str(e), in_flight_bytes=0)
                first = str(e) not in reported  # the same refusal again is logged at info
                reported.add(str(e))
                (self.log.warning if first else self.log.info)(
                    "location refused by the DIS; retrying later", code=e.code, error=e.details,
                    file=self._opening_file, dis=self._status.dis, retry_s=self.cfg.retry_refused_ms / 1000)
                self._wait(self.cfg.retry_refused_ms / 1000)
            except CorruptLogError as e:
                path = e.path or ""
                self._corrupt = (path, e.offset, _stat(path))
                self._note_corrupt(e)
                self._set(state="corrupt", error=str(e), in_flight_bytes=0)
                # logged at error when new, or when the file changed and is still corrupt there
                (self.log.info if self._corrupt == last_corrupt else self.log.error)(
                    "corrupt binary log: this location stops here until the file is repaired",
                    file=path, offset=e.offset, problem=e.problem, retry_s=self.cfg.retry_refused_ms / 1000)
            except (grpc.RpcError, StreamBroken, OSError) as e:
                if self._halt.is_set():
                    break
                if self._opened:  # the stream had been working: a fresh failure, start over
                    backoff = INITIAL_BACKOFF_S
                    reported.clear()
                detail = str(classify(e)) if isinstance(e, grpc.RpcError) else str(e)
                with self._lock:
                    self.reconnects += 1
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
        self._halt.wait(seconds)

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

    def problem(self) -> str:
        """What is wrong on this side of the location, for the DIS ("" when nothing)."""
        parts = [self._corrupt_problem] if self._corrupt_problem else []
        skipped = self.tailer.skipped_for(self.key)
        parts += [f"file {sk.name} is not streamed: {sk.problem}" for sk in skipped[:3]]
        if len(skipped) > 3:
            parts.append(f"and {len(skipped) - 3} more files whose names do not parse")
        return "; ".join(parts)

    def _sync_problem(self, s: IngestSession, accepts: bool, told: list) -> None:
        """Send the problem when it changed since the DIS was last told (``told[0]``)."""
        p = self.problem()
        if accepts and p != told[0]:
            s.report(p)
            told[0] = p

    def _idle_wait(self, seconds: float | None = None) -> None:
        self.wake.wait(self.cfg.poll_interval_ms / 1000 if seconds is None else seconds)
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
        owner = self.cfg.routing.owner(self.key.namespace, self.key.table)
        if owner is None:
            raise RefusedByDis("NOT_ROUTED", f"no DIS in the routing takes {self.key.table_key}")
        self._set(state="connecting", dis=owner.address)
        channel = open_channel(owner.address, self.cfg.security)
        try:
            session = IngestSession(channel, self.cfg.max_in_flight_bytes, self._halt, self._on_ack)
            self._session = session
            if self._halt.is_set():
                return True
            try:
                resume = session.open(dis_pb2.IngestOpen(
                    location=key_to_proto(self.key),
                    schema_fingerprint=header.fingerprint, tailer_id=self.tailer.tailer_id,
                    schema_json=header.schema.to_json()))
                self._follow(session, header.fingerprint, resume)
            finally:
                self._session = None
                session.close()
        finally:
            channel.close()
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

    def _follow(self, s: IngestSession, fingerprint: str, resume: dis_pb2.ResumePoint) -> None:
        self._opened = True
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
                self._past_corruption(name, offset)
                self._sync_problem(s, accepts, told)
                piece: Piece | None = None
                if cur is not None:
                    if reader is None:
                        reader = FrameReader(cur.path)
                    try:
                        piece = reader.read(offset, cfg.chunk_bytes)
                    except CorruptLogError as e:
                        s.drain()  # the good frames before the corruption reach the DIS
                        self._note_corrupt(e)
                        self._sync_problem(s, accepts, told)
                        if accepts:
                            s.finish()  # the report reaches the DIS before the stream is cut
                        raise
                    self._past_corruption(name, offset, read_there=True)
                    if piece.data and not checked:
                        # checked only when bytes of this file are to be sent: a resume point at
                        # the end of an older file of another schema must not cause a reopen
                        header = reader.header()
                        if header is not None and header.fingerprint != fingerprint:
                            self.log.info("schema fingerprint changes with this file; reopening the stream",
                                          file=cur.name, fingerprint=header.fingerprint)
                            s.drain()
                            self._hint = cur.name
                            return
                        checked = True
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
