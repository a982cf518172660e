"""Every location's stream to one DIS on one ``Ingest.Multiplex`` call: ``Multiplexer`` (the call)
and ``MuxStream`` (one location's stream on it).  Both live on the tailer's event loop
(``disd.tailer.loop``).

Why: a call per location costs the DIS a thread and a call per location; one call per tailer and
DIS costs it one reading thread, and the requests of many locations written at once travel
together: the writer here takes every frame queued since its last write into one ``MuxRequest``
(at most half a stream's window, ``max_in_flight_bytes``, and ``MAX_REQUEST_BYTES``, or one
larger chunk alone), built by
``disd.rpc.ingestwire.encode_mux_request`` so a chunk's bytes are joined once.  A tick that
appends to thousands of locations wakes their coroutines one after the other on the loop, each
queues its chunk, and the writer, which runs after them, sends them in one or a few requests.
Why half a window: the DIS acknowledges a request's chunks once it has taken them all, so a
request holding a whole window of one stream (two full chunks) would make that stream wait for
every ack before it reads and sends again, and the DIS wait for it meanwhile; in two requests, the
second is on its way while the DIS takes the first.

A stream's protocol is ``Stream``'s (docs/grpc-contract.md): the first frame is the ``open``,
the first reply the resume point, then an ack per chunk; a ``StreamEnd`` reply ends it with the
status ``Stream`` would have ended with, classified the same way (``classify_status``).  The
call breaking (the DIS restarting, the network) breaks every stream on it; the next stream
opened makes a new call.  So does the answer deadline (``ack_timeout_ms``,
``disd.tailer.deadline``): a DIS silent that long while a stream waits for it ends the call.  A
DIS that does not know ``Multiplex`` (UNIMPLEMENTED) is remembered, and streams to it are opened
as ``Stream`` calls (``disd.tailer.single``).
"""

from __future__ import annotations

import asyncio
import collections
from typing import Callable, cast

import grpc
import grpc.aio

from disd.rpc.ingestwire import ChunkOut, encode_mux_request
from disd.rpc.v1 import dis_pb2
from disd.tailer.deadline import AnswerDeadline, silence_problem
from disd.tailer.frames import Piece
from disd.tailer.loop import EventLoop
from disd.tailer.protocol import (EOF, LOCALLY_CANCELLED, MultiplexUnsupported, OnAck, StreamBroken, StreamFlow,
                                  classify, classify_status)

#: A request carries the frames queued since the last write up to this many bytes, and half a
#: stream's window (``request_limit``); a larger chunk goes alone.
MAX_REQUEST_BYTES = 8 << 20
_METHOD = "/disd.rpc.v1.Ingest/Multiplex"
#: gRPC status codes by number (a ``StreamEnd`` carries the number)
_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}


def request_limit(max_in_flight: int) -> int:
    """The most bytes of frames a request carries: half a stream's window, so a stream whose
    window is full has two requests in flight (see the module doc), at most ``MAX_REQUEST_BYTES``."""
    return max(1, min(MAX_REQUEST_BYTES, max_in_flight // 2))


class Multiplexer:
    """One ``Multiplex`` call to one DIS address: numbers its streams, writes their frames,
    hands each reply to its stream.  Created and used on the loop."""

    def __init__(self, loop: EventLoop, address: str, ack_timeout_s: float, max_in_flight: int) -> None:
        self.address = address
        self.ack_timeout_s = ack_timeout_s
        self.request_bytes = request_limit(max_in_flight)
        self._expired: StreamBroken | None = None  # why the answer deadline ended the call
        self._frames: collections.deque = collections.deque()  # (number, ChunkOut | bytes | None)
        self._sessions: dict[int, MuxStream] = {}
        self._next = 1
        self.broken: Exception | None = None  # set once the call ended: open a new Multiplexer
        self.unimplemented = False  # the DIS does not know Multiplex
        self._wake = asyncio.Event()
        self._metadata = loop.metadata
        self._task = asyncio.ensure_future(self._run(loop.channel(address)))

    def attach(self, session: "MuxStream") -> int:
        if self.broken is not None:
            raise self.broken
        number = self._next
        self._next += 1
        self._sessions[number] = session
        return number

    def detach(self, number: int) -> None:
        self._sessions.pop(number, None)

    def put(self, number: int, body: ChunkOut | bytes | None) -> None:
        """Queue one frame (None: the stream's end) for the next request."""
        if self.broken is not None:
            return
        self._frames.append((number, body))
        self._wake.set()

    def cancel(self) -> None:
        self._task.cancel()

    async def _run(self, channel: grpc.aio.Channel) -> None:
        writer = call = None
        error: Exception = StreamBroken("the DIS ended the multiplexed call")
        deadline = AnswerDeadline(self.ack_timeout_s, self._waiting)
        watcher = asyncio.ensure_future(self._watch(deadline))
        try:
            call = channel.stream_stream(
                _METHOD, request_serializer=None,
                response_deserializer=dis_pb2.MuxResponse.FromString)(None, metadata=self._metadata or None)
            # The DIS answers a Multiplex call with its initial metadata at once; one that does
            # not know the method ends the call (UNIMPLEMENTED) instead.  Nothing is written
            # before that answer: a write racing with the call's end can turn its status into
            # an INTERNAL error, and the tailer would not know to fall back.
            await call.initial_metadata()
            deadline.heard()
            if call.done():
                await call.read()  # raises the call's status
            writer = asyncio.ensure_future(self._write(call))
            while True:
                response = await call.read()
                if response is EOF:
                    break
                deadline.heard()
                for reply in cast(dis_pb2.MuxResponse, response).replies:
                    self._reply(reply)
        except grpc.RpcError as e:
            self.unimplemented = e.code() == grpc.StatusCode.UNIMPLEMENTED
            error = MultiplexUnsupported(f"UNIMPLEMENTED: {e.details()}") if self.unimplemented else classify(e)
        except asyncio.CancelledError:
            error = self._expired or StreamBroken(LOCALLY_CANCELLED)
        finally:
            watcher.cancel()
            if writer is not None:
                writer.cancel()
            if call is not None:
                call.cancel()
            self.broken = error
            sessions, self._sessions = list(self._sessions.values()), {}
            self._frames.clear()
            for s in sessions:
                s._ended(error)  # noqa: SLF001 - the call delivers its sessions' replies (companions)

    def _waiting(self) -> bool:
        """A stream on the call waits for an answer (its resume point, an ack)."""
        return any(s.waiting() for s in self._sessions.values())

    async def _watch(self, deadline: AnswerDeadline) -> None:
        """End the call once the DIS has been silent past the answer deadline with requests
        waiting (``disd.tailer.deadline``): its streams reconnect, the replica counts as down."""
        silent = await deadline.expired()
        self._expired = StreamBroken(silence_problem(self.address, silent, self.ack_timeout_s, "requests"))
        self._task.cancel()

    async def _write(self, call: grpc.aio.StreamStreamCall) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._frames:
                    await call.write(encode_mux_request(self._take()))
        except (grpc.RpcError, asyncio.InvalidStateError):
            return  # the call ended: its reader has the status
        except asyncio.CancelledError:
            raise
        except Exception:  # a request that cannot be written ends the call
            call.cancel()
            raise

    def _take(self) -> list[tuple[int, ChunkOut | bytes | None]]:
        batch: list[tuple[int, ChunkOut | bytes | None]] = []
        size = 0
        frames = self._frames
        while frames:
            number, body = frames[0]
            n = len(body.data) if isinstance(body, ChunkOut) else len(body or b"")
            if batch and size + n > self.request_bytes:
                break
            frames.popleft()
            batch.append((number, body))
            size += n
        return batch

    def _reply(self, reply: dis_pb2.MuxReply) -> None:
        session = self._sessions.get(reply.stream)
        if session is None:
            return
        if reply.HasField("end"):
            self._sessions.pop(reply.stream, None)
            code = _STATUS_CODES.get(reply.end.code)
            session._ended(None if code == grpc.StatusCode.OK else classify_status(code, reply.end.details))  # noqa: SLF001 - the call delivers its sessions' replies (companions)
            return
        session._response(reply.response)  # noqa: SLF001 - the call delivers its sessions' replies (companions)


class MuxStream(StreamFlow):
    """One location's stream on a ``Multiplexer``: its requests become frames."""

    def __init__(self, mux: Multiplexer, max_in_flight: int, on_ack: OnAck, on_end: Callable[[], None]) -> None:
        super().__init__(max_in_flight, on_ack, on_end)
        self._mux = mux
        self._resume: asyncio.Future = asyncio.get_running_loop().create_future()
        self._ending = False
        self.number = mux.attach(self)

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

    def waiting(self) -> bool:
        return not self._resume.done() or super().waiting()

    def _ended(self, error: Exception | None) -> None:
        super()._ended(error)
        if not self._resume.done():
            self._resume.set_exception(self._error or StreamBroken(
                "the DIS closed the stream before sending the resume point"))
            self._resume.exception()  # retrieved: nobody may be waiting for it any more

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

    async def open(self, msg: dis_pb2.IngestOpen) -> dis_pb2.ResumePoint:
        self._put(dis_pb2.IngestRequest(open=msg))
        return await asyncio.shield(self._resume)

    def close(self) -> None:
        """End the stream (the DIS rolls back what it left uncommitted); a coroutine waiting on it
        gets StreamBroken."""
        self._put(None)
        self._mux.detach(self.number)
        self._ended(StreamBroken(LOCALLY_CANCELLED))
