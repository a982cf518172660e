"""The block endpoint (``disd.server.blockhttp``) against clients that hold connections without
finishing a request: hundreds that send nothing and hundreds that send a request one byte a
second, kept at their numbers while an authenticated reader reads, through a real ``dis serve``
and a real ``dis proxy``; idle kept-alive connections; and a full endpoint, which answers 503."""

from __future__ import annotations

import errno
import http.client
import json
import pathlib
import select
import selectors
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import pytest

from disd.binlog import LocationKey
from support import Feeder, loaded_dis, running_dis, trade_rows

from .helpers import DisProcess

K1 = LocationKey("Market", "Trade", "feed1", "2026-11-22")
ROWS = 5000
TOKEN = "block-token"
#: ``http_header_timeout_s`` of the endpoints under attack (short, to keep the test short)
HEADER_S = 2.0
#: how much later than the header deadline a connection may be seen closed (scheduling on a busy
#: machine; a connection the deadline did not cut stays open the whole attack)
SLACK_S = 1.5
#: each request of the reader must be answered within this while the endpoint is attacked
READER_BOUND_S = 2.0


# -- an attack -------------------------------------------------------------------------------------
@dataclass
class _Conn:
    kind: str         # "idle" or "slow"
    started: float    # monotonic time of the connect call
    connected: float = 0.0
    sent: int = 0


class Attack:
    """``idle`` connections that send nothing and ``slow`` ones that send ``request`` one byte a
    second, to ``127.0.0.1:port``, kept at those numbers: each connection the server closes is
    replaced by a new one.  Connects are non-blocking (a server that stops accepting must not
    stop the attack).  Records how long each connection stayed open before the server closed it."""

    def __init__(self, port: int, idle: int, slow: int, request: bytes) -> None:
        self.addr = ("127.0.0.1", port)
        self.want = {"idle": idle, "slow": slow}
        self.request = request
        self.sel = selectors.DefaultSelector()
        self.conns: dict[socket.socket, _Conn] = {}
        #: per kind, (seconds open, bytes sent) of each connection the server closed
        self.lifetimes: dict[str, list[tuple[float, int]]] = {"idle": [], "slow": []}
        self.answered = 0  # connections that got bytes back (none should: no request completes)
        self.opened = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="attack", daemon=True)

    def __enter__(self) -> "Attack":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)
        for s in list(self.conns):
            s.close()

    def connected(self) -> int:
        return sum(1 for c in list(self.conns.values()) if c.connected)

    def wait_connected(self, n: int, timeout: float) -> None:
        end = time.monotonic() + timeout
        while self.connected() < n:
            assert time.monotonic() < end, f"only {self.connected()} of {n} attack connections connected"
            time.sleep(0.05)

    def oldest_open(self) -> float:
        """Age of the oldest connection still open (0 when none is)."""
        now = time.monotonic()
        return max((now - c.connected for c in list(self.conns.values()) if c.connected), default=0.0)

    def _open(self, kind: str) -> None:
        s = socket.socket()
        s.setblocking(False)
        err = s.connect_ex(self.addr)
        if err not in (0, errno.EINPROGRESS):
            s.close()
            return
        self.conns[s] = _Conn(kind, time.monotonic())
        self.sel.register(s, selectors.EVENT_WRITE)
        self.opened += 1

    def _closed(self, s: socket.socket) -> None:
        c = self.conns.pop(s)
        self.sel.unregister(s)
        s.close()
        if c.connected:
            self.lifetimes[c.kind].append((time.monotonic() - c.connected, c.sent))

    def _run(self) -> None:
        tick = time.monotonic() + 1.0
        next_open = 0.0
        while not self._stop.is_set():
            counts = {"idle": 0, "slow": 0}
            for c in self.conns.values():
                counts[c.kind] += 1
            now = time.monotonic()
            if now >= next_open:  # at most 64 new connections per 10 ms: the loop stays lively
                next_open = now + 0.01
                for kind, n in self.want.items():
                    for _ in range(min(64, n - counts[kind])):
                        self._open(kind)
            for key, events in self.sel.select(timeout=max(0.0, min(0.01, tick - now))):
                s = key.fileobj
                c = self.conns[s]
                if not c.connected:
                    if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                        self._closed(s)
                        continue
                    c.connected = time.monotonic()
                    self.sel.modify(s, selectors.EVENT_READ)
                    continue
                try:
                    data = s.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if data:
                    self.answered += 1
                else:
                    self._closed(s)
            now = time.monotonic()
            for s, c in list(self.conns.items()):
                if not c.connected and now - c.started > 2.0:  # a connect the server never took
                    self._closed(s)
            if now >= tick:
                tick = now + 1.0
                for s, c in list(self.conns.items()):
                    if c.kind == "slow" and c.connected and c.sent < len(self.request):
                        try:
                            s.send(self.request[c.sent:c.sent + 1])
                            c.sent += 1
                        except OSError:
                            self._closed(s)


# -- an authenticated reader ----------------------------------------------------------------------
def get(port: int, path: str, timeout: float = 5.0) -> tuple[int, bytes, dict]:
    """``GET path`` with the token, through urllib (a new connection): status, body, headers."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def read_path(file: str, start: int, stop: int) -> str:
    return (f"/v1/read?namespace={K1.namespace}&table={K1.table}&internal_partition={K1.internal_partition}"
            f"&column_partition={K1.column_partition}&file={file}&start={start}&stop={stop}")


def read_while(port: int, size_dat: bytes, seconds: float) -> list[tuple[str, float, str]]:
    """The reader: tables, locations and a range, again and again for ``seconds``; each request
    as (what, seconds it took, "ok" or what went wrong)."""
    asks = [("/v1/tables", lambda b: any(t["table"] == "Trade" for t in json.loads(b)["tables"])),
            ("/v1/locations?namespace=Market&table=Trade",
             lambda b: [loc["rows"] for loc in json.loads(b)["locations"]] == [ROWS]),
            (read_path("Size.dat", 400, 4 * ROWS), lambda b: b == size_dat[400:4 * ROWS])]
    out = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for path, check in asks:
            t0 = time.monotonic()
            try:
                status, body, _ = get(port, path, timeout=READER_BOUND_S + 3)
                outcome = "ok" if status == 200 and check(body) else f"HTTP {status}: {body[:200]!r}"
            except OSError as e:
                outcome = f"{type(e).__name__}: {e}"
            out.append((path.split("?")[0], time.monotonic() - t0, outcome))
        time.sleep(0.1)
    return out


def slow_request() -> bytes:
    return f"GET /v1/tables HTTP/1.1\r\nHost: dis\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode()


def check_reader(results: list[tuple[str, float, str]]) -> None:
    bad = [r for r in results if r[2] != "ok" or r[1] > READER_BOUND_S]
    assert results and not bad, f"{len(bad)} of {len(results)} reader requests failed or were slow: {bad[:5]}"


def attack_and_read(port: int, size_dat: bytes) -> None:
    """Two attacks while the reader reads: every request of the reader answered right within
    READER_BOUND_S, and no attacking connection open past the head deadline.

    - 250 connections that send nothing and 150 that send a request a byte a second: 400, more
      than the endpoint's 256 connections (``max_workers``), so waiting ones give way;
    - 150 and 50, fewer: each is held until its head deadline, and cut there (the slow ones
      while they are still sending)."""
    with Attack(port, idle=250, slow=150, request=slow_request()) as attack:
        attack.wait_connected(300, 15)
        results = read_while(port, size_dat, 5.0)
        oldest = attack.oldest_open()
    check_reader(results)
    longest = max(t for v in attack.lifetimes.values() for t, _ in v)
    assert oldest <= HEADER_S + SLACK_S and longest <= HEADER_S + SLACK_S, (
        f"attacking connections held past the {HEADER_S} s head deadline: longest {longest:.1f} s, "
        f"oldest still open {oldest:.1f} s")
    assert attack.opened > 400 and attack.answered == 0

    with Attack(port, idle=150, slow=50, request=slow_request()) as attack:
        attack.wait_connected(200, 15)
        results = read_while(port, size_dat, 2 * HEADER_S + 1.0)
        oldest = attack.oldest_open()
    check_reader(results)
    cut = {k: [t for t, _ in v] for k, v in attack.lifetimes.items()}
    assert len(cut["idle"]) >= 150 and len(cut["slow"]) >= 50, {k: len(v) for k, v in cut.items()}
    every = cut["idle"] + cut["slow"]
    assert HEADER_S * 0.75 <= min(every) and max(every) <= HEADER_S + SLACK_S and oldest <= HEADER_S + SLACK_S, (
        f"not cut at the {HEADER_S} s head deadline: held {min(every):.2f} to {max(every):.2f} s, "
        f"oldest still open {oldest:.1f} s")
    assert all(0 < sent < len(slow_request()) for _, sent in attack.lifetimes["slow"])  # cut while sending
    assert attack.answered == 0


@pytest.fixture
def descriptors():
    """Room for the attack's 400 sockets here and the endpoint's side of them in the daemons
    (which inherit the limit): a soft RLIMIT_NOFILE of at least 2048, restored after."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2048
    assert hard == resource.RLIM_INFINITY or hard >= want, f"the attack needs {want} descriptors, the hard limit is {hard}"
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture
def loaded_db(tmp_path, descriptors) -> tuple[pathlib.Path, bytes]:
    """A database with ROWS rows of Market.Trade checkpointed in one location, and its Size.dat."""
    db = tmp_path / "db"
    srv = loaded_dis(db, {K1: (0, ROWS)}, checkpoint=True)
    srv.stop(0.5)
    size_dat = (db / "Intraday/Market/Trade/feed1/2026-11-22/Trade/Size.dat").read_bytes()
    (tmp_path / "token").write_text(TOKEN + "\n")
    return db, size_dat


def test_idle_and_slow_connections_do_not_lock_readers_out_of_dis_serve(tmp_path, loaded_db):
    db, size_dat = loaded_db
    dis = DisProcess(tmp_path, db_root=str(db), token_file=str(tmp_path / "token"), http_header_timeout_s=HEADER_S)
    try:
        http_port = dis.port + 1
        assert get(http_port, "/v1/tables")[0] == 200
        attack_and_read(http_port, size_dat)
        assert dis.healthy()
    finally:
        dis.stop()


def test_idle_and_slow_connections_do_not_lock_readers_out_of_dis_proxy(tmp_path, loaded_db):
    """The same attack on a proxy's block endpoint (``dis proxy`` serves it with the same class,
    its own ``proxy.http_header_timeout_s`` and ``proxy.max_workers``)."""
    from proxy.proxy_support import start_proxy, write_proxy_config

    db, size_dat = loaded_db
    dis = DisProcess(tmp_path, db_root=str(db), token_file=str(tmp_path / "token"))
    proxy = None
    try:
        config, port = write_proxy_config(
            tmp_path, {"address": f"127.0.0.1:{dis.port}", "token_file": str(tmp_path / "token")},
            token_file=str(tmp_path / "token"), max_workers=256, http_header_timeout_s=HEADER_S)
        proxy = start_proxy(tmp_path, config)
        assert get(port + 1, "/v1/locations?namespace=Market&table=Trade")[0] == 200
        attack_and_read(port + 1, size_dat)
    finally:
        if proxy is not None and proxy.alive():
            proxy.terminate()
        dis.stop()


# -- capacity, in process -------------------------------------------------------------------------
@pytest.fixture
def small_dis(tmp_path):
    """An in-process DIS whose block endpoint takes at most 4 connections (``max_workers: 4``),
    with 1,000,000 rows (8 MB Price.dat: more than loopback buffers hold)."""
    with running_dis(tmp_path / "db", max_workers=4, flush_ms=3_600_000) as srv:
        Feeder(srv).append(K1, trade_rows(0, 1_000_000))
        yield srv


def hold_serving(port: int, n: int) -> list[socket.socket]:
    """``n`` connections, each with an 8 MB range asked and none of it read: each keeps a
    connection of the endpoint busy serving (its write blocked on a full socket)."""
    held = []
    for _ in range(n):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", port))
        s.sendall(f"GET {read_path('Price.dat', 0, 8_000_000)} HTTP/1.1\r\nHost: dis\r\n\r\n".encode())
        held.append(s)
    time.sleep(0.5)  # their responses start and fill the buffers
    return held


def test_idle_kept_alive_connections_give_way_to_new_ones(small_dis):
    port = small_dis.http_port
    kept = []
    for _ in range(4):  # as many as the endpoint takes, each idle after one answered request
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", "/v1/tables")
        r = c.getresponse()
        assert r.status == 200 and r.getheader("Connection") != "close"
        r.read()
        kept.append(c)
    try:
        for _ in range(3):
            t0 = time.monotonic()
            assert get(port, "/v1/tables", timeout=5)[0] == 200
            assert time.monotonic() - t0 < 1.0
    finally:
        for c in kept:
            c.close()


def test_a_full_endpoint_answers_503_at_once_and_serves_again_when_a_connection_frees(small_dis):
    port = small_dis.http_port
    held = hold_serving(port, 4)
    try:
        for _ in range(5):  # the accept loop is never blocked: each new connection answered at once
            t0 = time.monotonic()
            status, body, headers = get(port, "/v1/tables", timeout=5)
            assert status == 503 and time.monotonic() - t0 < 1.0, (status, body)
            assert "connections" in json.loads(body)["error"]
            assert headers["Connection"] == "close" and int(headers["Retry-After"]) >= 1
        held.pop().close()
        time.sleep(0.3)
        assert get(port, "/v1/tables", timeout=5)[0] == 200
    finally:
        for s in held:
            s.close()


def test_a_slow_request_is_cut_at_the_header_deadline_however_steadily_it_sends(tmp_path):
    """A total deadline, not one per byte: a byte every 0.3 s (never idle for long) is cut when
    the deadline passes; a whole request whose last bytes come within it is served."""
    with running_dis(tmp_path / "db", http_header_timeout_s=1.5) as srv:
        req = b"GET /v1/tables HTTP/1.1\r\nHost: dis\r\n\r\n"
        s = socket.create_connection(("127.0.0.1", srv.http_port))
        t0 = time.monotonic()
        cut_at = None
        for i in range(len(req) - 1):  # never the last byte: the request never completes
            if select.select([s], [], [], 0.3)[0]:
                try:
                    cut_at = time.monotonic() - t0 if s.recv(100) == b"" else None
                except OSError:
                    cut_at = time.monotonic() - t0
                break
            if time.monotonic() - t0 > 5:
                break
            try:
                s.send(req[i:i + 1])
            except OSError:
                cut_at = time.monotonic() - t0
                break
        s.close()
        assert cut_at is not None and 1.4 < cut_at < 1.5 + SLACK_S, cut_at
        # the first bytes at once, the rest within the deadline: served
        s = socket.create_connection(("127.0.0.1", srv.http_port))
        s.sendall(req[:5])
        time.sleep(0.8)
        s.sendall(req[5:])
        s.settimeout(5)
        assert s.recv(100).startswith(b"HTTP/1.1 200")
        s.close()


def test_with_tls_connections_that_never_shake_hands_give_way_and_a_full_endpoint_answers_503(tmp_path):
    """TLS: the handshake counts in the head deadline, connections that never start it give way
    to a reader's, and a full endpoint answers 503 after the handshake."""
    import shutil
    import ssl

    from server.test_security import make_pki

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    pki = make_pki(tmp_path / "pki")
    (tmp_path / "token").write_text(TOKEN + "\n")
    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))

    def tls_get(port: int) -> tuple[int, bytes, dict]:
        req = urllib.request.Request(f"https://localhost:{port}/v1/tables", headers={"Authorization": f"Bearer {TOKEN}"})
        try:
            with urllib.request.urlopen(req, timeout=5, context=ctx) as r:
                return r.status, r.read(), dict(r.headers)
        except urllib.error.HTTPError as e:
            return e.code, e.read(), dict(e.headers)

    with running_dis(tmp_path / "db", max_workers=4, flush_ms=3_600_000, token_file=str(tmp_path / "token"),
                     http_header_timeout_s=HEADER_S,
                     tls={"cert": str(pki / "server.pem"), "key": str(pki / "server.key")}) as srv:
        Feeder(srv).append(K1, trade_rows(0, 1_000_000))
        port = srv.http_port
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]  # 20 > 4, no ClientHello
        try:
            for _ in range(3):
                t0 = time.monotonic()
                assert tls_get(port)[0] == 200 and time.monotonic() - t0 < 1.0
            time.sleep(HEADER_S + SLACK_S)
            for s in silent:  # each closed: given way, or at the deadline
                s.settimeout(0.1)
                assert s.recv(10) == b""
        finally:
            for s in silent:
                s.close()
        held = []
        try:
            for _ in range(4):
                raw = socket.socket()
                raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                raw.connect(("127.0.0.1", port))
                s = ctx.wrap_socket(raw, server_hostname="localhost")
                s.sendall(f"GET {read_path('Price.dat', 0, 8_000_000)} HTTP/1.1\r\nHost: dis\r\n"
                          f"Authorization: Bearer {TOKEN}\r\n\r\n".encode())
                held.append(s)
            time.sleep(0.5)
            t0 = time.monotonic()
            status, body, headers = tls_get(port)
            assert status == 503 and time.monotonic() - t0 < 1.0 and headers["Connection"] == "close"
            assert "server.max_workers" in json.loads(body)["error"]
        finally:
            for s in held:
                s.close()


def test_header_deadline_config():
    from disd.config import ConfigError, parse_dis_config
    from disd.proxy.config import parse_proxy_config

    assert parse_dis_config({}).http_header_timeout_s == 5.0
    assert parse_dis_config({"server": {"http_header_timeout_s": 2}}).http_header_timeout_s == 2.0
    for bad in (0, -1, "x"):
        with pytest.raises(ConfigError) as e:
            parse_dis_config({"server": {"http_header_timeout_s": bad}}, "dis.yaml")
        assert "server.http_header_timeout_s" in str(e.value)
    up = {"address": "d:1"}
    assert parse_proxy_config({"upstream": up}, "p").http_header_timeout_s == 5.0
    assert parse_proxy_config({"proxy": {"http_header_timeout_s": 3}, "upstream": up}, "p").http_header_timeout_s == 3.0
    with pytest.raises(ConfigError) as e:
        parse_proxy_config({"proxy": {"http_header_timeout_s": 0}, "upstream": up}, "proxy.yaml")
    assert "proxy.http_header_timeout_s" in str(e.value)
