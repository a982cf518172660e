"""The connections of the block endpoint (``disd.server.blockhttp``): one thread accepts and
watches every connection that is not being served, until it has sent the head of a request (the
request line and headers); a worker thread then serves that one request.

Why not a thread per connection: a connection then holds a thread and a slot from accept to
close, so a few hundred connections that send nothing (or a byte a second) take every slot, and
an accept loop that waits for a free slot locks every reader out.  Here:

- **A deadline for the head.**  A new connection has ``header_timeout_s`` from its accept to send
  a whole request head, TLS handshake included: a total, however steadily it sends.  A
  kept-alive connection waits up to ``keepalive_s`` for the first byte of its next request, then
  has ``header_timeout_s`` for the rest.  Past its deadline a connection is closed.
- **Waiting connections give way.**  At most ``max_connections`` connections are open, waiting or
  being served.  A new connection at that number closes the waiting one nearest its deadline (one
  that sent nothing, or too little, or a kept-alive one between requests): none of them is being
  served, and a reader whose kept connection is closed opens a new one.
- **A full endpoint says so.**  When every connection is being served, a new one is answered
  ``503 Service Unavailable`` with ``Retry-After`` and ``Connection: close`` (after its TLS
  handshake, when there is TLS) and closed; at most ``REFUSING_MAX`` of those at a time, beyond
  that they are closed unanswered.
- **The accepting thread never blocks:** sockets are non-blocking, a TLS handshake is stepped as
  its bytes arrive, answers it writes itself are a few hundred bytes.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import re
import selectors
import socket
import ssl
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, cast

import structlog

log = structlog.get_logger(__name__)

#: Seconds a kept connection may wait for the first byte of its next request.
KEEPALIVE_S = 60.0
#: The largest request head accepted (431 above).
MAX_HEAD_BYTES = 64 << 10
#: Connections being refused (503, or 431) at once; more are closed without an answer.
REFUSING_MAX = 64
#: Seconds a refused connection may take to close its side after the answer.
DRAIN_S = 2.0
#: Connections accepted per wake-up before the waiting ones are looked at again.
ACCEPT_BATCH = 64
#: Seconds between two log lines about connections turned away.
REPORT_S = 60.0
BACKLOG = 512

_HEAD_END = re.compile(rb"\r?\n\r?\n")
_NO_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)

#: A peer's socket address: (host, port), or IPv6's (host, port, flowinfo, scope_id).
Peer = tuple[Any, ...]
#: Serves one request: (socket, its head, the peer) -> whether the connection may be kept.
Handle = Callable[[socket.socket, bytes, Peer], bool]


def plain_answer(status: int, reason: str, error: str, retry_after_s: int | None = None) -> bytes:
    """A whole ``Connection: close`` answer with ``{"error": ...}``, as the endpoint's errors."""
    body = ('{"error":"' + error.replace("\\", "\\\\").replace('"', '\\"') + '"}').encode()
    head = [f"HTTP/1.1 {status} {reason}", "Server: dis", "Content-Type: application/json",
            f"Content-Length: {len(body)}", "Connection: close"]
    if retry_after_s is not None:
        head.append(f"Retry-After: {retry_after_s}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


@dataclass(eq=False)
class Conn:
    """A connection the accepting thread watches (or has handed to a worker)."""

    sock: socket.socket           # an ssl.SSLSocket with TLS
    peer: Peer
    state: str                    # handshake | head | idle | refuse (handshake, then 503) | drain
    deadline: float = 0.0
    entry: int = 0                # the deadline heap's entry of this deadline (older ones are stale)
    events: int = 0               # what the selector watches (0: not registered)
    buf: bytearray = field(default_factory=bytearray)
    answer: bytes = b""           # what a refused connection is told


class ConnectionLoop:
    """Accepts on ``listener`` and hands each whole request head to ``handle`` in a pool of at
    most ``max_connections`` worker threads (see the module's docstring)."""

    def __init__(self, listener: socket.socket, handle: Handle, tls: ssl.SSLContext | None, max_connections: int,
                 header_timeout_s: float, serve_timeout_s: float, setting: str = "max_workers") -> None:
        self.listener = listener
        self.handle = handle
        self.tls = tls
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.serve_timeout_s = serve_timeout_s
        self.busy_answer = plain_answer(
            503, "Service Unavailable",
            f"all {max_connections} connections of the block endpoint are serving requests ({setting}): "
            "try again shortly", retry_after_s=1)
        # totals, for tests and logs: closed at the head deadline, closed to make room, answered 503
        self.timed_out = self.evicted = self.refused = 0
        self._reported = (0, 0, 0)
        self._next_report = time.monotonic() + REPORT_S
        self._sel = selectors.DefaultSelector()
        self._waiting: set[Conn] = set()      # admitted, not being served
        self._refusing: set[Conn] = set()
        self._due: list[tuple[float, int, Conn]] = []  # (deadline, entry, conn) of waiting connections
        self._refuse_due: list[tuple[float, int, Conn]] = []
        self._entries = itertools.count(1)
        self._serving = 0                     # handed to workers, not yet back
        self._serving_socks: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._returned: deque[tuple[Conn, bool]] = deque()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._accept_paused_until = 0.0
        self._stopping = False
        self._pool = ThreadPoolExecutor(max_workers=max_connections, thread_name_prefix="block-http")
        self._thread = threading.Thread(target=self._run, name="block-http-accept", daemon=True)

    # -- life cycle -------------------------------------------------------------------------------
    def start(self) -> None:
        self.listener.setblocking(False)
        self._sel.register(self.listener, selectors.EVENT_READ)
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._thread.start()

    def stop(self) -> None:
        """Stop accepting, close every waiting connection and end those being served."""
        self._stopping = True
        self._wake()
        if self._thread.is_alive():
            self._thread.join(10)
        self.listener.close()
        with self._lock:
            serving = list(self._serving_socks)
        for s in serving:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._pool.shutdown(wait=False)

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass  # full: a wake-up is pending anyway

    # -- the accepting thread ---------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopping:
                now = time.monotonic()
                for key, mask in self._sel.select(self._timeout(now)):
                    if key.fileobj is self._wake_r:
                        self._drain_wake()
                    elif key.fileobj is not self.listener:
                        self._step(key.data, mask)
                # the listener last: bytes of connections already open count before new ones
                self._take_returned()
                self._accept()
                now = time.monotonic()
                self._expire(now)
                self._report(now)
        except Exception:  # logged; the endpoint is then down, the daemon stays up
            log.error("block endpoint connection loop failed", exc_info=True)
        finally:
            for c in list(self._waiting) + list(self._refusing):
                self._close(c)
            self._sel.close()
            self._wake_r.close()
            self._wake_w.close()

    def _timeout(self, now: float) -> float:
        t = 1.0
        for heap, live in ((self._due, self._waiting), (self._refuse_due, self._refusing)):
            top = self._top(heap, live)
            if top is not None:
                t = min(t, top.deadline - now)
        if self._accept_paused_until:
            t = min(t, self._accept_paused_until - now)
        return max(0.0, t)

    @staticmethod
    def _top(heap: list[tuple[float, int, Conn]], live: set[Conn]) -> Conn | None:
        """The live connection of ``heap`` with the nearest deadline (stale entries dropped)."""
        while heap:
            _, entry, c = heap[0]
            if c in live and c.entry == entry:
                return c
            heapq.heappop(heap)
        return None

    def _set_deadline(self, c: Conn, deadline: float) -> None:
        c.deadline, c.entry = deadline, next(self._entries)
        heap, live = (self._refuse_due, self._refusing) if c in self._refusing else (self._due, self._waiting)
        heapq.heappush(heap, (deadline, c.entry, c))
        if len(heap) > 2 * len(live) + 1024:  # many stale entries: rebuild
            heap[:] = [(x.deadline, x.entry, x) for x in live]
            heapq.heapify(heap)

    def _watch(self, c: Conn, events: int) -> None:
        if c.events == events:
            return
        if c.events:
            self._sel.modify(c.sock, events, c)
        else:
            self._sel.register(c.sock, events, c)
        c.events = events

    def _close(self, c: Conn) -> None:
        if c.events:
            try:
                self._sel.unregister(c.sock)
            except (KeyError, ValueError):
                pass
            c.events = 0
        self._waiting.discard(c)
        self._refusing.discard(c)
        try:
            c.sock.close()
        except OSError:
            pass

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass

    # -- accepting --------------------------------------------------------------------------------
    def _accept(self) -> None:
        now = time.monotonic()
        if self._accept_paused_until:
            if now < self._accept_paused_until:
                return
            self._accept_paused_until = 0.0
            self._sel.register(self.listener, selectors.EVENT_READ)
        for _ in range(ACCEPT_BATCH):
            try:
                sock, peer = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in _NO_DESCRIPTORS:
                    # Out of descriptors: make room and wait a moment rather than spin on a
                    # listener that stays readable.
                    log.warning("block endpoint cannot accept a connection", error=str(e))
                    victim = self._top(self._due, self._waiting)
                    if victim is not None:
                        self.evicted += 1
                        self._close(victim)
                    self._sel.unregister(self.listener)
                    self._accept_paused_until = now + 0.1
                    return
                continue  # the peer gave up while queued
            self._admit(sock, peer, now)

    def _admit(self, sock: socket.socket, peer: Peer, now: float) -> None:
        try:
            sock.setblocking(False)
            # Headers and body go out as separate writes: without TCP_NODELAY the body would wait
            # for the client's delayed ACK of the headers (40 ms per response on Linux).
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            sock.close()
            return
        if len(self._waiting) + self._serving >= self.max_connections:
            victim = self._top(self._due, self._waiting)
            if victim is None:
                self._refuse(sock, peer, self.busy_answer, now)
                return
            self.evicted += 1
            self._close(victim)
        c = self._wrap(sock, peer, "handshake" if self.tls else "head")
        if c is None:
            return
        self._waiting.add(c)
        self._set_deadline(c, now + self.header_timeout_s)
        self._watch(c, selectors.EVENT_READ)

    def _wrap(self, sock: socket.socket, peer: Peer, state: str) -> Conn | None:
        if self.tls is not None:
            try:
                sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            except (ssl.SSLError, OSError):
                sock.close()
                return None
        return Conn(sock, peer, state)

    def _refuse(self, sock: socket.socket, peer: Peer, answer: bytes, now: float) -> None:
        """Answer ``answer`` (after the TLS handshake) and close, or just close when too many
        are being refused already."""
        self.refused += 1
        if len(self._refusing) >= REFUSING_MAX:
            sock.close()
            return
        c = self._wrap(sock, peer, "refuse")
        if c is None:
            return
        c.answer = answer
        self._refusing.add(c)
        if self.tls is None:
            self._answer(c, now)
        else:
            self._set_deadline(c, now + self.header_timeout_s)
            self._watch(c, selectors.EVENT_READ)

    def _answer(self, c: Conn, now: float) -> None:
        """Send a refused connection its answer, end our side, then read (and drop) what it
        sends until it closes: closing with its request unread would reset the connection and
        could destroy the answer before the client reads it."""
        try:
            c.sock.send(c.answer)
            c.sock.shutdown(socket.SHUT_WR)
        except (ssl.SSLError, OSError):
            self._close(c)
            return
        c.state = "drain"
        self._set_deadline(c, now + DRAIN_S)
        self._watch(c, selectors.EVENT_READ)

    # -- bytes from waiting connections -----------------------------------------------------------
    def _step(self, c: Conn, mask: int) -> None:  # noqa: ARG002 - one path for read and write readiness: the mask is not told apart
        try:
            if c.state in ("handshake", "refuse"):
                self._handshake(c)
            elif c.state == "drain":
                self._drain(c)
            else:
                self._read(c)
        except Exception:  # one connection's failure must not stop the others'
            log.warning("block endpoint connection failed", peer=_peer(c.peer), exc_info=True)
            self._close(c)

    def _handshake(self, c: Conn) -> None:
        try:
            cast(ssl.SSLSocket, c.sock).do_handshake()  # the handshake states are a TLS socket's alone
        except ssl.SSLWantReadError:
            self._watch(c, selectors.EVENT_READ)
            return
        except ssl.SSLWantWriteError:
            self._watch(c, selectors.EVENT_WRITE)
            return
        except (ssl.SSLError, OSError) as e:
            log.info("block endpoint TLS handshake failed", peer=_peer(c.peer), error=str(e))
            self._close(c)
            return
        if c.state == "refuse":
            self._answer(c, time.monotonic())
            return
        c.state = "head"
        self._watch(c, selectors.EVENT_READ)
        self._read(c)  # a request sent right behind the handshake is already decrypted

    def _read(self, c: Conn) -> None:
        while len(c.buf) <= MAX_HEAD_BYTES:
            try:
                data = c.sock.recv(65536)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
                self._watch(c, selectors.EVENT_READ)
                break
            except ssl.SSLWantWriteError:
                self._watch(c, selectors.EVENT_WRITE)
                break
            except OSError:  # ssl.SSLError included
                self._close(c)
                return
            if not data:
                self._close(c)
                return
            if c.state == "idle":  # the first byte of a kept connection's next request
                c.state = "head"
                self._set_deadline(c, time.monotonic() + self.header_timeout_s)
            c.buf += data
        self._check_head(c)

    def _check_head(self, c: Conn) -> None:
        if c.buf.startswith((b"\r", b"\n")):  # empty lines before a request line are ignored (RFC 9112)
            del c.buf[:len(c.buf) - len(c.buf.lstrip(b"\r\n"))]
        m = _HEAD_END.search(c.buf)
        if m is not None:
            head = bytes(c.buf[:m.end()])
            del c.buf[:m.end()]
            self._dispatch(c, head)
        elif len(c.buf) > MAX_HEAD_BYTES:
            self._waiting.discard(c)
            self._refusing.add(c)
            c.answer = plain_answer(431, "Request Header Fields Too Large",
                                    f"a request head may be at most {MAX_HEAD_BYTES} bytes")
            self._answer(c, time.monotonic())

    def _drain(self, c: Conn) -> None:
        try:
            data = c.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(c)

    def _expire(self, now: float) -> None:
        for heap, live in ((self._due, self._waiting), (self._refuse_due, self._refusing)):
            while True:
                c = self._top(heap, live)
                if c is None or c.deadline > now:
                    break
                if c.state != "idle" and live is self._waiting:
                    self.timed_out += 1
                self._close(c)

    def _report(self, now: float) -> None:
        if now < self._next_report:
            return
        self._next_report = now + REPORT_S
        counts = (self.timed_out, self.evicted, self.refused)
        new = [a - b for a, b in zip(counts, self._reported)]
        self._reported = counts
        if new[1] or new[2]:
            log.warning("block endpoint at its connection limit: turned connections away",
                        max_connections=self.max_connections, closed_waiting=new[1], answered_503=new[2],
                        head_deadline_passed=new[0], seconds=REPORT_S)
        elif new[0]:
            log.info("block endpoint closed connections that sent no request head in time", connections=new[0],
                     header_timeout_s=self.header_timeout_s, seconds=REPORT_S)

    # -- serving ----------------------------------------------------------------------------------
    def _dispatch(self, c: Conn, head: bytes) -> None:
        self._sel.unregister(c.sock)
        c.events = 0
        self._waiting.discard(c)
        self._serving += 1
        self._pool.submit(self._serve, c, head)

    def _serve(self, c: Conn, head: bytes) -> None:
        """In a worker: one request, then the connection back to the accepting thread."""
        keep = False
        with self._lock:
            self._serving_socks.add(c.sock)
        try:
            c.sock.settimeout(self.serve_timeout_s)
            keep = self.handle(c.sock, head, c.peer)
        except Exception:  # one request failed, the endpoint goes on
            log.warning("block endpoint request failed", peer=_peer(c.peer), exc_info=True)
        finally:
            with self._lock:
                self._serving_socks.discard(c.sock)
            keep = keep and not self._stopping
            if keep:
                try:
                    c.sock.setblocking(False)
                except OSError:
                    keep = False
            if not keep:
                try:
                    c.sock.close()
                except OSError:
                    pass
            self._returned.append((c, keep))
            self._wake()

    def _take_returned(self) -> None:
        now = time.monotonic()
        while self._returned:
            c, keep = self._returned.popleft()
            self._serving -= 1
            if not keep:
                continue
            if self._stopping:
                c.sock.close()
                continue
            self._waiting.add(c)
            if c.buf:  # the start of a next request came with the last one
                c.state = "head"
                self._set_deadline(c, now + self.header_timeout_s)
            else:
                c.state = "idle"
                self._set_deadline(c, now + KEEPALIVE_S)
            self._watch(c, selectors.EVENT_READ)
            if c.buf or (isinstance(c.sock, ssl.SSLSocket) and c.sock.pending()):
                self._step(c, selectors.EVENT_READ)


def _peer(peer: Peer) -> str:
    return f"{peer[0]}:{peer[1]}" if len(peer) >= 2 else str(peer)
