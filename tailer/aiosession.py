"""Every location's Ingest stream on one event loop: ``StreamLoop`` (one thread per tailer) and
``AioIngestSession`` (one stream on it, the same seam as ``tailer.session.IngestSession``).

Why: with the synchronous gRPC API a stream costs two threads besides its location's worker
(gRPC's thread draining the request iterator, and a thread reading the acks), and a chunk and its
ack pass through both and through the channel's thread: at 500 locations writing a row a second,
the tailers spent about a millisecond of CPU per write, most of it waking threads (docs/
benchmarks.md, "Many locations, scaling").  Here the streams are coroutines of one ``grpc.aio``
event loop: a worker hands its requests over thread-safely (``call_soon_threadsafe``), the loop
writes them and reads the acks, and the acks update the in-flight state under the session's
condition exactly as the threaded session does.  The only thread per location is its worker.

The semantics are the threaded session's (``tests/tailer`` runs against this one, the default,
and against both where they differ: threads, credentials): at most
``max_in_flight_bytes`` unacknowledged, acks matched to chunks in order, failures classified by
``classify`` (a refusal, ``RefusedByDis``, versus a broken stream, ``StreamBroken``), ``finish``
half-closes and waits a little for the DIS to end the stream, ``close`` half-closes then cancels.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
from typing import Callable

import grpc
import grpc.aio

from disd.rpc.channel import CHANNEL_OPTIONS
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from disd.security import ClientSecurity
from disd.tailer.session import FlowControl, StreamBroken, classify

#: How long ``close`` waits for the stream's coroutine to end after cancelling it (seconds).
CLOSE_WAIT_S = 5.0
#: Most streams of one tailer being opened to one DIS address at once (waiting for their resume
#: point); the others wait their turn.  A DIS takes an open call only when its gRPC server asks
#: for the next one, and gRPC's server cancels a call that waited longer than 30 s for that (its
#: ``grpc.server_max_unrequested_time_in_server``): thousands of streams opened at once, on a
#: loaded machine, had their calls cancelled (CANCELLED) and retried, adding to the queue.
MAX_OPENING = 16
#: How often a worker waiting for its resume point checks that the event loop still runs (s).
RESUME_POLL_S = 5.0
#: what a stream cut on the tailer's side ends with, as gRPC words a locally cancelled call
LOCALLY_CANCELLED = "CANCELLED: Locally cancelled by application!"
#: Most calls made for one stream's ``open`` when each ends with INTERNAL before the resume
#: point.  A server that ends the call at once (no such method: a ``dis proxy``; a refused
#: token) races with the write of the ``open``, and the lost race turns its status into INTERNAL
#: about one time in ten; made again, the call says what the server said.
OPEN_ATTEMPTS = 3
#: how long such a call made again waits for the server's answer before it writes the ``open``
RACE_DELAY_S = 0.1


class StreamLoop:
    """One asyncio event loop on one thread, running every stream of a tailer, and its
    ``grpc.aio`` channels (one per DIS address: HTTP/2 carries the streams over one connection)."""

    def __init__(self, security: ClientSecurity, extra_options: tuple[tuple[str, object], ...] = ()) -> None:
        self.security = security
        self.options = list(CHANNEL_OPTIONS) + list(extra_options)
        self.metadata: tuple[tuple[str, str], ...] = ()
        if security.token:
            # on every call, as the synchronous channel's interceptor (plaintext) or call
            # credentials (TLS) add it; the DIS reads the same header either way
            self.metadata = (("authorization", f"Bearer {security.token}"),)
        self.loop = asyncio.new_event_loop()
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._opening: dict[str, asyncio.Semaphore] = {}  # per address; used on the loop only
        self._lock = threading.Lock()
        self._closed = False
        self.thread = threading.Thread(target=self._run, name="tailer streams", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, coro, timeout: float | None = None):  # noqa: ANN001, ANN201 - a coroutine's result
        """Run ``coro`` on the loop and wait for its result (from any thread but the loop's)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def channel(self, address: str) -> grpc.aio.Channel:
        """The channel to ``address`` (opened on the loop on first use)."""
        with self._lock:
            if self._closed:
                raise StreamBroken("the tailer is stopping")
            ch = self._channels.get(address)
            if ch is None:
                ch = self._channels[address] = self.call(self._open(address))
            return ch

    def opening(self, address: str) -> asyncio.Semaphore:
        """The turns of the streams being opened to ``address`` (on the loop)."""
        sem = self._opening.get(address)
        if sem is None:
            sem = self._opening[address] = asyncio.Semaphore(MAX_OPENING)
        return sem

    async def _open(self, address: str) -> grpc.aio.Channel:
        sec = self.security
        if sec.tls:
            with open(sec.ca, "rb") as f:
                root = f.read()
            cert = key = None
            if sec.cert:
                with open(sec.cert, "rb") as f:
                    cert = f.read()
                with open(sec.key, "rb") as f:  # type: ignore[arg-type]
                    key = f.read()
            options = list(self.options)
            if sec.server_name:
                options.append(("grpc.ssl_target_name_override", sec.server_name))
            return grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(root, key, cert), options=options)
        return grpc.aio.insecure_channel(address, options=self.options)

    def close(self, timeout: float = 5.0) -> None:
        """Close the channels (cancelling what is still open on them) and end the thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            channels, self._channels = list(self._channels.values()), {}

        async def shut() -> None:
            for ch in channels:
                await ch.close()

        try:
            self.call(shut(), timeout)
        except (concurrent.futures.TimeoutError, RuntimeError):
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout)


def wait_resume(resume: concurrent.futures.Future, streams: StreamLoop) -> dis_pb2.ResumePoint:
    """The resume point a stream on ``streams`` is given (or its failure), as a worker waits for
    it: StreamBroken once the loop has stopped with the tailer, since nothing will answer."""
    while True:
        try:
            # the loop answers every stream it ends (a cancel, the call breaking, the tailer
            # stopping); the timeout only notices a loop that is gone, so it is long: thousands
            # of workers waiting for their opens each woke twice a second with 0.5 s
            return resume.result(RESUME_POLL_S)
        except concurrent.futures.TimeoutError:
            if not streams.thread.is_alive():
                raise StreamBroken("the tailer is stopping") from None


class AioIngestSession(FlowControl):
    """One open Ingest stream on a ``StreamLoop``: the worker's requests are handed to the loop,
    which writes them in order and reads the acks; ``send`` blocks while ``max_in_flight_bytes``
    are unacknowledged."""

    def __init__(self, streams: StreamLoop, address: str, max_in_flight: int, halt: threading.Event,
                 on_ack: Callable[[dis_pb2.Ack, int, int], None]) -> None:
        super().__init__(max_in_flight, halt, on_ack)
        self._streams = streams
        self._loop = streams.loop
        # requests not yet written (None: half-close); unbounded in count, bounded in bytes
        self._requests: collections.deque = collections.deque()
        self._wake = asyncio.Event()
        self._resume: concurrent.futures.Future = concurrent.futures.Future()
        self._open: dis_pb2.IngestRequest | None = None  # written again if a call is made again
        self._call: grpc.aio.StreamStreamCall | None = None
        self._cancelled = False
        self._atask: asyncio.Task | None = None
        channel = streams.channel(address)
        self._task: concurrent.futures.Future = asyncio.run_coroutine_threadsafe(
            self._run(channel, address), self._loop)

    # -- the loop's side ---------------------------------------------------------------------

    async def _run(self, channel: grpc.aio.Channel, address: str) -> None:
        self._atask = asyncio.current_task()
        writer = None
        try:
            if self._cancelled:
                raise asyncio.CancelledError
            async with self._streams.opening(address):  # until the resume point (or the failure)
                for _ in range(OPEN_ATTEMPTS):
                    call = dis_pb2_grpc.IngestStub(channel).Stream(metadata=self._streams.metadata or None)
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
                    opened = await reading
                    if opened or self._cancelled or self._open is None or not str(self._error).startswith("INTERNAL:"):
                        break
                    with self._cond:
                        self._error = None
            if opened:
                await self._read_acks(call)
        except asyncio.CancelledError:
            # cut while waiting for its turn to open: as a locally cancelled call
            with self._cond:
                self._error = self._error or StreamBroken(LOCALLY_CANCELLED)
        finally:
            if writer is not None:
                writer.cancel()
            with self._cond:
                self._set_done()
            if not self._resume.done():
                self._resume.set_exception(self._error or StreamBroken(
                    "the DIS closed the stream before sending the resume point"))

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
                if not self._requests:
                    await self._wake.wait()
        except (grpc.RpcError, asyncio.InvalidStateError):
            return  # the stream ended: its reader has the status
        except Exception:  # noqa: BLE001 - a request that cannot be written ends the stream
            call.cancel()
            raise

    async def _read_resume(self, call: grpc.aio.StreamStreamCall) -> bool:
        """Read the resume point (True), or note why the stream ended before it (False)."""
        try:
            first = await call.read()
            if first is grpc.aio.EOF:
                raise StreamBroken("the DIS closed the stream before sending the resume point")
            if first.WhichOneof("body") != "resume":
                raise StreamBroken(f"expected a resume point, got {first.WhichOneof('body')}")
            self._resume.set_result(first.resume)
            return True
        except grpc.RpcError as e:
            error: Exception = classify(e)
        except asyncio.CancelledError:
            error = StreamBroken(LOCALLY_CANCELLED)
        except StreamBroken as e:
            error = e
        with self._cond:
            self._error = error
        return False

    async def _read_acks(self, call: grpc.aio.StreamStreamCall) -> None:
        try:
            while True:
                r = await call.read()
                if r is grpc.aio.EOF:
                    return
                self._acked(r)
        except grpc.RpcError as e:
            with self._cond:
                self._error = classify(e)
        except asyncio.CancelledError:
            # cancelled here (``close``, the tailer stopping), as the threaded session's reader
            # sees a locally cancelled call
            with self._cond:
                self._error = StreamBroken(LOCALLY_CANCELLED)
        except StreamBroken as e:
            with self._cond:
                self._error = e

    def _put(self, item: dis_pb2.IngestRequest | None) -> None:
        """Hand a request to the loop (any thread); the writer writes them in order."""
        self._requests.append(item)
        try:
            self._loop.call_soon_threadsafe(self._wake.set)
        except RuntimeError:  # the loop is closed: the tailer is stopping
            pass

    # -- the worker's side -------------------------------------------------------------------

    def open(self, msg: dis_pb2.IngestOpen) -> dis_pb2.ResumePoint:
        self._open = dis_pb2.IngestRequest(open=msg)
        self._put(self._open)
        return wait_resume(self._resume, self._streams)

    def cancel(self) -> None:
        """Cut the stream (any thread): a worker blocked in ``open`` or ``send`` gets StreamBroken."""
        def cut() -> None:
            self._cancelled = True
            if self._call is not None:
                self._call.cancel()
            elif self._atask is not None:
                self._atask.cancel()  # waiting for its turn to open
        try:
            self._loop.call_soon_threadsafe(cut)
        except RuntimeError:  # the loop is closed: so is every call on it
            pass

    def close(self) -> None:
        self._put(None)  # half-close: the DIS sees the end of the requests
        self.cancel()
        if threading.current_thread() is not self._streams.thread:
            try:
                self._task.result(CLOSE_WAIT_S)
            except Exception:  # noqa: BLE001 - the stream's outcome is in _error; closing goes on
                pass
