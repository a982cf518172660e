"""One location's stream as an ``Ingest.Stream`` call of its own, on the tailer's event loop: the
fallback for a DIS that predates ``Multiplex`` (it answers that call with UNIMPLEMENTED;
``disd.tailer.muxcall``).  The same protocol and flow control as a multiplexed stream
(``disd.tailer.protocol``); at most ``MAX_OPENING`` such calls per DIS address wait for their
resume point at once (``disd.tailer.loop``), and the same answer deadline
(``disd.tailer.deadline``), counted from the call's turn to open.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Callable, cast

import grpc
import grpc.aio

from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from disd.tailer.deadline import AnswerDeadline, silence_problem
from disd.tailer.frames import Piece
from disd.tailer.loop import EventLoop
from disd.tailer.protocol import EOF, LOCALLY_CANCELLED, OnAck, StreamBroken, StreamFlow, classify

#: Most calls made for one stream's ``open`` when each ends with INTERNAL before the resume
#: point.  A server that ends the call at once (no such method: a ``dis proxy``; a refused
#: token) races with the write of the ``open``, and the lost race turns its status into INTERNAL
#: about one time in ten; made again, the call says what the server said.
OPEN_ATTEMPTS = 3
#: how long such a call made again waits for the server's answer before it writes the ``open``
RACE_DELAY_S = 0.1


def chunk_request(file_name: str, piece: Piece) -> dis_pb2.IngestRequest:
    """The request carrying ``piece``, built by assigning the nested message's fields: passing
    a ``LogChunk`` to ``IngestRequest(chunk=...)`` merges it, which costs milliseconds per
    4 MiB chunk (upb), many times what assigning costs."""
    req = dis_pb2.IngestRequest()
    chunk = req.chunk
    chunk.file_name = file_name
    chunk.offset = piece.offset
    chunk.data = bytes(piece.data)  # a view (``Piece``) is copied here: protobuf takes bytes only
    chunk.caught_up = piece.at_end
    return req


class SingleStream(StreamFlow):
    """One ``Stream`` call: a writer coroutine writes the requests in order, a reader takes the
    resume point and the acks."""

    def __init__(self, loop: EventLoop, address: str, max_in_flight: int, on_ack: OnAck,
                 on_end: Callable[[], None], ack_timeout_s: float) -> None:
        super().__init__(max_in_flight, on_ack, on_end)
        self._loop = loop
        self._address = address
        self.ack_timeout_s = ack_timeout_s
        self._expired: StreamBroken | None = None  # why the answer deadline ended the call
        self._deadline = AnswerDeadline(ack_timeout_s, self.waiting)
        # requests not yet written (None: half-close); unbounded in count, bounded in bytes
        self._requests: collections.deque = collections.deque()
        self._wake = asyncio.Event()
        self._resume: asyncio.Future = asyncio.get_running_loop().create_future()
        self._call: grpc.aio.StreamStreamCall | None = None
        self._open: dis_pb2.IngestRequest | None = None  # written again if a call is made again
        self._task = asyncio.ensure_future(self._run(loop.channel(address), address))

    async def _run(self, channel: grpc.aio.Channel, address: str) -> None:
        writer = watcher = None
        error: Exception | None = None
        try:
            async with self._loop.opening(address):  # until the resume point (or the failure)
                # the deadline counts from the turn to open: waiting for the turn is not the DIS's
                self._deadline.heard()
                watcher = asyncio.ensure_future(self._watch(self._deadline))
                for _ in range(OPEN_ATTEMPTS):
                    call = dis_pb2_grpc.IngestStub(channel).Stream(metadata=self._loop.metadata or None)
                    self._call = call
                    reading = asyncio.ensure_future(self._read_resume(call))
                    if writer is not None:
                        # the open lost its race with the call's end: this time a server that ends
                        # the call at once does so before the open is written
                        writer.cancel()
                        await asyncio.wait([reading], timeout=RACE_DELAY_S)
                        if not reading.done():
                            self._requests.appendleft(self._open)
                    writer = asyncio.ensure_future(self._write(call))
                    error = await reading
                    if error is None or self._open is None or not str(error).startswith("INTERNAL:"):
                        break
            while error is None:
                r = await call.read()
                if r is EOF:
                    return
                self._deadline.heard()
                self._acked(cast(dis_pb2.IngestResponse, r))
        except grpc.RpcError as e:
            error = classify(e)
        except asyncio.CancelledError:
            error = self._expired or StreamBroken(LOCALLY_CANCELLED)
        except StreamBroken as e:
            error = e
        finally:
            if watcher is not None:
                watcher.cancel()
            if writer is not None:
                writer.cancel()
            if self._call is not None:
                self._call.cancel()
            self._ended(error)
            if not self._resume.done():
                self._resume.set_exception(self._error or StreamBroken(
                    "the DIS closed the stream before sending the resume point"))
                self._resume.exception()  # retrieved: nobody may be waiting for it any more

    async def _read_resume(self, call: grpc.aio.StreamStreamCall) -> Exception | None:
        """Read the resume point (None), or say why the stream ended before it."""
        try:
            read = await call.read()
            self._deadline.heard()
            if read is EOF:
                raise StreamBroken("the DIS closed the stream before sending the resume point")
            first = cast(dis_pb2.IngestResponse, read)  # the call's deserializer's
            if first.WhichOneof("body") != "resume":
                raise StreamBroken(f"expected a resume point, got {first.WhichOneof('body')}")
            self._resume.set_result(first.resume)
            return None
        except grpc.RpcError as e:
            return classify(e)
        except StreamBroken as e:
            return e

    def waiting(self) -> bool:
        return not self._resume.done() or super().waiting()

    async def _watch(self, deadline: AnswerDeadline) -> None:
        """End the call once the DIS has been silent past the answer deadline with the stream
        waiting for it (``disd.tailer.deadline``)."""
        silent = await deadline.expired()
        self._expired = StreamBroken(silence_problem(self._address, silent, self.ack_timeout_s, "the stream"))
        self._task.cancel()

    async def _write(self, call: grpc.aio.StreamStreamCall) -> None:
        try:
            while True:
                while self._requests:
                    item = self._requests.popleft()
                    if item is None:
                        await call.done_writing()
                        return
                    await call.write(item)
                self._wake.clear()
                await self._wake.wait()
        except (grpc.RpcError, asyncio.InvalidStateError):
            return  # the stream ended: its reader has the status
        except asyncio.CancelledError:
            raise
        except Exception:  # a request that cannot be written ends the stream
            call.cancel()
            raise

    def _put(self, item: dis_pb2.IngestRequest | None) -> None:
        self._requests.append(item)
        self._wake.set()

    def _put_chunk(self, file_name: str, piece: Piece) -> None:
        self._put(chunk_request(file_name, piece))

    async def open(self, msg: dis_pb2.IngestOpen) -> dis_pb2.ResumePoint:
        self._open = dis_pb2.IngestRequest(open=msg)
        self._put(self._open)
        return await asyncio.shield(self._resume)

    def close(self) -> None:
        """Half-close, then cancel the call (or its wait for a turn to open)."""
        self._put(None)
        if self._call is not None:
            self._call.cancel()
        self._task.cancel()
