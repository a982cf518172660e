"""A table's upstream stream, followed for as long as the proxy runs: what a feed of sizes
(``disd.proxy.upstream.Feed``) and a feed of last-by states (``disd.proxy.lastbyfeed.LastByFeed``)
share.

A thread follows one member of the table's routing entry at a time, in the order
``Upstream.follow_order`` gives (healthy members in the table's ``replica_order``): the feed
opens its stream there and takes the state now (``_follow``); when the stream fails or ends (the
DIS stops, restarts, a replica goes away) the thread goes to the next member that answers, and
after a round of them waits (0.1 s doubling to 2 s) and starts another.  Each stream starts from
the whole state, so no change is missed.  A member that stops answering without closing its
connection (a frozen process, a host gone) is noticed by the channel's keepalive pings
(``upstream.keepalive_s``, ``upstream.keepalive_timeout_s``): its stream fails like any other,
and is counted (``dis_proxy_upstream_streams_lost``) and logged at warning.  Readers are told of what a feed publishes through its
listeners (``listen``).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Callable, Generic, Protocol, Self, TypeVar

import grpc
import structlog

from disd.blocks import RETRY_INITIAL_S, RETRY_MAX_S, explain, restarting
from disd.proxy.metrics import UPSTREAM_LOST
from disd.rpc.channel import open_channel
from disd.rpc.v1 import dis_pb2_grpc

if TYPE_CHECKING:
    from disd.proxy.upstream import Upstream

log = structlog.get_logger(__name__)

#: What a listener is given: the items a publish changed (snapshots, or locations' states).
Item = TypeVar("Item")


class Cancellable(Protocol):
    """An open upstream call: a ``Subscription``, a gRPC response stream."""

    def cancel(self) -> object: ...


class FollowedStream(Generic[Item]):
    """One table's upstream stream, followed by a thread across the members of its routing
    entry (see the module docstring).  ``stream`` names it in logs and in ``last_error``.

    A subclass says how a stream is opened and read (``_follow``), and may say which failures
    refuse for good (``_refusal``: when no member answers in a round, the feed ends with that
    answer, ``_end_refused``) and which errors are a message it cannot use (``unusable``: the
    stream is dropped and the next member followed)."""

    stream = "subscription"
    #: errors of a message the feed cannot use, besides gRPC's, and what such a message is
    unusable: tuple[type[Exception], ...] = ()
    message = "message"

    def __init__(self, upstream: Upstream, namespace: str, table: str, thread: str) -> None:
        self.upstream = upstream
        self.namespace, self.table = namespace, table
        self.name = f"{namespace}.{table}"
        self._listeners: list[Callable[[list[Item]], None]] = []
        self._lock = threading.Lock()
        self.primed = threading.Event()  # set once a DIS answered (or the feed was refused)
        self.connected_to: str | None = None  # the member whose stream is open, None between streams
        self.last_error = ""
        self._call: Cancellable | None = None
        self._delay = RETRY_INITIAL_S
        self._thread = threading.Thread(target=self._run, name=f"{thread}-{self.name}", daemon=True)

    def start(self) -> Self:
        self._thread.start()
        return self

    def listen(self, listener: Callable[[list[Item]], None]) -> Callable[[], None]:
        """Call ``listener(what a publish changed)`` after each publish; returns the unsubscribe."""
        with self._lock:
            self._listeners.append(listener)

        def remove() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return remove

    def stop(self) -> None:
        call = self._call
        if call is not None:
            call.cancel()

    # -- what a subclass says --------------------------------------------------------------------
    def _follow(self, stub: dis_pb2_grpc.TableDataStub, address: str) -> None:
        """Open the stream at ``address`` (``self._call``, which ``stop`` cancels), take the state
        now, call ``_connected``, then take the stream's messages until it ends."""
        raise NotImplementedError

    def _refusal(self, e: grpc.RpcError, address: str) -> tuple[grpc.StatusCode, str] | None:  # noqa: ARG002 - a hook: the feeds that refuse for good read them (lastbyfeed)
        """A failure that refuses the stream for good, as (status, details) for readers; None
        for one that may pass (the default: every failure)."""
        return None

    def _end_refused(self, code: grpc.StatusCode, details: str) -> None:
        """No member answered in a round and one refused: the feed ends with that answer."""

    def _connected(self, address: str) -> None:
        """The stream at ``address`` is open and its state taken: readers may be answered."""
        self.primed.set()
        self.connected_to = address
        self._delay = RETRY_INITIAL_S
        log.info(f"upstream {self.stream} open", table=self.name, dis=address)

    # -- the thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        down: dict[str, float] = {}
        closed = self.upstream.closed
        while not closed.is_set():
            refusal, answered = None, False
            for address in self.upstream.follow_order(self.name, self.namespace, self.table, down):
                if closed.is_set():
                    return
                channel = open_channel(address, self.upstream.security, self.upstream.feed_options)
                try:
                    self._follow(dis_pb2_grpc.TableDataStub(channel), address)
                    self.last_error = f"the DIS at {address} ended the {self.stream}"
                except grpc.RpcError as e:
                    if closed.is_set():
                        return
                    self.last_error = str(explain(e, address))
                    refused = self._refusal(e, address)
                    if refused is not None:
                        refusal = refused
                        log.error(f"upstream refuses the {self.stream}", table=self.name, dis=address,
                                  error=self.last_error)
                    elif not restarting(e) and e.code() not in (grpc.StatusCode.CANCELLED,
                                                                grpc.StatusCode.DEADLINE_EXCEEDED):
                        log.error(f"upstream refuses the {self.stream}", table=self.name, dis=address,
                                  error=self.last_error)
                except self.unusable as e:  # a message the feed cannot use: start over
                    self.last_error = f"the DIS at {address} sent a {self.message} the proxy cannot use: {e}"
                    log.error(f"upstream {self.message} refused", table=self.name, dis=address, error=self.last_error)
                finally:
                    if self.connected_to is not None:
                        answered = True
                        if not closed.is_set():
                            UPSTREAM_LOST.labels(self.name, address).inc()
                            log.warning(f"upstream {self.stream} lost", table=self.name, dis=address,
                                        error=self.last_error)
                    self.connected_to = None
                    call, self._call = self._call, None
                    if call is not None:
                        call.cancel()
                    channel.close()
                down[address] = time.monotonic()
            if refusal is not None and not answered:
                self._end_refused(*refusal)
                return
            closed.wait(self._delay)
            self._delay = min(self._delay * 2, RETRY_MAX_S)
