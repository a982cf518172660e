"""The block endpoint: listings and byte ranges of published column files over HTTP/1.1.

The JVM Spark reader (``jvm/``, docs/spark.md) runs inside Spark's JVM, where no gRPC library is
available without classpath conflicts; the JDK alone speaks HTTP/1.1 and TLS.  So the DIS serves
the same facts as the TableData service on a second port (``server.http_port``), with the same
TLS (and client certificates) and the same bearer token:

==========================================  ===================================================
``GET /v1/tables``                          JSON: every table this DIS serves, with its newest
                                            schema and every version (``versions_json``)
``GET /v1/locations?namespace=&table=``     JSON: each location's published rows, the sizes
``[&version=]``                             of its column files at that count and the schema
                                            version it is written in, and how each listed
                                            version reads as the presented one (``version``,
                                            default the newest; ``disd.server.listing``), as
                                            ListLocations
``GET /v1/read?namespace=&table=&``         the bytes ``[start, stop)`` of one column file, as
``internal_partition=&column_partition=&``  one response body (``Content-Length``); refused
``file=&start=&stop=``                      (416) when ``stop`` is past the published size
==========================================  ===================================================

A read is one response however large: the reader streams a whole task's range of a column
through one connection, and the DIS copies the file in 1 MiB reads through
``Location.read_range``, as ``ReadBlock`` reads it (the published size, the storage engine's
tracked handles with their identity checks and limits).
Bytes below the published size never change (docs/storage-format.md), so a range planned at one
listing reads exactly those rows however far ingestion has moved on.  Errors are JSON
``{"error": "..."}`` with 400 (bad request), 401 (token), 404 (unknown table, location or file),
416 (past the published size) or 503 (location in error or closed, or every connection busy).

Connections are accepted and watched by one thread until they have sent a request's head, within
``server.http_header_timeout_s``; only then does a worker thread serve the request
(``disd.server.httpconns``): connections that send nothing, or a byte at a time, never hold a
worker, and never keep a reader out.
"""

from __future__ import annotations

import hmac
import io
import json
import socket
import ssl
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any, Callable, Protocol
from urllib.parse import parse_qs, urlsplit

import structlog

from disd.binlog import LocationKey
from disd.config import TlsConfig
from disd.errors import DisError
from disd.names import InvalidNameError
from disd.server import metrics
from disd.server.httpconns import BACKLOG, ConnectionLoop, Peer
from disd.server.listing import ListingRefused, projections, versions_of_json
from disd.server.tabledata import readable_location
from disd.storage import LocationError, StorageEngine

if TYPE_CHECKING:
    from typing_extensions import Buffer

log = structlog.get_logger(__name__)

#: Bytes per read while streaming a range.
CHUNK_BYTES = 1 << 20


class HttpRefused(DisError):
    """A request the endpoint answers with an error status (and ``{"error": message}``)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def tls_context(tls: TlsConfig) -> ssl.SSLContext:
    """The server side of TLS: the DIS's certificate; client certificates required when
    ``client_ca`` is set (as for gRPC)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(tls.cert, tls.key)
    if tls.client_ca:
        ctx.load_verify_locations(tls.client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class _SocketWriter(io.BufferedIOBase):
    """``wfile``: every write sent whole (``sendall``), nothing buffered."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def writable(self) -> bool:
        return True

    def write(self, b: Buffer) -> int:
        self._sock.sendall(b)
        return memoryview(b).nbytes


class _Handler(BaseHTTPRequestHandler):
    """One request whose head the connection loop has read (``head``); the response goes to the
    socket.  ``close_connection`` says afterwards whether the connection may be kept."""

    protocol_version = "HTTP/1.1"
    server_version = "dis"
    sys_version = ""

    def __init__(self, sock: socket.socket, head: bytes, peer: Peer, server: BlockHttpServer) -> None:
        self.head = head
        self.endpoint = server
        # typeshed types a request handler's server as socketserver's BaseServer; http.server reads
        # nothing of it, and this one's is the endpoint (``endpoint``), served by httpconns' loop
        super().__init__(sock, peer, server)  # type: ignore[arg-type]

    def setup(self) -> None:
        self.connection = self.request
        self.rfile = io.BytesIO(self.head)
        self.wfile = _SocketWriter(self.request)

    def handle(self) -> None:
        self.close_connection = True
        self.handle_one_request()
        headers = getattr(self, "headers", None)
        if headers is not None and (headers.get("Content-Length", "0").strip() not in ("", "0")
                                    or "Transfer-Encoding" in headers):
            self.close_connection = True  # a body nobody reads: the next request would start inside it

    def finish(self) -> None:
        pass

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet: one log per error only
        pass

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj: object) -> None:
        self._send(status, json.dumps(obj, separators=(",", ":")).encode())

    def do_GET(self) -> None:
        try:
            self._authorize()
            url = urlsplit(self.path)
            q = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
            if url.path == "/v1/tables":
                self._json(200, self.endpoint.backend.tables())
            elif url.path == "/v1/locations":
                self._json(200, self.endpoint.backend.locations(q.get("namespace", ""), q.get("table", ""),
                                                              _version(q.get("version", ""))))
            elif url.path == "/v1/read":
                self._read(q)
            else:
                raise HttpRefused(404, f"no such endpoint {url.path!r}")
        except HttpRefused as r:
            self.close_connection = r.status in (400, 401)
            self._json(r.status, {"error": r.message})
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, socket.timeout):
            self.close_connection = True

    def _authorize(self) -> None:
        expected = self.endpoint.expected_auth
        if expected is None:
            return
        got = self.headers.get("Authorization")
        if got is None:
            raise HttpRefused(401, "missing bearer token")
        if not hmac.compare_digest(got.encode(), expected):
            raise HttpRefused(401, "invalid bearer token")

    def _read(self, q: dict[str, str]) -> None:
        try:
            key = LocationKey(q.get("namespace", ""), q.get("table", ""), q.get("internal_partition", ""),
                              q.get("column_partition", ""))
            start, stop = int(q.get("start", "")), int(q.get("stop", ""))
        except InvalidNameError as e:
            raise HttpRefused(400, str(e)) from None
        except ValueError:
            raise HttpRefused(400, "start and stop must be integers") from None
        if start < 0 or stop < start:
            raise HttpRefused(400, f"bad range [{start}, {stop})")
        name = q.get("file", "")
        chunk = self.endpoint.backend.open_range(key, name, start, stop)
        first = chunk(start, min(stop, start + CHUNK_BYTES))
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(stop - start))
        self.end_headers()
        self.wfile.write(first)
        pos = start + len(first)
        while pos < stop:
            try:
                data = chunk(pos, min(stop, pos + CHUNK_BYTES))
            except HttpRefused as r:
                # Headers are out: the reader sees a short body and names the error itself.
                log.warning("block endpoint read failed mid-response", location=str(key), file=name, error=r.message)
                self.close_connection = True
                return
            self.wfile.write(data)
            pos += len(data)


def _version(raw: str) -> int:
    """The ``version`` a listing presents (0, absent: the newest); 400 unless a whole number."""
    if not raw.strip():
        return 0
    try:
        v = int(raw)
    except ValueError:
        raise HttpRefused(400, f"version must be a schema version number, got {raw!r}") from None
    if v < 0:
        raise HttpRefused(400, f"version must be a schema version number, got {raw!r}")
    return v


def listing_refused(r: ListingRefused) -> HttpRefused:
    """A listing the backend cannot give, as the endpoint answers it (404 or 400)."""
    return HttpRefused(404 if r.not_found else 400, str(r))


class BlockBackend(Protocol):
    """What the block endpoint serves: a DIS's storage engine (``EngineBackend``) or a proxy's
    published snapshots and cache (``disd.proxy.service``).  Errors are ``HttpRefused``."""

    def tables(self) -> dict[str, Any]:
        """``{"tables": [...]}``: every table served, as ``GET /v1/tables`` answers."""
        ...

    def locations(self, namespace: str, table: str, version: int = 0) -> dict[str, Any]:
        """``{"block_size": n, "locations": [...], "projections": [...]}``: as ``GET
        /v1/locations`` answers, presenting ``version`` (0: each table's newest)."""
        ...

    def open_range(self, key: LocationKey, file: str, start: int, stop: int) -> Callable[[int, int], bytes]:
        """Check that ``[start, stop)`` of ``file`` is published (404, 416, 503 otherwise) and
        return ``chunk(a, b)``: the bytes [a, b) of that range, exactly ``b - a`` of them."""
        ...


class EngineBackend:
    """The DIS's block endpoint: the storage engine's locations at their published sizes, bytes
    read through ``Location.read_range``, as TableData's ``ReadBlock`` reads them.  A location
    closed, or cut back to its checkpoint, under a read is a 503."""

    def __init__(self, engine: StorageEngine, block_size: int, routed: Callable[[str, str], bool]) -> None:
        self.engine = engine
        self.block_size = block_size
        self.routed = routed

    def tables(self) -> dict[str, Any]:
        return {"tables": [
            {"namespace": s.namespace, "table": s.table, "partition_column": s.partition_column,
             "schema_json": s.to_json(), "fingerprint": s.fingerprint, "versions_json": s.history_json()}
            for s in self.engine.schemas if self.routed(s.namespace, s.table)]}

    def locations(self, namespace: str, table: str, version: int = 0) -> dict[str, Any]:
        out = []
        for loc in self.engine.locations():
            k = loc.key
            if (namespace and k.namespace != namespace) or (table and k.table != table):
                continue
            rows, files = loc.snapshot()
            out.append({"namespace": k.namespace, "table": k.table, "internal_partition": k.internal_partition,
                        "column_partition": k.column_partition, "rows": rows, "files": files,
                        "schema_version": loc.schema_version})
        try:
            found = projections(self.engine.schemas.get, versions_of_json(out), namespace, table, version)
        except ListingRefused as r:
            raise listing_refused(r) from None
        return {"block_size": self.block_size, "locations": out, "projections": found}

    def open_range(self, key: LocationKey, name: str, start: int, stop: int) -> Callable[[int, int], bytes]:
        loc, why = readable_location(self.engine, key)
        if loc is None:
            raise HttpRefused(404, why)
        size = loc.column_files().get(name)
        if size is None:
            raise HttpRefused(404, f"location {key} has no column file {name!r}")
        if stop > size:
            raise HttpRefused(416, f"{key} {name}: bytes [{start}, {stop}) asked, {size} published "
                               "(did the DIS recover to an earlier checkpoint after the scan was planned?)")
        bs = self.block_size
        metrics.BLOCK_READS.inc(-(-stop // bs) - start // bs if stop > start else 0)

        def chunk(a: int, b: int) -> bytes:
            try:
                data = loc.read_range(name, a, b)
            except LocationError as e:
                raise HttpRefused(503, str(e)) from None
            except OSError as e:
                raise HttpRefused(503, f"{key} {name}: {e}") from None
            if len(data) != max(0, b - a):
                raise HttpRefused(503, f"{key} {name}: the file holds {a + len(data)} bytes, {b} were published")
            return data

        return chunk


class BlockHttpServer:
    """The block endpoint on ``address``: at most ``max_connections`` connections, each with
    ``header_timeout_s`` to send a request head before it is closed, each response written
    within ``idle_timeout_s`` (a task may read its column ranges in turn); the connections are
    ``disd.server.httpconns``'s.  ``setting`` names the key of ``max_connections`` in the 503
    answer."""

    def __init__(self, address: tuple[str, int], backend: BlockBackend, tls: TlsConfig | None = None,
                 token: str | None = None, max_connections: int = 256, idle_timeout_s: float = 600.0,
                 header_timeout_s: float = 5.0, setting: str = "server.max_workers") -> None:
        self.backend = backend
        self.expected_auth = f"Bearer {token}".encode() if token else None
        self.idle_timeout_s = idle_timeout_s
        host = address[0]
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.create_server(address, family=family, backlog=BACKLOG)
        self.server_address = self.socket.getsockname()
        self.connections = ConnectionLoop(self.socket, self._handle, tls_context(tls) if tls else None,
                                          max_connections, header_timeout_s, idle_timeout_s, setting)

    def _handle(self, sock: socket.socket, head: bytes, peer: Peer) -> bool:
        return not _Handler(sock, head, peer, self).close_connection

    def start(self) -> None:
        self.connections.start()

    def stop(self) -> None:
        """Stop accepting and end every open connection."""
        self.connections.stop()


def start_block_http(host: str, port: int, backend: BlockBackend, tls: TlsConfig | None = None,
                     token: str | None = None, max_connections: int = 256,
                     idle_timeout_s: float = 600.0, key: str = "server.http_port",
                     header_timeout_s: float = 5.0) -> BlockHttpServer:
    """Bind and serve ``backend`` in a background thread; ``server.server_address[1]`` is the
    port.  ``key`` names the setting of the port in errors (its section names the others)."""
    section = key.rsplit(".", 1)[0]
    try:
        srv = BlockHttpServer((host, port), backend, tls, token, max_connections, idle_timeout_s, header_timeout_s,
                              setting=f"{section}.max_workers")
    except OSError as e:
        raise OSError(f"cannot serve the block endpoint on {host}:{port} ({key}): "
                      f"{e.strerror or e}") from None
    srv.start()
    return srv
