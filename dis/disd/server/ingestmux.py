"""The ``Ingest.Multiplex`` call: many locations' streams on one call, one thread reading them.

Why: with a ``Stream`` call per location, the DIS serves every location on a thread of its own,
and a location's write passes through that thread, gRPC's and the acking one: with many locations
each writing a little, threads waking one another cost the DIS many times what ingesting the chunk
does, and each new location costs a new call and a new thread.  On a ``Multiplex`` call, a
tailer's streams are numbered frames: one thread reads every request of the call and handles it
inline (``ServedStream``, the same code as ``Stream``'s), and the answers of a whole request go
back as one response.  A tailer that has many locations writing at once puts their chunks in one
request, so a message, and a wake-up, carries many locations' writes.

Threads: the reader (started here) owns the call's streams: it feeds and ends them.  It does not
wait on a new location's disk: the opens of new streams go to the call's opener thread
(``_open_group``), which makes a request's new locations together and answers each open as
soon as its stream is open, while the reader goes on taking the other streams' chunks; a later
frame of a stream whose open is under way (its end, a chunk sent before the answer) waits for
that open, so a stream's frames are still handled in order.  The reader does not wait on the
network either: a receiver thread takes the call's requests from gRPC one
ahead (``READ_AHEAD``), so the next request is received and parsed while the reader decodes and
writes this one (the two are in C, without the interpreter's lock), instead of the two taking
turns; the receiver asks gRPC for a request only while fewer than ``READ_AHEAD`` wait for the
reader, so the read-ahead, and the memory it holds, is one request however fast the tailer sends
(the tailer's own bound, ``max_in_flight_bytes``, stays the flow control).  Requests are handled
in the order they arrived, by the reader alone, and an ack still leaves only once its chunk is
taken.  The call's own thread only writes responses.  Another thread (the idle reaper, a stream of another
call taking a location over) ends a stream through ``_end_async``: its ``StreamEnd`` is queued at
once and the stream is closed by the writer thread before that reply leaves, never on the
caller's thread (which may hold the location's owner lock that closing takes).  Frames that
arrive for a stream already ended are dropped: the tailer sent them before it read the end.
"""

from __future__ import annotations

import enum
import functools
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Iterator

import grpc
import structlog

from disd.rpc.ingestwire import END, ChunkView, MuxBody, parse_ingest_request, parse_mux_request
from disd.rpc.v1 import dis_pb2
from disd.server.ingest import IngestService, RequestRefused, ServedStream, count_refusal
from disd.server.ingestsessions import UnopenedCall, end_stream
from disd.storage import writeout

log = structlog.get_logger(__name__)

#: answers of this many requests at most go out in one response (the writer takes what is queued)
MAX_COALESCED = 64
#: a request that takes longer than this to handle sends the answers so far before going on
REPLY_EVERY_S = 0.005
#: requests received and parsed ahead of the one the reader handles (``MuxCall.read``)
READ_AHEAD = 1


class _Done(enum.Enum):
    """The end of a call's replies, queued after the last of them."""

    DONE = enum.auto()


_DONE = _Done.DONE


class _Received(enum.Enum):
    """The end of a call's requests, queued by the receiver after the last of them."""

    END = enum.auto()


_END = _Received.END

#: what the receiver hands the reader: a request's frames, or the end of them
Received = list[tuple[int, MuxBody]] | _Received


def _end_reply(stream: int, code: grpc.StatusCode, details: str) -> dis_pb2.MuxReply:
    return dis_pb2.MuxReply(stream=stream, end=dis_pb2.StreamEnd(code=code.value[0], details=details))


class MuxCall:
    """One ``Multiplex`` call: its streams by number, the replies waiting to be written."""

    def __init__(self, service: IngestService, context: grpc.ServicerContext) -> None:
        self.service = service
        self.context = context
        self.peer = context.peer()
        self.streams: dict[int, ServedStream] = {}
        self.ended: set[int] = set()  # numbers the DIS ended: their late frames are dropped
        self.out: queue.SimpleQueue[list[dis_pb2.MuxReply] | _Done] = queue.SimpleQueue()  # lists of replies, then _DONE
        self.to_close: list[ServedStream] = []  # ended by another thread, closed by the writer
        self.lock = threading.Lock()
        # streams whose open the opener has not finished: the reader's own (it adds them, and
        # takes one out when a later frame of its stream waits for it)
        self.opening: dict[int, Future[None]] = {}
        self._opener: ThreadPoolExecutor | None = None  # made at the call's first open
        self._stopping = False  # the call is ending: the opener opens no more streams

    # -- the reader --------------------------------------------------------------------------

    def read(self, requests: Iterator[list[tuple[int, MuxBody]]]) -> None:
        """Handle the call's requests in order as the receiver (``_receive``, started here) hands
        them over, then close the call's streams and end its replies."""
        received: queue.SimpleQueue[Received] = queue.SimpleQueue()
        room = threading.Semaphore(READ_AHEAD)  # requests the receiver may take ahead
        stop = threading.Event()
        threading.Thread(target=self._receive, args=(requests, received, room, stop),
                         name="ingest-mux-receiver", daemon=True).start()
        try:
            while True:
                frames = received.get()
                room.release()  # the receiver asks gRPC for the next one while this one is handled
                if isinstance(frames, _Received):
                    break
                self._request(frames)
        except grpc.RpcError:
            pass  # the call ended (cancelled by the tailer, or the server stopping)
        except Exception:  # a bug must not leave the call's streams open
            log.exception("ingest multiplex call failed", peer=self.peer)
            self.context.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leaves RpcContext.cancel unannotated
        finally:
            stop.set()
            room.release()  # a receiver waiting for room sees the stop
            self._stop_opener()
            with self.lock:
                streams, self.streams = list(self.streams.values()), {}
            for s in streams:
                s.close()
            self.out.put(_DONE)

    def _receive(self, requests: Iterator[list[tuple[int, MuxBody]]], received: queue.SimpleQueue[Received],
                 room: threading.Semaphore, stop: threading.Event) -> None:
        """The receiver: each request from gRPC (received and parsed on gRPC's side once asked
        for) to the reader, at most ``READ_AHEAD`` waiting; then the end."""
        waiting: UnopenedCall | None = self.service.sessions.wait_open(self.peer, self._cancel)
        try:
            while True:
                room.acquire()
                if stop.is_set():
                    break  # the reader gave up the call
                frames = next(requests, None)
                if frames is None:
                    break
                if waiting is not None:
                    self.service.sessions.opened(waiting)
                    waiting = None
                received.put(frames)
        except grpc.RpcError:
            pass  # the call ended (cancelled by the tailer, or the server stopping)
        except Exception:  # a bug must not leave the call's streams open: the reader closes them
            log.exception("ingest multiplex call failed receiving", peer=self.peer)
            self.context.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leaves RpcContext.cancel unannotated
        finally:
            if waiting is not None:
                self.service.sessions.opened(waiting)
            received.put(_END)

    def _request(self, frames: list[tuple[int, MuxBody]]) -> None:
        """A request's frames, in order per stream: the chunks of open streams gathered and
        handed to the engine in batches (``IngestService.ingest``) of at most
        ``writeout.FLUSH_GROUP`` chunks (a batch holds its locations' locks until its caught-up
        ones are flushed and published: a tailer's request may carry thousands), the opens of new
        streams handed to the opener (``_open_group``), any other frame handled alone (a stream's chunks
        gathered so far go first; a frame of a stream whose open is under way waits for it)."""
        replies: list[dis_pb2.MuxReply] = []
        since = time.monotonic()
        batch: list[tuple[int, ServedStream, ChunkView]] = []
        in_batch: set[int] = set()
        new: list[tuple[int, dis_pb2.IngestRequest, Future[None]]] = []  # opens not handed over yet
        streams, ended, opening = self.streams, self.ended, self.opening
        for number, body in frames:
            if number in opening:
                if any(n == number for n, _, _ in new):
                    self._open_later(new)
                    new = []
                self._after_open(number)
            if type(body) is ChunkView:
                if len(batch) >= writeout.FLUSH_GROUP:  # a group ingested, flushed and released
                    self._chunks(batch, replies)
                    batch, in_batch = [], set()
                    if time.monotonic() - since > REPLY_EVERY_S:
                        self.out.put(replies)
                        replies, since = [], time.monotonic()
                stream = streams.get(number)  # (a racing end is seen below)
                if stream is not None and number not in ended:
                    batch.append((number, stream, body))
                    in_batch.add(number)
                    continue
            elif type(body) is dis_pb2.IngestRequest and number not in streams and number not in ended:
                future: Future[None] = Future()
                opening[number] = future
                new.append((number, body, future))
                continue
            if number in in_batch:
                self._chunks(batch, replies)
                batch, in_batch = [], set()
            self._frame(number, body, replies)
            if replies and time.monotonic() - since > REPLY_EVERY_S:
                self.out.put(replies)  # the answers so far go out while the rest is ingested
                replies, since = [], time.monotonic()
        if new:
            self._open_later(new)
        if batch:
            self._chunks(batch, replies)
        if replies:
            self.out.put(replies)

    def _chunks(self, batch: list[tuple[int, ServedStream, ChunkView]], replies: list[dis_pb2.MuxReply]) -> None:
        """A batch of chunks of open streams: acks, or the streams refused."""
        results = self.service.ingest([(stream, chunk) for _, stream, chunk in batch])
        for (number, stream, _), r in zip(batch, results):
            if r is None:
                continue  # after its stream's refused chunk: the stream has ended
            if isinstance(r, RequestRefused):
                self._refuse(number, stream, r, replies)
                continue
            with self.lock:
                dead = number in self.ended  # ended by another thread meanwhile: its end is on its way
            if not dead:
                replies.append(dis_pb2.MuxReply(stream=number, response=r))

    # -- the opener ---------------------------------------------------------------------------

    def _open_later(self, new: list[tuple[int, dis_pb2.IngestRequest, Future[None]]]) -> None:
        """Hand a request's opens of new streams to the call's opener, as one group.

        One group, not several answered in turn: a burst's locations made in groups of 8 or 16,
        each group's opens answered before the next was made, had their first opens answered
        sooner but their last ones later (the groups' creation competing with the first
        streams' chunks for the cores), and the burst ended no sooner."""
        for number in [n for n, f in self.opening.items() if f.done()]:
            del self.opening[number]  # answered streams that sent nothing since: nothing to wait for
        if self._opener is None:
            self._opener = ThreadPoolExecutor(1, thread_name_prefix="ingest-mux-opener")
        self._opener.submit(self._open_group, new)

    def _after_open(self, number: int) -> None:
        """(The reader) Wait until stream ``number``'s open is answered (or refused), so that a
        later frame of it (its end, a chunk sent before the answer) is handled after it."""
        self.opening.pop(number).result()  # a failed opener raises here: the call fails

    def _open_group(self, group: list[tuple[int, dis_pb2.IngestRequest, Future[None]]]) -> None:
        """(The opener) Open a group of new streams and answer each as soon as it is open.

        Why a thread of its own: making a location waits on the disk (its directories and first
        record made durable), tens to hundreds of milliseconds for a burst's locations; on the
        reader, that wait held up the chunks of the call's open streams and the answers of every
        open of the request.  The group's locations are made together first
        (``StorageEngine.open_many``); an open the DIS refuses creates nothing."""
        try:
            if len(group) > 1:
                wanted = []
                for _, body, _ in group:
                    try:
                        key, schema = self.service.open_target(body)
                    except RequestRefused:
                        continue  # refused, with its status, when its stream is opened
                    wanted.append((key, schema.version))
                self.service.engine.open_many(wanted)
            for number, body, future in group:
                if not self._stopping:
                    replies: list[dis_pb2.MuxReply] = []
                    self._frame(number, body, replies)
                    if replies:
                        self.out.put(replies)
                future.set_result(None)
        except BaseException as e:  # a bug must not leave the reader waiting, nor the call open
            log.exception("ingest multiplex call failed opening streams", peer=self.peer)
            for _, _, future in group:
                if not future.done():
                    future.set_exception(e)
            self.context.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leaves RpcContext.cancel unannotated

    def _stop_opener(self) -> None:
        """(The reader, at the call's end) Open no more streams and wait for the open under way,
        so that every stream opened is among those the call's end closes."""
        self._stopping = True
        if self._opener is not None:
            self._opener.shutdown(wait=True, cancel_futures=True)

    def _frame(self, number: int, body: MuxBody, replies: list[dis_pb2.MuxReply]) -> None:
        with self.lock:
            stream = self.streams.get(number)
            dead = number in self.ended
        if dead:
            return
        if body is END:
            if stream is not None:
                with self.lock:
                    self.streams.pop(number, None)
                    self.ended.add(number)
                stream.close()
            replies.append(_end_reply(number, grpc.StatusCode.OK, ""))
            return
        if isinstance(body, str):
            return self._refuse(number, stream, RequestRefused(
                grpc.StatusCode.INVALID_ARGUMENT, f"stream {number}: a frame carries a request or an end"), replies)
        response: dis_pb2.IngestResponse | None
        try:
            if stream is None:
                stream = ServedStream(self.service, self.peer, functools.partial(self._end_async, number))
                with self.lock:
                    self.streams[number] = stream
                response = stream.open(body)
                with self.lock:
                    if number in self.ended:
                        return  # ended by another thread while opening: its end is on its way, alone
            else:
                response = stream.handle(body)
        except RequestRefused as r:
            return self._refuse(number, stream, r, replies)
        if response is not None:
            replies.append(dis_pb2.MuxReply(stream=number, response=response))

    def _refuse(self, number: int, stream: ServedStream | None, r: RequestRefused,
                replies: list[dis_pb2.MuxReply]) -> None:
        with self.lock:
            self.streams.pop(number, None)
            ended_meanwhile = number in self.ended  # by another thread: its end is on its way
            self.ended.add(number)
        if stream is not None:
            stream.refused(r)
            stream.close()
        else:
            count_refusal(self.service.refusals, r, self.peer)
        if not ended_meanwhile:
            replies.append(_end_reply(number, r.code, r.details))

    # -- other threads -----------------------------------------------------------------------

    def _end_async(self, number: int, code: grpc.StatusCode, details: str) -> None:
        """End one stream from another thread (``EndStream``)."""
        with self.lock:
            stream = self.streams.pop(number, None)
            if stream is None or number in self.ended:
                return
            self.ended.add(number)
            self.to_close.append(stream)
        self.out.put([_end_reply(number, code, details)])

    def _cancel(self, code: grpc.StatusCode, details: str) -> None:
        """End the whole call (it sent no frame within the idle timeout)."""
        end_stream(self.context, code, details)

    # -- the call's thread: the responses ----------------------------------------------------

    def responses(self) -> Iterator[dis_pb2.MuxResponse]:
        while True:
            item = self.out.get()
            replies: list[dis_pb2.MuxReply] = []
            done = item is _DONE
            if not isinstance(item, _Done):
                replies.extend(item)
                for _ in range(MAX_COALESCED - 1):
                    try:
                        item = self.out.get_nowait()
                    except queue.Empty:
                        break
                    if item is _DONE:
                        done = True
                        break
                    replies.extend(item)
            with self.lock:
                closing, self.to_close = self.to_close, []
            for s in closing:  # before their ends leave: a reconnect finds them closed
                s.close()
            if replies:
                yield dis_pb2.MuxResponse(replies=replies)
            if done:
                return


def serve_multiplex(service: IngestService, requests: Iterator[dis_pb2.MuxRequest],
                    context: grpc.ServicerContext) -> Iterator[dis_pb2.MuxResponse]:
    """The ``Multiplex`` method: a reader thread for the requests, this one for the responses."""
    # answered at once, before any frame: the tailer writes nothing until it knows the call is
    # taken (a DIS without this method ends it with UNIMPLEMENTED instead)
    context.send_initial_metadata(())
    call = MuxCall(service, context)
    reader = threading.Thread(target=call.read, args=(requests,), name="ingest-mux-reader", daemon=True)
    reader.start()
    yield from call.responses()


def add_ingest_service(service: IngestService, server: grpc.Server) -> None:
    """Register ``service`` as ``disd.rpc.v1.Ingest``: ``Stream`` with the chunk-reading
    deserializer (``disd.rpc.ingestwire``: what the generated ``add_IngestServicer_to_server``
    does, without copying every chunk's bytes twice) and ``Multiplex``."""
    handlers = {
        "Stream": grpc.stream_stream_rpc_method_handler(
            service.Stream,
            request_deserializer=parse_ingest_request,
            response_serializer=dis_pb2.IngestResponse.SerializeToString,
        ),
        "Multiplex": grpc.stream_stream_rpc_method_handler(
            functools.partial(serve_multiplex, service),
            request_deserializer=parse_mux_request,
            response_serializer=dis_pb2.MuxResponse.SerializeToString,
        ),
    }
    name = dis_pb2.DESCRIPTOR.services_by_name["Ingest"].full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    # grpcio >= 1.62's method, which grpc-stubs (1.53) does not declare
    server.add_registered_method_handlers(name, handlers)  # type: ignore[attr-defined]
