"""``dis serve``: the daemon's life cycle.

Start: load schemas, check what the configuration names against them (``check_config``: a table
or column no schema declares exits 2 naming the key, before the database root is touched), open
the storage engine (which declares each schema to the database's
record of the table's versions, refusing a change the rules do not allow: ``dis serve`` then
exits 2 naming the table, the versions and the column; then it recovers every location, each in
its own schema version, from its checkpoint),
start the flush/checkpoint scheduler, the gRPC server (Ingest, TableData, health, reflection),
the Prometheus endpoint, warn of what an address other than loopback exposes
(``network_exposure``), settle the garbage collector (``start_serving``,
``disd.collector``), then tell systemd READY=1.  Stop (SIGTERM/SIGINT): STOPPING=1, stop
accepting and end the streams, then flush and checkpoint every location, exit 0.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import signal
import threading
import time
from concurrent import futures
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from disd.collector import settle_after_start
from disd.allocator import DIS as DIS_MALLOC
from disd.allocator import HeapTrimmer, tune_malloc
from disd.config import DisConfig, TlsConfig, check_import_tables
from disd.notify import Notifier, watchdog_interval_s
from disd.rpc.channel import MAX_MESSAGE_BYTES, MIN_KEEPALIVE_MS
from disd.rpc.v1 import dis_pb2, dis_pb2_grpc
from disd.schema import SchemaRegistry
from disd.server.auth import TokenInterceptor, server_credentials
from disd.server.blockcache import BlockCache
from disd.server.ingest import IngestService
from disd.server.ingestsessions import SessionRegistry
from disd.server.ingestmux import add_ingest_service
from disd.server.metrics import HEAP_TRIMS
from disd.server.tabledata import TableDataService
from disd.server.threadnames import name_threads_from_now
from disd.storage import StorageEngine
from disd.storage.dblock import DatabaseLock, lock_database
from disd.storage.filehandles import default_max_open_files

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.registry import Collector

    from disd.kafka.config import KafkaConfig
    from disd.kafka.service import KafkaImport
    from disd.server.blockhttp import BlockHttpServer

log = structlog.get_logger(__name__)

SERVICE_NAMES = (
    dis_pb2.DESCRIPTOR.services_by_name["Ingest"].full_name,
    dis_pb2.DESCRIPTOR.services_by_name["TableData"].full_name,
)


class DisServer:
    def __init__(self, config: DisConfig) -> None:
        self.config = config
        self.schemas = SchemaRegistry.load_dir(config.schemas)
        self.engine: StorageEngine | None = None
        self.server: grpc.Server | None = None
        self.port: int | None = None
        self.metrics_port: int | None = None
        self.http_port: int | None = None  # the block endpoint (disd.server.blockhttp), if on
        self._http_server: BlockHttpServer | None = None
        self._metrics_server: WSGIServer | None = None
        self.health = health.HealthServicer()
        self.sessions: SessionRegistry | None = None
        self.db_lock: DatabaseLock | None = None
        self.tabledata: TableDataService | None = None
        self.kafka: KafkaImport | None = None  # when import.kafka is configured
        self.started = time.time()

    def routed(self, namespace: str, table: str) -> bool:
        return self.config.routes(namespace, table)

    def start(self) -> int:
        kafka_config = check_config(self.config, self.schemas)  # a mistake stops us before anything opens
        # Before anything touches the column files: a second DIS on this root is refused here.
        self.db_lock = lock_database(self.config.db_root, "dis serve")
        try:
            return self._start(kafka_config)
        except BaseException:
            self.stop(0)  # checkpoint what was opened, release the lock
            raise

    def _start(self, kafka_config: KafkaConfig | None) -> int:
        cfg = self.config
        # storage.max_open_files left out: from the descriptor limit, less this server's sockets
        storage = cfg.storage if cfg.storage.max_open_files is not None else dataclasses.replace(
            cfg.storage, max_open_files=default_max_open_files(cfg.max_workers))
        log.info("column-file descriptors", max_open_files=storage.max_open_files,
                 derived=cfg.storage.max_open_files is None)
        engine = self.engine = StorageEngine(
            cfg.db_root,
            self.schemas,
            storage,
            cfg.import_default,
            cfg.import_tables,
        )
        self.engine.start()
        self.sessions = SessionRegistry(cfg.idle_timeout_s, lambda: engine.failures)
        token = cfg.token()
        self.server = grpc_server(cfg.max_workers, token)
        cache = BlockCache(cfg.block_cache_bytes)
        add_ingest_service(IngestService(self.engine, self.sessions, self.routed), self.server)
        self.tabledata = TableDataService(self.engine, self.sessions, cache, cfg.storage.block_size_bytes,
                                          self.routed, self.started)
        dis_pb2_grpc.add_TableDataServicer_to_server(self.tabledata, self.server)
        if kafka_config is not None:
            from disd.kafka.service import KafkaImport

            self.kafka = KafkaImport(kafka_config, self.engine)
            self.tabledata.kafka_status = self.kafka.status
        enable_health_and_reflection(self.server, self.health, SERVICE_NAMES)
        self.port = listen(self.server, cfg.host, cfg.port, cfg.tls)
        self.server.start()
        if cfg.http_port is not None:
            from disd.server.blockhttp import EngineBackend, start_block_http

            backend = EngineBackend(self.engine, cfg.storage.block_size_bytes, self.routed)
            self._http_server = start_block_http(cfg.host, cfg.http_port, backend, cfg.tls, token, cfg.max_workers,
                                                 cfg.idle_timeout_s, header_timeout_s=cfg.http_header_timeout_s)
            self.http_port = self._http_server.server_address[1]
        set_serving(self.health, SERVICE_NAMES)
        if cfg.metrics_port is not None:
            from disd.server.metrics import ServerCollector

            extra: list[Collector] = []
            if self.kafka is not None:
                from disd.kafka.service import KafkaCollector

                extra.append(KafkaCollector(self.kafka))
            self._metrics_server = serve_metrics(
                cfg.metrics_host or cfg.host, cfg.metrics_port, ServerCollector(self.engine, self.sessions, cfg.db_root, self.tabledata),
                *extra)
            self.metrics_port = self._metrics_server.server_address[1]
        if self.kafka is not None:
            self.kafka.start()
        warn_of_exposure("server", cfg.host, self.port, cfg.tls is not None, token is not None, self.metrics_port,
                         cfg.metrics_host)
        log.info("dis serving", address=f"{cfg.host}:{self.port}", metrics_port=self.metrics_port, http_port=self.http_port,
                 db_root=cfg.db_root, tables=len(self.schemas), tls=bool(cfg.tls), token=bool(token))
        return self.port

    def status_line(self) -> str:
        """One line for systemd's STATUS=: locations, those in error, connected tailers."""
        if self.engine is None or self.sessions is None:
            return "stopped"
        locs = self.engine.locations()
        bad = sum(1 for loc in locs if loc.in_error)
        return (f"serving on {self.config.host}:{self.port}; {len(locs)} locations, {bad} in error, "
                f"{len(self.sessions.sessions())} tailers connected")

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting, end the streams, then flush and checkpoint every location."""
        stop_front(self._http_server, self.server, self.health, grace_s)
        self._http_server = self.server = None
        if self.sessions is not None:
            self.sessions.close()
        if self.kafka is not None:  # before the engine's final checkpoint, which then holds every row consumed
            self.kafka.stop()
            self.kafka = None
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        stop_metrics(self._metrics_server)
        self._metrics_server = None
        if self.db_lock is not None:
            self.db_lock.release()  # last: the column files are checkpointed and closed
            self.db_lock = None
        log.info("dis stopped")


def check_config(cfg: DisConfig, schemas: SchemaRegistry) -> KafkaConfig | None:
    """Every table and column ``dis.yaml`` names, checked against the schemas: ``import.tables``
    (``disd.config.check_import_tables``) and ``import.kafka`` (parsed by ``disd.kafka``, whose
    parsed form is returned; None without one).  ``dis serve`` runs it before anything opens and
    ``dis verify --config`` runs it too; a ``ConfigError`` names the file and the key."""
    check_import_tables(cfg, schemas)
    if cfg.import_kafka is None:
        return None
    from disd.kafka.config import parse_kafka_config

    return parse_kafka_config(cfg.import_kafka, cfg.source, schemas, cfg.routes, cfg.schemas)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a listening address) is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


def network_exposure(section: str, host: str, *, tls: bool, token: bool, metrics_port: int | None,
                     metrics_host: str | None) -> list[str]:
    """What a daemon listening on ``host`` gives away to whoever reaches it, one sentence each
    (``section``: the configuration section, ``server`` or ``proxy``): a bearer token without TLS
    (it travels in clear text, and whoever sees it can use it), and the Prometheus endpoint when it
    follows a network ``host`` without ``metrics_host`` saying so (it asks for neither TLS nor the
    token).  Empty on loopback.  A network address without a token is the README's business
    ("Configure": serving other hosts takes TLS and a token), and not warned of here: the shipped
    container serves a private network that way."""
    risks: list[str] = []
    if is_loopback(host):
        return risks
    if token and not tls:
        risks.append(f"{section}.token_file is set but {section}.tls is not: on {host} the bearer token travels in "
                     f"clear text (gRPC and the block endpoint), and whoever sees the traffic can read it and use "
                     f"it; set {section}.tls")
    if metrics_port is not None and metrics_host is None:
        risks.append(f"the Prometheus endpoint ({section}.metrics_port {metrics_port}) listens on {host} too, "
                     f"without TLS or a token: whoever reaches it reads the names of tables and locations, row "
                     f"counts and errors; set {section}.metrics_host (127.0.0.1 to keep it on this host, or "
                     f"{host} to serve it on purpose)")
    return risks


def warn_of_exposure(section: str, host: str, port: int | None, tls: bool, token: bool, metrics_port: int | None,
                     metrics_host: str | None) -> None:
    """Log ``network_exposure``'s risks as warnings at start (the daemon runs as configured)."""
    for risk in network_exposure(section, host, tls=tls, token=token, metrics_port=metrics_port,
                                 metrics_host=metrics_host):
        log.warning("exposed on the network", address=f"{host}:{port}", risk=risk)


def stop_front(http_server: BlockHttpServer | None, server: grpc.Server | None, health: health.HealthServicer,
               grace_s: float) -> None:
    """What readers and writers reach, stopped first: the block endpoint, then the gRPC server
    (health says NOT_SERVING meanwhile; open streams get ``grace_s`` to end)."""
    if http_server is not None:
        http_server.stop()
    if server is not None:
        health.enter_graceful_shutdown()
        server.stop(grace_s).wait()


def stop_metrics(metrics_server: WSGIServer | None) -> None:
    if metrics_server is not None:
        metrics_server.shutdown()
        metrics_server.server_close()


def grpc_server(max_workers: int, token: str | None) -> grpc.Server:
    """A gRPC server as every daemon of the product runs one: a pool of ``max_workers`` threads
    (each call, and each open stream, holds one), the bearer-token check when ``token`` is set,
    keepalives, the large message limit, no port sharing.

    Clients' keepalive pings are accepted every ``MIN_KEEPALIVE_MS`` even on a connection whose
    calls send nothing (an idle subscription, a tailer's call between writes): the tailers and
    proxies ping every few seconds to notice a peer that stopped without closing its connections
    (docs/tailer.md, "Connections"), and gRPC's default (one ping per 5 minutes without data)
    would end their connections as abusive (GOAWAY ``too_many_pings``).  Both ping intervals
    are set: the core (1.85) took the floor of the pings it accepts from
    ``grpc.http2.min_ping_interval_without_data_ms``, and at 5 s it ended an idle subscription
    pinged every 2 s after its third ping, ``min_recv_ping_interval_without_data_ms`` at 1 s
    notwithstanding.  The server's own pings are ``keepalive_time_ms`` apart whatever it says."""
    return grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
        interceptors=[TokenInterceptor(token)] if token else [],
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.http2.min_ping_interval_without_data_ms", MIN_KEEPALIVE_MS),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", MIN_KEEPALIVE_MS),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.so_reuseport", 0),
            # Calls waiting for a thread of the pool: the core's defaults (1,000, hard limit
            # 3,000) turned stream opens away at random (CANCELLED or INTERNAL) when a few
            # thousand locations' tailers opened their streams at once.
            ("grpc.server.max_pending_requests", max(10_000, 2 * max_workers)),
            ("grpc.server.max_pending_requests_hard_limit", max(30_000, 6 * max_workers)),
        ],
        maximum_concurrent_rpcs=max_workers,
    )


def enable_health_and_reflection(server: grpc.Server, servicer: health.HealthServicer,
                                 services: tuple[str, ...]) -> None:
    """The gRPC health service (probes, ``dis health``) and reflection (``grpcurl``), open
    without a token (``disd.server.auth``)."""
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    reflection.enable_server_reflection(
        (*services, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server)


def set_serving(servicer: health.HealthServicer, services: tuple[str, ...]) -> None:
    for name in ("", *services):
        servicer.set(name, health_pb2.HealthCheckResponse.SERVING)


def listen(server: grpc.Server, host: str, port: int, tls: TlsConfig | None) -> int:
    """Bind ``host:port`` (TLS when ``tls``); the port bound, or OSError saying why not."""
    address = f"{host}:{port}"
    try:
        bound = server.add_secure_port(address, server_credentials(tls)) if tls else server.add_insecure_port(address)
    except RuntimeError:  # grpc's way of saying the bind failed
        bound = 0
    if not bound:
        raise OSError(f"cannot listen on {address} (in use, or not permitted)")
    return bound


def serve_metrics(host: str, port: int, collector: Collector, *more: Collector) -> WSGIServer:
    """The Prometheus endpoint of one server: process-wide metrics and ``collector``'s gauges
    (``disd.server.metrics.server_registry``), and those of ``more`` collectors (Kafka pull
    mode's); the families a collector renders as text itself (``RenderedFamilies``) are served
    after the registry's (``disd.server.exposition``).  Returns the HTTP server (``server_address``)."""
    from disd.server.exposition import RenderedFamilies, serve_metrics_http
    from disd.server.metrics import server_registry

    registry = server_registry(collector)
    for c in more:
        registry.register(c)
    rendered = [c for c in (collector, *more) if isinstance(c, RenderedFamilies)]
    try:
        return serve_metrics_http(host, port, registry, rendered)
    except OSError as e:
        raise OSError(f"cannot serve metrics on {host}:{port}: {e.strerror or e}") from None


def run_until_signalled(start: Callable[[], tuple[Any, str]],
                        every_turn: Callable[[], None] | None = None) -> int:
    """The life of a daemon under systemd: SIGTERM/SIGINT handlers first (a signal during the
    start still stops it), then ``start()`` (the started server, which has ``status_line()`` and
    ``stop()``, and the READY=1 status text); READY=1, the watchdog pinged from this loop (a hung
    daemon is restarted), STATUS= kept current and ``every_turn()`` called (at most a second
    apart), until a signal; then STOPPING=1 and ``server.stop()``.  Exit code 0."""
    notifier = Notifier()
    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server, ready_text = start()
    notifier.ready(ready_text)
    ping = watchdog_interval_s() if notifier.enabled else None
    shown = None
    while not stop.wait(min(ping, 1.0) if ping else 1.0):
        if ping:
            notifier.watchdog()
        if notifier.enabled:
            text = server.status_line()
            if text != shown:
                notifier.status(text)  # what `systemctl status` shows
                shown = text
        if every_turn is not None:
            every_turn()
    log.info("shutting down", signal=signal.Signals(received[0]).name if received else None)
    notifier.stopping()
    server.stop()
    return 0


def start_serving(config: DisConfig, trimmer: HeapTrimmer) -> tuple[DisServer, str]:
    """``serve``'s start: the allocator's settings, the server started, then the garbage
    collector's settings (``disd.collector.settle_after_start``: every object made so far out of
    its passes, its thresholds raised for the locations to come)."""
    tune_malloc(DIS_MALLOC)  # large messages leave, the buffers under them are reused (disd.allocator)
    trimmer.tick()  # the size before any message: the first bar a burst's growth is measured against
    server = DisServer(config)
    server.start()
    settle_after_start()
    return server, f"serving on {config.host}:{server.port}"


def serve(config: DisConfig) -> int:
    """Run until SIGTERM/SIGINT; returns the exit code."""
    name_threads_from_now()  # per-thread CPU names its thread (disd.server.threadnames)
    trimmer = HeapTrimmer()

    def trim_heaps() -> None:
        """Free memory a burst of large messages left between the heaps' blocks goes back to the
        system (disd.allocator.HeapTrimmer)."""
        if trimmer.tick():
            HEAP_TRIMS.inc()

    return run_until_signalled(lambda: start_serving(config, trimmer), every_turn=trim_heaps)
