"""Every location's stream to one DIS on one ``Ingest.Multiplex`` call: ``Multiplexer`` (the call,
on the tailer's ``StreamLoop``) and ``MuxIngestSession`` (one location's stream on it, the same
seam as ``tailer.session.IngestSession``).  ``stream_runtime: multiplexed``, the default.

Why: a call per location costs the DIS a thread and a call per location and about 3 ms of CPU
per write in threads waking one another (docs/benchmarks.md, "What bounds many locations");
one call per tailer and DIS costs it one reading thread, and the requests of many locations
written at once travel together: the writer here takes every frame queued since its last write
into one ``MuxRequest`` (at most ``MAX_REQUEST_BYTES``, or one larger chunk alone), built by
``disd.rpc.ingestwire.encode_mux_request`` so a chunk's bytes are joined once.

A stream's protocol is ``Stream``'s (docs/grpc-contract.md): the first frame is the ``open``,
the first reply the resume point, then an ack per chunk; a ``StreamEnd`` reply ends it with the
status ``Stream`` would have ended with, classified the same way (``classify_status``).  The
call breaking (the DIS restarting, the network) breaks every stream on it; the next stream
opened makes a new call.  A DIS that does not know ``Multiplex`` (UNIMPLEMENTED) is remembered,
and streams to it are opened as ``Stream`` calls (``supported``).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
from typing import Callable

import grpc
import grpc.aio

from disd.rpc.ingestwire import ChunkOut, encode_mux_request
from disd.rpc.v1 import dis_pb2
from disd.tailer.aiosession import LOCALLY_CANCELLED, StreamLoop, wait_resume
from disd.tailer.frames import Piece
from disd.tailer.session import FlowControl, StreamBroken, classify, classify_status

#: A request carries the frames queued since the last write up to this many bytes (a larger
#: chunk goes alone).
MAX_REQUEST_BYTES = 8 << 20


class MultiplexUnsupported(StreamBroken):
    """The DIS does not know ``Multiplex`` (an older release): open the stream again, as a call
    of its own (``Tailer.open_session`` does so from then on for that address)."""
_METHOD = "/disd.rpc.v1.Ingest/Multiplex"


class Multiplexer:
    """One ``Multiplex`` call to one DIS address: numbers its streams, writes their frames,
    hands each reply to its stream."""

    def __init__(self, streams: StreamLoop, address: str) -> None:
        self.streams = streams
        self.address = address
        self._loop = streams.loop
        self._lock = threading.Lock()
        self._frames: collections.deque = collections.deque()  # (number, ChunkOut | bytes | None)
        self._sessions: dict[int, MuxIngestSession] = {}
        self._next = 1
        self._kicked = False
        self.broken: Exception | None = None  # set once the call ended: open a new Multiplexer
        self.unimplemented = False  # the DIS does not know Multiplex
        self._wake: asyncio.Event | None = None
        channel = streams.channel(address)
        self._task = asyncio.run_coroutine_threadsafe(self._run(channel), self._loop)

    # -- any thread --------------------------------------------------------------------------

    def attach(self, session: "MuxIngestSession") -> int:
        with self._lock:
            if self.broken is not None:
                raise self.broken
            number = self._next
            self._next += 1
            self._sessions[number] = session
            return number

    def detach(self, number: int) -> None:
        with self._lock:
            self._sessions.pop(number, None)

    def put(self, number: int, body: ChunkOut | bytes | None) -> None:
        """Queue one frame (None: the stream's end) for the next request."""
        with self._lock:
            self._frames.append((number, body))
            if self._kicked:
                return
            self._kicked = True
        try:
            self._loop.call_soon_threadsafe(self._kick)
        except RuntimeError:  # the loop is closed: the tailer is stopping
            pass

    # -- the loop ----------------------------------------------------------------------------

    def _kick(self) -> None:
        with self._lock:
            self._kicked = False
        if self._wake is not None:
            self._wake.set()

    async def _run(self, channel: grpc.aio.Channel) -> None:
        self._wake = asyncio.Event()
        if self._frames:
            self._wake.set()
        writer = None
        error: Exception = StreamBroken("the DIS ended the multiplexed call")
        try:
            call = channel.stream_stream(
                _METHOD, request_serializer=None,
                response_deserializer=dis_pb2.MuxResponse.FromString)(metadata=self.streams.metadata or None)
            # The DIS answers a Multiplex call with its initial metadata at once; one that does
            # not know the method ends the call (UNIMPLEMENTED) instead.  Nothing is written
            # before that answer: a write racing with the call's end can turn its status into
            # an INTERNAL error, and the tailer would not know to fall back.
            await call.initial_metadata()
            if call.done():
                await call.read()  # raises the call's status
            writer = asyncio.ensure_future(self._write(call))
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    break
                for reply in response.replies:
                    self._reply(reply)
        except grpc.RpcError as e:
            self.unimplemented = e.code() == grpc.StatusCode.UNIMPLEMENTED
            error = MultiplexUnsupported(f"UNIMPLEMENTED: {e.details()}") if self.unimplemented else classify(e)
        except asyncio.CancelledError:
            error = StreamBroken(LOCALLY_CANCELLED)
        finally:
            if writer is not None:
                writer.cancel()
            with self._lock:
                self.broken = error
                sessions, self._sessions = list(self._sessions.values()), {}
                self._frames.clear()
            for s in sessions:
                s._ended(error)

    async def _write(self, call: grpc.aio.StreamStreamCall) -> None:
        assert self._wake is not None
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while True:
                    batch = self._take()
                    if not batch:
                        break
                    await call.write(encode_mux_request(batch))
        except (grpc.RpcError, asyncio.InvalidStateError):
            return  # the call ended: its reader has the status
        except Exception:  # noqa: BLE001 - a request that cannot be written ends the call
            call.cancel()
            raise

    def _take(self) -> list[tuple[int, ChunkOut | bytes | None]]:
        batch: list[tuple[int, ChunkOut | bytes | None]] = []
        size = 0
        with self._lock:
            while self._frames:
                number, body = self._frames[0]
                n = len(body.data) if isinstance(body, ChunkOut) else len(body or b"")
                if batch and size + n > MAX_REQUEST_BYTES:
                    break
                self._frames.popleft()
                batch.append((number, body))
                size += n
        return batch

    def _reply(self, reply: dis_pb2.MuxReply) -> None:
        with self._lock:
            session = self._sessions.get(reply.stream)
        if session is None:
            return
        if reply.WhichOneof("body") == "end":
            with self._lock:
                self._sessions.pop(reply.stream, None)
            code = _STATUS_CODES.get(reply.end.code)
            if code == grpc.StatusCode.OK:
                session._ended(None)
            else:
                session._ended(classify_status(code, reply.end.details))
            return
        session._response(reply.response)

#: gRPC status codes by number (a ``StreamEnd`` carries the number)
_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}


class MuxIngestSession(FlowControl):
    """One location's stream on a ``Multiplexer``: the worker's requests become frames,
    ``send`` blocks while ``max_in_flight_bytes`` are unacknowledged."""

    def __init__(self, mux: Multiplexer, max_in_flight: int, halt: threading.Event,
                 on_ack: Callable[[dis_pb2.Ack, int, int], None]) -> None:
        super().__init__(max_in_flight, halt, on_ack)
        self._mux = mux
        self._resume: concurrent.futures.Future = concurrent.futures.Future()
        self._ending = False
        self.number = mux.attach(self)

    # -- the loop's side (replies) -----------------------------------------------------------

    def _response(self, r: dis_pb2.IngestResponse) -> None:
        try:
            if not self._resume.done():
                if r.WhichOneof("body") != "resume":
                    raise StreamBroken(f"expected a resume point, got {r.WhichOneof('body')}")
                self._resume.set_result(r.resume)
                return
            self._acked(r)
        except StreamBroken as e:
            self._mux.detach(self.number)
            self._mux.put(self.number, None)
            self._ended(e)

    def _ended(self, error: Exception | None) -> None:
        """The stream ended (``error`` None: as the worker asked, after its end)."""
        with self._cond:
            if self._error is None and error is not None:
                self._error = error
            self._set_done()
        if not self._resume.done():
            self._resume.set_exception(error or StreamBroken(
                "the DIS closed the stream before sending the resume point"))

    # -- the worker's side -------------------------------------------------------------------

    def _put(self, item: dis_pb2.IngestRequest | None) -> None:
        if item is None:
            if self._ending:
                return
            self._ending = True
            self._mux.put(self.number, None)
        else:
            self._mux.put(self.number, item.SerializeToString())

    def _put_chunk(self, file_name: str, piece: Piece) -> None:
        self._mux.put(self.number, ChunkOut(file_name, piece.offset, piece.data, piece.at_end))

    def open(self, msg: dis_pb2.IngestOpen) -> dis_pb2.ResumePoint:
        self._put(dis_pb2.IngestRequest(open=msg))
        return wait_resume(self._resume, self._mux.streams)

    def cancel(self) -> None:
        """Cut the stream (any thread): a worker blocked in ``open`` or ``send`` gets
        StreamBroken, and the DIS ends the stream (rolling back what it left uncommitted)."""
        self._put(None)
        self._mux.detach(self.number)
        self._ended(StreamBroken(LOCALLY_CANCELLED))

    def close(self) -> None:
        self.cancel()
