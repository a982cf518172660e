"""One location's Ingest stream as the tailer's event loop sees it: how a stream fails, and the
flow control every stream shares, whichever call carries it (a numbered stream of the tailer's
``Multiplex`` call, ``disd.tailer.muxcall``, or a ``Stream`` call of its own against a DIS that
predates ``Multiplex``, ``disd.tailer.single``).

The protocol is docs/grpc-contract.md's: open, resume point, chunks and their acks in order,
reports.  Everything here runs on the loop (``disd.tailer.loop``): a location's coroutine awaits
its stream's resume point, the room to send (at most ``max_in_flight_bytes`` unacknowledged), or
its acks, and the loop's reader of the call resolves those waits as replies arrive.  Nothing is
shared with another thread but the status the ack callback writes (under the location's lock).
"""

from __future__ import annotations

import asyncio
import collections
from typing import Callable

import grpc
import grpc.aio

from disd.errors import DisError
from disd.rpc.ingeststatus import says_location_in_error
from disd.rpc.v1 import dis_pb2
from disd.tailer.frames import Piece

#: Statuses that mean "the DIS will not take this location as it is": retried after a long wait.
REFUSALS = frozenset({
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.DATA_LOSS,
    grpc.StatusCode.UNAUTHENTICATED,
})
#: what a stream cut on the tailer's side ends with, as gRPC words a locally cancelled call
LOCALLY_CANCELLED = "CANCELLED: Locally cancelled by application!"
#: what a call's ``read`` returns once the responses end
EOF: object = grpc.aio.EOF  # type: ignore[attr-defined]  # grpc-stubs do not declare grpc.aio.EOF


class RefusedByDis(DisError):
    """The DIS refused the location's stream (its gRPC status code and details)."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details


class NotADis(RefusedByDis):
    """The address does not serve the Ingest service (``UNIMPLEMENTED``): it is no DIS, most likely
    a ``dis proxy``, which serves readers only.  Retried after the long wait, in case a DIS takes
    the address over."""


class StreamBroken(DisError):
    """The stream ended without a refusal (a DIS restart, the network, the tailer stopping):
    reconnect with backoff."""


class LocationInError(StreamBroken):
    """The DIS holds the location in error (a full disk, an I/O error, damage to its files).  The
    DIS may take it back by itself (space freed) or need an operator, so the tailer reconnects with
    a backoff that grows to ``retry_refused_ms`` rather than ``max_backoff_ms``."""


class MultiplexUnsupported(StreamBroken):
    """The DIS does not know ``Multiplex`` (an older release): open the stream again, as a call
    of its own (the tailer does so from then on for that address)."""


def classify(e: grpc.RpcError) -> Exception:
    """A failed stream as a refusal (retried after a long wait) or a broken stream (reconnect)."""
    code = e.code() if hasattr(e, "code") else None
    details = (e.details() if hasattr(e, "details") else None) or str(e)
    return classify_status(code, details)


def classify_status(code: grpc.StatusCode | None, details: str) -> Exception:
    """``classify`` of a status given by its parts (a ``Multiplex`` call's ``StreamEnd``)."""
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return NotADis(code.name, details)
    if code in REFUSALS:
        return RefusedByDis(code.name, details)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED) and says_location_in_error(details):
        return LocationInError(f"{code.name}: {details}")
    return StreamBroken(f"{code.name if code else 'error'}: {details}")


#: a chunk at least this large goes to the writer before its location reads on (``StreamFlow.send``):
#: reading a piece this size costs far more than the turn of the loop that lets the writer start
WRITE_AT_ONCE_BYTES = 256 << 10

#: called with each ack: (the ack, bytes still in flight after it, bytes it acknowledged)
OnAck = Callable[[dis_pb2.Ack, int, int], None]


class StreamFlow:
    """What every stream shares: the in-flight bound, the ack accounting, and the waits of the
    location's coroutine (for room, for acks, for the end).  A runtime supplies ``_put`` (hand a
    request, or None for the half-close, to its writer) and ``_put_chunk``, and calls
    ``_acked`` for each ack and ``_ended`` when the stream ends.  On the loop only."""

    def __init__(self, max_in_flight: int, on_ack: OnAck, on_end: Callable[[], None]) -> None:
        self.max_in_flight = max_in_flight
        self.on_ack = on_ack
        self.on_end = on_end  # wakes the location: it may be idling, and must reconnect now
        self._inflight: collections.deque[int] = collections.deque()  # bytes of each chunk unacknowledged
        self.inflight_bytes = 0
        self._error: Exception | None = None
        self._done = False
        self._change: asyncio.Future | None = None  # resolved at the next ack or the end

    # -- the loop's side (replies) -----------------------------------------------------------

    def _acked(self, r: dis_pb2.IngestResponse) -> None:
        """One response read after the resume point: an ack of the oldest chunk in flight
        (anything else breaks the stream)."""
        if r.WhichOneof("body") != "ack":
            raise StreamBroken(f"expected an ack, got {r.WhichOneof('body')}")
        n = self._inflight.popleft() if self._inflight else 0
        self.inflight_bytes -= n
        self.on_ack(r.ack, self.inflight_bytes, n)
        self._changed()

    def _ended(self, error: Exception | None) -> None:
        """The stream ended (``error`` None: as the location asked, after its end)."""
        if self._done:
            return
        if self._error is None and error is not None:
            self._error = error
        self._done = True
        self._changed()
        self.on_end()

    def _changed(self) -> None:
        c = self._change
        if c is not None:
            self._change = None
            if not c.done():
                c.set_result(None)

    async def _next_change(self, timeout: float | None = None) -> None:
        """Until the next ack or the end (or ``timeout``).  One waiter per stream: its location's
        coroutine.  The timeout is a timer that resolves the same future (``asyncio.wait`` made
        a task per wait, a tenth of a tailer's CPU when thousands of locations wait for acks)."""
        c = self._change
        if c is None or c.done():  # (done: resolved by the timer of an earlier wait)
            c = self._change = asyncio.get_running_loop().create_future()
        if timeout is None:
            await c
            return
        timer = asyncio.get_running_loop().call_later(timeout, _resolve, c)
        try:
            await c
        finally:
            timer.cancel()

    # -- the location's side -----------------------------------------------------------------

    def _put(self, item: dis_pb2.IngestRequest | None) -> None:
        raise NotImplementedError

    def _put_chunk(self, file_name: str, piece: Piece) -> None:
        raise NotImplementedError

    def check(self) -> None:
        if self._error is not None:
            raise self._error
        if self._done:
            raise StreamBroken("the DIS ended the stream")

    def waiting(self) -> bool:
        """Whether the stream waits for the DIS to answer (a chunk's ack; a runtime adds its
        resume point): what the answer deadline watches (``disd.tailer.deadline``)."""
        return bool(self._inflight) and not self._done

    def room(self, n: int) -> bool:
        """Whether a chunk of ``n`` bytes may go now (always one, however large, when nothing is
        in flight)."""
        return not self._inflight or self.inflight_bytes + n <= self.max_in_flight

    async def send(self, file_name: str, piece: Piece) -> None:
        """Queue one chunk once the in-flight bound allows it.  A chunk of ``WRITE_AT_ONCE_BYTES``
        or more is handed to the writer before this returns (one turn of the loop), so its
        request goes out while the location reads its next piece, not after it: a location with
        a backlog would otherwise read until its window is full before its first request left,
        and after each ack read the next piece before writing the one that waited for the ack.
        Smaller chunks do not yield: many locations' small chunks gather in one request."""
        n = len(piece.data)
        while not self.room(n) and not self._done:
            await self._next_change()
        self.check()
        self._inflight.append(n)
        self.inflight_bytes += n
        self._put_chunk(file_name, piece)
        if n >= WRITE_AT_ONCE_BYTES:
            await asyncio.sleep(0)

    def report(self, problem: str) -> None:
        """Tell the DIS what is wrong on this side ("" = nothing); not acknowledged, not in flight."""
        self._put(dis_pb2.IngestRequest(report=dis_pb2.TailerReport(problem=problem)))

    async def finish(self, timeout: float = 2.0) -> None:
        """Half-close, and wait a little for the DIS to end the stream: what is queued (a report)
        reaches it before ``close`` cancels it."""
        self._put(None)
        deadline = asyncio.get_running_loop().time() + timeout
        while not self._done:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return
            await self._next_change(left)

    async def wait_acked(self, timeout: float) -> None:
        """Wait at most ``timeout`` until every chunk sent is acknowledged (or the stream ended:
        the next ``check`` says how); never raises."""
        if self._inflight and not self._done:
            await self._next_change(timeout)

    async def drain(self) -> None:
        """Wait until every chunk sent is acknowledged."""
        while self._inflight and not self._done:
            await self._next_change()
        self.check()


def _resolve(f: asyncio.Future) -> None:
    if not f.done():
        f.set_result(None)
