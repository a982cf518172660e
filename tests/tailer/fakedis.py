"""A small Ingest servicer on loopback for the tailer's tests: it checks the protocol like the
real DIS (offsets contiguous, new files at offset 0 with their header, whole frames), records what
arrives, and acknowledges from a separate thread, optionally slowly, so the test can measure how
many bytes the tailer keeps unacknowledged.  With ``accepts_reports`` it takes the tailer's
``report``s like a DIS of this release; without, it is an older DIS that refuses them."""

from __future__ import annotations

import collections
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from disd.binlog import LocationKey, LogFileName, decode_header, scan_frames
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from disd.schema import TableSchema


@dataclass
class LocationLog:
    """What the fake DIS holds for one location (survives a server restart when shared)."""

    file_name: str = ""
    offset: int = 0
    chunks: list = field(default_factory=list)  # (file, offset, length)
    opens: list = field(default_factory=list)  # fingerprints of every open
    open_versions: list = field(default_factory=list)  # the schema version of every open's schema_json
    data: dict = field(default_factory=dict)  # file -> bytearray of what was received
    reports: list = field(default_factory=list)  # the problems the tailer reported, in order


class FakeDis(dis_pb2_grpc.IngestServicer):
    def __init__(self, ack_delay: float = 0.0, refuse: dict | None = None,
                 store: dict | None = None, accepts_reports: bool = False,
                 refuse_versions: dict | None = None, open_delay: float = 0.0, workers: int = 16) -> None:
        self.ack_delay = ack_delay
        self.open_delay = open_delay  # seconds before the resume point, as a DIS opening a location
        self.workers = workers  # the server's pool: streams served at once
        self.opening = 0  # streams received and not yet given their resume point
        self.max_opening = 0
        self.accepts_reports = accepts_reports
        self.refuse = refuse or {}  # internal partition -> (StatusCode, details)
        # schema version (of an open's schema_json) -> (StatusCode, details), as a DIS refuses a
        # location's stream in another version than the location's
        self.refuse_versions = refuse_versions if refuse_versions is not None else {}
        self.store: dict[str, LocationLog] = store if store is not None else {}
        self.lock = threading.Lock()
        # set: opens and chunks are received (chunks checked) but not answered until it is cleared
        # (a DIS whose process answers, gRPC's pings included, while its ingest is stuck)
        self.stalled = threading.Event()
        self.max_unacked = 0
        self.errors: list[str] = []
        self.peers: list[str] = []  # the peer (client address and port) of every stream
        self.server: grpc.Server | None = None
        self.port = 0

    def log_of(self, ip: str) -> LocationLog:
        with self.lock:
            return self.store.setdefault(ip, LocationLog())

    # -- the service -------------------------------------------------------------------------

    def Stream(self, request_iterator, context):  # noqa: N802
        with self.lock:
            self.peers.append(context.peer())
            self.opening += 1
            self.max_opening = max(self.max_opening, self.opening)
        try:
            first = next(request_iterator)
            if self.open_delay:
                time.sleep(self.open_delay)
        finally:
            with self.lock:
                self.opening -= 1
        loc = first.open.location
        key = LocationKey(loc.namespace, loc.table, loc.internal_partition, loc.column_partition)
        ip = loc.internal_partition
        st = self.log_of(ip)
        st.opens.append(first.open.schema_fingerprint)
        version = (TableSchema.from_json(first.open.schema_json).version if first.open.schema_json else None)
        st.open_versions.append(version)
        if ip in self.refuse:
            code, details = self.refuse[ip]
            context.abort(code, details)
        if version in self.refuse_versions:
            code, details = self.refuse_versions[version]
            context.abort(code, details)
        while self.stalled.is_set() and context.is_active():
            time.sleep(0.02)
        yield dis_pb2.IngestResponse(resume=dis_pb2.ResumePoint(file_name=st.file_name, offset=st.offset,
                                                                accepts_reports=self.accepts_reports))
        pending: collections.deque = collections.deque()
        cond = threading.Condition()
        state = {"unacked": 0, "end": False, "error": None}

        def receive() -> None:
            try:
                for req in request_iterator:
                    if req.WhichOneof("body") == "report" and self.accepts_reports:
                        st.reports.append(req.report.problem)
                        continue
                    c = req.chunk
                    problem = self._check(key, st, c) if req.WhichOneof("body") == "chunk" else (
                        f"unexpected message {req.WhichOneof('body')}")
                    with cond:
                        if problem:
                            state["error"] = problem
                            cond.notify_all()
                            return
                        state["unacked"] += len(c.data)
                        with self.lock:
                            self.max_unacked = max(self.max_unacked, state["unacked"])
                        pending.append(c)
                        cond.notify_all()
            except Exception:  # noqa: BLE001 - the stream was cancelled
                pass
            finally:
                with cond:
                    state["end"] = True
                    cond.notify_all()

        threading.Thread(target=receive, daemon=True).start()
        while True:
            with cond:
                while not pending and not state["end"] and state["error"] is None:
                    cond.wait(0.1)
                if state["error"] is not None:
                    self.errors.append(state["error"])
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, state["error"])
                if not pending:
                    return
                c = pending.popleft()
            if self.ack_delay:
                time.sleep(self.ack_delay)
            while self.stalled.is_set() and context.is_active():
                time.sleep(0.02)
            with cond:
                state["unacked"] -= len(c.data)
            yield dis_pb2.IngestResponse(ack=dis_pb2.Ack(file_name=c.file_name, offset=c.offset + len(c.data),
                                                         committed_rows=0))

    def _check(self, key: LocationKey, st: LocationLog, c: dis_pb2.LogChunk) -> str | None:
        name = LogFileName.try_parse(c.file_name)
        if name is None or name.location != key:
            return f"bad file name {c.file_name}"
        if c.file_name == st.file_name:
            if c.offset != st.offset:
                return f"{c.file_name}: offset {c.offset}, expected {st.offset}"
        elif c.offset != 0:
            return f"{c.file_name}: new file at offset {c.offset}"
        start = 0
        schema = None
        if c.offset == 0:
            h = decode_header(c.data)
            if h is None:
                return f"{c.file_name}: first chunk without the header"
            start, schema = h.size, h.schema
        else:
            h = decode_header(bytes(st.data[c.file_name][:1 << 20]))
            schema = h.schema
        run = scan_frames(c.data, c.offset, schema, start=start)
        if run.end_offset != c.offset + len(c.data):
            return f"{c.file_name}: chunk does not end on a frame boundary"
        st.chunks.append((c.file_name, c.offset, len(c.data)))
        st.data.setdefault(c.file_name, bytearray()).extend(c.data)
        st.file_name, st.offset = c.file_name, c.offset + len(c.data)
        return None

    # -- serving -----------------------------------------------------------------------------

    def start(self, port: int = 0) -> "FakeDis":
        self.server = grpc.server(futures.ThreadPoolExecutor(self.workers),
                                  options=[("grpc.max_receive_message_length", 64 << 20)])
        dis_pb2_grpc.add_IngestServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        assert self.port, "port in use"
        self.server.start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(0).wait(5)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"
