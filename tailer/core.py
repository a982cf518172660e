"""The tailer: finds binary logs, and streams each location's files to the DIS that owns it.

One thread watches the log directories (inotify when the kernel offers it, else polling) and
keeps, per location, its files ordered by time stamp.  One worker thread per location holds an
Ingest stream: it learns the resume point, then sends whole frames of the files in order, never
a partial one, keeping at most ``max_in_flight_bytes`` unacknowledged.  It follows a growing
file, moves to the next file once a newer one exists and the current one is complete, waits on
a torn tail (and gives up on it after a grace period when a newer file exists), and reconnects
with backoff when the stream fails.  A location the DIS refuses is retried later; the others go on.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import queue
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

import grpc
import structlog

from disd.binlog import CorruptLogError, LocationKey, LogFileName, decode_header, scan_frames
from disd.binlog.format import FRAME_HEADER_SIZE, MAX_FRAME_PAYLOAD
from disd.rpc.channel import open_channel
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from disd.schema import TableSchema
from disd.tailer.config import TailerConfig

log = structlog.get_logger(__name__)

REFUSALS = {
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.DATA_LOSS,
    grpc.StatusCode.UNAUTHENTICATED,
}


# ---------------------------------------------------------------------------------------------
# Watching directories


class DirectoryWaker:
    """Wakes the scanner when a log directory changes (inotify), or after the poll interval."""

    IN_MODIFY, IN_CLOSE_WRITE, IN_MOVED_TO, IN_CREATE = 0x2, 0x8, 0x80, 0x100

    def __init__(self, dirs: list[str]) -> None:
        self.fd = -1
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd < 0:
                return
            mask = self.IN_MODIFY | self.IN_CLOSE_WRITE | self.IN_MOVED_TO | self.IN_CREATE
            for d in dirs:
                if os.path.isdir(d):
                    libc.inotify_add_watch(fd, os.fsencode(d), mask)
            self.fd = fd
        except (OSError, AttributeError):
            self.fd = -1

    @property
    def inotify(self) -> bool:
        return self.fd >= 0

    def wait(self, timeout: float) -> None:
        if self.fd < 0:
            time.sleep(timeout)
            return
        r, _, _ = select.select([self.fd], [], [], timeout)
        if r:
            try:
                while os.read(self.fd, 65536):
                    pass
            except BlockingIOError:
                pass

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass
class LocationFiles:
    key: LocationKey
    files: list[tuple[int, str, str]] = field(default_factory=list)  # (sort key, name, path)

    def after(self, name: str | None) -> list[tuple[int, str, str]]:
        if name is None:
            return list(self.files)
        cur = LogFileName.try_parse(name)
        k = (cur.sort_key, name) if cur else (0, name)
        return [f for f in self.files if (f[0], f[1]) > k]


def scan_dirs(dirs: list[str], reported: set[str]) -> dict[LocationKey, LocationFiles]:
    out: dict[LocationKey, LocationFiles] = {}
    for d in dirs:
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            if not e.is_file():
                continue
            name = LogFileName.try_parse(e.name)
            if name is None:
                if e.name not in reported:
                    reported.add(e.name)
                    log.info("ignoring file that is not a binary log", file=e.path)
                continue
            lf = out.setdefault(name.location, LocationFiles(name.location))
            lf.files.append((name.sort_key, e.name, e.path))
    for lf in out.values():
        lf.files.sort()
    return out


# ---------------------------------------------------------------------------------------------
# Reading whole frames


@dataclass
class Piece:
    data: bytes
    offset: int
    end: int


def read_frames(path: str, offset: int, schema: TableSchema, max_bytes: int) -> Piece:
    """Whole frames of ``path`` from ``offset`` (with the file header when offset is 0), at most
    about ``max_bytes``; a single frame bigger than that is returned alone.  Empty when no whole
    frame follows ``offset`` yet."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if offset >= size:
            return Piece(b"", offset, offset)
        f.seek(offset)
        data = f.read(min(max(max_bytes, FRAME_HEADER_SIZE), size - offset))
        start = 0
        if offset == 0:
            header = decode_header(data, path)
            if header is None and len(data) < size:
                data += f.read(min(1 << 20, size - len(data)))
                header = decode_header(data, path)
            if header is None:
                return Piece(b"", 0, 0)
            start = header.size
        run = scan_frames(data, offset, schema, start=start, path=path)
        if not run.starts and len(data) >= start + FRAME_HEADER_SIZE and offset + len(data) < size:
            plen = struct.unpack_from("<I", data, start)[0]
            need = start + FRAME_HEADER_SIZE + plen
            if plen <= MAX_FRAME_PAYLOAD and offset + need <= size:
                data += f.read(need - len(data))
                run = scan_frames(data, offset, schema, start=start, path=path, max_frames=1)
        if not run.starts:
            return Piece(b"", offset, offset)
        return Piece(data[: run.end_offset - offset], offset, run.end_offset)


def complete_end(path: str, schema: TableSchema, offset: int = 0) -> int:
    """The offset just past the last complete frame of a file."""
    while True:
        piece = read_frames(path, offset, schema, 64 << 20)
        if not piece.data:
            return offset
        offset = piece.end


# ---------------------------------------------------------------------------------------------
# One location


class Refused(Exception):
    pass


@dataclass
class WorkerStatus:
    file: str | None = None
    sent_offset: int = 0
    acked_offset: int = 0
    acked_file: str | None = None
    committed_rows: int = 0
    state: str = "starting"
    error: str | None = None


class LocationWorker(threading.Thread):
    def __init__(self, tailer: "Tailer", key: LocationKey) -> None:
        super().__init__(name=f"tailer-{key}", daemon=True)
        self.tailer = tailer
        self.key = key
        self.cfg = tailer.config
        self.status = WorkerStatus()
        self.wake = threading.Event()
        self._halt = tailer._stop

    def files(self) -> LocationFiles:
        return self.tailer.files_of(self.key)

    def run(self) -> None:
        backoff = 0.1
        while not self._halt.is_set():
            try:
                self._stream()
                backoff = 0.1
            except Refused as e:
                self.status.state, self.status.error = "refused", str(e)
                log.warning("location refused by the DIS; retrying later", location=str(self.key), error=str(e),
                            retry_s=self.cfg.retry_refused_ms / 1000)
                self._halt.wait(self.cfg.retry_refused_ms / 1000)
            except CorruptLogError as e:
                self.status.state, self.status.error = "corrupt", str(e)
                log.error("corrupt binary log; location stopped until the file is fixed", location=str(self.key),
                          error=str(e))
                self._halt.wait(self.cfg.retry_refused_ms / 1000)
            except (grpc.RpcError, OSError, _StreamBroken) as e:
                detail = e.details() if isinstance(e, grpc.RpcError) and hasattr(e, "details") else str(e)
                if not self._halt.is_set():
                    self.status.state, self.status.error = "reconnecting", detail
                    log.info("ingest stream broken; reconnecting", location=str(self.key), error=detail,
                             backoff_s=round(backoff, 2))
                self._halt.wait(backoff)
                backoff = min(backoff * 2, self.cfg.max_backoff_ms / 1000)

    def _stream(self) -> None:
        files = self.files().files
        if not files:
            self._halt.wait(self.cfg.poll_interval_ms / 1000)
            return
        with open(files[0][2], "rb") as f:
            header = decode_header(f.read(1 << 20), files[0][2])
        if header is None:
            self._halt.wait(self.cfg.poll_interval_ms / 1000)
            return
        schema = header.schema
        owner = self.cfg.routing.owner(self.key.namespace, self.key.table)
        if owner is None:
            raise Refused(f"no DIS in the routing takes {self.key.table_key}")
        channel = open_channel(owner.address, self.cfg.security)
        requests: queue.Queue = queue.Queue(maxsize=4)
        acked = threading.Condition()
        state = {"inflight": [], "error": None, "done": False}

        def request_iter():
            while True:
                item = requests.get()
                if item is None:
                    return
                yield item

        try:
            responses = dis_pb2_grpc.IngestStub(channel).Stream(request_iter())
            requests.put(dis_pb2.IngestRequest(open=dis_pb2.IngestOpen(
                location=dis_pb2.LocationKey(namespace=self.key.namespace, table=self.key.table,
                                             internal_partition=self.key.internal_partition,
                                             column_partition=self.key.column_partition),
                schema_fingerprint=header.fingerprint, tailer_id=self.tailer.tailer_id)))
            try:
                first = next(responses)
            except grpc.RpcError as e:
                if e.code() in REFUSALS:
                    raise Refused(f"{e.code().name}: {e.details()}") from None
                raise
            resume = first.resume
            self.status.state, self.status.error = "streaming", None
            log.info("ingest stream open", location=str(self.key), dis=owner.address,
                     resume_file=resume.file_name or None, resume_offset=resume.offset)

            def read_acks() -> None:
                try:
                    for r in responses:
                        with acked:
                            a = r.ack
                            if state["inflight"]:
                                state["inflight"].pop(0)
                            self.status.acked_file, self.status.acked_offset = a.file_name, a.offset
                            self.status.committed_rows = a.committed_rows
                            acked.notify_all()
                except grpc.RpcError as e:
                    with acked:
                        state["error"] = e
                        acked.notify_all()
                finally:
                    with acked:
                        state["done"] = True
                        acked.notify_all()

            reader = threading.Thread(target=read_acks, name=f"acks-{self.key}", daemon=True)
            reader.start()
            cur_name = resume.file_name or None
            cur_offset = resume.offset if cur_name else 0
            if cur_name and not any(f[1] == cur_name for f in self.files().files):
                log.warning("resume file not found in the log directories; continuing with newer files",
                            location=str(self.key), file=cur_name)
                cur_path = None
            else:
                cur_path = next((f[2] for f in self.files().files if f[1] == cur_name), None)
            if cur_name is None:
                nxt = self.files().files[0]
                cur_name, cur_path, cur_offset = nxt[1], nxt[2], 0
            torn_since: float | None = None
            while not self._halt.is_set():
                self._check(state, acked)
                piece = read_frames(cur_path, cur_offset, schema, self.cfg.chunk_bytes) if cur_path else Piece(b"", 0, 0)
                if piece.data:
                    torn_since = None
                    self._send(requests, acked, state, cur_name, piece)
                    cur_offset = piece.end
                    self.status.file, self.status.sent_offset = cur_name, cur_offset
                    continue
                newer = self.files().after(cur_name)
                size = os.path.getsize(cur_path) if cur_path else 0
                if newer:
                    complete = cur_path is None or cur_offset >= size
                    if not complete:
                        torn_since = torn_since or time.monotonic()
                        if time.monotonic() - torn_since < self.cfg.torn_tail_grace_ms / 1000:
                            self._idle_wait()
                            continue
                        log.warning("giving up on an incomplete frame at the end of a file with a newer one",
                                    location=str(self.key), file=cur_name, offset=cur_offset, size=size)
                    with open(newer[0][2], "rb") as f:
                        h = decode_header(f.read(1 << 20), newer[0][2])
                    if h is not None and h.fingerprint != header.fingerprint:
                        log.info("schema changes with the next file; reopening the stream", location=str(self.key))
                        self._drain(requests, acked, state)
                        return
                    cur_name, cur_path, cur_offset = newer[0][1], newer[0][2], 0
                    torn_since = None
                    continue
                self._idle_wait()
        finally:
            try:
                requests.put_nowait(None)
            except queue.Full:
                pass
            channel.close()

    def _idle_wait(self) -> None:
        self.status.state = "following"
        self.wake.wait(self.cfg.poll_interval_ms / 1000)
        self.wake.clear()

    def _check(self, state: dict, acked: threading.Condition) -> None:
        with acked:
            if state["error"] is not None:
                e = state["error"]
                if e.code() in REFUSALS:
                    raise Refused(f"{e.code().name}: {e.details()}")
                raise e
            if state["done"]:
                raise _StreamBroken("the DIS ended the stream")

    def _send(self, requests: queue.Queue, acked: threading.Condition, state: dict, name: str, piece: Piece) -> None:
        n = len(piece.data)
        with acked:
            while (sum(state["inflight"]) + n > self.cfg.max_in_flight_bytes and state["inflight"]
                   and state["error"] is None and not state["done"] and not self._halt.is_set()):
                acked.wait(0.5)
            state["inflight"].append(n)
        self._check(state, acked)
        msg = dis_pb2.IngestRequest(chunk=dis_pb2.LogChunk(file_name=name, offset=piece.offset, data=piece.data))
        while not self._halt.is_set():
            try:
                requests.put(msg, timeout=0.5)
                return
            except queue.Full:
                self._check(state, acked)

    def _drain(self, requests, acked, state) -> None:  # noqa: ANN001
        with acked:
            while state["inflight"] and state["error"] is None and not state["done"]:
                acked.wait(0.5)


class _StreamBroken(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# The tailer


class Tailer:
    def __init__(self, config: TailerConfig) -> None:
        self.config = config
        self.tailer_id = f"{socket.gethostname()}:{os.getpid()}"
        self._stop = threading.Event()
        self._files: dict[LocationKey, LocationFiles] = {}
        self._workers: dict[LocationKey, LocationWorker] = {}
        self._lock = threading.Lock()
        self._reported: set[str] = set()
        self._scanner: threading.Thread | None = None
        self.waker = DirectoryWaker(config.log_dirs)

    def files_of(self, key: LocationKey) -> LocationFiles:
        with self._lock:
            return self._files.get(key) or LocationFiles(key)

    def rescan(self) -> None:
        found = scan_dirs(self.config.log_dirs, self._reported)
        with self._lock:
            self._files = found
            new = [k for k in found if k not in self._workers]
            for k in new:
                w = self._workers[k] = LocationWorker(self, k)
                w.start()
            workers = list(self._workers.values())
        for w in workers:
            w.wake.set()

    def _scan_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.rescan()
            except Exception as e:  # noqa: BLE001 - keep watching
                log.error("scan failed", error=repr(e))
            self.waker.wait(self.config.poll_interval_ms / 1000)

    def start(self) -> "Tailer":
        for d in self.config.log_dirs:
            if not os.path.isdir(d):
                log.warning("log directory does not exist (yet)", dir=d)
        self.rescan()
        self._scanner = threading.Thread(target=self._scan_loop, name="tailer-scan", daemon=True)
        self._scanner.start()
        log.info("tailer started", log_dirs=self.config.log_dirs, inotify=self.waker.inotify,
                 dis=self.config.routing.addresses)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        with self._lock:
            workers = list(self._workers.values())
        for w in workers:
            w.wake.set()
        for w in workers:
            w.join(timeout)
        if self._scanner is not None:
            self._scanner.join(timeout)
        self.waker.close()

    def status(self) -> dict[str, dict]:
        with self._lock:
            return {str(k): vars(w.status).copy() for k, w in self._workers.items()}

    def idle(self) -> bool:
        """Every location's files are acknowledged up to their last complete frame."""
        with self._lock:
            items = list(self._workers.items())
            files = dict(self._files)
        for key, w in items:
            lf = files.get(key)
            if not lf or not lf.files:
                continue
            _, name, path = lf.files[-1]
            with open(path, "rb") as f:
                header = decode_header(f.read(1 << 20), path)
            if header is None:
                continue
            if w.status.acked_file == name and w.status.acked_offset >= os.path.getsize(path):
                continue
            end = complete_end(path, header.schema)
            if end <= header.size:
                continue
            if w.status.acked_file != name or w.status.acked_offset < end:
                return False
        return True

    def wait_idle(self, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.idle():
                return True
            time.sleep(0.05)
        return False
