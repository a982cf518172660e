"""One open ``Ingest.Stream`` as the tailer sees it: the requests it sends, the acks it reads,
and the flow control between them (at most ``max_in_flight_bytes`` unacknowledged).

Split from ``tailer.stream`` (which decides *what* a location sends and when) because the
stream's protocol — open, resume point, chunks and acks, reports, refusals versus broken
streams — is a concept of its own (docs/grpc-contract.md).
"""

from __future__ import annotations

import collections
import queue
import threading
from typing import Callable, Iterator

import grpc

from disd.errors import DisError
from disd.rpc.ingeststatus import says_location_in_error
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
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
    pass


class LocationInError(StreamBroken):
    """The DIS holds the location in error (a full disk, an I/O error, damage to its files).  The
    DIS may take it back by itself (space freed) or need an operator, so the tailer reconnects with
    a backoff that grows to ``retry_refused_ms`` rather than ``max_backoff_ms``."""


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



def chunk_request(file_name: str, piece: Piece) -> dis_pb2.IngestRequest:
    """The request carrying ``piece``, built by assigning the nested message's fields: passing
    a ``LogChunk`` to ``IngestRequest(chunk=...)`` merges it, which took 5-10 ms per 4 MiB chunk
    (upb) against 0.1 ms this way, a third of a tailer's time in a 4 M-row burst."""
    req = dis_pb2.IngestRequest()
    chunk = req.chunk
    chunk.file_name = file_name
    chunk.offset = piece.offset
    chunk.data = piece.data
    chunk.caught_up = piece.at_end
    return req


class FlowControl:
    """What both stream runtimes share: the in-flight bound, the ack accounting and the
    worker's calls that only queue requests (``send``, ``report``, ``finish``, ``drain``).
    A runtime supplies ``_put`` (hand a request, or None for the half-close, to its writer)
    and calls ``_acked`` for each ack and sets ``_error`` / ``_done`` when the stream ends."""

    def __init__(self, max_in_flight: int, halt: threading.Event,
                 on_ack: Callable[[dis_pb2.Ack, int, int], None]) -> None:
        self.max_in_flight = max_in_flight
        self.halt = halt
        self.on_ack = on_ack
        self._cond = threading.Condition()
        self._inflight: collections.deque[int] = collections.deque()  # bytes of each chunk unacknowledged
        self.inflight_bytes = 0
        self._error: Exception | None = None
        self._done = False
        #: set when the stream ends, with ``_done``: the worker idling on it looks at once
        self.wake: threading.Event | None = None

    def _put(self, item: dis_pb2.IngestRequest | None) -> None:
        raise NotImplementedError

    def _acked(self, r: dis_pb2.IngestResponse) -> None:
        """One response read after the resume point: an ack of the oldest chunk in flight
        (anything else breaks the stream)."""
        if r.WhichOneof("body") != "ack":
            raise StreamBroken(f"expected an ack, got {r.WhichOneof('body')}")
        with self._cond:
            n = self._inflight.popleft() if self._inflight else 0
            self.inflight_bytes -= n
            self.on_ack(r.ack, self.inflight_bytes, n)
            self._cond.notify_all()

    def _set_done(self) -> None:
        """(``_cond`` held) The stream ended: wake everyone waiting on it, the worker too (it
        may be idling for a long ``idle_poll_s``, and must reconnect now)."""
        self._done = True
        self._cond.notify_all()
        if self.wake is not None:
            self.wake.set()

    def _check_locked(self) -> None:
        if self._error is not None:
            raise self._error
        if self._done:
            raise StreamBroken("the DIS ended the stream")

    def check(self) -> None:
        with self._cond:
            self._check_locked()

    def send(self, file_name: str, piece: Piece) -> bool:
        """Queue one chunk once the in-flight bound allows it; False if halted meanwhile."""
        n = len(piece.data)
        with self._cond:
            while (self._inflight and self.inflight_bytes + n > self.max_in_flight
                   and self._error is None and not self._done and not self.halt.is_set()):
                self._cond.wait(0.5)
            self._check_locked()
            if self.halt.is_set():
                return False
            self._inflight.append(n)
            self.inflight_bytes += n
        self._put_chunk(file_name, piece)
        return True

    def _put_chunk(self, file_name: str, piece: Piece) -> None:
        """Hand one chunk to the writer (a runtime that writes its own bytes overrides this)."""
        self._put(chunk_request(file_name, piece))

    def report(self, problem: str) -> None:
        """Tell the DIS what is wrong on this side ("" = nothing); not acknowledged, not in flight."""
        self._put(dis_pb2.IngestRequest(report=dis_pb2.TailerReport(problem=problem)))

    def finish(self, timeout: float = 2.0) -> None:
        """Half-close, and wait a little for the DIS to end the stream: what is queued (a report)
        reaches it before ``close`` cancels the call."""
        self._put(None)
        with self._cond:
            self._cond.wait_for(lambda: self._done, timeout)

    def wait_acked(self, timeout: float) -> None:
        """Wait at most ``timeout`` until every chunk sent is acknowledged (or the stream ended:
        the next ``check`` says how); unlike ``drain``, never raises."""
        with self._cond:
            self._cond.wait_for(lambda: not self._inflight or self._error is not None or self._done
                                or self.halt.is_set(), timeout)

    def drain(self) -> None:
        """Wait until every chunk sent is acknowledged."""
        with self._cond:
            while self._inflight and self._error is None and not self._done and not self.halt.is_set():
                self._cond.wait(0.5)
            self._check_locked()


class IngestSession(FlowControl):
    """One open Ingest stream: requests go through a queue the gRPC runtime drains, acks are read
    by a thread, and ``send`` blocks while ``max_in_flight_bytes`` are unacknowledged."""

    def __init__(self, channel: grpc.Channel, max_in_flight: int, halt: threading.Event,
                 on_ack: Callable[[dis_pb2.Ack, int, int], None]) -> None:
        super().__init__(max_in_flight, halt, on_ack)
        # Unbounded in count, bounded in bytes: every queued chunk counts as in flight.
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._reader: threading.Thread | None = None
        self.call = dis_pb2_grpc.IngestStub(channel).Stream(self._iter())

    def _put(self, item: dis_pb2.IngestRequest | None) -> None:
        self._requests.put(item)

    def _iter(self) -> Iterator[dis_pb2.IngestRequest]:
        while True:
            item = self._requests.get()
            if item is None:
                return
            yield item

    def open(self, msg: dis_pb2.IngestOpen) -> dis_pb2.ResumePoint:
        self._put(dis_pb2.IngestRequest(open=msg))
        try:
            first = next(self.call)
        except StopIteration:
            raise StreamBroken("the DIS closed the stream before sending the resume point") from None
        except grpc.RpcError as e:
            raise classify(e) from None
        if first.WhichOneof("body") != "resume":
            raise StreamBroken(f"expected a resume point, got {first.WhichOneof('body')}")
        self._reader = threading.Thread(target=self._read_acks, name="tailer-acks", daemon=True)
        self._reader.start()
        return first.resume

    def _read_acks(self) -> None:
        try:
            for r in self.call:
                self._acked(r)
        except grpc.RpcError as e:
            with self._cond:
                self._error = classify(e)
        except StreamBroken as e:
            with self._cond:
                self._error = e
        finally:
            with self._cond:
                self._set_done()

    def cancel(self) -> None:
        """Cut the stream (any thread): a worker blocked in ``open`` or ``send`` gets StreamBroken."""
        self.call.cancel()

    def close(self) -> None:
        self._requests.put(None)  # half-close: the DIS sees the end of the requests
        self.call.cancel()
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(5)
