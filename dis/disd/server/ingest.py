"""The Ingest service: one bidirectional stream per location, from a tailer.

The protocol is in proto/disd/rpc/v1/dis.proto.  This module keeps the protocol and the session rules: it
validates every message (names, schema version at ``open``, what may follow it), decides who owns
a location (takeovers, ends) and answers each chunk with what the storage engine's chunk entry
(``storage.ingest.ingest_chunks``: the file order and offsets, frames and checksums, rows and
transactions, writes and publishing) made of it, as an ack or a precise gRPC status; hostile or
broken input loses nothing.  When a stream ends for any reason, the location's open transaction is rolled back: its
rows were never published, and the tailer resends them from the resume point.

Schema versions (docs/schema-versions.md): a stream's logs are in one version of the table, named
by the header schema of its ``open``.  The DIS takes every version it holds, admits an older one
it has not stored when the rules allow it, and refuses a newer one than the YAML declares.  A
location is written in one version for ever: a stream of another version than its location is
refused before anything is written, naming the remedy (a log-format suffix on the internal
partition, so each version has its own locations).
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Callable, Iterator, TypeGuard

import grpc
import structlog

from disd.errors import DisError
from disd.binlog import LocationKey
from disd.names import InvalidNameError
from disd.rpc.ingeststatus import location_in_error
from disd.rpc.ingestwire import ChunkView
from disd.rpc.keys import key_from_proto
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from disd.schema import SchemaError, TableSchema
from disd.server import metrics
from disd.server.ingestsessions import EndStream, Session, SessionRegistry, end_stream, error_status
from disd.server.refusallog import RefusalLog
from disd.storage import Location, LocationError, StorageEngine
from disd.storage.ingest import (
    ChunkResult,
    LocationIngest,
    Refused,
    RefusalKind,
    ingest_chunks,
    schema_mismatch_message,
    version_mismatch_message,
)

log = structlog.get_logger(__name__)


class RequestRefused(DisError):
    """Refuse an Ingest request with this gRPC status (raised inside the service, answered there)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


def location_key(msg: dis_pb2.LocationKey) -> LocationKey:
    try:
        return key_from_proto(msg)
    except InvalidNameError as e:
        raise RequestRefused(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None


def schema_mismatch(table: TableSchema, fingerprint: str, log_schema: "TableSchema | str | None",
                    where: str) -> RequestRefused:
    """FAILED_PRECONDITION naming the table and, when the log's schema is known (a file header, or
    the ``schema_json`` of a tailer's ``open``), the columns that differ.  ``table`` is the
    version of the table the log is compared with (the one of the log's version number, when
    the DIS holds it)."""
    if isinstance(log_schema, str) and log_schema:
        log_schema = parse_log_schema(log_schema)
    logged = log_schema if isinstance(log_schema, TableSchema) else None
    return RequestRefused(grpc.StatusCode.FAILED_PRECONDITION, schema_mismatch_message(table, fingerprint, logged, where))


@functools.lru_cache(maxsize=256)
def parse_log_schema(text: str) -> TableSchema | None:
    """The schema a tailer's ``open`` carries (``schema_json``), None when absent or unreadable
    (the fingerprint alone then decides).  Cached by text: every stream of a table sends the same
    one, and a schema is immutable."""
    if not text:
        return None
    try:
        return TableSchema.from_json(text, "<open.schema_json>")
    except (SchemaError, ValueError):
        return None


def version_mismatch(key: LocationKey, location_version: int, log_version: int, where: str = "") -> RequestRefused:
    """FAILED_PRECONDITION for a log of another schema version than its location: a location is
    written in one version for ever, so the rows must go to another internal partition."""
    return RequestRefused(grpc.StatusCode.FAILED_PRECONDITION,
                          version_mismatch_message(key, location_version, log_version, where))


_STATUS = {
    RefusalKind.INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    RefusalKind.DATA_LOSS: grpc.StatusCode.DATA_LOSS,
    RefusalKind.SCHEMA: grpc.StatusCode.FAILED_PRECONDITION,
    RefusalKind.CANCELLED: grpc.StatusCode.CANCELLED,
}


def refusal(r: Refused) -> RequestRefused:
    """The gRPC status of a chunk the storage engine refused."""
    code = error_status(r.errno) if r.kind is RefusalKind.LOCATION else _STATUS[r.kind]
    return RequestRefused(code, r.message)


def count_refusal(said: RefusalLog, r: RequestRefused, peer: str, key: LocationKey | None = None,
                  tailer_id: str | None = None) -> None:
    """Count a refused request (``dis_ingest_rejections_total``) and log it, naming what is known
    of its stream: at warning the first time, its repeats counted and said now and then
    (``RefusalLog``)."""
    metrics.INGEST_REJECTIONS.labels(r.code.name).inc()
    said.refused(r.code.name, r.details, peer, str(key) if key else None, tailer_id)


def _ack(r: ChunkResult) -> dis_pb2.IngestResponse:
    return dis_pb2.IngestResponse(ack=dis_pb2.Ack(file_name=r.file_name, offset=r.offset, committed_rows=r.committed_rows))


Request = ChunkView | dis_pb2.IngestRequest


def _body(req: Request) -> str | None:
    return "chunk" if isinstance(req, ChunkView) else req.WhichOneof("body")


def _opens(req: Request | None) -> TypeGuard[dis_pb2.IngestRequest]:
    """Whether ``req`` is an ``open`` (a chunk never is)."""
    return req is not None and _body(req) == "open"


class IngestService(dis_pb2_grpc.IngestServicer):
    def __init__(self, engine: StorageEngine, sessions: SessionRegistry, routed: Callable[[str, str], bool]) -> None:
        self.engine = engine
        self.sessions = sessions
        self.routed = routed
        self.refusals = RefusalLog()

    def Stream(self, request_iterator: Iterator[Request], context: grpc.ServicerContext) -> Iterator[dis_pb2.IngestResponse]:  # noqa: N802
        """One location's stream on its own call (the ``Multiplex`` call carries many:
        ``disd.server.ingestmux``)."""
        stream = ServedStream(self, context.peer(), functools.partial(end_stream, context))
        try:
            waiting = self.sessions.wait_open(stream.peer, stream.end)
            try:
                first = next(request_iterator, None)
            finally:
                self.sessions.opened(waiting)
            yield stream.open(first)
            for req in request_iterator:
                response = stream.handle(req)
                if response is not None:
                    yield response
        except RequestRefused as r:
            stream.refused(r)
            context.abort(r.code, r.details)
        finally:
            stream.close()

    def open_target(self, first: Request | None) -> tuple[LocationKey, TableSchema]:
        """The location a stream's first request opens and the schema version its logs are in;
        RequestRefused when that request is not an ``open`` the DIS takes (an unknown or
        unrouted table, a schema it does not hold).  Nothing is opened yet."""
        if not _opens(first):
            raise RequestRefused(grpc.StatusCode.INVALID_ARGUMENT, "the first message of an ingest stream must be 'open'")
        key = location_key(first.open.location)
        schema = self.engine.schemas.get(key.namespace, key.table)
        if schema is None:
            raise RequestRefused(grpc.StatusCode.NOT_FOUND, f"unknown table {key.table_key}")
        if not self.routed(key.namespace, key.table):
            raise RequestRefused(grpc.StatusCode.PERMISSION_DENIED, f"table {key.table_key} is not routed to this DIS")
        return key, self._stream_version(schema, first.open.schema_fingerprint, first.open.schema_json)

    def _stream_version(self, table: TableSchema, fingerprint: str, schema_json: str) -> TableSchema:
        """The version of ``table`` a stream's logs are written in, from its ``open``: the version
        the ``schema_json`` names when the DIS holds it with the same columns, or an older one the
        database admits now (``StorageEngine.admit``).  Without ``schema_json`` (older tailers),
        the newest version with the fingerprint.  Refused (FAILED_PRECONDITION) otherwise."""
        logged = parse_log_schema(schema_json)
        if logged is None or logged.fingerprint != fingerprint or logged.key != table.key:
            matching = [s for s in table.versions.values() if s.fingerprint == fingerprint]
            if matching:
                return matching[-1]
            raise schema_mismatch(table, fingerprint, logged, "")
        return self._held_version(table, logged, "")

    def _held_version(self, table: TableSchema, logged: TableSchema, where: str) -> TableSchema:
        """``logged`` (a log header's schema) as the version the DIS holds, admitting an older
        version the database has not stored; FAILED_PRECONDITION for a version newer than the
        declared one, another version's columns under a held number, or a refused change."""
        held = table.versions.get(logged.version)
        if held is not None:
            if held.fingerprint != logged.fingerprint:
                raise schema_mismatch(held, logged.fingerprint, logged, where)
            return held
        if logged.version > table.version:
            raise RequestRefused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{where}schema version {logged.version} of {table.key} in the log is newer than the version the DIS "
                f"declares ({table.version}): declare it in the table's schema file (version: {logged.version}) "
                f"and restart the DIS; log fingerprint {logged.fingerprint}",
            )
        try:
            newest = self.engine.admit(logged)
        except SchemaError as e:
            raise RequestRefused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{where}schema mismatch: version {logged.version} of {table.key} in the log cannot be admitted "
                f"to the versions the DIS holds ({', '.join(map(str, table.versions))}): {e.problem}",
            ) from None
        log.info("schema version admitted from a log header", table=table.key, version=logged.version,
                 fingerprint=logged.fingerprint)
        return newest.at_version(logged.version)

    @staticmethod
    def _rollback(loc: Location, key: LocationKey) -> None:
        try:
            loc.rollback()
        except Exception as e:  # noqa: BLE001 - the location reports its own error state
            log.error("rollback failed", location=str(key), error=str(e))

    def ingest(self, chunks: "list[tuple[ServedStream, ChunkView | dis_pb2.LogChunk]]"
               ) -> "list[dis_pb2.IngestResponse | RequestRefused | None]":
        """The chunks of open streams, in order, handed to the storage engine as one batch: each
        one's ack or refusal, or None for a chunk after its stream's refused one (the stream ends
        there).  The session rules: the streams' owner locks are held across the batch (a stream
        taken over or closed ingests nothing after its successor learnt where to resume)."""
        opened = [s.opened() for s, _ in chunks]
        owners = {id(owner): owner for _, owner, _ in opened}
        now = time.monotonic()
        held = []
        try:
            for k in sorted(owners):
                owners[k].acquire()
                held.append(owners[k])
            items = []
            for (_, chunk), (session, _, cursor) in zip(chunks, opened):
                session.last_message = now
                veto = None
                if session.taken_over:
                    veto = Refused(RefusalKind.CANCELLED, f"taken over by a newer ingest stream for {session.key}")
                elif session.closed:
                    veto = Refused(RefusalKind.CANCELLED, f"the ingest stream for {session.key} was closed")
                items.append((cursor, chunk, veto))
            results = ingest_chunks(items)
        finally:
            for lock in reversed(held):
                lock.release()
        out: list[dis_pb2.IngestResponse | RequestRefused | None] = []
        counted: dict[str, int] = {}
        for (session, _, _), r in zip(opened, results):
            if r is None:
                out.append(None)
            elif r.refused is not None:
                out.append(refusal(r.refused))
            else:
                session.file_name, session.offset = r.file_name, r.offset
                if r.took:
                    table = session.key.table_key
                    counted[table] = counted.get(table, 0) + 1
                out.append(_ack(r))
        for table, n in counted.items():
            metrics.INGEST_CHUNKS.labels(table).inc(n)
        return out


class ServedStream:
    """One location's ingest stream as the DIS serves it (the tailer's side is
    ``disd.tailer.location.LocationStream``), whichever call carries it: a ``Stream`` call of its
    own or one of the streams of a ``Multiplex`` call.  ``open`` takes the first request and answers
    the resume point; ``handle`` takes each later one and answers its ack (None for a report);
    both raise ``RequestRefused``, after which the caller ends the stream with that status;
    ``close`` ends it (its uncommitted rows rolled back), once, from any thread."""

    def __init__(self, service: IngestService, peer: str, end: EndStream) -> None:
        self.service = service
        self.peer = peer
        self.end = end
        self.session: Session | None = None
        self.key: LocationKey | None = None
        self.tailer_id: str | None = None
        self.loc: Location | None = None
        self.schema: TableSchema | None = None
        self.owner: threading.Lock | None = None  # the location's owner lock, looked up once
        self.cursor: LocationIngest | None = None  # where the stream is in its logs
        self._closing = threading.Lock()
        self._closed = False

    def open(self, first: Request | None) -> dis_pb2.IngestResponse:
        svc = self.service
        if _opens(first):  # named in the log of a refusal too
            self.tailer_id = first.open.tailer_id or "?"
            self.key = location_key(first.open.location)
        key, schema = svc.open_target(first)
        self.key, self.schema = key, schema
        try:
            loc = self.loc = svc.engine.location(key, create=True, version=schema.version)
        except LocationError as e:
            raise RequestRefused(grpc.StatusCode.UNAVAILABLE, location_in_error(key, e)) from None
        if loc.in_error:
            raise RequestRefused(error_status(loc.error_errno), location_in_error(key, loc.error))
        if loc.schema_version != schema.version:
            raise version_mismatch(key, loc.schema_version, schema.version)
        session = Session(key, self.tailer_id or "?", self.peer, self.end)  # (set above: ``first`` opens)
        self.owner = svc.sessions.owner_lock(key)
        with self.owner:
            if self._closed:  # ended (the call cut) while the location was being opened
                raise RequestRefused(grpc.StatusCode.CANCELLED, f"the ingest stream for {key} was closed")
            self.session = session
            svc.sessions.add(session)
            # whatever the previous stream left uncommitted is resent from the resume point
            svc._rollback(loc, key)  # noqa: SLF001 - IngestService's rollback, for its companion ServedStream
            rp, session.epoch = loc.resume()
            session.location = loc
            self.cursor = LocationIngest(loc, schema, rp, session.epoch)
        session.file_name, session.offset = rp.file_name, rp.offset
        log.info("ingest stream open", location=str(key), tailer=session.tailer_id, peer=session.peer,
                 resume_file=rp.file_name, resume_offset=rp.offset)
        return dis_pb2.IngestResponse(resume=dis_pb2.ResumePoint(file_name=rp.file_name or "", offset=rp.offset,
                                                                accepts_reports=True))

    def opened(self) -> tuple[Session, threading.Lock, LocationIngest]:
        """The stream's session, its location's owner lock and its place in its logs, which
        ``open`` set: a chunk is ingested only on an open stream."""
        session, owner, cursor = self.session, self.owner, self.cursor
        assert session is not None and owner is not None and cursor is not None, "ingest before open"
        return session, owner, cursor

    def handle(self, req: Request) -> dis_pb2.IngestResponse | None:
        session, loc = self.session, self.loc
        assert session is not None and loc is not None, "handle before open"
        session.last_message = time.monotonic()
        body = _body(req)
        if body == "report" and isinstance(req, dis_pb2.IngestRequest):
            if not session.taken_over:
                self.service.sessions.report(session, req.report.problem)
            return None
        if body != "chunk":
            raise RequestRefused(grpc.StatusCode.INVALID_ARGUMENT, "only 'chunk' and 'report' messages may follow 'open'")
        chunk = req if isinstance(req, ChunkView) else req.chunk
        response = self.service.ingest([(self, chunk)])[0]
        if isinstance(response, RequestRefused):
            try:
                raise response
            finally:  # no cycle through this frame: the message it holds goes with the exception
                response = None
        return response

    def refused(self, r: RequestRefused) -> None:
        """Count and log a refusal (the caller ends the stream with its status)."""
        count_refusal(self.service.refusals, r, self.peer, self.key, self.tailer_id)

    def close(self) -> None:
        """End the stream: forget it and, if it still owned its location, roll back what it left
        uncommitted.  Idempotent; safe against a ``handle`` of it on another thread, which
        ingests nothing after this (``Session.closed``, checked under the owner lock)."""
        with self._closing:
            if self._closed:
                return
            self._closed = True
        session, key = self.session, self.key
        if key is None or self.owner is None:
            return
        with self.owner:
            session = self.session
            if session is None:
                return
            session.closed = True
            owner = self.service.sessions.remove(session)
            if owner and self.loc is not None:
                self.service._rollback(self.loc, key)  # noqa: SLF001 - IngestService's rollback, for its companion ServedStream
        reason = "idle timeout" if session.idle_cancelled else ("taken over" if session.taken_over else "closed")
        log.info("ingest stream closed", location=str(key), tailer=session.tailer_id, reason=reason)
