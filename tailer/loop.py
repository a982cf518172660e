"""The tailer's one event loop: a thread running asyncio, on which every location lives.

Why one loop and no thread per location: a location's work per write is small (read the new
bytes, cut whole frames, queue a chunk, take its ack), and with a thread each, 10,000 locations
are 10,000 threads waking one another and waiting for the interpreter's lock, which costs the
tailers far more CPU per location write than the work itself (docs/benchmarks-history.md, "the
event-loop tailer").  On the loop a location is a
coroutine (``disd.tailer.location``) woken by inotify (or the rescan), by its acks and by its
timers, and the chunks of every location travel on one ``Multiplex`` call per DIS
(``disd.tailer.muxcall``).  Directory scans stay on a thread of their own (``disd.tailer.core``):
a scan of thousands of files must not stall the loop.

Here: the loop's thread, the ``grpc.aio`` channels (one per DIS address, opened on first use),
the calls' credentials, and the ways other threads hand work to the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Callable, Coroutine

import grpc
import grpc.aio
import structlog

from disd.rpc.channel import channel_options
from disd.security import ClientSecurity
from disd.tailer.protocol import StreamBroken

log = structlog.get_logger("disd.tailer")

#: Most ``Stream`` calls of one tailer being opened to one DIS address at once (waiting for their
#: resume point): a DIS without ``Multiplex`` takes an open call only when its gRPC server asks
#: for the next one, and gRPC's server rejects calls beyond its backlog (CANCELLED, INTERNAL) and
#: cancels one that waited longer than 30 s: thousands of streams opened at once, on a loaded
#: machine, failed and were retried (docs/benchmarks-history.md).
MAX_OPENING = 16


class EventLoop:
    """One asyncio loop on one thread, and its ``grpc.aio`` channels."""

    def __init__(self, security: ClientSecurity, extra_options: tuple[tuple[str, object], ...] = ()) -> None:
        self.security = security
        self.options = channel_options(extra_options)
        self.metadata: tuple[tuple[str, str], ...] = ()
        if security.token:
            # on every call, as the synchronous channel's interceptor (plaintext) or call
            # credentials (TLS) add it; the DIS reads the same header either way
            self.metadata = (("authorization", f"Bearer {security.token}"),)
        self.loop = asyncio.new_event_loop()
        self._channels: dict[str, grpc.aio.Channel] = {}  # on the loop only
        self._opening: dict[str, asyncio.Semaphore] = {}  # on the loop only
        self.closed = False
        self.thread = threading.Thread(target=self._run, name="tailer loop", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def on_loop(self) -> bool:
        return threading.current_thread() is self.thread

    # -- from any thread ---------------------------------------------------------------------

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop (from any thread); nothing once the loop is closed."""
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: the tailer is stopping
            pass

    def run(self, coro: Coroutine, timeout: float | None = None) -> Any:
        """Run ``coro`` on the loop and wait for its result (from a thread other than the loop's)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def run_sync(self, fn: Callable[[], Any], timeout: float | None = None) -> Any:
        """``fn()`` on the loop, waited for (called at once on the loop's own thread)."""
        if self.on_loop():
            return fn()
        done: concurrent.futures.Future = concurrent.futures.Future()

        def call() -> None:
            try:
                done.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
                done.set_exception(e)

        self.loop.call_soon_threadsafe(call)
        return done.result(timeout)

    # -- on the loop -------------------------------------------------------------------------

    def channel(self, address: str) -> grpc.aio.Channel:
        """The channel to ``address`` (opened on first use)."""
        if self.closed:
            raise StreamBroken("the tailer is stopping")
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = self._open(address)
        return ch

    def connect(self, addresses: list[str]) -> None:
        """Open the channel to every DIS of the routing and start connecting, without waiting:
        the first location's stream then finds the connection made, and the process's first
        channel (which sets up gRPC's event engine, about 4 ms) behind it, instead of paying
        both before its first request.  A DIS that is down is retried by the channel, as it
        would be at the first stream; a channel that cannot be made (a certificate file not
        readable) is left to the first stream, which reports it as before."""
        for address in addresses:
            try:
                self.channel(address).get_state(try_to_connect=True)
            except OSError as e:
                log.warning("cannot open the channel to a DIS yet; its streams will retry", dis=address, error=str(e))

    def opening(self, address: str) -> asyncio.Semaphore:
        """The turns of the ``Stream`` calls being opened to ``address``."""
        sem = self._opening.get(address)
        if sem is None:
            sem = self._opening[address] = asyncio.Semaphore(MAX_OPENING)
        return sem

    def _open(self, address: str) -> grpc.aio.Channel:
        sec = self.security
        if sec.ca is not None:  # ``sec.tls``
            with open(sec.ca, "rb") as f:
                root = f.read()
            cert = key = None
            if sec.cert:  # the configuration gives a key with a certificate (never one alone)
                with open(sec.cert, "rb") as f:
                    cert = f.read()
            if sec.key:
                with open(sec.key, "rb") as f:
                    key = f.read()
            options = list(self.options)
            if sec.server_name:
                options.append(("grpc.ssl_target_name_override", sec.server_name))
            return grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(root, key, cert), options=options)
        return grpc.aio.insecure_channel(address, options=self.options)

    async def close_channels(self) -> None:
        self.closed = True
        channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            await ch.close(None)  # no grace: what is still open is cancelled

    # -- the end -----------------------------------------------------------------------------

    def stop(self, timeout: float = 5.0) -> None:
        """Close the channels (cancelling what is still open on them) and end the thread."""
        if not self.thread.is_alive():
            return
        try:
            self.run(self.close_channels(), timeout)
        except (concurrent.futures.TimeoutError, RuntimeError):
            pass
        self.call_soon(self.loop.stop)
        self.thread.join(timeout)
